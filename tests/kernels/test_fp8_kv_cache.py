"""fp8 (e4m3) KV cache: the Triton KV writes quantize and the attention kernels read fp8 pages, each
against its PyTorch reference."""

from __future__ import annotations

import functools

import pytest
import torch
from kernel_cases import DEVICE, INTERPRETING, attention_case, batch_meta, paged_pool, rel_err

from flotilla.kernels.cpu_attention import paged_attention_cpu
from flotilla.kernels.paged_attention import paged_attention_ref, write_kv_cache_ref
from flotilla.kernels.rotary import apply_rotary_ref

FP8 = torch.float8_e4m3fn


def _assert_fp8_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal to one e4m3 step (the interpreter truncates where torch rounds to nearest). The interpreter
    also loses the carry when rounding up crosses a power of two (0.489 -> 0.25 instead of 0.5; the GPU's
    cvt instruction does not): such elements, at most 2 %, are left out under the interpreter only."""
    out, ref = out.cpu().float(), ref.float()
    if INTERPRETING:
        carry_lost = (ref != 0) & (out * 2 == ref) & (ref.abs().log2() == ref.abs().log2().round())
        assert carry_lost.float().mean() < 0.02
        out = torch.where(carry_lost, ref, out)
    torch.testing.assert_close(out, ref, rtol=0.13, atol=2**-9)


def test_kv_write_quantizes_with_scales_and_saturates():
    from flotilla.kernels.triton_kv_write import write_kv_cache

    g = torch.Generator().manual_seed(0)
    key, value = torch.randn(12, 2, 32, generator=g).to(torch.bfloat16), torch.randn(12, 2, 32, generator=g)
    key[0, 0, 0] = 1000.0  # beyond 448 * k_scale: saturates instead of becoming NaN
    slots = torch.randperm(64, generator=g)[:12]
    slots[5] = -1
    k_ref, v_ref = torch.zeros(4, 16, 2, 32, dtype=FP8), torch.zeros(4, 16, 2, 32, dtype=FP8)
    write_kv_cache_ref(key, value, k_ref, v_ref, slots, 0.5, 0.25)
    k_cache, v_cache = torch.zeros_like(k_ref).to(DEVICE), torch.zeros_like(v_ref).to(DEVICE)
    write_kv_cache(key.to(DEVICE), value.to(DEVICE), k_cache, v_cache, slots.to(DEVICE), 0.5, 0.25)
    _assert_fp8_close(k_cache, k_ref)
    _assert_fp8_close(v_cache, v_ref)
    assert k_ref.view(-1, 2, 32)[slots[0], 0, 0].float() == 448.0
    assert not k_cache.cpu().float().isnan().any()


def test_rotary_kv_write_quantizes_the_rotated_key():
    from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

    g = torch.Generator().manual_seed(1)
    tokens, dim = 6, 32
    q, k, v = (torch.randn(tokens, h, dim, generator=g) for h in (4, 2, 2))
    positions = torch.arange(3, 3 + tokens)
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.arange(64).float()[:, None] * inv[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    slots = torch.tensor([0, 17, 5, -1, 30, 2])
    k_ref, v_ref = torch.zeros(2, 16, 2, dim, dtype=FP8), torch.zeros(2, 16, 2, dim, dtype=FP8)
    q_ref, k_rot = apply_rotary_ref(positions, q, k, cos_sin)
    write_kv_cache_ref(k_rot, v, k_ref, v_ref, slots, 2.0, 0.5)
    k_cache, v_cache = torch.zeros_like(k_ref).to(DEVICE), torch.zeros_like(v_ref).to(DEVICE)
    q_out = rotary_and_write_kv(*(t.to(DEVICE) for t in (positions, q, k, v, cos_sin)), k_cache, v_cache,
                                slots.to(DEVICE), 2.0, 0.5)
    torch.testing.assert_close(q_out.cpu(), q_ref, rtol=1e-5, atol=1e-5)
    _assert_fp8_close(k_cache, k_ref)
    _assert_fp8_close(v_cache, v_ref)


def _fp8_case(q_lens, seq_lens):
    query, k_cache, v_cache, tables, qsl, lens = attention_case(q_lens, seq_lens, 8, 2, torch.float32)
    return query, k_cache.to(FP8), v_cache.to(FP8), tables, qsl, lens


@pytest.mark.parametrize("kernel", ["decode", "decode_fused", "prefill"])
def test_attention_kernels_read_fp8_pages(kernel):
    """The kernels upcast fp8 pages; with the scales folded in (`dispatch.paged_attention`: k_scale in
    the softmax scale, v_scale in the decode kernel or on the prefill output) they equal the reference
    on the dequantized pages; "decode_fused": the decode kernel's splits merged in the kernel (v_scale
    applied before the partials are stored)."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    q_lens = [1, 1] if kernel.startswith("decode") else [21, 7]
    query, k8, v8, tables, qsl, lens = _fp8_case(q_lens, [37, 40])
    k_scale, v_scale = 0.5, 2.0
    if kernel.startswith("decode"):  # the decode kernel takes v_scale itself
        out = paged_decode_attention(query, k8, v8, tables, qsl, lens, 0.2 * k_scale, num_splits=2, block_n=16,
                                     v_scale=v_scale, fused_merge=kernel == "decode_fused")  # fmt: skip
    else:
        out = v_scale * paged_prefill_attention(query, k8, v8, tables, qsl, lens, 0.2 * k_scale, block_m=64, block_n=16)
    deq = (k8.float() * k_scale).to(DEVICE), (v8.float() * v_scale).to(DEVICE)
    ref = paged_attention_ref(query, *deq, tables, qsl, lens, 0.2)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("fp8_kv", ["cvt", "bits", "asm", "cvt16", "perm", "cvtpx", "perm_k", "cvtpx_k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_fp8_operand_paths_match_reference(fp8_kv, dtype):
    """Every way the decode kernel turns e4m3 pages into tensor-core operands (the bit moves to fp16
    x 2^-8 with the 2^8 folded back, or Triton's upcast) equals the reference on the dequantized pages,
    negative, subnormal and padded values included; a bf16 query within fp16/bf16 operand rounding."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k_cache, v_cache, tables, qsl, lens = attention_case([1, 1, 1], [37, 64, 5], 8, 2, dtype, seed=7)
    k8 = (k_cache.float() * 0.05).to(FP8)  # ~30 % of the values subnormal (|x| < 2^-6)
    v8 = v_cache.to(FP8)
    out = paged_decode_attention(query, k8, v8, tables, qsl, lens, 4.0, num_splits=2, block_n=16, fp8_kv=fp8_kv)
    ref = paged_attention_ref(query, k8.float(), v8.float(), tables, qsl, lens, 4.0)
    assert out.dtype == dtype
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1.5e-2)  # fp32: fp32 operands throughout


def _run_ptx(asm: str, word: int) -> list[int]:
    """The integer PTX of an `inline_asm_elementwise` body (b32 mov/shr/shl/and/or/prmt) run on one input
    register $2, giving $0 and $1: the interpreter never runs inline asm, so its constants are checked here."""
    regs: dict[str, int] = {"$2": word}

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0)

    for line in asm.strip("{}\n").splitlines():
        op, _, args = line.strip().rstrip(";").partition(" ")
        if not args or op.startswith(".reg"):
            continue
        d, *src = [a.strip() for a in args.split(",")]
        a = [val(t) for t in src]
        if op == "shr.b32":
            r = a[0] >> a[1]
        elif op == "shl.b32":
            r = a[0] << a[1]
        elif op == "and.b32":
            r = a[0] & a[1]
        elif op == "or.b32":
            r = a[0] | a[1]
        elif op == "prmt.b32":
            pool = (a[1] << 32) | a[0]
            r = sum(((pool >> (8 * ((a[2] >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        else:
            raise AssertionError(f"op {op} not modelled")
        regs[d] = r & 0xFFFFFFFF
    return [regs["$0"], regs["$1"]]


@pytest.mark.parametrize("asm_name", ["_E4M3X4_TO_F16X4", "_E4M3X4_TO_F16X4_BYTES"])
def test_e4m3_bit_move_asm_gives_every_code_times_2_to_the_minus_8(asm_name):
    """Both PTX sequences of the decode kernel's "asm" and "perm" paths turn each of the 254 finite e4m3
    codes, in every byte position of the word, into fp16 bits of exactly value x 2^-8."""
    from flotilla.kernels import triton_paged_decode

    asm = getattr(triton_paged_decode, asm_name).value
    codes = torch.arange(256, dtype=torch.uint8)
    want = (codes.view(FP8).float() * 2.0**-8).half().view(torch.int16).int() & 0xFFFF
    finite = ~codes.view(FP8).float().isnan()
    for c in range(256):
        if not finite[c]:
            continue
        for pos in range(4):
            filler = [0x5A, 0xC3, 0x01, 0xFE]  # other bytes of the word must not leak into this value
            filler[pos] = c
            word = sum(b << (8 * i) for i, b in enumerate(filler))
            out = _run_ptx(asm, word)
            got = (out[pos // 2] >> (16 * (pos % 2))) & 0xFFFF
            assert got == want[c].item(), (asm_name, hex(c), pos, hex(got))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_key_streams_match_reference(dtype):
    """The loop as a batched dot over interleaved key streams: one stream, and one a warp (4 streams of 16 in
    a 64-key tile; sequences of 37 and 5 keys leave some streams empty in the last tile, one with none at all),
    merged at the end: the reference output, on a float and on an fp8 pool. Fewer than 16 keys a stream is
    refused."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k_cache, v_cache, tables, qsl, lens = attention_case([1, 1, 1], [37, 130, 5], 8, 2, dtype, seed=9)
    for k, v, mode in ((k_cache, v_cache, None), (k_cache.to(FP8), v_cache.to(FP8), "cvtpx")):
        ref = paged_attention_ref(query, k.float(), v.float(), tables, qsl, lens, 0.5)
        for streams, form in ((1, ""), (4, ""), (4, "t"), (2, "t"), (1, "t"), (2, "h"), (1, "h")):
            out = paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, num_splits=2, block_n=64, num_warps=4,
                                         key_streams=streams, fp8_kv=mode, form=form)  # fmt: skip
            assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1.5e-2), (streams, form)
        # streams over heads with a 16-key tile (one page a tile), 2 heads a program over 3 splits and 1 split
        for splits in (3, 1):
            out = paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, num_splits=splits, block_n=16,
                                         num_warps=2, key_streams=2, fp8_kv=mode, form="h")  # fmt: skip
            assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1.5e-2), ("h", splits)
        # the transposed streams with a sub-tile of one page (16 keys) over 3 splits, merged by the kernel or fused
        # (by argument, or by FLOTILLA_DECODE_FUSED_MERGE=1 when the caller leaves it unset, as the engine does)
        for fused, env in ((False, None), (True, None), (None, "1")):
            with pytest.MonkeyPatch.context() as mp:
                if env:
                    mp.setenv("FLOTILLA_DECODE_FUSED_MERGE", env)
                out = paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, num_splits=3, block_n=32,
                                             num_warps=2, key_streams=2, fp8_kv=mode, form="t",
                                             fused_merge=fused)  # fmt: skip
            assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1.5e-2), ("3 splits", fused, env)
    with pytest.raises(ValueError, match="16 keys"):
        paged_decode_attention(query, k_cache, v_cache, tables, qsl, lens, 0.5, block_n=32, key_streams=4)
    with pytest.raises(ValueError, match="head streams"):  # 3 streams over 2 KV heads; a fused merge over heads
        paged_decode_attention(query, k_cache, v_cache, tables, qsl, lens, 0.5, block_n=16, key_streams=3, form="h")
    with pytest.raises(ValueError, match="head streams"):
        paged_decode_attention(query, k_cache, v_cache, tables, qsl, lens, 0.5, block_n=16, key_streams=2, form="h",
                               num_splits=2, fused_merge=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_streams_over_heads_and_keys_match_reference(dtype):
    """Form "h<N>" (kv15): a program covers N neighbouring KV heads with key_streams / N interleaved key streams a
    head, merged per head at the end. 4 KV heads (group 2), sequences of 37, 130 and 5 keys (streams with no key in
    the last tile, one with none at all) and a padding sequence: 2 heads x 2 streams at 1 and 3 splits, 2 heads x 4
    streams of 16 in a 64-key tile, 4 heads x 2 streams, 1 head x 2 streams ("h1": the transposed key streams'
    grid); the reference on a float and on an fp8 pool. N not dividing the streams or the KV heads is refused."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k_cache, v_cache, tables, qsl, lens = attention_case([1, 0, 1, 1], [37, 0, 130, 5], 8, 4, dtype, seed=15)
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    for k, v, mode in ((k_cache, v_cache, None), (k_cache.to(FP8), v_cache.to(FP8), "cvtpx")):
        ref = paged_attention_ref(query, k.float(), v.float(), tables, qsl, lens, 0.5)
        for block_n, streams, form, splits in ((32, 4, "h2", 1), (32, 4, "h2", 3), (64, 8, "h2", 1), (32, 8, "h4", 2),
                                               (32, 2, "h1", 1)):  # fmt: skip
            out = paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, num_splits=splits, block_n=block_n,
                                         num_warps=streams, key_streams=streams, fp8_kv=mode, form=form)  # fmt: skip
            assert rel_err(out, ref) < tol, (block_n, streams, form, splits)
        if INTERPRETING:  # h2 at 32/4 is t at 32/2 per head: the same 16-key streams and merge, the same numbers
            t = paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, num_splits=1, block_n=32, num_warps=2,
                                       key_streams=2, fp8_kv=mode, form="t")  # fmt: skip
            h2 = paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, num_splits=1, block_n=32, num_warps=4,
                                        key_streams=4, fp8_kv=mode, form="h2")  # fmt: skip
            assert torch.equal(t, h2)
    for streams, form in ((4, "h3"), (8, "h8")):  # 4 streams over 3 heads; 8 heads a program of 4 KV heads
        with pytest.raises(ValueError, match="head streams"):
            paged_decode_attention(query, k_cache, v_cache, tables, qsl, lens, 0.5, block_n=64, key_streams=streams,
                                   form=form)  # fmt: skip
    with pytest.raises(ValueError, match="16 keys"):  # 2 heads x 2 streams of 8 keys
        paged_decode_attention(query, k_cache, v_cache, tables, qsl, lens, 0.5, block_n=16, key_streams=4, form="h2")


@pytest.mark.parametrize("head_dim", [32, 40])
def test_decode_lean_heads_loop_gives_the_same_numbers(monkeypatch, head_dim):
    """`lean` (FLOTILLA_DECODE_FP8_LEAN): the "h" forms' full tiles without key masks, the partial last tile masked,
    and a stream of whole pages (32-key streams: 64-key tiles at 2 streams a head, or "h" with one stream a head)
    finding its pages a page at a time give exactly the numbers of the masked loop, on a float and an fp8 pool, with
    sequences of 37, 130 and 5 keys (tails in every stream position, a stream with no key in the last tile), a
    padding sequence, 1 to 3 splits, one KV head a program ("h1", kv30's rows) or several, and a head dim of 40 (the
    head dims still masked). The switch reads on/off
    spellings, refuses others, and leaves a float pool's default alone."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k_cache, v_cache, tables, qsl, lens = attention_case([1, 0, 1, 1], [37, 0, 130, 5], 8, 4, torch.float32,
                                                                head_dim=head_dim, seed=24)  # fmt: skip
    args = (tables, qsl, lens, 0.5)
    for k, v, mode in ((k_cache, v_cache, None), (k_cache.to(FP8), v_cache.to(FP8), "cvtpx")):
        ref = paged_attention_ref(query, k.float(), v.float(), *args)
        for block_n, streams, form, splits in ((32, 4, "h2", 1), (32, 4, "h2", 3), (64, 4, "h2", 1), (64, 4, "h2", 2),
                                               (64, 8, "h2", 1), (32, 8, "h4", 2), (64, 2, "h", 1),
                                               (64, 2, "h1", 1), (64, 4, "h1", 1)):  # fmt: skip
            kw = dict(num_splits=splits, block_n=block_n, num_warps=streams, key_streams=streams, fp8_kv=mode,
                      form=form)  # fmt: skip
            lean = paged_decode_attention(query, k, v, *args, lean=True, **kw)
            plain = paged_decode_attention(query, k, v, *args, lean=False, **kw)
            # compiled, the two loops may contract a multiply-add differently
            assert torch.equal(lean, plain) if INTERPRETING else rel_err(lean, plain) < 1e-6, kw
            assert rel_err(lean, ref) < 1e-5, kw
    k8, v8 = k_cache.to(FP8), v_cache.to(FP8)
    kw = dict(num_splits=1, block_n=64, num_warps=4, key_streams=4, form="h2")
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LEAN", "on")
    switched = paged_decode_attention(query, k8, v8, *args, fp8_kv="cvtpx", **kw)
    assert torch.equal(switched, paged_decode_attention(query, k8, v8, *args, fp8_kv="cvtpx", lean=True, **kw))
    assert torch.equal(paged_decode_attention(query, k_cache, v_cache, *args, **kw),
                       paged_decode_attention(query, k_cache, v_cache, *args, lean=False, **kw))  # fmt: skip
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LEAN", "fast")
    with pytest.raises(ValueError, match="FLOTILLA_DECODE_FP8_LEAN"):
        paged_decode_attention(query, k8, v8, *args, fp8_kv="cvtpx", **kw)


