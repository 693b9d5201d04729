"""bitsandbytes 4-bit linear: the reference against a hand-computed block and bitsandbytes itself, the Triton
lookup-table GEMM against the reference, and the dispatch."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err, tolerance

from flotilla.kernels import dispatch
from flotilla.kernels.nf4_linear import (
    NF4_TABLE,
    dequantize_4bit_blocks,
    nf4_linear_ref,
    pack_nibbles,
    quantize_4bit_blocks,
    table,
    unpack_nibbles,
)


def _case(m: int, n: int, k: int, dtype: torch.dtype, *, bias: bool = True, quant_type: str = "nf4", seed: int = 0):
    """`x [m, k]` in `dtype`, a random weight `[n, k]` quantized to 4-bit blocks, the table, a bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    packed, absmax = quantize_4bit_blocks(torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g),
                                          quant_type)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, packed, absmax, table(quant_type), b


def test_one_block_by_hand():
    """One row of 64 inputs, absmax 2: 2.0 is code 15 (1.0), -1.0 is -0.5 scaled, nearest -0.5251 (code 2), 0.3 is
    0.15 scaled, nearest 0.1609 (code 9), zeros code 7; the even input lands in the high nibble."""
    w = torch.zeros(1, 64)
    w[0, :4] = torch.tensor([2.0, -1.0, 0.3, 0.0])
    packed, absmax = quantize_4bit_blocks(w)
    assert absmax.tolist() == [[2.0]]
    assert packed.shape == (1, 32) and packed[0, :2].tolist() == [0xF2, 0x97] and set(packed[0, 2:].tolist()) == {0x77}
    deq = dequantize_4bit_blocks(packed, absmax, table("nf4"))
    expected = torch.tensor([2.0, 2 * NF4_TABLE[2], 2 * NF4_TABLE[9], 0.0], dtype=torch.float32)
    assert torch.equal(deq[0, :4], expected) and not deq[0, 4:].any()
    assert torch.equal(unpack_nibbles(pack_nibbles(torch.arange(16).repeat(2))), torch.arange(16, dtype=torch.uint8)
                       .repeat(2))
    x = torch.zeros(1, 64)
    x[0, 1] = 1.0
    assert nf4_linear_ref(x, packed, absmax, table("nf4")).item() == pytest.approx(2 * NF4_TABLE[2])


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_codes_and_dequantization_equal_bitsandbytes(quant_type):
    """bitsandbytes' own quantize_4bit writes the same bytes and absmax, its table is ours, and its dequantize_4bit
    gives the same weight bit for bit."""
    bnb = pytest.importorskip("bitsandbytes.functional")
    w = torch.randn(96, 256) * torch.rand(96, 1)
    q, state = bnb.quantize_4bit(w, blocksize=64, quant_type=quant_type, compress_statistics=False)
    packed, absmax = quantize_4bit_blocks(w, quant_type)
    assert torch.equal(bnb.get_4bit_type(quant_type, device="cpu"), table(quant_type))
    assert torch.equal(packed.reshape(-1), q.reshape(-1)) and torch.equal(absmax.reshape(-1), state.absmax)
    assert torch.equal(dequantize_4bit_blocks(packed, absmax, table(quant_type)), bnb.dequantize_4bit(q, state))


def _on_device(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [t.to(DEVICE) if t is not None else None for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 72, 192), (20, 96, 128), (70, 130, 128)])
def test_default_tiles_match_the_reference(dtype, m, n, k):
    """Decode (swap AB, split K), 17..64 rows and a prefill's tiles; N ends mid-tile."""
    from flotilla.kernels.triton_nf4_linear import nf4_linear

    x, packed, absmax, values, bias = _case(m, n, k, dtype)
    out = nf4_linear(*_on_device(x, packed, absmax, values, bias))
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out.cpu(), nf4_linear_ref(x, packed, absmax, values, bias)) < tolerance(dtype)


@pytest.mark.parametrize(("split_k", "swap_ab"), [(1, False), (3, True)])
def test_split_k_and_fp4_match_the_reference(split_k, swap_ab):
    """fp4's table, K cut in ranges of whole blocks, either operand order, `x` with a leading batch dimension."""
    from flotilla.kernels.triton_nf4_linear import Nf4GemmConfig, nf4_linear

    x, packed, absmax, values, _ = _case(6, 40, 192, torch.float32, bias=False, quant_type="fp4", seed=1)
    cfg = Nf4GemmConfig(block_m=16, block_n=16, split_k=split_k, num_warps=4, num_stages=2, swap_ab=swap_ab)
    out = nf4_linear(*_on_device(x.reshape(2, 3, 192), packed, absmax, values), config=cfg)
    assert out.shape == (2, 3, 40)
    assert rel_err(out.cpu().reshape(6, 40), nf4_linear_ref(x, packed, absmax, values)) < 1e-5


def test_default_config_splits_k_where_decode_tiles_are_few():
    """Llama-3.1-8B's o_proj at one row: 64 tiles on 132 SMs, K cut in 5 ranges; a prefill never splits."""
    from flotilla.kernels.triton_nf4_linear import default_config

    assert default_config(1, 4096, 4096, 132).split_k == 5 and default_config(1, 4096, 4096, 132).swap_ab
    assert default_config(512, 4096, 4096, 132).split_k == 1


def test_dispatch_runs_the_reference_on_the_cpu():
    x, packed, absmax, values, bias = _case(3, 24, 128, torch.float32)
    assert torch.equal(dispatch.nf4_linear(x, packed, absmax, values, bias),
                       nf4_linear_ref(x, packed, absmax, values, bias))
