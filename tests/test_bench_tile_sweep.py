"""bench/tile_sweep.py's kernel families (bench/tile_families.py) without a GPU: each family's candidates are tiles
its kernel takes (the rope forms' qkv tiles hold whole rotation pairs, bf16's never split K), the start tables are
what the engine launches today, a table set the family's way reaches the lookups, and `--dry-run` finds the made-up
optimum and prints the lines that adopt it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import tile_descent  # noqa: E402 - bench/ is not a package
from tile_families import BF16, FAMILIES, FP8, SKINNY32, dry_start, rope_fits, skinny_key  # noqa: E402


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_candidates_are_valid_distinct_neighbours(name):
    """Every shape: the incumbent first, then distinct tiles the family's `valid` takes, one or two knobs away."""
    fam = FAMILIES[name]
    for shape, tile in dry_start(fam).items():
        cands = fam.candidates(shape, tile)
        assert cands[0] == tile and len(cands) > 5
        assert len({tuple(sorted(c.items())) for c in cands}) == len(cands)
        assert all(fam.valid(shape, c) and c.keys() == tile.keys() for c in cands)
        assert all(1 <= sum(c[k] != tile[k] for k in tile) <= 2 for c in cands[1:])


def test_rope_and_split_rules():
    """qkv tiles (the rope forms) hold whole pairs of a 128-wide head; bf16's qkv never splits K; the gated forms'
    register budget counts gate and up."""
    assert rope_fits(16) and rope_fits(128) and not rope_fits(256) and not rope_fits(1)
    qkv = {"block_n": 16, "block_k": 512, "split_k": 1, "num_warps": 4, "num_stages": 2}
    assert BF16.valid("qkv", qkv) and not BF16.valid("qkv", dict(qkv, split_k=2))
    assert not BF16.valid("qkv", dict(qkv, block_n=256)) and BF16.valid("o", dict(qkv, split_k=2))
    assert all(c["split_k"] == 1 for c in BF16.candidates("qkv", qkv))
    gated = {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3}
    assert BF16.valid("gate_up", gated) and not BF16.valid("gate_up", dict(gated, block_n=8))
    row = {"block_n": 64, "block_k": 512, "num_warps": 4, "prefetch": 2, "trigger": 0, "use_pdl": 1}
    assert FP8.valid("o", row) and not FP8.valid("gate_up", dict(row, block_k=1024))
    assert not FP8.valid("o", dict(row, prefetch=4)) and not FP8.valid("qkv", dict(row, block_n=256))


def test_start_tables_are_the_launches_of_today():
    """On no card (CPU): bf16 at `default_config`'s lead (qkv 16 x 512, o/down 8 x 512, gate_up 4 + 4 x 512 at 3
    stages, the head at LM_HEAD_GEMV's knobs); fp8 at session 16's measured knobs over the lead."""
    bf16 = BF16.start(None, 132)
    assert bf16["qkv"] == {"block_n": 16, "block_k": 512, "split_k": 1, "num_warps": 4, "num_stages": 2}
    assert bf16["o"] == bf16["down"] == dict(bf16["qkv"], block_n=8)
    assert bf16["gate_up"] == {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3}
    assert bf16["lm_head"]["block_k"] == 1024
    fp8 = FP8.start(None, 132)
    assert fp8["qkv"]["block_n"] == 8 and fp8["qkv"]["prefetch"] == 3 and fp8["o"]["block_k"] == 1024


