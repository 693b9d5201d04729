"""LoRA on a quantized base model whose linear layers keep packed codes instead of the dense weight (rtn at 4 and
8 bits, GPTQ, AWQ, packed int4 compressed-tensors, GGUF Q4_0), as vLLM serves it: the adapter's delta is added to
the base layer's own quantized product. Oracle: HF transformers + PEFT with the same adapter on a dense copy of the
dequantized weights (fp32, where the engine's quantized product equals the dequantized one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flotilla.engine.llm import LLM
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.sampling_params import SamplingParams

from ..gguf_files import write_tiny_llama_gguf
from ..quant_checkpoints import compressed_tensors_checkpoint, int4_checkpoint
from .peft_reference import ALL_SEVEN, make_adapter, peft_greedy

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13] * 6, [5, 6, 7, 8, 9]]
TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)


def _rtn_rounded_copy(src: Path, dst: Path, bits: int, group: int | None) -> Path:
    """`src` with every linear weight (not the LM head) rounded as `--quantization rtn` rounds it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flotilla.engine.quantization.rtn import rtn_quantize

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                codes, scales = rtn_quantize(module.weight, bits, group)
                scale = scales.repeat_interleave(module.weight.shape[1] // scales.shape[1], dim=1)
                module.weight.copy_((codes.float() - 2 ** (bits - 1)) * scale)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def _gguf_dense_copy(path: Path, dst: Path, tokenizer: Path) -> Path:
    """The GGUF file as transformers dequantizes it, saved as a dense HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)  # transformers will not save a "gguf-quantized" model: a plain copy
    model = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(config), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(dst)
    return dst


@pytest.mark.parametrize("scheme", ["rtn4", "rtn8", "gptq", "awq", "W4A16", "gguf"])
def test_lora_on_packed_quantized_layers_matches_peft_on_the_dequantized_weights(
        scheme, tiny_model_dirs, embedded_model_dir, tmp_path, monkeypatch):
    """A batch of adapter and base-model requests: the adapter's tokens equal PEFT's on the dequantized weights,
    the base model's tokens equal the dequantized model's, and the adapter changes the tokens (the oracle bites)."""
    src = tiny_model_dirs["llama"]
    kwargs: dict = {}
    if scheme.startswith("rtn"):
        bits = int(scheme[3:])
        monkeypatch.setenv("RTN_NUM_BITS", str(bits))
        monkeypatch.setenv("RTN_GROUP_SIZE", "32" if bits == 4 else "-1")
        model, kwargs = src, {"quantization": "rtn"}
        dense = _rtn_rounded_copy(src, tmp_path / "dense", bits, 32 if bits == 4 else None)
    elif scheme in ("gptq", "awq"):
        model, kwargs = int4_checkpoint(src, tmp_path / scheme, scheme), {"quantization": scheme}
        dense = model / "dequantized"
    elif scheme == "W4A16":
        model = compressed_tensors_checkpoint(src, tmp_path / scheme, scheme, group_size=32)
        dense = model / "dequantized"
    else:
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(embedded_model_dir))
        model = write_tiny_llama_gguf(tmp_path / "tiny.gguf", vocab)
        kwargs = {"tokenizer": str(embedded_model_dir), "dtype": "float32"}
        dense = _gguf_dense_copy(model, tmp_path / "dense", embedded_model_dir)
    adapter = make_adapter(dense, tmp_path / "adapter", 8, 16, ALL_SEVEN, False, seed=3)
    llm = LLM(str(model), max_model_len=128, enable_lora=True, max_lora_rank=16, **kwargs)
    wrapped = llm.engine.runner.lora.layers.values()
    assert all(not hasattr(layer.base, "weight") for layer in wrapped), "the base layers should hold packed codes"
    lora = LoRARequest("a", 1, str(adapter))
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=[lora, lora, None])
    got = [o.outputs[0].token_ids for o in outs]
    want = peft_greedy(dense, adapter, PROMPTS[:2], TOKENS)
    base = peft_greedy(dense, None, PROMPTS[2:], TOKENS)
    assert got == want + base
    assert got[0] != got[2]


def test_lora_on_bf16_int4_kernel_layers_runs(tiny_model_dirs, tmp_path, monkeypatch):
    """bf16 on the CPU: the packed layers take torch's int4 kernel; the adapter's delta goes on top of it."""
    monkeypatch.setenv("RTN_NUM_BITS", "4")
    monkeypatch.setenv("RTN_GROUP_SIZE", "32")
    src = tiny_model_dirs["llama"]
    adapter = make_adapter(src, tmp_path / "adapter", 8, 16, ALL_SEVEN, False, seed=3)
    llm = LLM(str(src), quantization="rtn", dtype="bfloat16", max_model_len=128, enable_lora=True)
    layers = list(llm.engine.runner.lora.layers.values())
    assert all(getattr(layer.base, "cpu_int_weight", None) is not None for layer in layers)
    assert all(layer.lora_a.dtype == torch.bfloat16 for layer in layers)
    lora = LoRARequest("a", 1, str(adapter))
    outs = llm.generate(PROMPTS[:1] * 2, GREEDY, use_tqdm=False, lora_request=[lora, None])
    assert outs[0].outputs[0].token_ids != outs[1].outputs[0].token_ids

