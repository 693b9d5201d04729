"""Skinny decode GEMM (Triton, swap-AB, split-K with an in-kernel fix-up, gated SiLU epilogue) against
`skinny_gemm_ref` (`F.linear`, then `silu_and_mul_ref`), and its shapes-only configuration."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import linear_case, rel_err, tolerance

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,split_k,bias", [(17, 1, True), (5, 3, False), (32, 2, True)])
@pytest.mark.parametrize("tma", [0, 1])
def test_matches_reference_with_and_without_split_k(dtype, m, split_k, bias, tma):
    """M below, at and between powers of two (the batch masked inside a 16/32-wide tile, or zero-filled by
    the tensor descriptor); with split-K the last program of each column tile sums the partials (3 ranges
    over 6 K tiles) and adds the bias."""
    from flotilla.kernels.triton_skinny_gemm import SkinnyGemmConfig, skinny_gemm, skinny_gemm_ref

    x, weight, b = linear_case(m, 256, 192, dtype, bias=bias)
    cfg = SkinnyGemmConfig(block_n=128, block_k=32, split_k=split_k, num_warps=4, num_stages=2, tma=tma)
    out = skinny_gemm(x, weight, b, config=cfg)
    assert out.dtype == dtype and out.shape == (m, 256)
    assert rel_err(out, skinny_gemm_ref(x, weight, b)) < tolerance(dtype)


@pytest.mark.parametrize("tma", [0, 1])
def test_ragged_k_and_counters_reset_between_calls(tma):
    """K = 200 ends mid-tile (the masked loop; the descriptor's zero fill); two split-K calls in a row give
    the same result, so the arrival counters were left at zero by the first."""
    from flotilla.kernels.triton_skinny_gemm import SkinnyGemmConfig, skinny_gemm, skinny_gemm_ref

    x, weight, _ = linear_case(9, 128, 200, torch.float32, seed=1, bias=False)
    cfg = SkinnyGemmConfig(block_n=128, block_k=32, split_k=3, num_stages=2, tma=tma)
    first = skinny_gemm(x, weight, config=cfg)
    second = skinny_gemm(x, weight, config=cfg)
    assert torch.equal(first, second)
    assert rel_err(first, skinny_gemm_ref(x, weight)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k,bias,tma", [(1, False, 0), (2, True, 0), (2, True, 1)])
def test_gated_epilogue_matches_linear_then_silu_and_mul(dtype, split_k, bias, tma):
    """The merged gate/up weight `[2N, K]`: the output is `silu(gate) * up` `[M, N]`, rounded as the two
    reference steps round (bf16: the projection, then the SiLU, then the product)."""
    from flotilla.kernels.triton_skinny_gemm import SkinnyGemmConfig, skinny_gemm, skinny_gemm_ref

    x, weight, b = linear_case(20, 256, 128, dtype, bias=bias, seed=2)
    cfg = SkinnyGemmConfig(block_n=128, block_k=32, split_k=split_k, num_stages=2, tma=tma)
    out = skinny_gemm(x, weight, b, gated=True, config=cfg)
    assert out.shape == (20, 128)
    assert rel_err(out, skinny_gemm_ref(x, weight, b, gated=True)) < tolerance(dtype)


@pytest.mark.parametrize("gated,tma", [(False, 0), (False, 1), (True, 0)])
def test_narrow_column_tiles_of_32_rows(gated, tma):
    """32-wide column tiles (the bench's grid at batch tiles of 32 tries them: twice the programs of 64-wide
    tiles without a split-K fix-up; on sm_90 the MMA falls back from wgmma's 64 rows to mma.sync), M = 24
    masked inside the 32-row batch tile, plain and gated."""
    from flotilla.kernels.triton_skinny_gemm import SkinnyGemmConfig, skinny_gemm, skinny_gemm_ref

    x, weight, b = linear_case(24, 256, 128, torch.bfloat16, bias=not gated, seed=3)
    cfg = SkinnyGemmConfig(block_n=32, block_k=32, num_warps=4, num_stages=2, tma=tma)
    out = skinny_gemm(x, weight, b, gated=gated, config=cfg)
    assert out.shape == (24, 128 if gated else 256)
    assert rel_err(out, skinny_gemm_ref(x, weight, b, gated=gated)) < tolerance(torch.bfloat16)


def test_default_config_follows_the_table_and_fits_shared_memory(monkeypatch):
    """Unlisted shapes take the measured winners' shape (no split of K); listed ones their entry; every
    default fits the pipeline in shared memory. The measured table parses and covers Llama-3.1-8B's
    projections at the engine's batch tiles."""
    from flotilla.kernels import triton_skinny_gemm as sg
    from flotilla.kernels.card_tables import DEFAULT
    from flotilla.kernels.triton_skinny_gemm import block_m, default_config, smem_bytes

    monkeypatch.setattr(sg, "_TABLES", {DEFAULT: {}})
    assert default_config(64, 4096, 4096, 132) == sg.SkinnyGemmConfig(block_n=64, block_k=128, num_stages=6)
    monkeypatch.setattr(sg, "_TABLES", {DEFAULT: sg.parse_configs(sg.MEASURED_CONFIGS[DEFAULT])})
    assert default_config(64, 4096, 14336, 132) == sg.parse_config("bn=64,bk=128,sk=1,w=4,s=6,t=1")
    assert sg.measured(64, 28672, 4096, gated=True) and sg.cublas_preferred(128, 6144, 4096)
    assert not sg.measured(64, 1000, 4096)
    for m in (17, 32, 64, 128, 256):
        for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
            for gated in (False, True):
                cfg = default_config(m, n, k, 132, gated)
                assert smem_bytes(cfg, block_m(m), gated) <= 220 * 1024
    assert [block_m(m) for m in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, 128]


def test_configs_parse_from_the_environment_form():
    """FLOTILLA_SKINNY_GEMM_CONFIGS: per `NxK@BLOCK_M` shape, the knobs the sweep prints (`spec`)."""
    from flotilla.kernels.triton_skinny_gemm import SkinnyGemmConfig, config_key, parse_configs

    cfg = SkinnyGemmConfig(block_n=256, block_k=128, split_k=3, num_warps=8, num_stages=3)
    table = parse_configs(f"4096x4096@64:{cfg.spec()}; 6144x4096@32:bn=64;{config_key(28672, 4096, 64, True)}:sk=2")
    assert table == {(4096, 4096, 64, False): cfg, (6144, 4096, 32, False): SkinnyGemmConfig(block_n=64),
                     (28672, 4096, 64, True): SkinnyGemmConfig(split_k=2)}
    assert parse_configs("") == {}


def test_a_cublas_entry_keeps_its_shape_on_cublas(monkeypatch):
    """The sweep writes `cublas` for shapes where cuBLAS was faster: the dispatch then leaves them alone,
    per padded batch tile and per epilogue (gated or not)."""
    from flotilla.kernels import triton_skinny_gemm as sg
    from flotilla.kernels.card_tables import DEFAULT

    table = sg.parse_configs("4096x4096@64:cublas;28672x4096@64+silu:bn=64")
    assert table == {(4096, 4096, 64, False): None, (28672, 4096, 64, True): sg.SkinnyGemmConfig(block_n=64)}
    monkeypatch.setattr(sg, "_TABLES", {DEFAULT: table})
    assert sg.cublas_preferred(64, 4096, 4096) and sg.cublas_preferred(48, 4096, 4096)
    assert not sg.cublas_preferred(32, 4096, 4096) and not sg.cublas_preferred(64, 28672, 4096, gated=True)
    assert sg.default_config(64, 14336, 4096, 132, gated=True) == sg.SkinnyGemmConfig(block_n=64)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 17, 64, 129])
