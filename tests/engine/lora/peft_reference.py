"""PEFT as the LoRA oracle: random nonzero adapters saved with PEFT's `save_pretrained`, and greedy
tokens from HF transformers + `PeftModel`."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> (rank, alpha, target modules, rsLoRA): ranks, scalings and targets all differ.
ADAPTERS = {
    "all7": (8, 16, ALL_SEVEN, False),
    "attn": (4, 8, ["q_proj", "v_proj"], False),
    "mlp": (16, 8, ["gate_proj", "up_proj", "down_proj"], True),
}


def make_adapter(model_dir: Path, out: Path, rank: int, alpha: int, targets: list[str], rslora: bool,
                 seed: int) -> Path:
    """A PEFT LoRA adapter of `model_dir` with random A and B (PEFT would start B at zero: no effect)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, use_rslora=rslora,
                        task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    model.save_pretrained(out)
    return out


def peft_greedy(model_dir: Path, adapter_dir: Path | None, prompts: list[list[int]], max_new_tokens: int):
    """HF transformers + PEFT's PeftModel: greedy tokens, one prompt at a time (the oracle)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=None)
            outs.append(y[0, len(ids):].tolist())
    return outs
