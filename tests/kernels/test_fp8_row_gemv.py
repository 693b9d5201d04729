"""The register-pipelined one-row W8A16 GEMV (`triton_fp8_row_gemv.py`): every e4m3 code decoded exactly at every
byte position of a word, the plain and gated forms against the PyTorch references (ragged N and K, bias, fp16 and
bf16 activations, 1-3 tiles in flight), the PDL code path bit-equal to the plain one, the launch heuristic and knob
parser, and the dispatch seams (FLOTILLA_FP8_ROW_GEMV, on by default)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import DEVICE, INTERPRETING, assert_same_rope_writes, rel_err, tolerance

from flotilla.kernels import dispatch
from flotilla.kernels.fp8_linear import fp8_weight_only_linear_ref, quantize_fp8_rows
from flotilla.kernels.triton_fp8_row_gemv import default_config, fp8_row_gemv, parse_config, parse_configs, supported

ACTS = [torch.bfloat16, torch.float16]


def _case(n: int, k: int, dtype: torch.dtype, *, bias: bool, seed: int = 0):
    """One row `x` in `dtype`; an e4m3 weight `[n, k]` rounded per output row with fp32 scales `[n, 1]`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=g).to(dtype)
    w8, scale = quantize_fp8_rows(torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) / k**0.5)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w8, scale, b


