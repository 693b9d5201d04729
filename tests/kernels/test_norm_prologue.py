"""The RMSNorm (+ residual add) in the prologue of the one-row GEMVs (`RMSNormPrologue`, FLOTILLA_NORM_GEMV): the
qkv GEMV with rotary + KV write (`triton_gemv_rope.py`) and the gated gate/up GEMV (`triton_gated_gemv.py`) given
the un-normalised row equal the standalone norm kernel followed by the plain fused GEMV, the next residual is
stored once and exactly; the dispatch rule; a tiny model's greedy tokens through the model path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_cases import DEVICE, INTERPRETING, linear_case, rel_err

from flotilla.engine.layers.rotary import _cos_sin_table
from flotilla.kernels.layernorm import RMSNormPrologue, prologue_fits


def _hopper() -> bool:
    return DEVICE.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)


def _norm_case(k: int, dtype: torch.dtype, residual: bool, seed: int):
    """A seeded un-normalised row `[1, k]`, gamma `[k]` and (optionally) a residual row."""
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(1, k, generator=g)).to(dtype).to(DEVICE)
    gamma = (1 + 0.2 * torch.randn(k, generator=g)).to(dtype).to(DEVICE)
    res = torch.randn(1, k, generator=g).to(dtype).to(DEVICE) if residual else None
    return x, gamma, res


def _standalone(x, gamma, eps, res):
    """The unfused path's norm: the Triton RMSNorm kernel (the interpreter's rounding on CPU tensors)."""
    from flotilla.kernels.triton_rmsnorm import rms_norm

    out, summed = rms_norm(x, gamma, eps, res)
    return out, (x if summed is None else summed)


# against the PyTorch reference: the interpreter truncates fp32 -> bf16 at each of the norm's and the GEMV's
# rounding points (test_gated_gemv.py's `_round`), the GPU rounds to nearest
REF_BOUND = 5e-2 if INTERPRETING else 1e-2


def _check(got, want, got_res, want_res):
    """The residual exactly; the output bit for bit under the interpreter (the same arithmetic), and on the GPU
    except where the prologue's K-tile order of the sum of squares moves rstd across a rounding boundary."""
    assert torch.equal(got_res, want_res)
    if INTERPRETING:
        assert torch.equal(got, want)
    else:
        assert rel_err(got.float(), want.float()) < 1e-2 and (got == want).float().mean().item() > 0.75


# (K, dtype, bias, residual, peeled PDL step)
GATED_CASES = [
    (1100, torch.bfloat16, False, True, False),  # 3 K steps, the last ragged
    (1100, torch.bfloat16, True, True, True),  # the PDL peel, a bias
    (256, torch.float16, False, False, False),  # the first layer: no residual
    (96, torch.bfloat16, False, True, True),  # one short K tile
]


@pytest.mark.parametrize("k,dtype,bias,residual,peeled", GATED_CASES)
def test_gated_gemv_with_the_norm_equals_the_norm_kernel_then_the_gemv(k, dtype, bias, residual, peeled):
    from flotilla.kernels.triton_gated_gemv import gated_gemv, gated_gemv_ref

    x, gamma, res = _norm_case(k, dtype, residual, seed=k)
    _, weight, b = linear_case(1, 2 * 24, k, dtype, bias=bias, seed=k + 1)
    h, want_res = _standalone(x, gamma, 1e-5, res)
    want = gated_gemv(h, weight, b, pdl=False)
    norm = RMSNormPrologue.of(x, gamma, 1e-5, res)
    got = gated_gemv(x, weight, b, norm=norm, pdl=peeled, pdl_gdc=_hopper())
    _check(got, want, norm.next_residual(x), want_res)
    ref_norm = RMSNormPrologue.of(x, gamma, 1e-5, res)
    ref = gated_gemv_ref(x, weight, b, norm=ref_norm)
    assert rel_err(got.float(), ref.float()) < REF_BOUND
    assert rel_err(ref_norm.next_residual(x).float(), want_res.float()) < REF_BOUND