def test_decode_default_form_fits_the_callers_key_streams():
    """A caller's own `key_streams` without a form takes the fp8 pool's form ("h2": 2 KV heads a program) where the
    streams can carry its heads, else the row form: one stream was refused ("2 heads a program must divide 1
    streams"), which the GPU test of the operand paths hit."""
    from flotilla.kernels.triton_paged_decode import _FP8_FORM, paged_decode_attention

    assert _FP8_FORM == "h2"
    query, k_cache, v_cache, tables, qsl, lens = attention_case([1, 1, 1], [37, 130, 5], 8, 4, torch.float32, seed=3)
    k, v = k_cache.to(FP8), v_cache.to(FP8)
    ref = paged_attention_ref(query, k.float(), v.float(), tables, qsl, lens, 0.5)
    for streams, same_as in ((1, ""), (4, "h2")):
        kw = {"num_splits": 1, "block_n": 64, "num_warps": 4, "key_streams": streams, "fp8_kv": "cvtpx"}
        out = paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, **kw)
        assert torch.equal(out, paged_decode_attention(query, k, v, tables, qsl, lens, 0.5, form=same_as, **kw))
        assert rel_err(out, ref) < 1e-5, streams


def test_decode_fp8_launch_per_card(monkeypatch):
    """The fp8 pool's launch is its card's `FP8_LAUNCHES` entry where it has one (tile, form and the wave its split
    count fills), DEFAULT's on any other card and off CUDA; FLOTILLA_DECODE_FP8_LAUNCH still overrides the tile, and
    a float pool keeps its own launch. Seen at the kernel's launch (the grid and the compile knobs), with the card
    made "NVIDIA H200" and a made-up H200 entry (one KV head a program, 2 streams, 2 warps, 3 stages, wave 4); the
    numbers still match the reference."""
    from flotilla.kernels import triton_paged_decode as tpd
    from flotilla.kernels.card_tables import DEFAULT, H100, H200

    entry = ((32, 2, 3, "cvtpx", 2), "h1", 4)
    monkeypatch.setitem(tpd.FP8_LAUNCHES, H200, entry)
    monkeypatch.delenv("FLOTILLA_DECODE_FP8_LAUNCH", raising=False)
    monkeypatch.delenv("FLOTILLA_DECODE_WAVE", raising=False)
    assert tpd._launch_defaults(True, H200) == (32, 2, 3, "cvtpx", 2, "h1")
    assert tpd._launch_defaults(True, H100) == tpd._launch_defaults(True, None) == (*tpd.FP8_LAUNCHES[DEFAULT][0], "h2")
    assert tpd._fp8_wave(H200) == 4 and tpd._fp8_wave(H100) == tpd._fp8_wave(None) == 2
    launches = []

    class Spy:  # records each launch of the split kernel, then runs it
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs))
                return real[grid](*args, **kwargs)

            return launch

    real = tpd._decode_split_kernel
    monkeypatch.setattr(tpd, "_decode_split_kernel", Spy())
    monkeypatch.setattr(tpd, "device_card", lambda tensor: H200)
    monkeypatch.setattr(tpd, "device_sms", lambda tensor: 4)
    query, k_cache, v_cache, tables, qsl, lens = attention_case([1, 1], [70, 20], 8, 4, torch.float32, seed=30)
    k8, v8 = k_cache.to(FP8), v_cache.to(FP8)
    ref = paged_attention_ref(query, k8.float(), v8.float(), tables, qsl, lens, 0.5)
    out = tpd.paged_decode_attention(query, k8, v8, tables, qsl, lens, 0.5)
    assert rel_err(out, ref) < 1e-5
    grid, kw = launches[-1]
    # 2 sequences x 4 KV heads, one a program; wave 4 x 4 SMs // 8 programs = 2 splits (DEFAULT's wave 2: 1)
    assert grid == (2, 4, 2), grid
    assert (kw["BLOCK_N"], kw["num_warps"], kw["num_stages"], kw["KEY_STREAMS"]) == (32, 2, 3, 2)
    assert kw["HEAD_STREAMS"] and kw["KEY_SUB"] == 2
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LAUNCH", "64,4,3,cvtpx,4h2")  # the override wins over the card's tile
    tpd.paged_decode_attention(query, k8, v8, tables, qsl, lens, 0.5)
    grid, kw = launches[-1]
    assert (grid[1], kw["BLOCK_N"], kw["num_warps"], kw["KEY_SUB"]) == (2, 64, 4, 2)
    tpd.paged_decode_attention(query, k_cache, v_cache, tables, qsl, lens, 0.5)  # a float pool: its own launch
    assert launches[-1][1]["KEY_STREAMS"] == 0 and launches[-1][0][1] == 4


