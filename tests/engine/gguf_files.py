"""Tiny llama GGUF files for the tests, written with the `gguf` package's own writer and quantizers.

The layout is llama.cpp's: llama.cpp names, Q and K rows permuted as its converter permutes them
(`convert_hf_to_gguf.py` LlamaModel.permute), the linear weights in the type asked for, the embedding F16,
the final norm F32 and a separate LM head (`output.weight`) in Q8_0; `types` sets any tensor's type by its name
(a Q4_K_M-like mix). The k-quants, which gguf-py does not quantize, come from the test-side encoder
(`gguf_kquants.py`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from .gguf_kquants import K_TYPES, quantize_k


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(path: Path, vocab: int, linear: str = "Q4_0", hidden: int = 64, inter: int = 128,
                          layers: int = 2, heads: int = 4, kv_heads: int = 2, std: float = 0.1, seed: int = 0,
                          arch: str = "llama", types: dict[str, str] | None = None) -> Path:
    """A random llama model as a GGUF file (linear weights ~ N(0, std): peaked logits, greedy far from ties);
    `types` maps a llama.cpp tensor name to its type in place of the defaults (k-quants need inputs a multiple of
    256)."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // heads)

    def add(name: str, shape: tuple[int, ...], kind: str, heads_of_rows: int | None = None, around: float = 0.0
            ) -> None:
        data = (around + rng.normal(0.0, std, shape)).astype(np.float32)
        kind = (types or {}).get(name, kind)
        if heads_of_rows:
            data = _permute(data, heads_of_rows)
        if kind == "F32":
            writer.add_tensor(name, data)
        elif kind == "F16":
            writer.add_tensor(name, data.astype(np.float16))
        elif kind in K_TYPES:
            writer.add_tensor(name, quantize_k(data, kind), raw_dtype=GGMLQuantizationType[kind])
        else:
            qtype = GGMLQuantizationType[kind]
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    head_dim = hidden // heads
    add("token_embd.weight", (vocab, hidden), "F16")
    add("output_norm.weight", (hidden,), "F32", around=1.0)
    add("output.weight", (vocab, hidden), "Q8_0")
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,), "F32", around=1.0)
        add(f"blk.{i}.ffn_norm.weight", (hidden,), "F32", around=1.0)
        add(f"blk.{i}.attn_q.weight", (hidden, hidden), linear, heads_of_rows=heads)
        add(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden), linear, heads_of_rows=kv_heads)
        add(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden), linear)
        add(f"blk.{i}.attn_output.weight", (hidden, hidden), linear)
        add(f"blk.{i}.ffn_gate.weight", (inter, hidden), linear)
        add(f"blk.{i}.ffn_up.weight", (inter, hidden), linear)
        add(f"blk.{i}.ffn_down.weight", (hidden, inter), linear)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
