"""The one-row qkv GEMV with rotary + KV write in its epilogue (`triton_gemv_rope.py`): the rotated query and the
cache contents equal the unfused pair's (the plain GEMV, then `rotary_and_write_kv`) bit for bit, and its PyTorch
reference to rounding; where it applies (`fuses_rope`)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRETING, assert_same_rope_writes, linear_case, rel_err

from flotilla.engine.layers.rotary import _cos_sin_table


def _hopper() -> bool:
    return DEVICE.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)


def _case(heads, kv_heads, head_dim, k, dtype, bias, cache_dtype, seed=0):
    """x, the qkv weight (and bias), the cos/sin table, a seeded `[3, 16, Hkv, D]` K and V pool each."""
    x, weight, b = linear_case(1, (heads + 2 * kv_heads) * head_dim, k, dtype, bias=bias, seed=seed)
    cos_sin = _cos_sin_table(head_dim, 256, 10000.0, "null", torch.device("cpu")).to(DEVICE)
    g = torch.Generator().manual_seed(seed + 1)
    pools = [torch.randn(3, 16, kv_heads, head_dim, generator=g).to(cache_dtype).to(DEVICE) for _ in range(2)]
    return x, weight, b, cos_sin, pools


def _unfused(x, weight, b, positions, cos_sin, k_cache, v_cache, slots, heads, kv_heads, scales):
    from flotilla.kernels.triton_gemv import gemv
    from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

    d = cos_sin.shape[-1]
    q, k, v = gemv(x, weight, b, pdl=False).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    return rotary_and_write_kv(positions, q.view(1, heads, d), k.view(1, kv_heads, d), v.view(1, kv_heads, d),
                               cos_sin, k_cache, v_cache, slots, *scales)  # fmt: skip


# (heads, kv_heads, head_dim, K, dtype, bias, cache dtype, position, slot, peeled PDL step)
CASES = [
    (4, 2, 32, 1100, torch.bfloat16, False, torch.bfloat16, 7, 21, False),  # 3 K steps, the last ragged
    (4, 2, 64, 200, torch.bfloat16, True, torch.bfloat16, 130, 47, False),  # Qwen2's qkv bias, one K tile
    (2, 1, 128, 256, torch.float16, False, torch.float16, 0, 3, True),  # Llama's head_dim, fp16, the PDL peel
    (4, 2, 32, 512, torch.bfloat16, False, torch.float8_e4m3fn, 255, 16, False),  # an fp8 cache with scales
    (4, 2, 32, 96, torch.bfloat16, False, torch.bfloat16, 9, -1, True),  # padding slot: no cache write
]


@pytest.mark.parametrize("heads,kv_heads,head_dim,k,dtype,bias,cache_dtype,pos,slot,peeled", CASES)
def test_query_and_cache_equal_the_unfused_pair_bit_for_bit(heads, kv_heads, head_dim, k, dtype, bias, cache_dtype,
                                                            pos, slot, peeled):  # fmt: skip
    from flotilla.kernels.triton_gemv_rope import fuses_rope, gemv_rope, gemv_rope_ref

    x, weight, b, cos_sin, (kc, vc) = _case(heads, kv_heads, head_dim, k, dtype, bias, cache_dtype)
    assert fuses_rope(x, weight, head_dim)
    positions = torch.tensor([pos], device=DEVICE)
    slots = torch.tensor([slot], device=DEVICE)
    scales = (0.5, 2.0) if cache_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    want_k, want_v = kc.clone(), vc.clone()
    want_q = _unfused(x, weight, b, positions, cos_sin, want_k, want_v, slots, heads, kv_heads, scales)
    got_k, got_v = kc.clone(), vc.clone()
    got_q = gemv_rope(x, weight, b, positions, cos_sin, got_k, got_v, slots, heads, kv_heads, *scales,
                      pdl=peeled, pdl_gdc=_hopper())  # fmt: skip
    assert got_q.shape == (1, heads, head_dim)
    assert_same_rope_writes((got_q, got_k, got_v), (want_q, want_k, want_v), (kc, vc), slot, dtype)
    ref_k, ref_v = kc.clone(), vc.clone()
    ref_q = gemv_rope_ref(x, weight, b, positions, cos_sin, ref_k, ref_v, slots, heads, kv_heads, *scales)
    assert rel_err(got_q, ref_q) < 1e-2
    assert rel_err(got_k.float(), ref_k.float()) < 1e-2 and rel_err(got_v.float(), ref_v.float()) < 1e-2


def test_applies_only_where_the_plain_gemv_is_one_range_of_head_sized_tiles():
    """One bf16/fp16 row, a weight of its dtype, FMA tiles of one K range no wider than a head."""
    from flotilla.kernels.triton_gemv_rope import fuses_rope

    x, weight, _ = linear_case(1, 6144, 4096, torch.bfloat16, bias=False)
    assert fuses_rope(x, weight, 128)  # Llama-3.1-8B's qkv: 16-row tiles, 384 programs
    assert not fuses_rope(x.float(), weight.float(), 128)  # fp32
    assert not fuses_rope(torch.cat([x, x]), weight, 128)  # two rows
    assert not fuses_rope(x, weight.half(), 128)  # mixed dtypes
    assert not fuses_rope(x, weight, 8)  # a 16-row tile spans two heads of 8
    small_x, small_w, _ = linear_case(1, 64, 8192, torch.bfloat16, bias=False)
    assert not fuses_rope(small_x, small_w, 32)  # the plain GEMV would split K


@pytest.mark.skipif(not INTERPRETING, reason="the dispatch's device check is bypassed only under the interpreter")
def test_dispatch_takes_only_switched_on_cuda_rows(monkeypatch):
    """`qkv_rope_takes` switched on: on CPU tensors never (the CPU path keeps the reference pair)."""
    from flotilla.kernels import dispatch

    x, weight, _ = linear_case(1, 6144, 4096, torch.bfloat16, bias=False)
    monkeypatch.setattr(dispatch, "QKV_ROPE", True)
    assert not dispatch.qkv_rope_takes(x, weight, 128, 1)  # CPU tensors


@pytest.mark.skipif(not INTERPRETING, reason="runs the kernels on the CPU model's tensors under the interpreter")
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_tokens_equal_through_the_model_path(tiny_model_dirs, monkeypatch, arch):
    """A tiny model's greedy tokens, one sequence at a time (one-row decode steps), with the fused kernel behind
    `LlamaAttention`'s dispatch equal those of the unfused Triton pair (the GEMV, then `rotary_and_write_kv`) at
    the same seam; Qwen2's qkv bias goes in, Qwen3's q/k norm stays out. The dispatch rule is `qkv_rope_takes`'
    without its CUDA check (the interpreter runs on CPU tensors)."""
    import flotilla.engine.layers.attention as attention
    import flotilla.engine.models.llama as llama
    import flotilla.engine.models.llama_cpu_decode as fast
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.kernels.triton_gemv_rope import fuses_rope

    monkeypatch.setattr(fast, "CPU_DECODE_LAYERS", False)  # the module path, where LlamaAttention dispatches
    llm = LLM(str(tiny_model_dirs[arch]), dtype="bfloat16", max_model_len=256, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    taken: list[bool] = []

    def takes(x: torch.Tensor, weight: torch.Tensor, head_dim: int, gemv_max_rows: int) -> bool:
        ok = x.dim() == 2 and x.shape[0] == 1 <= gemv_max_rows and fuses_rope(x, weight, head_dim)
        taken.append(ok)
        return ok

    def run() -> list[list[int]]:
        prompts = [[5, 6, 7, 8, 9], [11, 12, 13] * 10]
        return [list(llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].token_ids)
                for p in prompts]  # fmt: skip

    def pair(x, weight, b, positions, cos_sin, k_cache, v_cache, slots, heads, kv_heads, k_scale, v_scale):
        return _unfused(x, weight, b, positions, cos_sin, k_cache, v_cache, slots, heads, kv_heads, (k_scale, v_scale))

    monkeypatch.setattr(llama, "qkv_rope_takes", takes)
    fused = attention.qkv_rotary_and_write_kv
    monkeypatch.setattr(attention, "qkv_rotary_and_write_kv", pair)
    want = run()
    monkeypatch.setattr(attention, "qkv_rotary_and_write_kv", fused)
    assert run() == want
    assert any(taken) == (arch != "qwen3")


def test_the_fused_path_steps_aside_for_a_hook_on_attention(monkeypatch):
    """`LlamaAttention` skips the fused kernel while a forward pre-hook watches `Attention.forward` (the
    `--calculate-kv-scales` calibration reads k and v there: the fused path never calls it)."""
    import flotilla.engine.models.llama as llama

    arch = llama.LlamaArch.from_hf({"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1})
    layer = llama.LlamaAttention(arch)
    projected: list[bool] = []
    monkeypatch.setattr(llama, "qkv_rope_takes", lambda *args: True)
    monkeypatch.setattr(layer.attn, "forward_projected", lambda x, *args: projected.append(True) or x.new_zeros(1, 64))
    hidden, positions = torch.zeros(1, 64), torch.zeros(1, dtype=torch.long)
    layer(positions, hidden)
    assert projected == [True]
    seen: list[bool] = []
    layer.attn.register_forward_pre_hook(lambda module, args: seen.append(True))
    layer(positions, hidden)  # no attention metadata: Attention.forward's zeros
    assert projected == [True] and seen == [True]