def _llama_fp8_case(seed: int) -> tuple[torch.Tensor, ...]:
    """On the GPU: Llama-3-8B heads (32 query, 8 KV, 128 dims), sequences of 4,000, 300 and 17 tokens on an fp8
    pool (K scaled to ~30 % subnormal values), one bf16 query row each, scale 0.3; returns (query, k8, v8, tables,
    qsl, lens, the reference on the fp8 pages)."""
    g = torch.Generator().manual_seed(seed)
    k16, v16, tables = paged_pool([4000, 300, 17], 8, 128, torch.float32, generator=g)
    k8, v8 = (k16 * 0.05).to(FP8).cuda(), v16.to(FP8).cuda()
    query = torch.randn(3, 32, 128, generator=g).bfloat16().cuda()
    qsl, lens = (t.cuda() for t in batch_meta([1, 1, 1], [4000, 300, 17]))
    tables = tables.cuda()
    return query, k8, v8, tables, qsl, lens, paged_attention_ref(query, k8.float(), v8.float(), tables, qsl, lens, 0.3)


@pytest.mark.gpu
def test_cuda_fp8_transposed_streams_at_llama_heads():
    """On the GPU (cvtpx's inline PTX runs only there): Llama-3-8B heads, sequences of 4,000, 300 and 17 tokens on an
    fp8 pool; the transposed key streams as fp8kv11's grid launches them (2 warps at 1 and 2 splits, 1 warp at 4
    splits, the fused merge; over 2 / 4 / 8 KV heads at 4 splits) equal the reference, also when replayed from a
    CUDA graph."""
    launches = (("t", 32, 2, 4, 1, False), ("t", 32, 2, 3, 2, False), ("t", 16, 1, 3, 4, False),
                ("t", 32, 2, 3, 2, True), ("h", 16, 2, 2, 4, False), ("h", 16, 4, 2, 4, False),
                ("h", 16, 8, 2, 4, False))  # fmt: skip
    _check_fp8_launches_at_llama_heads(launches)


