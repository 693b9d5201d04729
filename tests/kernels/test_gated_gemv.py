"""The one-row gated GEMV (`triton_gated_gemv.py`): `silu(gate) * up` from the merged gate/up weight against the
reference and main's rounding points, the PDL-peeled first step, the launch heuristic, the dispatch seam
(`dispatch.silu_and_mul_linear`, FLOTILLA_GATED_GEMV) and a tiny model's greedy tokens with the kernel in its MLPs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import DEVICE, INTERPRETING, linear_case, rel_err, tolerance

from flotilla.kernels.activation import silu_and_mul_ref

DTYPES = [torch.float32, torch.bfloat16]


def _round(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` (fp32) rounded to `dtype` as the kernel's `.to()` rounds: to nearest even on the GPU; Triton 3.9's
    interpreter truncates fp32 -> bf16 (measured: `v.to(tl.bfloat16)` keeps the top 16 bits, with or without
    `fp_downcast_rounding="rtne"`), so there the expectation truncates too."""
    if dtype == torch.bfloat16 and INTERPRETING:
        return (t.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
    return t.to(dtype)


def _main_rounding(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What main computes from exact (fp64) sums: gate and up rounded to the dtype, SiLU in fp32 rounded, the
    product rounded (`F.linear` then the SiLU kernel)."""
    y = F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()
    gate, up = (_round(h, x.dtype).float() for h in y.chunk(2, dim=-1))
    return _round(_round(F.silu(gate), x.dtype).float() * up, x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_the_reference_on_ragged_tiles(dtype, m, bias):
    """N = 40 gated outputs (80 weight rows) and K = 200 end mid-tile (16 x 64 tiles); the output has main's
    rounding points: within a last-bit difference of gate/up rounded from exact sums (the sums' order differs)."""
    from flotilla.kernels.triton_gated_gemv import gated_gemv, gated_gemv_ref

    x, weight, b = linear_case(m, 80, 200, dtype, bias=bias, seed=11)
    out = gated_gemv(x, weight, b, block_n=16, block_k=64, pdl=False)
    assert out.dtype == dtype and out.shape == (m, 40)
    assert rel_err(out, gated_gemv_ref(x, weight, b)) < tolerance(dtype)
    if dtype == torch.bfloat16:
        expected = _main_rounding(x, weight, b)
        same = (out == expected).float().mean().item()
        assert same >= 0.9, same  # only sums within a rounding of a bf16 boundary may land on its other side
        assert rel_err(out, expected) < 2e-3


@pytest.mark.parametrize("m,n,k,knobs", [(1, 40, 200, dict(block_n=16, block_k=64)),
                                         (2, 24, 48, dict(block_n=8, block_k=64)),  # one K tile only
                                         (1, 64, 256, dict(block_n=4, block_k=32, num_stages=3))])  # fmt: skip
@pytest.mark.parametrize("bias", [False, True])
def test_peeled_first_step_is_bit_equal_to_the_loop(m, n, k, knobs, bias):
    """The PDL variant (first gate and up tiles before the wait) sums the same products in the same order. Under
    the interpreter the peel runs without griddepcontrol (`pdl_gdc=False`); on Hopper with it, launched by PDL."""
    from flotilla.kernels.triton_gated_gemv import gated_gemv

    hopper = DEVICE.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
    x, weight, b = linear_case(m, 2 * n, k, torch.bfloat16, bias=bias, seed=5)
    plain = gated_gemv(x, weight, b, pdl=False, **knobs)
    assert torch.equal(gated_gemv(x, weight, b, pdl=True, pdl_gdc=hopper, **knobs), plain)


def test_default_config_and_the_knob_parser():
    """One row (Llama-3.1-8B's gate/up): the H200 sweep's winner, 4 + 4 weight rows x 512 K, 4 warps, 3 stages
    (3,584 programs); M = 4 (unswept): 8 columns, a narrower K step, 2 stages; a small intermediate size fewer
    columns a program; given knobs kept."""
    from flotilla.kernels.triton_gated_gemv import GatedGemvConfig, default_config, parse_config

    assert default_config(1, 14336, 4096, 132) == GatedGemvConfig(4, 512, 4, 3)
    assert default_config(1, 512, 4096, 132).block_n == 4
    assert default_config(4, 14336, 4096, 132) == GatedGemvConfig(8, 128, 4, 2)
    assert default_config(4, 512, 4096, 132).block_n == 4
    assert default_config(1, 14336, 4096, 132, block_n=16, num_warps=8) == GatedGemvConfig(16, 512, 8, 3)
    assert parse_config("bn=4, bk=1024,w=8,s=3") == dict(block_n=4, block_k=1024, num_warps=8, num_stages=3)
    assert parse_config("") == {} and GatedGemvConfig(8, 512, 4, 2).spec() == "bn=8,bk=512,w=4,s=2"
    with pytest.raises(ValueError, match="FLOTILLA_GATED_GEMV_CONFIG"):
        parse_config("bn=8,split=2")


def test_degenerate_shapes():
    """No rows, and K = 0 (the bias alone, as the reference)."""
    from flotilla.kernels.triton_gated_gemv import gated_gemv, gated_gemv_ref

    x, weight, b = linear_case(1, 32, 64, torch.float32, bias=True, seed=2)
    assert gated_gemv(x[:0], weight, b).shape == (0, 16)
    empty_x, empty_w = x[:, :0], weight[:, :0].contiguous()
    assert torch.equal(gated_gemv(empty_x, empty_w, b), gated_gemv_ref(empty_x, empty_w, b))


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the dispatch decision alone, no kernel launched."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_dispatch_takes_it_only_where_switched_on_for_one_row(monkeypatch):
    """`_gated_gemv_takes`: never with the switch off; on, only CUDA rows <= min(gemv_max_rows, 1), supported
    operands, and a single-process engine. On CPU tensors `silu_and_mul_linear` is the reference, bit for bit,
    whatever the switch."""
    from flotilla.kernels import dispatch

    x, weight, b = linear_case(1, 64, 32, torch.float32, bias=True, seed=3)
    x, weight, b = x.cpu(), weight.cpu(), b.cpu()
    fake = x.as_subclass(_FakeCuda)
    monkeypatch.setattr(dispatch, "GATED_GEMV", False)  # FLOTILLA_GATED_GEMV=0
    assert not dispatch._gated_gemv_takes(fake, weight, b, 1)
    monkeypatch.setattr(dispatch, "GATED_GEMV", True)
    assert dispatch._gated_gemv_takes(fake, weight, b, 1)
    assert not dispatch._gated_gemv_takes(fake, weight, b, 0)  # --triton-gemv-max-rows 0: cuBLAS kept
    assert not dispatch._gated_gemv_takes(x, weight, b, 1)  # CPU
    two = torch.cat([x, x]).as_subclass(_FakeCuda)
    assert not dispatch._gated_gemv_takes(two, weight, b, 4)  # two rows: cuBLAS (unmeasured)
    assert not dispatch._gated_gemv_takes(fake, weight[:63], None, 1)  # odd weight rows
    assert not dispatch._gated_gemv_takes(fake, weight.to(torch.bfloat16), None, 1)  # mixed dtypes
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    assert not dispatch._gated_gemv_takes(fake, weight, b, 1)  # tensor/pipeline parallel: the two steps
    monkeypatch.undo()
    monkeypatch.setattr(dispatch, "GATED_GEMV", True)
    assert torch.equal(dispatch.silu_and_mul_linear(x, weight, b, 1), silu_and_mul_ref(F.linear(x, weight, b)))


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the interpreter on CPU tensors stands in for the GPU here")
def test_greedy_tokens_unchanged_with_the_gated_gemv(tiny_model_dirs, monkeypatch):
    """The tiny Llama's greedy tokens with every one-row gate/up + SiLU run by the gated GEMV (the interpreter on
    CPU tensors, patched in at the model's seam where dispatch's CUDA check would send it) equal the two-step
    path's; the patch counts its calls, so the test fails if the model stops routing through it."""
    from flotilla.engine.llm import LLM
    from flotilla.engine.models import llama
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.kernels.dispatch import silu_and_mul_linear
    from flotilla.kernels.triton_gated_gemv import gated_gemv, supported

    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = [5, 17, 99, 1000, 2048, 7]
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, enforce_eager=True)
    two_step = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    calls = []

    def gated(x, weight, bias=None, gemv_max_rows=0):
        if x.shape[0] == 1 and supported(x, weight, bias):
            calls.append(1)
            return gated_gemv(x, weight, bias, pdl=False)
        return silu_and_mul_linear(x, weight, bias, gemv_max_rows)

    monkeypatch.setattr(llama, "silu_and_mul_linear", gated)
    tokens = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    assert tokens == two_step
    assert len(calls) == 5 * 2  # 5 one-row decode steps x 2 layers


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_llama_shape_against_cublas_and_the_silu_kernel(pdl):
    """On the GPU at Llama-3.1-8B's gate/up shape, one row: equal to cuBLAS + the SiLU kernel except where the
    summation order moves a sum across a bf16 rounding boundary."""
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_gated_gemv import gated_gemv

    x, weight, _ = linear_case(1, 28672, 4096, torch.bfloat16, bias=False, seed=9)
    ref = silu_and_mul(F.linear(x, weight))
    out = gated_gemv(x, weight, pdl=pdl)
    assert rel_err(out, ref) < 4e-3 and (out == ref).float().mean().item() > 0.9


@pytest.mark.gpu
def test_pdl_chain_in_a_cuda_graph_equals_plain_launches():
    """On Hopper: RMSNorm -> gated GEMV (by PDL) -> down GEMV captured in a CUDA graph and replayed gives the plain
    launches' result bit for bit (the early weight loads change no arithmetic, and the wait orders the reads)."""
    from flotilla.kernels.triton_gated_gemv import gated_gemv
    from flotilla.kernels.triton_gemv import gemv
    from flotilla.kernels.triton_rmsnorm import rms_norm

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("PDL needs sm_90")
    x, weight, _ = linear_case(1, 1024, 512, torch.bfloat16, bias=False, seed=13)
    _, down, _ = linear_case(1, 512, 512, torch.bfloat16, bias=False, seed=14)
    res, norm_w = torch.randn_like(x), torch.ones(512, device=x.device, dtype=x.dtype)

    def chain(pdl: bool) -> torch.Tensor:
        h, _ = rms_norm(x, norm_w, 1e-5, res)
        return gemv(gated_gemv(h, weight, pdl=pdl), down, pdl=pdl)

    plain = chain(False)
    chain(True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plain)


def test_the_batch1_fusions_are_on_by_default():
    """FLOTILLA_GATED_GEMV and FLOTILLA_QKV_ROPE unset: both fused one-row kernels on (measured faster on the H200,
    session 14: bs1 ctx512 4.490 -> 4.440 and -> 4.447 ms/step); "0" switches each off."""
    code = "from flotilla.kernels import dispatch; assert dispatch.GATED_GEMV is True and dispatch.QKV_ROPE is True"
    env = {k: v for k, v in os.environ.items() if k not in ("FLOTILLA_GATED_GEMV", "FLOTILLA_QKV_ROPE")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    off = "from flotilla.kernels import dispatch; assert not dispatch.GATED_GEMV and not dispatch.QKV_ROPE"
    subprocess.run([sys.executable, "-c", off], check=True, env=env | {"FLOTILLA_GATED_GEMV": "0",
                                                                       "FLOTILLA_QKV_ROPE": "0"})
