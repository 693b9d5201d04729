"""Shared builders for the kernel tests: the device the kernels run on, paged pools, error checks."""

from __future__ import annotations

import os

import torch

from flotilla.kernels.packed_int_linear import pack_codes, packed_int_linear_ref

# Under the interpreter, kernels run on CPU tensors; compiled, on the GPU.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "") == "1"
DEVICE = torch.device("cpu" if INTERPRETING or not torch.cuda.is_available() else "cuda")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64; NaN anywhere fails every bound."""
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def tolerance(dtype: torch.dtype) -> float:
    """Relative-error bound: fp32 stays exact to rounding, bf16 pays its 8-bit mantissa."""
    return 1e-5 if dtype == torch.float32 else 1.5e-2


def linear_case(m: int, n: int, k: int, dtype: torch.dtype, *, bias: bool, seed: int = 0):
    """A seeded `x [m, k]`, `weight [n, k]` (scaled by 1/sqrt(k)) and optional bias `[n]` on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    weight = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, weight, b


def int4_weight(n: int, k: int, group: int, g: torch.Generator, dtype: torch.dtype,
                symmetric: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random int4 weight `[n, k]` drawn from `g` (codes, then scales, then zero points), on the CPU: packed
    codes, scales `[n, k / group]` in `dtype` and uint8 zero points (all 8 when `symmetric`)."""
    codes = torch.randint(0, 16, (n, k), generator=g)
    scales = (torch.rand(n, k // group, generator=g) * 0.02 + 0.001).to(dtype)
    zeros = torch.full((n, k // group), 8, dtype=torch.uint8) if symmetric else \
        torch.randint(0, 16, (n, k // group), generator=g).to(torch.uint8)
    return pack_codes(codes, 4), scales, zeros


def int4_case(m: int, n: int, k: int, group: int, dtype: torch.dtype, symmetric: bool, bias: bool, seed: int = 0):
    """A seeded int4 W4A16 case: the arguments of the int4 linears `(x, packed, scales, zeros or None, group,
    bias or None)` on DEVICE, and `packed_int_linear_ref`'s output (fp32, on the CPU) to check them against."""
    g = torch.Generator().manual_seed(seed * 7919 + m * 1000 + n + k)
    packed, scales, zeros = int4_weight(n, k, group, g, dtype, symmetric)
    x = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    args = (x.to(DEVICE), packed.to(DEVICE), scales.to(DEVICE), None if symmetric else zeros.to(DEVICE), group,
            b.to(DEVICE) if bias else None)  # fmt: skip
    # the reference where the kernel runs (a Llama-sized weight dequantized on the CPU takes seconds)
    ref = packed_int_linear_ref(args[0].float(), args[1], args[2].float(), zeros.to(DEVICE), 4, group,
                                args[5].float() if bias else None)  # fmt: skip
    return args, ref.cpu()

def paged_pool(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    *,
    page: int = 16,
    share_prefix_blocks: int = 0,
    spare_blocks: int = 5,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A KV pool and block tables with shuffled physical blocks.

    Sequence 1 reuses sequence 0's first `share_prefix_blocks` blocks (a prefix-cache hit), unused
    table entries are -1, and spare blocks that no sequence owns hold random data too.
    """
    needed = [(n + page - 1) // page for n in seq_lens]
    width = max(max(needed), 1)
    own = sum(needed) - (share_prefix_blocks if len(seq_lens) > 1 else 0)
    num_blocks = own + spare_blocks
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    for i, n in enumerate(needed):
        for j in range(n):
            if i == 1 and j < share_prefix_blocks:
                tables[i, j] = tables[0, j]
            else:
                tables[i, j] = perm.pop()
    shape = (num_blocks, page, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    return k_cache.to(DEVICE), v_cache.to(DEVICE), tables.to(DEVICE)


def batch_meta(q_lens: list[int], seq_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`query_start_loc` and `seq_lens` tensors (int32) for a flattened batch."""
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return (
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
    )


def attention_case(
    q_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
    *,
    head_dim: int = 32,
    share: int = 0,
    seed: int = 0,
) -> tuple[torch.Tensor, ...]:
    """A paged attention call's arguments (query, k_cache, v_cache, block_tables, query_start_loc,
    seq_lens): random queries for `q_lens` new tokens over contexts of `seq_lens` in a shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = paged_pool(
        seq_lens, num_kv_heads, head_dim, dtype, share_prefix_blocks=share, generator=g
    )
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    qsl, lens = batch_meta(q_lens, seq_lens)
    return query, k_cache, v_cache, tables, qsl, lens


def assert_same_rope_writes(got: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                            want: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                            caches: tuple[torch.Tensor, torch.Tensor], slot: int, dtype: torch.dtype) -> None:
    """A fused projection + rotary + KV write (`got`: rotated query `[1, heads, head_dim]`, key and value caches)
    equals the unfused kernels' (`want`) bit for bit, caches compared as bytes (fp8 included); a padding slot
    (`slot < 0`) leaves both `caches` (as they were before the call) untouched."""
    (got_q, got_k, got_v), (want_q, want_k, want_v) = got, want
    assert got_q.shape == want_q.shape and got_q.dtype == dtype
    assert torch.equal(got_q, want_q)
    assert torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))
    if slot < 0:
        assert torch.equal(got_k.view(torch.uint8), caches[0].view(torch.uint8))
        assert torch.equal(got_v.view(torch.uint8), caches[1].view(torch.uint8))