def test_apply_reaches_the_lookups(monkeypatch):
    """A table set the family's way is what the kernels' lookups give (on any card), the start table's way back."""
    from flotilla.kernels import dispatch, triton_fp8_row_gemv, triton_gated_gemv, triton_gemv

    monkeypatch.setattr(triton_gemv, "_ONE_ROW", dict(triton_gemv._ONE_ROW))
    monkeypatch.setattr(triton_gated_gemv, "ENV_KNOBS", {})
    monkeypatch.setattr(dispatch, "LM_HEAD_GEMV", dict(dispatch.LM_HEAD_GEMV))
    monkeypatch.setattr(triton_fp8_row_gemv, "ENV_CONFIGS", {})
    start = BF16.start(None, 132)
    new = {**start, "o": dict(start["o"], block_n=16), "gate_up": dict(start["gate_up"], num_stages=2),
           "lm_head": dict(start["lm_head"], split_k=2)}  # fmt: skip
    BF16.apply(new)
    assert BF16.start("NVIDIA H200", 132) == new
    BF16.apply(start)
    assert BF16.start(None, 132) == start
    fp8 = FP8.start(None, 132)
    FP8.apply({**fp8, "down": dict(fp8["down"], num_warps=8)})
    assert FP8.start("NVIDIA H200", 132)["down"]["num_warps"] == 8


@pytest.mark.parametrize("name", ["bf16", "fp8", "skinny32"])
def test_dry_run_finds_the_made_up_optimum_and_prints_the_tables(name):
    """`--dry-run` (no GPU): the descent reaches the bowl's bottom and prints the per-card entry and the environment
    line that select it."""
    fam = FAMILIES[name]
    table = dry_start(fam)
    cost = tile_descent.bowl_cost(fam.dry_best)
    final = tile_descent.sweep_rounds(table, list(fam.shapes), fam.candidates, cost, lambda: False, 0.001, 3)
    assert cost(final) == pytest.approx(2.6)
    out = subprocess.run([sys.executable, str(BENCH / "tile_sweep.py"), "--family", name, "--dry-run"],
                         capture_output=True, text=True, check=True, timeout=300).stdout  # fmt: skip
    adopt = [line for line in out.splitlines() if line.startswith("SWEEP adopt:")]
    assert f"SWEEP dry-run {name}: " in out and "-> 2.600 ms" in out and len(adopt) >= 2
    key = {"bf16": "FLOTILLA_GEMV_CONFIG=", "fp8": "FLOTILLA_FP8_ROW_GEMV_CONFIG=",
           "skinny32": "FLOTILLA_SKINNY_GEMM_CONFIGS="}[name]
    assert key in adopt[-1]


