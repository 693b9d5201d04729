"""`--calculate-kv-scales`: an fp8 KV cache's per-layer scales computed from the model's own K and V.

vLLM's meaning: with `--kv-cache-dtype fp8`, each attention layer whose checkpoint carries no
`k_scale`/`v_scale` gets `k_scale = max|K| / 200` and `v_scale = max|V| / 100` (vLLM's defaults of
its K_SCALE_CONSTANT and V_SCALE_CONSTANT) over one forward, instead of 1.0. The cache stores
`K / k_scale`, so the calibration maximum lands at 200 of e4m3's 448 (2.24x headroom for later,
larger keys) and values at 100 (4.48x). vLLM took the maxima from its first forward (at start-up,
the warm-up run on dummy tokens); layers with scales from the checkpoint keep those here.

When: once, at start-up, after the KV pool exists and before any CUDA graph is captured. A
captured graph bakes in the Python-float scales its kernels were launched with; computed before
the capture and never changed afterwards, the baked values are the final ones, so the kernels need
no device-side scale.

What it runs on: a fixed sequence of token ids drawn from the vocabulary with a seeded generator
(no tokenizer or text is needed, every model has a vocabulary), prefilled through the real model
and the real KV pool (blocks that no request owns yet). The maxima are of the key after rotary
embedding, as the cache stores it, and of the value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from flotilla.engine.forward_context import AttentionMetadata, forward_context
from flotilla.engine.layers.attention import Attention
from flotilla.kernels.rotary import apply_rotary_ref

logger = logging.getLogger(__name__)

K_SCALE_CONSTANT = 200.0  # vLLM's default divisor of max|K|
V_SCALE_CONSTANT = 100.0  # and of max|V|
CALIBRATION_TOKENS = 512  # the length of the calibration sequence, capped by the step budget
CALIBRATION_SEED = 0


def scale_from_amax(amax: float, constant: float) -> float:
    """`amax / constant`; 1.0 for a layer whose tensor was all zeros (any scale stores zeros exactly)."""
    if not amax < float("inf"):
        raise ValueError(f"--calculate-kv-scales: the calibration forward produced a non-finite K or V ({amax})")
    return amax / constant if amax > 0 else 1.0


def calibration_token_ids(vocab_size: int, length: int, seed: int = CALIBRATION_SEED) -> list[int]:
    """The calibration sequence: `length` ids drawn uniformly from the vocabulary, the same every start."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


@contextmanager
def observe_kv_amax(layers: list[Attention]) -> Iterator[list[list[float]]]:
    """While open, record each layer's largest |K| (after rotary) and |V| of every forward into the
    yielded `[[k_amax, v_amax], ...]`, one pair per layer in `layers`' order."""
    amax = [[0.0, 0.0] for _ in layers]

    def hook(index: int) -> Callable[[Attention, tuple, dict], None]:
        def record(module: Attention, args: tuple, kwargs: dict) -> None:
            query, k, v, *rest = args
            positions = kwargs.get("positions", rest[0] if rest else None)
            cos_sin_cache = kwargs.get("cos_sin_cache", rest[1] if len(rest) > 1 else None)
            if cos_sin_cache is not None and positions is not None:
                q = query.view(-1, module.num_heads, module.head_dim)
                _, k = apply_rotary_ref(positions, q, k.view(-1, module.num_kv_heads, module.head_dim), cos_sin_cache)
            for slot, tensor in ((0, k), (1, v)):
                seen = float(tensor.abs().max())
                if not seen <= amax[index][slot]:  # a NaN stays NaN (max() would drop it): refused later
                    amax[index][slot] = seen
        return record

    handles = [layer.register_forward_pre_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        yield amax
    finally:
        for handle in handles:
            handle.remove()


def apply_calculated_scales(layers: list[Attention], amax: list[list[float]]) -> int:
    """Set k_scale/v_scale from the observed maxima on every layer without checkpoint scales; returns
    how many layers were set."""
    count = 0
    for layer, (k_amax, v_amax) in zip(layers, amax, strict=True):
        if layer.scales_from_checkpoint:
            continue
        layer.k_scale = scale_from_amax(k_amax, K_SCALE_CONSTANT)
        layer.v_scale = scale_from_amax(v_amax, V_SCALE_CONSTANT)
        count += 1
    return count


@torch.inference_mode()
def calibrate_kv_scales(model: torch.nn.Module, layers: list[Attention], vocab_size: int, length: int,
                        block_size: int, device: torch.device) -> None:
    """Prefill the calibration sequence of `length` tokens into the pool's first blocks (owned by no
    request yet; they are written again before any request reads them) and set the scales of the
    layers without checkpoint scales. The fp8 cache holds 1.0-scaled K/V during this forward; that
    shifts the later layers' maxima by fp8 rounding noise only."""
    blocks = -(-length // block_size)
    metadata = AttentionMetadata(
        slot_mapping=torch.arange(length, dtype=torch.long, device=device),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=device).view(1, blocks),
        query_start_loc=torch.tensor([0, length], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([length], dtype=torch.int32, device=device),
        max_query_len=length,
        max_seq_len=length,
    )
    ids = torch.tensor(calibration_token_ids(vocab_size, length), dtype=torch.long, device=device)
    positions = torch.arange(length, dtype=torch.long, device=device)
    with observe_kv_amax(layers) as amax, forward_context(metadata):
        model(ids, positions)
    count = apply_calculated_scales(layers, amax)
    if count:
        k_scales = [layer.k_scale for layer in layers if not layer.scales_from_checkpoint]
        v_scales = [layer.v_scale for layer in layers if not layer.scales_from_checkpoint]
        logger.info("--calculate-kv-scales: %d layers calibrated over %d tokens; k_scale %.4g..%.4g, "
                    "v_scale %.4g..%.4g", count, length, min(k_scales), max(k_scales), min(v_scales), max(v_scales))
    else:
        logger.info("--calculate-kv-scales: every layer has k/v scales from the checkpoint; they are kept")
