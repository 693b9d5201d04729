"""Programmatic dependent launch through the batch-1 decode chain (`kernels/pdl.py`): the GEMV's peeled first K
step gives the plain loop's result bit for bit, the switch stays off where it cannot work, the L2 prefetch's
extent, and (on a Hopper GPU) the chain RMSNorm -> GEMV -> SiLU-and-mul -> GEMV -> RMSNorm -> rotary + KV write,
launched by PDL and replayed in a CUDA graph, equal to the plain launches."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRETING, linear_case

from flotilla.kernels.fp8_linear import quantize_fp8_rows


def _hopper() -> bool:
    return DEVICE.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)


# (m, n, k, dtype, knobs): FMA tiles ending mid-tile, split-K partials, the dot path, one K tile only
CASES = [
    (1, 40, 200, torch.bfloat16, dict(block_n=16, block_k=64, split_k=1, use_dot=False)),
    (3, 40, 200, torch.float32, dict(block_n=16, block_k=64, split_k=3, use_dot=False)),
    (8, 40, 200, torch.bfloat16, dict(block_n=16, block_k=32, split_k=2, use_dot=True)),
    (1, 24, 48, torch.float32, dict(block_n=8, block_k=64, split_k=1, use_dot=False)),
]


@pytest.mark.parametrize("m,n,k,dtype,knobs", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_peeled_first_step_is_bit_equal_to_the_loop(m, n, k, dtype, knobs, bias):
    """The PDL variant loads the first weight tile before the wait and runs that step outside the loop: the
    same products summed in the same order. Under the interpreter the peel runs without the griddepcontrol
    instructions (`pdl_gdc=False`); on a Hopper GPU with them, launched by PDL."""
    from flotilla.kernels.triton_gemv import gemv

    x, weight, b = linear_case(m, n, k, dtype, bias=bias, seed=7)
    plain = gemv(x, weight, b, pdl=False, **knobs)
    peeled = gemv(x, weight, b, pdl=True, pdl_gdc=_hopper(), **knobs)
    assert torch.equal(peeled, plain)


@pytest.mark.parametrize("m,split_k,use_dot", [(1, 1, False), (2, 2, False), (5, 1, True)])
def test_peeled_fp8_weight_step_is_bit_equal(m, split_k, use_dot):
    """W8A16: the fp8 tile converted in registers and the per-output scale after the sum, peeled or not."""
    from flotilla.kernels.triton_gemv import fp8_gemv

    g = torch.Generator().manual_seed(3)
    x = torch.randn(m, 96, generator=g).to(torch.bfloat16).to(DEVICE)
    w8, scale = quantize_fp8_rows(torch.randn(48, 96, generator=g) / 10)
    w8, scale = w8.to(DEVICE), scale.to(DEVICE)
    knobs = dict(block_n=16, block_k=32, split_k=split_k, use_dot=use_dot)
    plain = fp8_gemv(x, w8, scale, pdl=False, **knobs)
    assert torch.equal(fp8_gemv(x, w8, scale, pdl=True, pdl_gdc=_hopper(), **knobs), plain)


def test_only_the_one_row_chain_launches_by_pdl(monkeypatch):
    """On a capable device with FLOTILLA_PDL on, a kernel launches by PDL at one row only (batch 64 measured slower
    with it), and an fp8 GEMV (a weight scale) never does."""
    from flotilla.kernels import pdl, triton_gemv

    monkeypatch.setattr(pdl, "PDL_ENABLED", True)
    monkeypatch.setattr(pdl, "pdl_capable", lambda tensor: True)
    assert pdl.pdl_active(torch.zeros(1, 4096)) and pdl.pdl_launch_options(torch.zeros(1, 8)) == {
        "PDL": True, "launch_pdl": True}
    assert not pdl.pdl_active(torch.zeros(64, 4096)) and pdl.pdl_launch_options(torch.zeros(2, 8)) == {}
    launched = []
    monkeypatch.setattr(triton_gemv, "pdl_active", lambda tensor: True)
    real = triton_gemv._gemv_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append("PDL" in kwargs)
                return real[grid](*args, **{k: v for k, v in kwargs.items() if k not in ("launch_pdl",)})
            return launch

    monkeypatch.setattr(triton_gemv, "_gemv_kernel", Spy())
    x = torch.randn(1, 64, device=DEVICE)
    w8 = torch.randn(32, 64, device=DEVICE).to(torch.float8_e4m3fn)
    scale = torch.ones(32, device=DEVICE)
    triton_gemv.fp8_gemv(x, w8, scale, block_n=16, block_k=32, split_k=1, pdl_gdc=False)
    assert launched == [False]


def test_switch_is_off_where_pdl_cannot_run(monkeypatch):
    """FLOTILLA_PDL on, but a CPU tensor (or the interpreter): plain launches, no options."""
    from flotilla.kernels import pdl

    monkeypatch.setattr(pdl, "PDL_ENABLED", True)
    cpu = torch.zeros(1)
    assert not pdl.pdl_active(cpu) and pdl.pdl_launch_options(cpu) == {}
    if INTERPRETING:
        assert not pdl.pdl_capable(torch.zeros(1, device=DEVICE))
    monkeypatch.setattr(pdl, "PDL_ENABLED", False)
    assert pdl.pdl_launch_options(torch.zeros(1, device=DEVICE)) == {}


def test_l2_prefetch_extent_keeps_the_budget_and_16_byte_bulk_sizes():
    """All of K when the weight fits the budget; else the rows' first part within it, each of a row's
    prefetches a whole number of 16-byte units; none without a budget or with rows off 16 bytes."""
    from flotilla.kernels.triton_gemv import l2_prefetch_k

    w = torch.empty(4096, 4096, dtype=torch.bfloat16)
    assert l2_prefetch_k(4096, 4096, w, 8, 64) == 4096  # o_proj's 32 MiB within 64 MiB
    part = l2_prefetch_k(4096, 4096, w, 8, 8)  # 8 MiB of it: a quarter of each row
    assert part == 1024 and (part // 8 * 2) % 16 == 0
    qkv = l2_prefetch_k(6144, 4096, torch.empty(6144, 4096, dtype=torch.bfloat16), 8, 24)
    assert qkv * 6144 * 2 <= 24 << 20 and qkv % 64 == 0 and qkv > 0
    fp8 = l2_prefetch_k(28672, 4096, torch.empty(28672, 4096, dtype=torch.float8_e4m3fn), 16, 24)
    assert fp8 * 28672 <= 24 << 20 and (fp8 // 16) % 16 == 0
    assert l2_prefetch_k(4096, 4096, w, 8, 0) == 0
    assert l2_prefetch_k(40, 100, torch.empty(40, 101, dtype=torch.bfloat16)[:, :100], 8, 64) == 0  # 202-byte rows


def test_cublas_prefetch_extent_and_no_op_without_pdl(monkeypatch):
    """The launch ahead of a cuBLAS projection: the weight's first budget bytes over the threads of one program
    an SM, 16-byte requests; nothing for a strided weight, without a budget, or where PDL is off."""
    from flotilla.kernels import pdl
    from flotilla.kernels.triton_l2_prefetch import l2_prefetch, l2_prefetch_bytes

    gate_up = torch.empty(28672, 4096, dtype=torch.bfloat16)
    chunk = l2_prefetch_bytes(gate_up, 24, 132)
    assert chunk % 16 == 0 and 0 < chunk * 132 * 128 <= 24 << 20 and (chunk + 16) * 132 * 128 > 24 << 20
    assert l2_prefetch_bytes(gate_up[:, :2048], 24, 132) == 0 and l2_prefetch_bytes(gate_up, 0, 132) == 0
    small = torch.empty(64, 64, dtype=torch.bfloat16)  # 8 KB: all of it, if it makes a 16-byte request a thread
    assert l2_prefetch_bytes(small, 24, 4) == 16 and l2_prefetch_bytes(small, 24, 132) == 0
    monkeypatch.setattr(pdl, "PDL_ENABLED", True)
    l2_prefetch(small, small[:1], 24)  # a CPU tensor: nothing launched


def _chain(x, residual, norm_w, w_up, w_down, qkv_w, positions, cos_sin, k_cache, v_cache, slots):
    """A layer's batch-1 kernels in launch order, each reading its predecessor's output; gate/up on cuBLAS with
    the L2 prefetch ahead of it, as the dispatch runs bf16's."""
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_gemv import gemv
    from flotilla.kernels.triton_l2_prefetch import l2_prefetch
    from flotilla.kernels.triton_rmsnorm import rms_norm
    from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

    h, residual = rms_norm(x, norm_w, 1e-5, residual)
    l2_prefetch(w_up, h)
    h = gemv(silu_and_mul(torch.nn.functional.linear(h, w_up)), w_down)
    h, residual = rms_norm(h, norm_w, 1e-5, residual)
    q, k, v = gemv(h, qkv_w).split([256, 128, 128], dim=-1)
    q = rotary_and_write_kv(positions, q.view(1, 4, 64), k.view(1, 2, 64), v.view(1, 2, 64), cos_sin, k_cache,
                            v_cache, slots)  # fmt: skip
    return q, residual