def test_compile_worker_calls_each_host_with_a_candidates_knobs():
    """The warm-up's worker (`tile_sweep._warm_one`) launches a recorded host call once per candidate, the tile given
    as keywords: the bf16 GEMV (a split-K tile), the gated GEMV and the fp8 row GEMV's gated form (its recorded
    `gated=True` kept); a tile the kernel cannot take is counted as failed, not raised."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent / "kernels"))
    import tile_sweep
    from kernel_cases import DEVICE

    from flotilla.kernels.fp8_linear import quantize_fp8_rows

    x = torch.randn(1, 256).to(torch.bfloat16).to(DEVICE)
    w = torch.randn(64, 256).to(torch.bfloat16).to(DEVICE)
    w8, scale = (t.to(DEVICE) for t in quantize_fp8_rows(torch.randn(64, 256) / 16))
    gemv = {"block_n": 16, "block_k": 64, "split_k": 2, "num_warps": 2, "num_stages": 1}
    gated = {"block_n": 8, "block_k": 64, "num_warps": 2, "num_stages": 1}
    row = {"block_n": 8, "block_k": 128, "num_warps": 2, "prefetch": 1, "trigger": 0, "use_pdl": 0}
    jobs = [("triton_gemv", "gemv", [x, w], {"pdl": False}, [gemv, dict(gemv, block_k=48)]),
            ("triton_gated_gemv", "gated_gemv", [x, w], {"pdl": False}, [gated]),
            ("triton_fp8_row_gemv", "fp8_row_gemv", [x, w8, scale], {"gated": True}, [row])]  # fmt: skip
    done = [tile_sweep._warm_one((mod, fn, [tile_sweep._describe(a) for a in args],
                                  {k: tile_sweep._describe(v) for k, v in kw.items()}, tiles, str(DEVICE)))
            for mod, fn, args, kw, tiles in jobs]  # fmt: skip
    assert "gemv 2 tiles, 1 failed" in done[0]
    assert "gated_gemv 1 tiles, 0 failed" in done[1] and "fp8_row_gemv 1 tiles, 0 failed" in done[2]


def test_skinny32_starts_from_the_committed_table_on_every_card():
    """The skinny GEMM's start is what the engine launches at 32 rows today on the card: the committed table's entries
    (the H200's, serving every card without its own, and off CUDA: `dry_start`); the H100's own entry (session 33's
    sweep) starts there from o_proj without TMA, gate_up on 4 warps and down on cuBLAS."""
    from flotilla.kernels.card_tables import H100, H200

    start = SKINNY32.start(None, 132)
    assert start == SKINNY32.start(H200, 132) == SKINNY32.start("NVIDIA B200", 132) == dry_start(SKINNY32)
    h100 = SKINNY32.start(H100, 132)
    assert h100["qkv"] == start["qkv"] and h100["o"] == dict(start["o"], tma=0)
    assert h100["gate_up"] == dict(start["gate_up"], num_warps=4) and h100["down"]["cublas"] == 1
    assert start["o"] == {"block_n": 64, "block_k": 128, "split_k": 1, "num_warps": 4, "num_stages": 6, "tma": 1,
                          "cublas": 0}  # fmt: skip
    assert start["down"]["split_k"] == 2 and start["gate_up"]["block_n"] == 128
    assert skinny_key("gate_up") == (28672, 4096, 32, True) and skinny_key("qkv") == (6144, 4096, 32, False)


def test_skinny32_candidates_offer_cublas_and_fit_the_kernel():
    """Each shape's first candidate after the incumbent is cuBLAS (launched by no worker: `launch` is None); a
    cuBLAS incumbent's only neighbour is the tile it carries; every candidate's pipeline fits shared memory and its
    columns and K steps divide the shape; a candidate launches as the SkinnyGemmConfig of its knobs."""
    from flotilla.kernels.triton_skinny_gemm import SMEM_LIMIT, SkinnyGemmConfig, smem_bytes

    for shape, tile in dry_start(SKINNY32).items():
        cands = SKINNY32.candidates(shape, tile, 14)
        assert cands[1] == dict(tile, cublas=1) and SKINNY32.launch(cands[1]) is None
        assert len(cands) >= 10
        for c in cands[2:]:
            cfg = SKINNY32.launch(c)["config"]
            assert cfg == SkinnyGemmConfig(**{k: v for k, v in c.items() if k != "cublas"})
            assert smem_bytes(cfg, 32) <= SMEM_LIMIT  # gated: one pipeline at a time (`skinny_valid`)
        assert SKINNY32.candidates(shape, cands[1]) == [cands[1], tile]
    assert not SKINNY32.valid("o", dict(dry_start(SKINNY32)["o"], num_stages=12))  # 12 stages: past shared memory
    assert not SKINNY32.valid("down", dict(dry_start(SKINNY32)["down"], block_n=512))


def test_skinny32_apply_reaches_the_dispatch_on_every_card_and_adopt_round_trips(monkeypatch):
    """A table set the family's way is what the dispatch's lookups give on every card (a `cublas` tile keeps its shape
    on cuBLAS), `start` reads it back, and the adopt line's FLOTILLA_SKINNY_GEMM_CONFIGS parses to the card's whole
    table with those entries."""
    from flotilla.kernels import triton_skinny_gemm as sg
    from flotilla.kernels.card_tables import H100, H200

    monkeypatch.setattr(sg, "_TABLES", dict(sg._TABLES))
    start = SKINNY32.start(None, 132)
    new = {**start, "qkv": dict(start["qkv"], cublas=1), "down": dict(start["down"], split_k=4, tma=1)}
    SKINNY32.apply(new)
    for card in (None, H100, H200):
        assert sg.cublas_preferred(20, 6144, 4096, card=card) and not sg.measured(20, 6144, 4096, card=card)
        assert sg.default_config(20, 4096, 14336, 132, card=card) == sg.parse_config("bn=64,bk=128,sk=4,w=4,s=5,t=1")
        now = SKINNY32.start(card, 132)  # a cuBLAS entry carries the lead tile (the table keeps no knobs for it)
        assert now["qkv"]["cublas"] == 1 and {s: t for s, t in now.items() if s != "qkv"} == \
            {s: t for s, t in new.items() if s != "qkv"}
    SKINNY32.apply(start)
    assert SKINNY32.start(H100, 132) == start
    adopt = SKINNY32.adopt(new, H100)
    assert adopt[0].startswith('triton_skinny_gemm.MEASURED_CONFIGS["NVIDIA H100 80GB HBM3"] = "')
    spec = adopt[-1].removeprefix("FLOTILLA_SKINNY_GEMM_CONFIGS=").strip('"')
    assert sg.parse_configs(spec) == {**sg.parse_configs(sg.H200_CONFIGS), (6144, 4096, 32, False): None,
                                      (4096, 14336, 32, False): sg.parse_config("bn=64,bk=128,sk=4,w=4,s=5,t=1")}


def test_compile_worker_launches_a_skinny_candidate_from_its_config():
    """The warm-up's worker launches the recorded skinny-GEMM call (32 rows, the gated form) with a candidate's
    `config` keyword (`Family.launch`)."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent / "kernels"))
    import tile_sweep
    from kernel_cases import DEVICE

    x = torch.randn(32, 128).to(torch.bfloat16).to(DEVICE)
    w = torch.randn(256, 128).to(torch.bfloat16).to(DEVICE)
    tile = {"block_n": 64, "block_k": 64, "split_k": 2, "num_warps": 4, "num_stages": 2, "tma": 0, "cublas": 0}
    kws = [SKINNY32.launch(t) for t in (tile, dict(tile, cublas=1))]
    assert kws[1] is None
    done = tile_sweep._warm_one(("triton_skinny_gemm", "skinny_gemm", [tile_sweep._describe(a) for a in (x, w, None)],
                                 {"gated": ("V", True)}, kws[:1], str(DEVICE)))  # fmt: skip
    assert "skinny_gemm 1 tiles, 0 failed" in done


def test_extend_graph_records_a_cached_prefix_extend_on_cpu(tmp_path):
    """bench/extend_graph.py on the CPU (the graphs' padded buffers run eagerly): a request caches a prefix, the next
    one's 20-token extend over it is recorded as the step the graphs ran, in the 32-row one-sequence mixed graph; the
    greedy check's tokens are the same twice (its prefix cached the second time)."""
    import random

    from extend_graph import ExtendGraph
    from model_dirs import make_model_dir

    from flotilla.engine.cuda_graphs import GraphKey, StepGraphs
    from flotilla.engine.llm import LLM

    llm = LLM(str(make_model_dir("tiny-llama", tmp_path / "tiny", weights_seed=0)), device="cpu", max_model_len=256,
              block_size=8, enable_prefix_caching=True)  # fmt: skip
    engine, runner = llm.engine, llm.engine.runner
    runner.graphs = StepGraphs(runner.model, 8, engine.config.scheduler.max_num_batched_tokens, 256, 8, runner.device)
    vocab = engine.config.model.hf_config["vocab_size"]
    hits = engine.block_manager.prefix_cache_hits
    case = ExtendGraph(engine, vocab, random.Random(0), prefix_len=64, new=20)
    assert engine.block_manager.prefix_cache_hits - hits == 64
    assert case.describe() == {"new_tokens": 20, "context": 84, "graph_tokens": 32, "graph_seqs": 1,
                               "graph_width": case.key.width}  # fmt: skip
    assert case.key == GraphKey(False, 32, 1, case.key.width) and case.flat.positions == list(range(64, 84))
    assert "run" not in vars(runner.graphs)  # the recording wrapper is gone
    first = case.greedy(4)
    assert len(first) == 4 and case.greedy(4) == first

