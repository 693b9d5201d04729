"""HF model directories of a known shape, without a checkpoint download: config.json plus a synthetic
word-level tokenizer (one token per id), for benchmarks with `load_format="dummy"` (random weights
generated on the device) or with HF's own random init.

    python bench/model_dirs.py llama-3.1-8b /tmp/llama-8b
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The published config.json numbers of each model (architecture only; no weights).
SHAPES: dict[str, dict] = {
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
    # mixtures of experts (engine/layers/moe.py): Qwen3-30B-A3B (128 experts of 768, top 8) and Mixtral-8x7B
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    },
}
# A small Llama whose steps take milliseconds on a CPU (pipeline-overlap measurements).
SHAPES["small-llama"] = {
    **SHAPES["tiny-llama"],
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
# Llama-3.1-70B: the 8B's config with the 70B's widths (bf16 weights need at least two H200s).
SHAPES["llama-3.1-70b"] = {
    **SHAPES["llama-3.1-8b"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}


def write_tokenizer(path: Path, vocab_size: int, bos: int, eos: int) -> None:
    """A word-level tokenizer with one token `<i>` per id, saved as an HF fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<0>", pad_token="<0>", bos_token=f"<{bos}>", eos_token=f"<{eos}>"
    )
    fast.save_pretrained(path)


def make_model_dir(shape: str, path: str | Path, weights_seed: int | None = None) -> Path:
    """Write config.json and the tokenizer for `shape` into `path`; with `weights_seed`, also HF's
    random init as safetensors (only sensible for small shapes)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = SHAPES[shape]
    (path / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(path, config["vocab_size"], config["bos_token_id"], config["eos_token_id"])
    if weights_seed is not None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(weights_seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
        model.save_pretrained(path)
        (path / "config.json").write_text(json.dumps(config, indent=2))  # keep our exact numbers
    return path


if __name__ == "__main__":
    print(make_model_dir(sys.argv[1], sys.argv[2]))