@pytest.mark.gpu
def test_cuda_fp8_streams_over_heads_and_keys_at_llama_heads():
    """On the GPU, as above: kv15's launches (over 2 / 4 KV heads with 2 / 4 key streams a head, "h2" / "h4", at 1 and
    2 splits; "h" over 2 heads at 2 splits) equal the reference, also replayed from a CUDA graph."""
    _check_fp8_launches_at_llama_heads((("h2", 32, 4, 4, 1, False), ("h2", 32, 4, 6, 1, False),
                                        ("h2", 64, 4, 3, 1, False), ("h2", 64, 8, 2, 1, False),
                                        ("h4", 32, 8, 4, 1, False), ("h2", 32, 4, 2, 2, False),
                                        ("h", 32, 2, 3, 2, False)))  # fmt: skip


@pytest.mark.gpu
def test_cuda_fp8_kv30_launches_at_llama_heads():
    """On the GPU, as above: the launches bench/fp8_kv_decode.py's `--grid kv30` times for the engine (the lean loop,
    the pool's default): h2 64/8/3 (4 key streams a head), h1 64/4/3 (one KV head a program, 4 streams), h1 64/2/3,
    32/2/4 and 32/2/3 (2 streams), at 1 and 2 splits, equal the reference, also replayed from a CUDA graph."""
    _check_fp8_launches_at_llama_heads((("h2", 64, 8, 3, 1, False), ("h1", 64, 4, 3, 1, False),
                                        ("h1", 64, 2, 3, 1, False), ("h1", 32, 2, 4, 1, False),
                                        ("h1", 32, 2, 3, 1, False), ("h2", 64, 8, 3, 2, False),
                                        ("h1", 64, 2, 3, 2, False)))  # fmt: skip