def test_dispatch_takes_the_skinny_gemm_only_for_decode_batches(monkeypatch, m):
    """Switched on for every shape, `linear` and `silu_and_mul_linear` give the references' results at every
    M; 17..128 rows run the skinny GEMM (counted), 16 and 129 stay on cuBLAS."""
    from flotilla.kernels import dispatch, triton_skinny_gemm

    calls = []
    real = triton_skinny_gemm.skinny_gemm
    monkeypatch.setattr(dispatch, "SKINNY_GEMM_MODE", "all")
    monkeypatch.setattr(triton_skinny_gemm, "skinny_gemm", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    x, weight, b = linear_case(m, 512, 256, torch.bfloat16, bias=True, seed=4)
    assert rel_err(dispatch.linear(x, weight, b), triton_skinny_gemm.skinny_gemm_ref(x, weight, b)) < 1.5e-2
    gated = dispatch.silu_and_mul_linear(x, weight, b)
    assert rel_err(gated, triton_skinny_gemm.skinny_gemm_ref(x, weight, b, gated=True)) < 1.5e-2
    assert len(calls) == (2 if 17 <= m <= 128 else 0)


def test_every_card_resolves_the_h200_table_until_it_has_its_own(monkeypatch):
    """Per-card tables (`card_tables.py`): the H200's table is `DEFAULT`'s too, so a card without an entry and off CUDA
    launch each Llama projection at every batch tile as the H200; the H100's own entry (session 33) differs at the
    32-row tile only (o_proj without TMA, gate_up + SiLU on 4 warps, down on cuBLAS); a card given its own entry gets
    it, the others keep theirs."""
    from flotilla.kernels import triton_skinny_gemm as sg
    from flotilla.kernels.card_tables import DEFAULT, H100, H200

    assert sg.MEASURED_CONFIGS[DEFAULT] == sg.MEASURED_CONFIGS[H200] == sg.H200_CONFIGS
    shapes = [(n, k, m, g) for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
              for m in (17, 20, 32, 64, 128) for g in (False, True)]  # fmt: skip

    def launches(card):
        return [(sg.default_config(m, n // 2 if g else n, k, 132, g, card), sg.measured(m, n, k, g, card),
                 sg.cublas_preferred(m, n, k, g, card)) for n, k, m, g in shapes]  # fmt: skip

    assert launches(H200) == launches("NVIDIA B200") == launches(None)
    h100, h200 = launches(H100), launches(H200)
    differ = {(n, k, g) for (n, k, m, g), a, b in zip(shapes, h100, h200, strict=True) if a != b}
    assert differ == {(4096, 4096, False), (28672, 4096, True), (4096, 14336, False)}
    assert all(a == b for (_, _, m, _), a, b in zip(shapes, h100, h200, strict=True) if m > 32)
    assert sg.cublas_preferred(20, 4096, 14336, card=H100) and not sg.cublas_preferred(20, 4096, 14336, card=H200)
    assert sg.default_config(20, 14336, 4096, 132, True, H100).num_warps == 4
    own = sg.parse_configs("4096x4096@32:bn=128,bk=64,sk=2,w=8,s=3,t=0;6144x4096@32:cublas")
    monkeypatch.setattr(sg, "_TABLES", {**sg._TABLES, H100: {**sg.configs(H200), **own}})
    assert sg.default_config(20, 4096, 4096, 132, card=H100) == own[(4096, 4096, 32, False)]
    assert sg.cublas_preferred(20, 6144, 4096, card=H100) and not sg.cublas_preferred(20, 6144, 4096, card=H200)
    assert sg.default_config(20, 4096, 4096, 132, card=H200) == sg.parse_config("bn=64,bk=128,sk=1,w=4,s=6,t=1")


def test_set_configs_reaches_every_card_and_restores(monkeypatch):
    """`set_configs` (bench/tile_sweep.py's skinny32 family) replaces its entries on every card's table, keeping the
    rest; `restore_configs` puts the tables back; `table_spec` writes a table `parse_configs` reads back equal."""
    from flotilla.kernels import triton_skinny_gemm as sg
    from flotilla.kernels.card_tables import H100, H200

    monkeypatch.setattr(sg, "_TABLES", dict(sg._TABLES))
    before = {card: dict(sg.configs(card)) for card in (None, H100, H200)}
    new = {(4096, 14336, 32, False): sg.parse_config("bn=128,bk=128,sk=4,w=4,s=4,t=1"),
           (28672, 4096, 32, True): None}  # fmt: skip
    previous = sg.set_configs(new)
    for card in (None, H100, H200):
        assert sg.configs(card) == {**before[card], **new}
        assert sg.cublas_preferred(32, 28672, 4096, gated=True, card=card)
    assert sg.parse_configs(sg.table_spec(sg.configs(H200))) == sg.configs(H200)
    sg.restore_configs(previous)
    assert {card: sg.configs(card) for card in (None, H100, H200)} == before
    assert sg.parse_configs(sg.table_spec(before[None])) == sg.parse_configs(sg.H200_CONFIGS)
