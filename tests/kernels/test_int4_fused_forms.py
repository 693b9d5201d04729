"""The wide int4 GEMV's one-row fused forms (`triton_int4_gemv_fused.py`): the gated gate/up projection equals the plain
wide GEMV then the SiLU-and-mul kernel, and the qkv form equals the plain wide GEMV then `rotary_and_write_kv`, bit for
bit (symmetric and zero-point weights, groups of 32 and 128, both word layouts, split-K, bias, the PDL code path), and
the PyTorch references (the unfused pair) to rounding; the dispatch switches (FLOTILLA_INT4_GATED,
FLOTILLA_INT4_QKV_ROPE); and a tiny int4 checkpoint whose one-row decode steps run both forms under the interpreter,
with greedy tokens equal to the unfused path's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from kernel_cases import DEVICE, INTERPRETING, assert_same_rope_writes, int4_weight, rel_err, tolerance

from flotilla.kernels import dispatch
from flotilla.kernels.activation import silu_and_mul_ref
from flotilla.kernels.packed_int_linear import PackedInt4, packed_int_linear_ref
from flotilla.kernels.triton_rope_epilogue import qkv_rope_ref


def _weight(n: int, k: int, group: int, dtype: torch.dtype, symmetric: bool, seed: int):
    """A random int4 weight `[n, k]` (`PackedInt4` on DEVICE) and its zero points for the reference (8: symmetric)."""
    packed, scales, zeros = int4_weight(n, k, group, torch.Generator().manual_seed(seed), dtype, symmetric)
    w = PackedInt4(packed.to(DEVICE), scales.to(DEVICE), None if symmetric else zeros.to(DEVICE), group)
    return w, zeros


def _ref_linear(x: torch.Tensor, w: PackedInt4, zeros: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The unfused projection's PyTorch reference, in fp32, rounded to x's dtype as the GEMV stores it."""
    out = packed_int_linear_ref(x.cpu().float(), w.packed.cpu(), w.scales.cpu().float(), zeros, 4, w.group_size,
                                None if bias is None else bias.cpu().float())  # fmt: skip
    return out.to(x.dtype)


# (K, N of one half, group, dtype, symmetric, bias, knobs): one range, split-K over 2-3 ranges (the last ragged),
# ragged row tiles (masked rows), both layouts, fp32 activations, PDL code path (pdl_gdc False: no griddepcontrol)
GATED_CASES = [
    (256, 48, 128, torch.bfloat16, True, False, {"block_n": 16, "block_w": 32}),
    (256, 40, 128, torch.bfloat16, False, True, {"block_n": 16, "block_w": 16, "split_k": 2, "layout": 1}),
    (384, 24, 32, torch.float32, False, False, {"block_n": 8, "block_w": 16, "split_k": 3}),
    (512, 32, 128, torch.float16, True, True, {"block_n": 32, "block_w": 32, "layout": 1, "pdl": "top"}),
    (256, 64, 64, torch.bfloat16, False, False, {"block_n": 16, "block_w": 32, "split_k": 2, "pdl": "late"}),
    # the tensor-core K step (FLOTILLA_INT4_WIDE_MMA; plain and fused alike): masked rows, zero points, split-K, PDL
    (256, 40, 128, torch.bfloat16, False, True, {"block_n": 16, "block_w": 16, "split_k": 2, "layout": 1,
                                                 "pdl": "top", "mma": True}),
]