def _check_fp8_launches_at_llama_heads(launches: tuple[tuple[str, int, int, int, int, bool], ...]) -> None:
    """Each (form, block_n, warps, stages, splits, fused merge) launch, one key stream a warp, on `_llama_fp8_case`:
    the reference, called and replayed twice from a CUDA graph."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k8, v8, tables, qsl, lens, ref = _llama_fp8_case(12)
    for form, block_n, warps, stages, splits, fused in launches:
        cfg = dict(fp8_kv="cvtpx", block_n=block_n, num_warps=warps, num_stages=stages, key_streams=warps, form=form,
                   num_splits=splits, fused_merge=fused)  # fmt: skip
        run = functools.partial(paged_decode_attention, query, k8, v8, tables, qsl, lens, 0.3, **cfg)
        assert rel_err(run(), ref) < 1e-2, cfg
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        for _ in range(2):
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert rel_err(out, ref) < 1e-2, ("graph", cfg)


@pytest.mark.parametrize("q_lens", [[1, 1], [21, 7]])
def test_cpu_attention_reads_fp8_pages(q_lens):
    query, k8, v8, tables, qsl, lens = _fp8_case(q_lens, [37, 40])
    args = [t.cpu() for t in (query, k8, v8, tables, qsl, lens)]
    out = paged_attention_cpu(*args, 0.2, max(q_lens))
    ref = paged_attention_ref(args[0], args[1].float(), args[2].float(), *args[3:], 0.2)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.gpu
def test_cuda_fp8_decode_with_scales_replays_in_a_graph():
    """Llama-3-8B heads, one sequence of 4,000 tokens (32 splits) and a short one, on an fp8 pool with
    k/v scales through `dispatch.paged_attention` (v_scale applied in the kernel): each of several
    graph replays equals the reference."""
    from flotilla.kernels import dispatch

    g = torch.Generator().manual_seed(3)
    k16, v16, tables = paged_pool([4000, 33], 8, 128, torch.float32, generator=g)
    k8, v8 = (k16 * 4).to(FP8).cuda(), (v16 / 2).to(FP8).cuda()  # the pool holds K / k_scale, V / v_scale
    query = torch.randn(2, 32, 128, generator=g).bfloat16().cuda()
    qsl, lens = (t.cuda() for t in batch_meta([1, 1], [4000, 33]))
    tables = tables.cuda()
    run = lambda: dispatch.paged_attention(query, k8, v8, tables, qsl, lens, 0.088, max_query_len=1,  # noqa: E731
                                           k_scale=0.25, v_scale=2.0)  # fmt: skip
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    ref = paged_attention_ref(query, k8.float() * 0.25, v8.float() * 2.0, tables, qsl, lens, 0.088)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, ref) < 1.5e-2


@pytest.mark.gpu
@pytest.mark.parametrize("fp8_kv", ["asm", "cvt16", "perm", "cvtpx", "perm_k", "cvtpx_k"])
def test_cuda_fp8_operand_paths_at_llama_heads(fp8_kv):
    """On the GPU (the inline PTX runs only there): Llama-3-8B heads, three sequences (4,000 tokens, so
    32 splits with the merge, then 300 and 17), a bf16 query, K with ~30 % subnormal values: each fp8
    operand path equals the reference on the fp8 pages within fp16 operand rounding, in the default tile,
    in 128-token tiles of 8 warps, with a key stream per warp (4 and 2 warps) and as one batched stream; the
    merge by programmatic dependent launch gives the same output."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k8, v8, tables, qsl, lens, ref = _llama_fp8_case(11)
    plain = paged_decode_attention(query, k8, v8, tables, qsl, lens, 0.3, fp8_kv=fp8_kv)
    assert rel_err(plain, ref) < 1e-2
    wide = paged_decode_attention(query, k8, v8, tables, qsl, lens, 0.3, fp8_kv=fp8_kv, block_n=128, num_warps=8)
    assert rel_err(wide, ref) < 1e-2
    for block_n, warps, streams in ((64, 4, 4), (32, 2, 2), (64, 4, 1)):
        out = paged_decode_attention(query, k8, v8, tables, qsl, lens, 0.3, fp8_kv=fp8_kv, block_n=block_n,
                                     num_warps=warps, key_streams=streams)  # fmt: skip
        assert rel_err(out, ref) < 1e-2, (block_n, warps, streams)
    pdl = paged_decode_attention(query, k8, v8, tables, qsl, lens, 0.3, fp8_kv=fp8_kv, pdl_merge=True)
    torch.testing.assert_close(pdl, plain, rtol=0, atol=0)