# (heads, kv_heads, head_dim, K, dtype, bias, residual, position, slot, peeled PDL step)
ROPE_CASES = [
    (4, 2, 32, 1100, torch.bfloat16, False, True, 7, 21, False),  # 3 K steps, the last ragged
    (4, 2, 64, 200, torch.bfloat16, True, True, 130, 47, True),  # Qwen2's qkv bias, the PDL peel
    (2, 1, 128, 256, torch.float16, False, False, 0, 3, True),  # the first layer: no residual
]


@pytest.mark.parametrize("heads,kv_heads,head_dim,k,dtype,bias,residual,pos,slot,peeled", ROPE_CASES)
def test_gemv_rope_with_the_norm_equals_the_norm_kernel_then_the_gemv(heads, kv_heads, head_dim, k, dtype, bias,
                                                                      residual, pos, slot, peeled):  # fmt: skip
    from flotilla.kernels.triton_gemv_rope import gemv_rope, gemv_rope_ref

    x, gamma, res = _norm_case(k, dtype, residual, seed=k)
    _, weight, b = linear_case(1, (heads + 2 * kv_heads) * head_dim, k, dtype, bias=bias, seed=k + 1)
    cos_sin = _cos_sin_table(head_dim, 256, 10000.0, "null", torch.device("cpu")).to(DEVICE)
    g = torch.Generator().manual_seed(k + 2)
    kc, vc = (torch.randn(3, 16, kv_heads, head_dim, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    positions, slots = torch.tensor([pos], device=DEVICE), torch.tensor([slot], device=DEVICE)
    args = (positions, cos_sin)
    h, want_res = _standalone(x, gamma, 1e-6, res)
    want_k, want_v = kc.clone(), vc.clone()
    want_q = gemv_rope(h, weight, b, *args, want_k, want_v, slots, heads, kv_heads, pdl=False)
    got_k, got_v = kc.clone(), vc.clone()
    norm = RMSNormPrologue.of(x, gamma, 1e-6, res)
    got_q = gemv_rope(x, weight, b, *args, got_k, got_v, slots, heads, kv_heads, norm=norm, pdl=peeled,
                      pdl_gdc=_hopper())  # fmt: skip
    _check(got_q, want_q, norm.next_residual(x), want_res)
    _check(got_k, want_k, norm.next_residual(x), want_res)
    _check(got_v, want_v, norm.next_residual(x), want_res)
    ref_k, ref_v = kc.clone(), vc.clone()
    ref_q = gemv_rope_ref(x, weight, b, *args, ref_k, ref_v, slots, heads, kv_heads,
                          norm=RMSNormPrologue.of(x, gamma, 1e-6, res))  # fmt: skip
    assert rel_err(got_q.float(), ref_q.float()) < REF_BOUND and rel_err(got_k.float(), ref_k.float()) < REF_BOUND


def test_prologue_fits_one_contiguous_row_of_one_dtype():
    """One row; gamma `[K]` and the residual `[1, K]` of x's dtype, all contiguous."""
    x, gamma, res = _norm_case(64, torch.bfloat16, True, seed=1)
    assert prologue_fits(x, gamma, res) and prologue_fits(x, gamma, None)
    assert not prologue_fits(torch.cat([x, x]), gamma, None)  # two rows
    assert not prologue_fits(x, gamma.float(), res)  # an fp32 gamma: the output would be fp32
    assert not prologue_fits(x, gamma, res.half())
    assert not prologue_fits(x, gamma[:32], res)
    assert not prologue_fits(torch.randn(64, 2, dtype=torch.bfloat16, device=DEVICE).t()[:1], gamma, None)


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the dispatch decision alone, no kernel launched."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_dispatch_takes_only_switched_on_sites_and_cuda_rows(monkeypatch):
    """`norm_gemv_takes`: only at the sites FLOTILLA_NORM_GEMV names, CUDA, operands `prologue_fits`."""
    from flotilla.kernels import dispatch

    x, gamma, res = (t.cpu() if t is not None else None for t in _norm_case(64, torch.bfloat16, True, seed=2))
    fake = x.as_subclass(_FakeCuda)
    monkeypatch.setattr(dispatch, "NORM_GEMV", dispatch.NORM_GEMV_SITES["0"])
    assert not dispatch.norm_gemv_takes("qkv", fake, gamma, res)
    monkeypatch.setattr(dispatch, "NORM_GEMV", dispatch.NORM_GEMV_SITES["qkv"])
    assert dispatch.norm_gemv_takes("qkv", fake, gamma, res) and dispatch.norm_gemv_takes("qkv", fake, gamma, None)
    assert not dispatch.norm_gemv_takes("gated", fake, gamma, res)
    monkeypatch.setattr(dispatch, "NORM_GEMV", dispatch.NORM_GEMV_SITES["1"])
    assert dispatch.norm_gemv_takes("gated", fake, gamma, res)
    assert not dispatch.norm_gemv_takes("gated", x, gamma, res)  # CPU tensors: the reference norm
    assert not dispatch.norm_gemv_takes("gated", fake, gamma.float(), res)


def test_the_switch_is_off_by_default_and_reads_its_values():
    """FLOTILLA_NORM_GEMV unset: off (unmeasured); "1", "qkv", "gated" the sites; anything else an error."""
    from flotilla.kernels import dispatch
    from flotilla.kernels.switches import parse_choice

    assert parse_choice("FLOTILLA_NORM_GEMV", "", dispatch.NORM_GEMV_SITES, frozenset()) == frozenset()
    assert parse_choice("FLOTILLA_NORM_GEMV", "1", dispatch.NORM_GEMV_SITES, frozenset()) == {"qkv", "gated"}
    assert parse_choice("FLOTILLA_NORM_GEMV", "gated", dispatch.NORM_GEMV_SITES, frozenset()) == {"gated"}
    with pytest.raises(ValueError, match="FLOTILLA_NORM_GEMV"):
        parse_choice("FLOTILLA_NORM_GEMV", "on", dispatch.NORM_GEMV_SITES, frozenset())
    code = "from flotilla.kernels import dispatch; assert dispatch.NORM_GEMV == frozenset()"
    env = {k: v for k, v in os.environ.items() if k != "FLOTILLA_NORM_GEMV"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.skipif(not INTERPRETING, reason="runs the kernels on the CPU model's tensors under the interpreter")
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_tokens_equal_with_the_norms_in_the_gemv_prologues(tiny_model_dirs, monkeypatch, arch):
    """A tiny bf16 model's greedy tokens, one sequence at a time (one-row decode steps), with both RMSNorms of
    every layer in the prologues of the qkv and gated GEMVs equal those of the same fused GEMVs behind the
    standalone Triton norm kernel. The dispatch rules are the real ones without their CUDA checks (the
    interpreter runs on CPU tensors); the counts fail the test if the model stops routing through the prologue."""
    import flotilla.engine.layers.norm as norm_layer
    import flotilla.engine.models.llama as llama
    import flotilla.engine.models.llama_cpu_decode as fast
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.kernels import dispatch
    from flotilla.kernels.triton_gated_gemv import supported
    from flotilla.kernels.triton_gemv_rope import fuses_rope
    from flotilla.kernels.triton_rmsnorm import rms_norm

    monkeypatch.setattr(fast, "CPU_DECODE_LAYERS", False)  # the module path, where the layers dispatch
    monkeypatch.setattr(norm_layer, "rms_norm", rms_norm)  # the standalone norm: the Triton kernel's rounding
    monkeypatch.setattr(llama, "qkv_rope_takes", lambda x, w, d, rows: x.dim() == 2 and x.shape[0] == 1 <= rows
                        and fuses_rope(x, w, d))  # fmt: skip
    monkeypatch.setattr(llama, "gated_gemv_takes", lambda x, w, b, rows: x.shape[0] == 1 <= rows
                        and supported(x, w, b))  # fmt: skip
    taken: dict[str, int] = {"qkv": 0, "gated": 0}
    sites: frozenset[str] = frozenset()

    def takes(site, x, weight, residual):
        ok = site in sites and prologue_fits(x, weight, residual)
        taken[site] += ok
        return ok

    def gated(x, weight, bias=None, gemv_max_rows=0):  # the gated GEMV behind the standalone norm
        if x.shape[0] == 1 and supported(x, weight, bias):
            from flotilla.kernels.triton_gated_gemv import gated_gemv

            return gated_gemv(x, weight, bias, pdl=False)
        return dispatch.silu_and_mul_linear(x, weight, bias, gemv_max_rows)

    monkeypatch.setattr(llama, "norm_gemv_takes", takes)
    monkeypatch.setattr(llama, "silu_and_mul_linear", gated)
    llm = LLM(str(tiny_model_dirs[arch]), dtype="bfloat16", max_model_len=256, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def run() -> list[list[int]]:
        prompts = [[5, 6, 7, 8, 9], [11, 12, 13] * 6]
        return [list(llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].token_ids)
                for p in prompts]  # fmt: skip

    want = run()
    assert taken == {"qkv": 0, "gated": 0}
    sites = dispatch.NORM_GEMV_SITES["1"]
    assert run() == want
    assert taken == {"qkv": 2 * 5 * 2, "gated": 2 * 5 * 2}, taken  # 2 prompts x 5 one-row steps x 2 layers


@pytest.mark.gpu
def test_pdl_chain_with_the_prologue_in_a_cuda_graph_equals_plain_launches():
    """On Hopper: o_proj GEMV -> gated GEMV with the norm prologue (by PDL) -> down GEMV -> qkv-rope GEMV with the
    next layer's norm prologue, captured in a CUDA graph and replayed, gives the plain launches' outputs and residuals
    bit for bit (every activation read and the residual store come after the wait)."""
    from flotilla.kernels.triton_gated_gemv import gated_gemv
    from flotilla.kernels.triton_gemv import gemv
    from flotilla.kernels.triton_gemv_rope import gemv_rope

    if not _hopper():
        pytest.skip("PDL needs sm_90")
    k, heads, kv_heads, head_dim = 512, 4, 2, 64
    x, o_w, _ = linear_case(1, k, k, torch.bfloat16, bias=False, seed=21)
    _, gu_w, _ = linear_case(1, 2 * 1024, k, torch.bfloat16, bias=False, seed=22)
    _, down_w, _ = linear_case(1, k, 1024, torch.bfloat16, bias=False, seed=23)
    _, qkv_w, _ = linear_case(1, (heads + 2 * kv_heads) * head_dim, k, torch.bfloat16, bias=False, seed=24)
    _, gamma, res = _norm_case(k, torch.bfloat16, True, seed=25)
    cos_sin = _cos_sin_table(head_dim, 256, 10000.0, "null", torch.device("cpu")).to(DEVICE)
    caches = [torch.zeros(2, 16, kv_heads, head_dim, dtype=torch.bfloat16, device=DEVICE) for _ in range(2)]
    pos, slot = torch.tensor([5], device=DEVICE), torch.tensor([3], device=DEVICE)

    def chain(pdl: bool) -> tuple[torch.Tensor, ...]:
        post = RMSNormPrologue.of(x, gamma, 1e-5, res)
        h = gemv(x, o_w, pdl=pdl)
        down = gemv(gated_gemv(h, gu_w, norm=post, pdl=pdl), down_w, pdl=pdl)
        nxt = RMSNormPrologue.of(down, gamma, 1e-5, post.residual_out)
        q = gemv_rope(down, qkv_w, None, pos, cos_sin, *caches, slot, heads, kv_heads, norm=nxt, pdl=pdl)
        return q, post.residual_out, nxt.residual_out

    plain = chain(False)
    chain(True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(True)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out, plain, strict=True))