@pytest.mark.parametrize("k,n,group,dtype,symmetric,bias,knobs", GATED_CASES)
def test_gated_form_equals_the_plain_gemv_then_silu_and_mul_bit_for_bit(k, n, group, dtype, symmetric, bias, knobs):
    """`int4_gemv_wide_gated` of the merged `[2N, K]` weight: the plain wide GEMV's `[1, 2N]` (same tile, same sums)
    then the SiLU-and-mul kernel, bit for bit; the PyTorch pair (reference projection rounded, `silu_and_mul_ref`)
    to the dtype's rounding."""
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_int4_gemv_fused import int4_gemv_wide_gated
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    w, zeros = _weight(2 * n, k, group, dtype, symmetric, seed=k + n)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(1, k, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(2 * n, generator=g).to(dtype).to(DEVICE) if bias else None
    knobs = dict(knobs)
    pdl = knobs.pop("pdl", "")
    plain = int4_gemv_wide(x, *w, b, pdl="", **knobs)
    got = int4_gemv_wide_gated(x, *w, b, pdl=pdl, pdl_gdc=False, **knobs)
    assert got.shape == (1, n) and got.dtype == dtype
    assert torch.equal(got, silu_and_mul(plain))
    want = silu_and_mul_ref(_ref_linear(x, w, zeros, b))
    assert rel_err(got.cpu(), want) < tolerance(dtype)


# (heads, kv_heads, head_dim, K, group, dtype, symmetric, bias, cache dtype, position, slot, knobs)
ROPE_CASES = [
    (4, 2, 32, 256, 128, torch.bfloat16, True, False, torch.bfloat16, 7, 21, {"block_n": 16, "block_w": 32}),
    (2, 1, 64, 512, 128, torch.bfloat16, False, True, torch.bfloat16, 130, 47,
     {"block_n": 16, "block_w": 16, "split_k": 2, "layout": 1, "pdl": "top"}),  # Qwen2's qkv bias, split-K + fixup
    (2, 1, 128, 384, 32, torch.float16, False, False, torch.float16, 0, 3,
     {"block_n": 32, "block_w": 16, "split_k": 3}),  # Llama's head_dim, a ragged last range
    (4, 2, 32, 256, 128, torch.bfloat16, True, False, torch.float8_e4m3fn, 255, 16,
     {"block_n": 8, "block_w": 32, "layout": 1}),  # an fp8 cache with scales
    (4, 2, 32, 256, 64, torch.float32, False, False, torch.float32, 9, -1,
     {"block_n": 16, "block_w": 32, "pdl": "late"}),  # padding slot: no cache write
    (2, 1, 64, 512, 128, torch.bfloat16, False, True, torch.bfloat16, 130, 47,
     {"block_n": 16, "block_w": 16, "split_k": 2, "layout": 1, "pdl": "top", "mma": True}),  # the tensor-core K step
]


@pytest.mark.parametrize("heads,kv_heads,head_dim,k,group,dtype,symmetric,bias,cache_dtype,pos,slot,knobs",
                         ROPE_CASES)  # fmt: skip
def test_rope_form_equals_the_plain_gemv_then_rotary_bit_for_bit(heads, kv_heads, head_dim, k, group, dtype, symmetric,
                                                                 bias, cache_dtype, pos, slot, knobs):  # fmt: skip
    """`int4_gemv_wide_rope`: the rotated query and the cache rows equal the plain wide GEMV then `rotary_and_write_kv`
    bit for bit, and the PyTorch pair (reference projection, `apply_rotary_ref`, `write_kv_cache_ref`) to rounding."""
    from flotilla.engine.layers.rotary import _cos_sin_table
    from flotilla.kernels.triton_int4_gemv_fused import int4_gemv_wide_rope
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide
    from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

    n = (heads + 2 * kv_heads) * head_dim
    w, zeros = _weight(n, k, group, dtype, symmetric, seed=pos)
    g = torch.Generator().manual_seed(slot + 100)
    x = torch.randn(1, k, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    cos_sin = _cos_sin_table(head_dim, 256, 10000.0, "null", torch.device("cpu")).to(DEVICE)
    kc, vc = (torch.randn(3, 16, kv_heads, head_dim, generator=g).to(cache_dtype).to(DEVICE) for _ in range(2))
    positions, slots = torch.tensor([pos], device=DEVICE), torch.tensor([slot], device=DEVICE)
    scales = (0.5, 2.0) if cache_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    knobs = dict(knobs)
    pdl = knobs.pop("pdl", "")
    want_k, want_v = kc.clone(), vc.clone()
    q, kk, v = int4_gemv_wide(x, *w, b, pdl="", **knobs).split([heads * head_dim, kv_heads * head_dim,
                                                                kv_heads * head_dim], dim=-1)  # fmt: skip
    want_q = rotary_and_write_kv(positions, q.reshape(1, heads, head_dim), kk.reshape(1, kv_heads, head_dim),
                                 v.reshape(1, kv_heads, head_dim), cos_sin, want_k, want_v, slots, *scales)  # fmt: skip
    got_k, got_v = kc.clone(), vc.clone()
    got_q = int4_gemv_wide_rope(x, *w, b, positions, cos_sin, got_k, got_v, slots, heads, kv_heads, *scales, pdl=pdl,
                                pdl_gdc=False, **knobs)  # fmt: skip
    assert got_q.shape == (1, heads, head_dim)
    assert_same_rope_writes((got_q, got_k, got_v), (want_q, want_k, want_v), (kc, vc), slot, dtype)
    ref_k, ref_v = kc.clone().cpu(), vc.clone().cpu()
    ref_q = qkv_rope_ref(_ref_linear(x, w, zeros, b), positions.cpu(), cos_sin.cpu(), ref_k, ref_v, slots.cpu(), heads,
                         kv_heads, *scales)  # fmt: skip
    bound = 2 * tolerance(dtype) if cache_dtype == torch.float8_e4m3fn else tolerance(dtype)
    assert rel_err(got_q.cpu(), ref_q) < bound
    assert rel_err(got_k.cpu().float(), ref_k.float()) < bound and rel_err(got_v.cpu().float(), ref_v.float()) < bound


def test_fused_forms_apply_at_llama_shapes_of_the_tile_table(monkeypatch):
    """Llama-3.1-8B's qkv (6,144 x 4,096: 16-row tiles, 8 pairs of a 128-wide head) and gate/up (28,672 x 4,096)
    take the fused forms; not a tile wider than a head, heads that do not divide N, fp32 scales of the wrong shape,
    two rows, or groups that are not a multiple of 32."""
    from flotilla.kernels import triton_int4_gemv_fused as mod
    from flotilla.kernels import triton_int4_gemv_wide as wide
    from flotilla.kernels.triton_int4_gemv import _parse_tiles

    monkeypatch.setattr(mod, "device_sms", lambda t: 132)
    x = torch.zeros(1, 4096, dtype=torch.bfloat16)
    qkv = PackedInt4(torch.zeros(6144, 512, dtype=torch.int32), torch.ones(6144, 32, dtype=torch.bfloat16), None, 128)
    gate_up = PackedInt4(torch.zeros(28672, 512, dtype=torch.int32), torch.ones(28672, 32, dtype=torch.bfloat16),
                         torch.zeros(28672, 32, dtype=torch.uint8), 128)  # fmt: skip
    assert mod.fuses_rope(x, *qkv, None, 128) and mod.fuses_gated(x, *gate_up, None)
    assert not mod.fuses_rope(x, *qkv, None, 100)
    assert not mod.fuses_rope(torch.cat([x, x]), *qkv, None, 128) and not mod.fuses_gated(torch.cat([x, x]), *gate_up,
                                                                                              None)  # fmt: skip
    assert not mod.fuses_gated(x, gate_up.packed, gate_up.scales[:, :16], gate_up.zeros, 128, None)
    assert not mod.fuses_gated(x, gate_up.packed, torch.ones(28672, 256, dtype=torch.bfloat16), None, 16, None)
    monkeypatch.setattr(wide, "_WIDE_TILES", _parse_tiles("6144x4096:block_n=256"))
    assert not mod.fuses_rope(x, *qkv, None, 128)  # a tile wider than a head
    monkeypatch.setattr(wide, "_WIDE_TILES", _parse_tiles(wide.MEASURED_TILES[wide.DEFAULT]))
    monkeypatch.setattr(wide, "_PDL_TILES", _parse_tiles("6144x4096:block_n=256"))
    assert not mod.fuses_rope(x, *qkv, None, 128)  # the PDL launch's tile too


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the dispatch decision alone, no kernel launched."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_dispatch_switches(monkeypatch):
    """`int4_gated_gemv_takes` / `int4_qkv_rope_takes`: on by default (unless the environment says 0), one CUDA row
    the wide GEMV takes in a single-process engine; each switch turns its form off alone; FLOTILLA_INT4_GEMV_WIDE=0
    (no wide GEMV) turns both off."""
    from flotilla.kernels import triton_int4_gemv_fused as mod

    off = ("0", "false", "no", "off")
    assert dispatch.INT4_GATED is (os.environ.get("FLOTILLA_INT4_GATED", "1").lower() not in off)
    assert dispatch.INT4_QKV_ROPE is (os.environ.get("FLOTILLA_INT4_QKV_ROPE", "1").lower() not in off)
    monkeypatch.setattr(mod, "device_sms", lambda t: 132)
    monkeypatch.setattr(mod, "device_card", lambda t: None)  # the fake CUDA tensor's card: DEFAULT's tables
    monkeypatch.setattr(dispatch, "INT4_GATED", True)
    monkeypatch.setattr(dispatch, "INT4_QKV_ROPE", True)
    w, _ = _weight(256, 256, 128, torch.bfloat16, False, seed=1)
    w = PackedInt4(w.packed.cpu(), w.scales.cpu(), w.zeros.cpu(), 128)
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    fake = x.as_subclass(_FakeCuda)
    assert dispatch.int4_gated_gemv_takes(fake, w, None) and dispatch.int4_qkv_rope_takes(fake, w, None, 32)
    assert not dispatch.int4_gated_gemv_takes(x, w, None) and not dispatch.int4_qkv_rope_takes(x, w, None, 32)  # CPU
    two = torch.zeros(2, 256, dtype=torch.bfloat16).as_subclass(_FakeCuda)
    assert not dispatch.int4_gated_gemv_takes(two, w, None) and not dispatch.int4_qkv_rope_takes(two, w, None, 32)
    monkeypatch.setattr(dispatch, "INT4_GATED", False)
    assert not dispatch.int4_gated_gemv_takes(fake, w, None) and dispatch.int4_qkv_rope_takes(fake, w, None, 32)
    monkeypatch.setattr(dispatch, "INT4_GATED", True)
    monkeypatch.setattr(dispatch, "INT4_QKV_ROPE", False)
    assert dispatch.int4_gated_gemv_takes(fake, w, None) and not dispatch.int4_qkv_rope_takes(fake, w, None, 32)
    monkeypatch.setattr(dispatch, "INT4_QKV_ROPE", True)
    monkeypatch.setattr(dispatch, "INT4_GEMV_WIDE_ROWS", 0)
    assert not dispatch.int4_gated_gemv_takes(fake, w, None) and not dispatch.int4_qkv_rope_takes(fake, w, None, 32)
    monkeypatch.setattr(dispatch, "INT4_GEMV_WIDE_ROWS", 1)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    assert not dispatch.int4_gated_gemv_takes(fake, w, None) and not dispatch.int4_qkv_rope_takes(fake, w, None, 32)


@pytest.fixture(scope="module")
def int4_checkpoints(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> dict[str, Path]:
    """A tiny random Llama (hidden 128, MLP 128, 2 heads of 64, 1 KV head, fp32) as int4 checkpoints: compressed-
    tensors W4A16 (symmetric, group 128, packed by the library) and GPTQ (zero points, group 32). MLP 128 and heads
    of 64 (qkv and gate/up both 256 rows: 4 programs of 64 under the interpreter, the decode test's tile) keep the
    decode test's time down: the interpreter's time goes by programs, not by their size."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
    from quant_checkpoints import compressed_tensors_checkpoint, int4_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=False, initializer_range=0.1, bos_token_id=1, eos_token_id=2)  # fmt: skip
    root = tmp_path_factory.mktemp("int4-fused")
    LlamaForCausalLM(config).save_pretrained(root / "src")
    tokenizer.save_pretrained(root / "src")
    return {"compressed-tensors": compressed_tensors_checkpoint(root / "src", root / "ct", "W4A16",
                                                                dequantized_copy=False),
            "gptq": int4_checkpoint(root / "src", root / "gptq", "gptq")}  # fmt: skip


@pytest.mark.skipif(DEVICE.type != "cpu" or not INTERPRETING, reason="the interpreter on CPU tensors stands in here")
@pytest.mark.parametrize("fmt", ["compressed-tensors", "gptq"])
def test_int4_llama_decodes_through_both_fused_forms(int4_checkpoints, monkeypatch, fmt):
    """A tiny int4 Llama (fp32) generates greedily one sequence at a time: with the seams' decisions forced for a CPU
    row (dispatch's CUDA check is the only thing bypassed: `fuses_gated` / `fuses_rope` still decide), every one-row
    MLP runs `int4_gemv_wide_gated` and every one-row attention `int4_gemv_wide_rope` (the real kernels, under the
    interpreter), each call within fp32 rounding (sums in another order) of the PyTorch pair it replaces; the greedy
    tokens equal the unfused path's (the switches off). The call counters make the test fail if the model stops
    routing through a seam."""
    import flotilla.engine.layers.attention as attention
    import flotilla.engine.models.llama as llama
    import flotilla.engine.models.llama_cpu_decode as fast
    import flotilla.kernels.triton_int4_gemv_wide as wide
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.kernels.triton_int4_gemv_fused import fuses_gated, fuses_rope

    monkeypatch.setattr(fast, "CPU_DECODE_LAYERS", False)  # the module path, where the layers dispatch
    # qkv and gate/up are both [256, 128]: a 64-row tile (a whole head of 64, so `fuses_rope` still holds) runs 4
    # interpreted programs a launch, not the table's 16-row tile's 16 (the time goes by programs); the bit-for-bit
    # tests above cover the smaller tiles
    monkeypatch.setattr(wide, "_WIDE_TILES", {**wide._WIDE_TILES, (256, 128): {"block_n": 64, "block_w": 128,
                                                                               "num_warps": 4, "num_stages": 1}})
    llm = LLM(str(int4_checkpoints[fmt]), max_model_len=128, enforce_eager=True, enable_prefix_caching=False,
              **({"quantization": "gptq"} if fmt == "gptq" else {}))  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def run() -> list[list[int]]:
        return [list(llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].token_ids)
                for p in ([5, 6, 7, 8, 9], [11, 12, 13] * 10)]  # fmt: skip

    monkeypatch.setattr(dispatch, "INT4_GATED", False)
    monkeypatch.setattr(dispatch, "INT4_QKV_ROPE", False)
    want = run()
    errors: dict[str, list[float]] = {"gated": [], "rope": []}
    real_gated, real_rope = llama.int4_gated_gemv, attention.qkv_rotary_and_write_kv

    def gated(x, w, bias=None):
        out = real_gated(x, w, bias)
        ref = silu_and_mul_ref(dispatch.packed_int_linear(x, w.packed, w.scales, _zeros(w), 4, w.group_size, bias))
        errors["gated"].append(rel_err(out, ref))
        return out

    def rope(x, w, bias, positions, cos_sin, k_cache, v_cache, slots, heads, kv_heads, k_scale, v_scale):
        assert isinstance(w, PackedInt4)
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        q = real_rope(x, w, bias, positions, cos_sin, k_cache, v_cache, slots, heads, kv_heads, k_scale, v_scale)
        qkv = dispatch.packed_int_linear(x, w.packed, w.scales, _zeros(w), 4, w.group_size, bias)
        ref_q = qkv_rope_ref(qkv, positions, cos_sin, ref_k, ref_v, slots, heads, kv_heads, k_scale, v_scale)
        errors["rope"].append(max(rel_err(q, ref_q), rel_err(k_cache, ref_k), rel_err(v_cache, ref_v)))
        return q

    monkeypatch.setattr(llama, "int4_gated_gemv_takes", lambda x, w, b: x.shape[0] == 1 and fuses_gated(x, *w, b))
    monkeypatch.setattr(llama, "int4_qkv_rope_takes",
                        lambda x, w, b, head_dim: x.shape[0] == 1 and fuses_rope(x, *w, b, head_dim))  # fmt: skip
    monkeypatch.setattr(llama, "int4_gated_gemv", gated)
    monkeypatch.setattr(attention, "qkv_rotary_and_write_kv", rope)
    assert run() == want
    steps = 2 * (6 - 1)  # one-row decode steps: 5 a prompt (the first token comes from the prefill)
    assert len(errors["gated"]) == len(errors["rope"]) == steps * 2  # x 2 layers
    assert max(errors["gated"]) < 1e-4 and max(errors["rope"]) < 1e-4, errors  # fp32 sums in another order


def _zeros(w: PackedInt4) -> torch.Tensor:
    """The reference's zero points: the weight's, or the middle code 8 (symmetric)."""
    return w.zeros if w.zeros is not None else torch.full(w.scales.shape, 8, dtype=torch.uint8)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
def test_llama_shapes_on_the_gpu():
    """Llama-3.1-8B's gate/up (28,672 x 4,096) and qkv (6,144 x 4,096, 32 + 2 x 8 heads of 128) at the measured tiles,
    compiled: the fused forms against the plain wide GEMV then the pair's kernel (equal up to the order of the final
    sum over chunks, which the compiler may pick apart for the two kernels), and the PDL launch against the plain
    launch of the same form (bit-equal where sm_90 runs griddepcontrol)."""
    from flotilla.engine.layers.rotary import _cos_sin_table
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_int4_gemv_fused import int4_gemv_wide_gated, int4_gemv_wide_rope
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide
    from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

    hopper = torch.cuda.get_device_capability() >= (9, 0)
    x = torch.randn(1, 4096, device=DEVICE).to(torch.bfloat16)
    w, _ = _weight(28672, 4096, 128, torch.bfloat16, True, seed=5)
    got = int4_gemv_wide_gated(x, *w, pdl="")
    assert rel_err(got.float(), silu_and_mul(int4_gemv_wide(x, *w, pdl="")).float()) < 1e-2
    if hopper:
        assert torch.equal(int4_gemv_wide_gated(x, *w, pdl="top"), got)
    w, _ = _weight(6144, 4096, 128, torch.bfloat16, False, seed=6)
    cos_sin = _cos_sin_table(128, 1024, 500000.0, "null", torch.device("cpu")).to(DEVICE)
    kc, vc = (torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    positions, slots = torch.tensor([513], device=DEVICE), torch.tensor([37], device=DEVICE)
    q, k, v = int4_gemv_wide(x, *w, pdl="").split([4096, 1024, 1024], dim=-1)
    want_k, want_v = kc.clone(), vc.clone()
    want_q = rotary_and_write_kv(positions, q.reshape(1, 32, 128), k.reshape(1, 8, 128), v.reshape(1, 8, 128), cos_sin,
                                 want_k, want_v, slots)  # fmt: skip
    for pdl in ("", "top") if hopper else ("",):
        got_k, got_v = kc.clone(), vc.clone()
        got_q = int4_gemv_wide_rope(x, *w, None, positions, cos_sin, got_k, got_v, slots, 32, 8, pdl=pdl)
        assert rel_err(got_q.float(), want_q.float()) < 1e-2 and rel_err(got_k.float(), want_k.float()) < 1e-2
        assert rel_err(got_v.float(), want_v.float()) < 1e-2