def _dev(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [t.to(DEVICE) if t is not None else None for t in tensors]


def _round(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 `t` rounded as the kernel's `.to(dtype)`: to nearest even on the GPU; Triton's interpreter truncates
    fp32 -> bf16 (tests/kernels/test_gated_gemv.py), so there the expectation truncates too."""
    if dtype == torch.bfloat16 and INTERPRETING:
        return (t.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
    return t.to(dtype)


def test_every_e4m3_code_is_decoded_exactly_at_every_byte_of_a_word():
    """Row r holds code r everywhere (the two NaN codes zeroed); a one-hot x at K position p (p = 0..3: each byte of
    a weight word) picks the decoded value, exact in the output dtype (e4m3 values are bf16 values)."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    w8 = codes[:, None].expand(256, 16).contiguous().view(torch.float8_e4m3fn)
    scale = torch.ones(256, 1)
    want = w8[:, 0].float()
    for p in range(4):
        x = torch.zeros(1, 16, dtype=torch.bfloat16)
        x[0, p] = 1.0
        out = fp8_row_gemv(*_dev(x, w8, scale), block_n=16, block_k=16)
        assert torch.equal(out.cpu()[0].float(), want), p


@pytest.mark.parametrize("dtype", ACTS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("prefetch", [1, 2, 3])
@pytest.mark.parametrize("k", [200, 320])
def test_plain_matches_the_w8a16_reference_on_ragged_tiles(dtype, bias, prefetch, k):
    """N = 40 over 16-row tiles (rows past N re-read the last row, stores masked); K = 200 over 64-wide steps (4
    steps, the last ragged: masked loads) or 320 (5 whole steps: unmasked loads, the window's loads past K clamped
    to the last tile, and 5 steps not a multiple of the 2-4 unrolled steps: the skipped step); the scale per output
    and the bias."""
    x, w8, scale, b = _case(40, k, dtype, bias=bias, seed=prefetch)
    out = fp8_row_gemv(*_dev(x, w8, scale, b), block_n=16, block_k=64, prefetch=prefetch)
    assert out.dtype == dtype and out.shape == (1, 40)
    assert rel_err(out.cpu(), fp8_weight_only_linear_ref(x, w8, scale, b)) < tolerance(dtype)


@pytest.mark.parametrize("dtype", ACTS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("prefetch", [1, 3])
def test_gated_matches_main_rounding(dtype, bias, prefetch):
    """`silu(gate) * up` of the merged `[2N, K]` weight (N = 24 over 16-column tiles, K = 96) against main's
    rounding points from fp64 sums (each projection rounded, SiLU rounded, the product rounded); the bf16 bound
    leaves room for one rounding step of difference."""
    x, w8, scale, b = _case(48, 96, dtype, bias=bias, seed=7)
    out = fp8_row_gemv(*_dev(x, w8, scale, b), gated=True, block_n=16, block_k=32, prefetch=prefetch)
    assert out.shape == (1, 24)
    wd = w8.double() * scale.double()
    y = F.linear(x.double(), wd, None if b is None else b.double()).float()
    gate, up = (_round(h, dtype).float() for h in y.chunk(2, dim=-1))
    want = _round(_round(F.silu(gate), dtype).float() * up, dtype)
    assert rel_err(out.cpu(), want) < tolerance(dtype)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("trigger", [0, 1])
def test_pdl_path_is_bit_equal_to_the_plain_launch(gated, trigger):
    """The PDL variant (its griddepcontrol left out: the interpreter has none; on a GPU `pdl_gdc=False` compiles the
    same code without it) issues the same loads and sums: identical outputs."""
    x, w8, scale, b = _case(64, 160, torch.bfloat16, bias=True, seed=3)
    args = _dev(x, w8, scale, b)
    plain = fp8_row_gemv(*args, gated=gated, pdl=False, block_n=8, block_k=32, prefetch=2)
    pdl = fp8_row_gemv(*args, gated=gated, pdl=True, pdl_gdc=False, block_n=8, block_k=32, prefetch=2,
                       trigger=trigger)  # fmt: skip
    assert torch.equal(plain, pdl)


def test_default_config_and_knob_parser():
    """Llama-3.1-8B on 132 SMs: 16 x 512 tiles (8 + 8 gated) down to 8 rows where 16 give too few programs;
    knobs kept; the parser's spelling round-trips and rejects unknown knobs."""
    assert default_config(6144, 4096, 132).spec() == "bn=16,bk=512,w=4,p=2,t=0,d=1"
    assert default_config(4096, 4096, 132).spec() == "bn=8,bk=512,w=4,p=3,t=0,d=1"  # 256 programs < 2/SM at 16
    assert default_config(14336, 4096, 132, gated=True).spec() == "bn=8,bk=512,w=4,p=2,t=0,d=1"
    assert default_config(4096, 14336, 132, block_n=32, prefetch=3).spec() == "bn=32,bk=512,w=4,p=3,t=0,d=1"
    assert default_config(40, 200, 132).block_k == 256 and default_config(40, 200, 132).block_n == 4
    assert parse_config("bn=8, bk=1024,w=8,p=3,t=1,d=0") == {"block_n": 8, "block_k": 1024, "num_warps": 8,
                                                              "prefetch": 3, "trigger": 1, "use_pdl": 0}  # fmt: skip
    assert default_config(6144, 4096, 132, **parse_config("bn=8,t=1")).spec() == "bn=8,bk=512,w=4,p=3,t=1,d=1"
    with pytest.raises(ValueError, match="FLOTILLA_FP8_ROW_GEMV_CONFIG"):
        parse_config("stages=3")
    # the engine's form: global knobs and per weight shape (ROWSxK), as the GPU script writes its sweep's winners
    assert parse_configs("") == {}
    assert parse_configs("w=2; 6144x4096:bn=16,p=3;28672x4096:bn=8") == {
        None: {"num_warps": 2}, (6144, 4096): {"block_n": 16, "prefetch": 3}, (28672, 4096): {"block_n": 8}}
    with pytest.raises(ValueError, match="bad shape"):
        parse_configs("6144*4096:bn=16")


def test_env_config_reaches_the_launch(monkeypatch):
    """A shape's FLOTILLA_FP8_ROW_GEMV_CONFIG entry wins over the global one; a call's own knobs over both."""
    from flotilla.kernels import triton_fp8_row_gemv as mod

    monkeypatch.setattr(mod, "ENV_CONFIGS", parse_configs("bn=4,p=1;40x64:bn=8"))
    assert mod.env_knobs(40, 64) == {"block_n": 8, "prefetch": 1} and mod.env_knobs(16, 64) == {"block_n": 4,
                                                                                                 "prefetch": 1}
    seen = []
    real = mod.default_config
    monkeypatch.setattr(mod, "default_config", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    x, w8, scale, _ = _case(40, 64, torch.bfloat16, bias=False)
    out = fp8_row_gemv(*_dev(x, w8, scale), block_k=32)
    assert seen[-1] == {"gated": False, "block_n": 8, "prefetch": 1, "block_k": 32}
    assert rel_err(out.cpu(), fp8_weight_only_linear_ref(x, w8, scale)) < tolerance(torch.bfloat16)
    # d=0: launched plainly even where the one-row chain launches by PDL (here forced on: on the CPU the PDL
    # launch could not run at all, so the call succeeding shows the plain launch)
    monkeypatch.setattr(mod, "pdl_active", lambda t: True)
    monkeypatch.setattr(mod, "ENV_CONFIGS", parse_configs("40x64:d=0"))
    assert torch.equal(fp8_row_gemv(*_dev(x, w8, scale), block_n=8, block_k=32, prefetch=1), out)
    if INTERPRETING:
        with pytest.raises(Exception):  # noqa: B017 - the interpreter has no griddepcontrol: a PDL launch fails
            fp8_row_gemv(*_dev(x, w8, scale), block_n=8, block_k=32, prefetch=1, use_pdl=1)


def test_supported_operands():
    """One 16-bit row, an e4m3 weight of K a multiple of 4 (read as int32 words), N fp32 scales."""
    x, w8, scale, b = _case(8, 64, torch.bfloat16, bias=True)
    assert supported(x, w8, scale, b) and supported(x, w8, scale.reshape(-1)) and supported(x, w8, scale, gated=True)
    assert not supported(x.float(), w8, scale)  # fp32 activations: the other GEMV
    assert not supported(torch.cat([x, x]), w8, scale)  # two rows
    assert not supported(x[:, :62], w8[:, :62], scale)  # K not a multiple of 4
    assert not supported(x, w8[:7], scale[:7], gated=True)  # odd rows for gate/up halves
    assert not supported(x, w8, scale.double())


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the dispatch decision alone, no kernel launched."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_dispatch_decisions(monkeypatch):
    """`fp8_gated_gemv_takes` / `fp8_qkv_rope_takes`: never with FLOTILLA_FP8_ROW_GEMV=0; on (the default), one
    CUDA row of supported operands in a single-process engine; the rope form also needs FLOTILLA_QKV_ROPE and tiles
    holding whole pairs of a head."""
    from flotilla.kernels import triton_fp8_row_gemv as mod

    monkeypatch.setattr(mod, "device_sms", lambda t: 132)  # the fake CUDA tensor's SM count
    monkeypatch.setattr(mod, "device_card", lambda t: None)  # and its card: DEFAULT's tables
    x, w8, scale, _ = _case(6 * 32, 64, torch.bfloat16, bias=False)
    fake = x.as_subclass(_FakeCuda)
    monkeypatch.setattr(dispatch, "FP8_ROW_GEMV", False)  # FLOTILLA_FP8_ROW_GEMV=0
    assert not dispatch.fp8_gated_gemv_takes(fake, w8, scale, None)
    assert not dispatch.fp8_qkv_rope_takes(fake, w8, scale, None, 32)
    monkeypatch.setattr(dispatch, "FP8_ROW_GEMV", True)
    assert dispatch.fp8_gated_gemv_takes(fake, w8, scale, None) and dispatch.fp8_qkv_rope_takes(fake, w8, scale, None,
                                                                                                 32)  # fmt: skip
    assert not dispatch.fp8_qkv_rope_takes(fake, w8, scale, None, 100)  # not whole heads
    assert not dispatch.fp8_gated_gemv_takes(x, w8, scale, None)  # CPU
    two = torch.cat([x, x]).as_subclass(_FakeCuda)
    assert not dispatch.fp8_gated_gemv_takes(two, w8, scale, None) and not dispatch.fp8_qkv_rope_takes(
        two, w8, scale, None, 32)  # fmt: skip
    monkeypatch.setattr(dispatch, "QKV_ROPE", False)
    assert not dispatch.fp8_qkv_rope_takes(fake, w8, scale, None, 32)
    monkeypatch.setattr(dispatch, "QKV_ROPE", True)
    monkeypatch.setattr(dispatch, "FP8_GEMV_ENABLED", False)  # FLOTILLA_FP8_GEMV=0: W8A8 everywhere, no row GEMV
    assert not dispatch.fp8_gated_gemv_takes(fake, w8, scale, None)
    monkeypatch.setattr(dispatch, "FP8_GEMV_ENABLED", True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    assert not dispatch.fp8_gated_gemv_takes(fake, w8, scale, None)
    assert not dispatch.fp8_qkv_rope_takes(fake, w8, scale, None, 32)


def test_dispatch_routes_one_row_only_where_switched_on(monkeypatch):
    """FLOTILLA_FP8_ROW_GEMV is on by default (unless the environment says 0); on, `fp8_weight_only_linear` sends a
    CUDA one-row call here (the CPU keeps the reference: CI computes what the reference says), and
    `fp8_gated_gemv_takes` gates the fused MLP."""
    assert dispatch.FP8_ROW_GEMV is (os.environ.get("FLOTILLA_FP8_ROW_GEMV", "1") not in ("0", "false", "no", "off"))
    x, w8, scale, b = _case(16, 64, torch.bfloat16, bias=False)
    monkeypatch.setattr(dispatch, "FP8_ROW_GEMV", False)
    assert not dispatch.fp8_gated_gemv_takes(x, w8, scale, b)
    monkeypatch.setattr(dispatch, "FP8_ROW_GEMV", True)
    # CPU tensors: the reference, whatever the switch says
    assert torch.equal(dispatch.fp8_weight_only_linear(x, w8, scale, b), fp8_weight_only_linear_ref(x, w8, scale, b))
    assert not dispatch.fp8_gated_gemv_takes(x, w8, scale, b)  # not CUDA
    if DEVICE.type == "cuda":
        xd, wd, sd = x.cuda(), w8.cuda(), scale.cuda()
        assert dispatch.fp8_gated_gemv_takes(xd, wd, sd, None)
        assert not dispatch.fp8_gated_gemv_takes(torch.cat([xd, xd]), wd, sd, None)
        assert rel_err(dispatch.fp8_weight_only_linear(xd, wd, sd).cpu(),
                       fp8_weight_only_linear_ref(x, w8, scale)) < tolerance(torch.bfloat16)  # fmt: skip


def _llama_case(n: int, k: int, seed: int):
    """`_case` at Llama's shapes, built on the device (the CPU takes seconds to quantize 28,672 x 4,096)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(1, k, generator=g, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g, device=DEVICE) * torch.rand(n, 1, generator=g, device=DEVICE) / k**0.5
    return (x, *quantize_fp8_rows(w))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
def test_llama_shapes_on_the_gpu():
    """Llama-3.1-8B's four one-row projections (and the gated gate/up) against the fp32 reference and the main fp8
    GEMV, compiled (the inline-PTX conversion), plain and launched by PDL (the same sums: equal outputs)."""
    from flotilla.kernels.triton_gemv import fp8_gemv

    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        x, w8, scale = _llama_case(n, k, n + k)
        out = fp8_row_gemv(x, w8, scale, pdl=False)
        assert torch.equal(fp8_row_gemv(x, w8, scale, pdl=True), out), (n, k)
        ref = fp8_weight_only_linear_ref(x.float(), w8, scale)
        assert rel_err(out.float(), ref) < 1e-2, (n, k)
        main = fp8_gemv(x, w8, scale)
        assert rel_err(out.float(), main.float()) < 1e-2, (n, k)
        if n == 28672:
            gated = fp8_row_gemv(x, w8, scale, gated=True, pdl=False)
            assert torch.equal(fp8_row_gemv(x, w8, scale, gated=True, pdl=True), gated)
            want = F.silu(main[:, : n // 2].float()) * main[:, n // 2 :].float()
            assert rel_err(gated.float(), want) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
def test_pdl_chain_in_a_cuda_graph_equals_plain_launches():
    """Eight GEMVs chained through their outputs (each row feeds the next: a real dependence), launched by PDL
    (both trigger positions) inside a CUDA graph, equal the plain launches bit for bit."""
    x, w8, scale = _llama_case(4096, 4096, 11)

    def chain(**kw):
        h = x
        for _ in range(8):
            h = fp8_row_gemv(h, w8, scale, **kw)
            h = h / h.abs().amax().clamp_min(1e-6)
        return h

    want = chain(pdl=False)
    for trigger in (0, 1):
        chain(pdl=True, trigger=trigger)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain(pdl=True, trigger=trigger)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want), trigger


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the interpreter on CPU tensors stands in for the GPU here")
def test_fp8_llama_seams_run_the_gated_and_rope_forms(tiny_model_dirs, monkeypatch):
    """The tiny Llama at `--quantization fp8` (bf16): with the seams' decisions forced for one CPU row (dispatch's
    CUDA check would refuse it), every one-row MLP calls the gated form and every one-row attention the rope form
    with the layer's fp8 weight, scales and bias, and each call equals what it replaces (W8A16 reference +
    SiLU-and-mul; W8A16 + rotary + the KV write, caches included) within bf16 rounding; the patches count their
    calls, so the test fails if the model stops routing through a seam."""
    from flotilla.engine.llm import LLM
    from flotilla.engine.models import llama
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.kernels.activation import silu_and_mul_ref

    calls = []

    def takes(x, w8, scale, bias):
        return x.dim() == 2 and x.shape[0] == 1 and supported(x, w8, scale, bias, gated=True)

    def gated(x, w8, scale, bias=None):
        out = fp8_row_gemv(x, w8, scale, bias, gated=True, pdl=False)
        want = silu_and_mul_ref(fp8_weight_only_linear_ref(x.float(), w8, scale, bias))
        calls.append(rel_err(out, want))
        return out

    from flotilla.engine.layers import attention
    from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv_rope_ref, fuses_rope

    rope_calls = []
    real_rope = attention.qkv_rotary_and_write_kv

    def rope_takes(x, w8, scale, bias, head_dim):
        return x.shape[0] == 1 and fuses_rope(x, w8, scale, bias, head_dim)

    def rope(x, w8, bias, positions, cos_sin, k_cache, v_cache, slots, heads, kv_heads, k_scale, v_scale, *,
             weight_scale):  # fmt: skip
        scale = weight_scale  # the fp8 seam passes the layer's scales
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        q = real_rope(x, w8, bias, positions, cos_sin, k_cache, v_cache, slots, heads, kv_heads, k_scale, v_scale,
                      scale)  # fmt: skip
        ref_q = fp8_row_gemv_rope_ref(x, w8, scale, bias, positions, cos_sin, ref_k, ref_v, slots, heads, kv_heads,
                                      k_scale, v_scale)  # fmt: skip
        rope_calls.append(max(rel_err(q, ref_q), rel_err(k_cache.float(), ref_k.float()),
                              rel_err(v_cache.float(), ref_v.float())))  # fmt: skip
        return q

    from flotilla.kernels import triton_fp8_row_gemv as mod

    # the tiny Llama's qkv [128, 64] and gate/up [256, 64] take 4-row tiles by default (32 interpreted programs a
    # launch, where the time goes); 16 rows (one 16-wide head, so `fuses_rope` still holds) make 8: the tile tests
    # above cover the small tiles bit for bit
    monkeypatch.setattr(mod, "ENV_CONFIGS", parse_configs("128x64:bn=16;256x64:bn=16"))
    monkeypatch.setattr(llama, "fp8_gated_gemv_takes", takes)
    monkeypatch.setattr(llama, "fp8_gated_gemv", gated)
    monkeypatch.setattr(llama, "fp8_qkv_rope_takes", rope_takes)
    monkeypatch.setattr(attention, "qkv_rotary_and_write_kv", rope)
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, enforce_eager=True, quantization="fp8",
              dtype="bfloat16")  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate([5, 17, 99, 1000, 2048, 7], greedy, use_tqdm=False)
    assert len(calls) == 3 * 2 and len(rope_calls) == 3 * 2  # 3 one-row decode steps (prefill: 6 rows) x 2 layers
    assert max(calls) < tolerance(torch.bfloat16), calls
    assert max(rope_calls) < tolerance(torch.bfloat16), rope_calls


# (heads, kv_heads, head_dim, K, dtype, bias, cache dtype, position, slot, PDL code path)
ROPE_CASES = [
    (2, 1, 32, 1104, torch.bfloat16, False, torch.bfloat16, 7, 21, False),  # 3 K steps, the last ragged (masked)
    (2, 1, 64, 256, torch.bfloat16, True, torch.bfloat16, 130, 47, True),  # Qwen2's qkv bias, whole tiles, PDL path
    (2, 1, 128, 256, torch.float16, False, torch.float16, 0, 3, False),  # Llama's head_dim, fp16
    (2, 1, 32, 512, torch.bfloat16, False, torch.float8_e4m3fn, 255, 16, False),  # an fp8 cache with scales
    (4, 2, 32, 96, torch.bfloat16, False, torch.bfloat16, 9, -1, True),  # padding slot: no cache write
]


@pytest.mark.parametrize("heads,kv_heads,head_dim,k,dtype,bias,cache_dtype,pos,slot,pdl", ROPE_CASES)
def test_rope_form_equals_the_plain_kernel_then_rotary_bit_for_bit(heads, kv_heads, head_dim, k, dtype, bias,
                                                                   cache_dtype, pos, slot, pdl):  # fmt: skip
    """`fp8_row_gemv_rope`: the rotated query and the cache rows equal the plain row GEMV followed by
    `rotary_and_write_kv` bit for bit (the same per-row sums in the same order, the rotary kernel's rounding), and
    the PyTorch reference (W8A16 + `apply_rotary_ref` + `write_kv_cache_ref`) to rounding."""
    from flotilla.engine.layers.rotary import _cos_sin_table
    from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv_rope, fp8_row_gemv_rope_ref, fuses_rope
    from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

    n = (heads + 2 * kv_heads) * head_dim
    x, w8, scale, b = _dev(*_case(n, k, dtype, bias=bias, seed=pos))
    cos_sin = _cos_sin_table(head_dim, 256, 10000.0, "null", torch.device("cpu")).to(DEVICE)
    g = torch.Generator().manual_seed(slot + 100)
    kc, vc = (torch.randn(3, 16, kv_heads, head_dim, generator=g).to(cache_dtype).to(DEVICE) for _ in range(2))
    positions, slots = torch.tensor([pos], device=DEVICE), torch.tensor([slot], device=DEVICE)
    scales = (0.5, 2.0) if cache_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    assert fuses_rope(x, w8, scale, b, head_dim)
    want_k, want_v = kc.clone(), vc.clone()
    q, kk, v = fp8_row_gemv(x, w8, scale, b, pdl=False).split([heads * head_dim, kv_heads * head_dim,
                                                                kv_heads * head_dim], dim=-1)  # fmt: skip
    want_q = rotary_and_write_kv(positions, q.view(1, heads, head_dim), kk.view(1, kv_heads, head_dim),
                                 v.view(1, kv_heads, head_dim), cos_sin, want_k, want_v, slots, *scales)  # fmt: skip
    got_k, got_v = kc.clone(), vc.clone()
    got_q = fp8_row_gemv_rope(x, w8, scale, b, positions, cos_sin, got_k, got_v, slots, heads, kv_heads, *scales,
                              pdl=pdl, pdl_gdc=False)  # fmt: skip
    assert got_q.shape == (1, heads, head_dim)
    assert_same_rope_writes((got_q, got_k, got_v), (want_q, want_k, want_v), (kc, vc), slot, dtype)
    ref_k, ref_v = kc.clone(), vc.clone()
    ref_q = fp8_row_gemv_rope_ref(x, w8, scale, b, positions, cos_sin, ref_k, ref_v, slots, heads, kv_heads, *scales)
    assert rel_err(got_q, ref_q) < 1.5e-2
    assert rel_err(got_k.float(), ref_k.float()) < 1.5e-2 and rel_err(got_v.float(), ref_v.float()) < 1.5e-2


def test_rope_form_applies_to_whole_heads_of_pair_holding_tiles(monkeypatch):
    """Llama-3.1-8B's qkv (16-row tiles: 8 pairs of a 128-wide head); not where the tile is wider than a head or
    the operands are not the row GEMV's."""
    from flotilla.kernels import triton_fp8_row_gemv as mod

    x = torch.zeros(1, 4096, dtype=torch.bfloat16)
    w8 = torch.zeros(6144, 4096, dtype=torch.float8_e4m3fn)
    scale = torch.ones(6144, 1)
    monkeypatch.setattr(mod, "device_sms", lambda t: 132)
    assert mod.fuses_rope(x, w8, scale, None, 128)
    assert not mod.fuses_rope(x, w8, scale, None, 100)  # 6144 rows are not whole 100-wide heads
    monkeypatch.setattr(mod, "ENV_CONFIGS", parse_configs("6144x4096:bn=256"))
    assert not mod.fuses_rope(x, w8, scale, None, 128)  # a tile wider than a head
    assert not mod.fuses_rope(x.float(), w8, scale, None, 128)