def test_fp8_launch_override_reads_tile_path_and_key_streams(monkeypatch):
    """FLOTILLA_DECODE_FP8_LAUNCH (what a device call's sweep hands to the engine) names the tile, the fp8
    operand path and optionally the key streams; anything else is refused."""
    from flotilla.kernels.triton_paged_decode import _FP8_FORM, _FP8_LAUNCH, _launch_defaults

    monkeypatch.delenv("FLOTILLA_DECODE_FP8_LAUNCH", raising=False)
    assert _launch_defaults(True) == (*_FP8_LAUNCH, _FP8_FORM)
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LAUNCH", "32,2,4,cvtpx,2")
    assert _launch_defaults(True) == (32, 2, 4, "cvtpx", 2, "")
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LAUNCH", "32,2,3,cvtpx,2t")
    assert _launch_defaults(True) == (32, 2, 3, "cvtpx", 2, "t")
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LAUNCH", "16,4,2,cvtpx,4h")
    assert _launch_defaults(True) == (16, 4, 2, "cvtpx", 4, "h")
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LAUNCH", "32,4,4,cvtpx,4h2")
    assert _launch_defaults(True) == (32, 4, 4, "cvtpx", 4, "h2")
    monkeypatch.setenv("FLOTILLA_DECODE_FP8_LAUNCH", "64,4,3,perm")
    assert _launch_defaults(True) == (64, 4, 3, "perm", 0, "")
    assert _launch_defaults(False)[3:] == ("cvt", 0, "")  # the bf16 pool keeps its own
    monkeypatch.setenv("FLOTILLA_DECODE_BF16_LAUNCH", "64,4,2,4t")
    assert _launch_defaults(False) == (64, 4, 2, "cvt", 4, "t")
    for bad in ("64,4,3,fast", "64,4,3,perm,ws", "64,4,3,perm,1,128", "64,4,3,perm,t", "64,4,3,perm,0t",
                "64,4,3,perm,2x", "64,4,3,perm,4h0", "64,4,3,perm,4t2", "64,4,3,perm,0h2"):  # fmt: skip
        monkeypatch.setenv("FLOTILLA_DECODE_FP8_LAUNCH", bad)
        with pytest.raises(AssertionError):
            _launch_defaults(True)
