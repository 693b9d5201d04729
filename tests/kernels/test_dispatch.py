"""Kernel dispatch: the reference on CPU without importing Triton, the Triton kernels on CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from kernel_cases import batch_meta, paged_pool, rel_err

from flotilla.kernels import dispatch
from flotilla.kernels.layernorm import rms_norm_ref
from flotilla.kernels.paged_attention import paged_attention_ref


def test_cpu_path_never_imports_triton_kernels():
    """Importing dispatch and calling it on CPU tensors loads no Triton kernel module."""
    code = (
        "import sys, torch\n"
        "from flotilla.kernels import dispatch\n"
        "x = torch.randn(2, 8); dispatch.rms_norm(x, torch.ones(8), 1e-6)\n"
        "dispatch.silu_and_mul(torch.randn(2, 8))\n"
        "bad = [m for m in sys.modules if m.startswith('flotilla.kernels.triton')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cpu_dispatch_is_the_reference():
    """On CPU the dispatch result is the reference's, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 16, generator=g), torch.randn(16, generator=g)
    assert torch.equal(dispatch.rms_norm(x, w, 1e-6)[0], rms_norm_ref(x, w, 1e-6)[0])


def _llama_step(q_lens, seq_lens, dtype=torch.bfloat16):
    """Llama-3-8B attention heads (32 q / 8 kv / 128) over 16-token pages, on the GPU."""
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache, tables = paged_pool(seq_lens, 8, 128, dtype, share_prefix_blocks=1, generator=g)
    query = torch.randn(sum(q_lens), 32, 128, generator=g).to(dtype).cuda()
    qsl, lens = batch_meta(q_lens, seq_lens)
    return query, k_cache.cuda(), v_cache.cuda(), tables.cuda(), qsl.cuda(), lens.cuda()


@pytest.mark.gpu
def test_cuda_decode_and_extend_match_reference_at_model_shapes():
    """Decode (hint 1) over contexts up to 3000 tokens; extend (no hint) with cached prefixes."""
    args = _llama_step([1] * 5, [1, 17, 513, 2048, 3000])
    assert rel_err(dispatch.paged_attention(*args, 0.088, max_query_len=1), paged_attention_ref(*args, 0.088)) < 1e-2
    args = _llama_step([300, 1, 77], [300, 900, 1100])
    assert rel_err(dispatch.paged_attention(*args, 0.088), paged_attention_ref(*args, 0.088)) < 1e-2


@pytest.mark.gpu
def test_cuda_decode_replays_inside_a_cuda_graph():
    """No host sync in the decode path: it captures, and a replay sees new sequence lengths."""
    query, k_cache, v_cache, tables, qsl, lens = _llama_step([1] * 4, [100, 200, 300, 400])
    run = lambda: dispatch.paged_attention(query, k_cache, v_cache, tables, qsl, lens, 0.088, max_query_len=1)  # noqa: E731
    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    lens.copy_(torch.tensor([5, 150, 257, 399], dtype=lens.dtype))  # within each table's blocks
    graph.replay()
    torch.cuda.synchronize()
    ref = paged_attention_ref(query, k_cache, v_cache, tables, qsl, lens, 0.088)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
def test_cuda_fused_layers_match_reference():
    """RMSNorm(+residual), rotary, SiLU-and-mul and KV write through dispatch at 4096 wide."""
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(64, 4096, generator=g).bfloat16().cuda() for _ in range(2))
    w = torch.randn(4096, generator=g).bfloat16().cuda()
    out, res = dispatch.rms_norm(x, w, 1e-5, r)
    ref, ref_res = rms_norm_ref(x, w, 1e-5, r)
    assert rel_err(out, ref) < 1e-2 and torch.equal(res, ref_res)
    gate_up = torch.randn(64, 2 * 4096, generator=g).bfloat16().cuda()
    assert (
        rel_err(dispatch.silu_and_mul(gate_up), torch.nn.functional.silu(gate_up[:, :4096]) * gate_up[:, 4096:]) < 1e-2
    )


@pytest.mark.gpu
def test_cuda_linear_takes_the_gemv_only_up_to_the_given_rows():
    """One decode row: cuBLAS's result at gemv_max_rows=0 (the default), the Triton GEMV's at 1."""
    from flotilla.kernels.triton_gemv import gemv

    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 4096, generator=g).bfloat16().cuda()
    w = torch.randn(1024, 4096, generator=g).bfloat16().cuda()
    assert torch.equal(dispatch.linear(x, w), torch.nn.functional.linear(x, w))
    assert torch.equal(dispatch.linear(x, w, gemv_max_rows=1), gemv(x, w, None))
    two = torch.randn(2, 4096, generator=g).bfloat16().cuda()
    assert torch.equal(dispatch.linear(two, w, gemv_max_rows=1), torch.nn.functional.linear(two, w))