@pytest.mark.gpu
@pytest.mark.parametrize("l2_mb", [0.0, 0.5])
def test_chain_launched_by_pdl_in_a_cuda_graph_equals_plain_launches(monkeypatch, l2_mb):
    """Hopper only: the chain with every kernel launched by PDL (and the GEMVs' L2 prefetch), captured in a CUDA
    graph and replayed on new inputs, equals the same chain launched plainly, bit for bit."""
    if not _hopper():
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    from flotilla.kernels import pdl, triton_gemv, triton_l2_prefetch

    g = torch.Generator().manual_seed(11)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).cuda()

    hidden, inter = 512, 1024
    weights = (rnd(hidden), rnd(2 * inter, hidden, scale=hidden**-0.5), rnd(hidden, inter, scale=inter**-0.5),
               rnd(512, hidden, scale=hidden**-0.5))  # fmt: skip
    positions, slots = torch.tensor([37], device="cuda"), torch.tensor([21], device="cuda")
    cos_sin = torch.randn(64, 64, generator=g).cuda()
    pool = rnd(2, 4, 16, 2, 64)

    def run(x, residual, caches):
        return _chain(x, residual, *weights, positions, cos_sin, *caches, slots)

    inputs = [(rnd(1, hidden), rnd(1, hidden)) for _ in range(3)]
    monkeypatch.setattr(pdl, "PDL_ENABLED", False)  # the reference: plain launches, whatever FLOTILLA_PDL says
    plain = []
    for x, r in inputs:
        caches = (pool[0].clone(), pool[1].clone())
        plain.append((run(x, r, caches), caches))
    monkeypatch.setattr(pdl, "PDL_ENABLED", True)
    monkeypatch.setattr(triton_gemv, "L2_PREFETCH_MB", l2_mb)
    monkeypatch.setattr(triton_l2_prefetch, "L2_PREFETCH_MB", l2_mb)
    x_buf, r_buf = torch.empty_like(inputs[0][0]), torch.empty_like(inputs[0][1])
    caches = (pool[0].clone(), pool[1].clone())
    run(x_buf.copy_(inputs[0][0]), r_buf.copy_(inputs[0][1]), caches)  # compile the PDL variants outside capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = run(x_buf, r_buf, caches)
    torch.cuda.current_stream().wait_stream(stream)
    for (x, r), ((q_ref, res_ref), (k_ref, v_ref)) in zip(inputs, plain, strict=True):
        x_buf.copy_(x)
        r_buf.copy_(r)
        caches[0].copy_(pool[0])
        caches[1].copy_(pool[1])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], q_ref) and torch.equal(out[1], res_ref)
        assert torch.equal(caches[0], k_ref) and torch.equal(caches[1], v_ref)
