"""Where the int4 (W4A16) batch-1 decode step's time goes, and the step with the wide int4 GEMV's PDL launches
(FLOTILLA_INT4_WIDE_PDL) against main's plain ones, in ONE engine.

    python3 bench/int4_step_ab.py --model /tmp/llama8b-w4a16 --json int4-step.json [--variants main,top,late,...]

The engine (Llama-3.1-8B shape, compressed-tensors W4A16 g128 from bench/results/w4a16-model.sh, random codes under
`--load-format dummy`) starts once; each variant is set in-process (the module globals the kernels read at every
call: `triton_int4_gemv_wide.WIDE_PDL` and `_PDL_TILES`; `pdl.PDL_ENABLED` for the PDL-off profile) and the batch-1
decode graphs are captured again (`quant_gpu._recapture_decode`). Jobs, in order:
- `profile_pdl_off`: main's step with FLOTILLA_PDL off (every kernel launched plainly: kernel times do not overlap),
  per kernel (the int4 GEMVs per projection by their order in a layer): launches, us a step, mean us, and the idle
  gap before each kernel; wall, busy (sum of kernel times), idle inside the step and between steps;
- `profile_main`: the same with PDL on (the engine's default; times overlap, `union` is the busy span);
- `ab`: one request of 512 tokens prefilled once, then the variants in the order v1..vn vn..v1 (each phase: graphs
  captured again, 3 settling steps, `--steps` timed), mean ms a step per variant (both its phases);
- tokens: 32 greedy tokens of a fixed prompt per variant (a PDL launch of the same tile must give the same tokens);
- `profile_best`: the fastest variant's (other than main) step, profiled with PDL on.
Variant specs (`parse_variants`): `main` (plain), `rows` (plain, the [rows, words] tile: LAYOUT 1), `top`/`late`
(PDL, main's tiles), `top_rows`, `top_rows_w256` (256 words a step), ..., or `NAME=MODE@CONFIG`. The JSON is
rewritten after each job.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from decode_steps import start_decoding, timed_steps

PROJ_ORDER = ("qkv", "o", "gate_up", "down")
GEMV_NAME = "_int4_gemv_wide_kernel"


def parse_variants(text: str) -> dict[str, tuple[str, str]]:
    """`--variants` as name -> (mode, tile config string; "" = the tables as at start-up). A name is `main`, or
    `_`-joined: an optional mode (`top`/`late`: PDL) and tile flags of bench/int4_wide_pdl.py's rules (`rows`, `w256`,
    `s2x`), e.g. `rows` (plain, LAYOUT 1), `top_rows_w256`; or `NAME=MODE@CONFIG` (MODE 0/1/late, CONFIG in
    FLOTILLA_INT4_GEMV_WIDE_CONFIG syntax)."""
    from int4_wide_pdl import config_string

    out = {}
    for spec in (s for s in text.split(",") if s):
        name, _, rest = spec.partition("=")
        if rest:
            mode, _, config = rest.partition("@")
            mode = {"0": "", "1": "top"}.get(mode, mode)
        elif name == "main":
            mode, config = "", ""
        else:
            head, _, tail = name.partition("_")
            mode, tile = (head, tail) if head in ("top", "late") else ("", name)
            config = config_string(tile) if tile else ""
        assert mode in ("", "top", "late"), spec
        out[name] = (mode, config)
    assert "main" in out, "--variants needs main (the baseline)"
    return out


_START_TILES: dict = {}


def set_variant(engine, mode: str, config: str, pdl_on: bool = True) -> float:
    """Set the int4 GEMV's launch (and FLOTILLA_PDL) in-process and capture the batch-1 decode graphs again: `config`
    is the PDL table (`mode` set) or the plain table (no mode; "": the start-up table)."""
    from quant_gpu import _recapture_decode

    from flotilla.kernels import pdl, triton_int4_gemv, triton_int4_gemv_wide, triton_paged_decode
    from flotilla.kernels.card_tables import card_name

    if not _START_TILES:  # the card's table (`card_tables.py`), then the one table every card looks up here
        _START_TILES.update(triton_int4_gemv_wide.wide_tiles(card_name(torch.cuda.current_device())))
        triton_int4_gemv_wide._CARD_TILES = {}
    tiles = triton_int4_gemv._parse_tiles(config)
    triton_int4_gemv_wide.WIDE_PDL = mode
    triton_int4_gemv_wide._PDL_TILES = tiles if mode else {}
    triton_int4_gemv_wide._WIDE_TILES = dict(_START_TILES) if mode or not config else tiles
    pdl.PDL_ENABLED = pdl_on
    triton_paged_decode.PDL_ENABLED = pdl_on  # imported by value there
    return _recapture_decode(engine, 1)


def greedy(engine, vocab: int, tokens: int = 32) -> list[int]:
    """The greedy continuation of a fixed 64-token prompt (decoded at batch 1)."""
    from flotilla.engine.sampling_params import SamplingParams

    prompt = [random.Random(1).randrange(100, vocab) for _ in range(64)]
    req = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return list(req.output_token_ids)


def _events(prof) -> list[tuple[str, float, float]]:
    """The profile's GPU activities (kernels, copies) as (name, start us, end us), in start order."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return sorted(out, key=lambda t: t[1])


def analyse(events: list[tuple[str, float, float]], steps: int, wall_us: float, gap_cap_us: float = 60.0) -> dict:
    """Per kernel key (int4 GEMVs by projection, from their order in a layer): launches, us and gap-before us a
    step; totals. A gap over `gap_cap_us` counts as between steps (host work, the next graph's launch)."""
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # us, launches, gap before
    gemv_seen = 0
    inside = between = 0.0
    prev_end = None
    for name, start, end in events:
        key = name[:70]
        if GEMV_NAME in name:
            key = f"int4 GEMV {PROJ_ORDER[gemv_seen % 4]}"
            gemv_seen += 1
        row = per[key]
        row[0] += end - start
        row[1] += 1
        if prev_end is not None:
            gap = start - prev_end
            if gap <= gap_cap_us:
                row[2] += gap
                inside += max(gap, 0.0)
            else:
                between += gap
        prev_end = end
    busy = sum(r[0] for r in per.values())
    union, span_start, span_end = 0.0, None, None  # the busy span: kernels overlapping under PDL counted once
    for _, start, end in events:
        if span_end is None or start > span_end:
            union += 0.0 if span_end is None else span_end - span_start
            span_start, span_end = start, end
        else:
            span_end = max(span_end, end)
    union += 0.0 if span_end is None else span_end - span_start
    kernels = sorted(({"key": k, "us_per_step": r[0] / steps, "launches_per_step": r[1] / steps,
                       "mean_us": r[0] / r[1], "gap_before_us_per_step": r[2] / steps} for k, r in per.items()),
                     key=lambda d: -d["us_per_step"])  # fmt: skip
    return {"steps": steps, "wall_us_per_step": wall_us, "busy_us_per_step": busy / steps,
            "union_us_per_step": union / steps, "idle_inside_us_per_step": inside / steps,
            "idle_between_us_per_step": between / steps, "launches_per_step": len(events) / steps,
            "int4_gemvs_per_step": gemv_seen / steps, "kernels": kernels}  # fmt: skip


def _sync() -> None:
    """Wait for the GPU (nothing to wait for on a CPU dry run)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile(engine, vocab: int, steps: int, rng: random.Random) -> dict:
    """`steps` batch-1 decode steps at context 512 under torch.profiler (CUDA activities), analysed."""
    from flotilla.engine.sampling_params import SamplingParams

    req = engine.add_request([rng.randrange(100, vocab) for _ in range(512)],
                             SamplingParams(temperature=0.0, max_tokens=steps + 40, ignore_eos=True))  # fmt: skip
    start_decoding(engine, [req])
    _sync()
    activity = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[activity.CUDA if torch.cuda.is_available() else activity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        _sync()
        wall = time.perf_counter() - t0
    engine.abort([req.request_id])
    return analyse(_events(prof), steps, 1e6 * wall / steps)


def print_profile(label: str, p: dict, top: int = 18) -> None:
    """The profile as lines of the log."""
    print(f"PROFILE {label}: wall {p['wall_us_per_step']:.0f} us/step, kernels {p['busy_us_per_step']:.0f} (union "
          f"{p['union_us_per_step']:.0f}), idle inside the step {p['idle_inside_us_per_step']:.0f}, between steps "
          f"{p['idle_between_us_per_step']:.0f}; {p['launches_per_step']:.0f} launches/step, "
          f"{p['int4_gemvs_per_step']:.0f} int4 GEMVs", flush=True)  # fmt: skip
    for k in p["kernels"][:top]:
        print(f"    {k['us_per_step']:7.1f} us/step x{k['launches_per_step']:<4.0f} mean {k['mean_us']:6.2f} us, gap "
              f"before {k['gap_before_us_per_step']:6.1f} us/step  {k['key']}", flush=True)  # fmt: skip


def ab(engine, variants: dict[str, tuple[str, str]], vocab: int, steps: int, rng: random.Random) -> dict:
    """One request at context 512, the variants in the order v1..vn vn..v1 (module docstring)."""
    from flotilla.engine.sampling_params import SamplingParams

    names, failed = [], {}
    for name in variants:  # every variant captured once first (compiles its kernels); one that fails is left out
        try:
            set_variant(engine, *variants[name])
            names.append(name)
        except Exception as exc:  # reported in the JSON; the others are still measured
            failed[name] = repr(exc)[:300]
            print(f"  variant {name} left out: {failed[name]}", flush=True)
    order = names + names[::-1]
    req = engine.add_request([rng.randrange(100, vocab) for _ in range(512)],
                             SamplingParams(temperature=0.0, max_tokens=len(order) * (steps + 3) + 32,
                                            ignore_eos=True))  # fmt: skip
    start_decoding(engine, [req], settle=0)
    phases = []
    for name in order:
        capture_s = set_variant(engine, *variants[name])
        for _ in range(3):
            engine.step()
        graphed: list[bool] = []
        times = timed_steps(engine, steps, lambda seen=graphed: seen.append(engine.runner.last_step.graphed))
        phases.append({"name": name, "ms_per_step": 1e3 * statistics.fmean(times),
                       "ms_median": 1e3 * statistics.median(times), "graphed": sum(graphed), "recapture_s": capture_s})
        print(f"  phase {name:10s} {phases[-1]['ms_per_step']:.3f} ms/step (median {phases[-1]['ms_median']:.3f}, "
              f"graphed {sum(graphed)}/{steps}, recapture {capture_s:.1f} s)", flush=True)  # fmt: skip
    engine.abort([req.request_id])
    mean = {n: statistics.fmean(p["ms_per_step"] for p in phases if p["name"] == n) for n in names}
    return {"steps": steps, "order": order, "phases": phases, "ms_per_step": mean, "failed": failed,
            "ratio_vs_main": {n: mean[n] / mean["main"] for n in names}}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--variants", default="main,rows,top,late,top_rows,late_rows,top_rows_w256")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--profile-steps", type=int, default=8)
    p.add_argument("--jobs", default="profile_pdl_off,profile_main,ab,tokens,profile_best")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from quant_gpu import record_paths

    from flotilla.engine.llm import LLM

    variants = parse_variants(a.variants)
    jobs = a.jobs.split(",")
    paths = record_paths() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    n_phases = 2 * len(variants)
    llm = LLM(a.model, load_format="dummy", max_model_len=512 + n_phases * (a.steps + 3) + 256, max_num_seqs=4,
              max_num_batched_tokens=4096, enable_prefix_caching=False)  # fmt: skip
    engine = llm.engine
    vocab = engine.config.model.hf_config["vocab_size"]
    out: dict = {"command": " ".join(sys.argv), "startup_s": time.perf_counter() - t0,
                 "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                 "quantization": engine.config.model.quantization, "variants": variants,
                 "env": {k: v for k, v in os.environ.items() if k.startswith("FLOTILLA_")}}  # fmt: skip
    print(f"startup {out['startup_s']:.1f} s, quantization {out['quantization']}", flush=True)

    def save() -> None:
        if paths is not None:
            out["int4_paths"] = {key: sorted(rows) for key, rows in paths.items() if key.startswith("int4")}
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    save()
    rng = random.Random(0)
    if "profile_pdl_off" in jobs:
        set_variant(engine, "", "", pdl_on=False)
        out["profile_pdl_off"] = profile(engine, vocab, a.profile_steps, rng)
        print_profile("main, FLOTILLA_PDL=0", out["profile_pdl_off"])
        set_variant(engine, "", "")
        save()
    if "profile_main" in jobs:
        out["profile_main"] = profile(engine, vocab, a.profile_steps, rng)
        print_profile("main (PDL on)", out["profile_main"])
        save()
    if "ab" in jobs:
        out["ab"] = ab(engine, variants, vocab, a.steps, rng)
        print("AB " + ", ".join(f"{n} {ms:.3f} ms ({out['ab']['ratio_vs_main'][n]:.3f}x)"
                                for n, ms in out["ab"]["ms_per_step"].items()), flush=True)  # fmt: skip
        save()
    if "tokens" in jobs:
        out["tokens"] = {}
        for name, (mode, config) in variants.items():
            if name in out.get("ab", {}).get("failed", {}):
                continue
            set_variant(engine, mode, config)
            out["tokens"][name] = greedy(engine, vocab)
            save()
        same = {n: t == out["tokens"]["main"] for n, t in out["tokens"].items()}
        print(f"tokens: main {out['tokens']['main'][:8]}...; equal to main: {same}", flush=True)
        save()
    if "profile_best" in jobs and "ab" in out:
        others = [n for n in out["ab"]["ms_per_step"] if n != "main"]
        if others:
            best = min(others, key=lambda n: out["ab"]["ms_per_step"][n])
            set_variant(engine, *variants[best])
            out["profile_best"] = {"variant": best, **profile(engine, vocab, a.profile_steps, rng)}
            print_profile(f"{best} (PDL on)", out["profile_best"])
            save()
    sys.stdout.flush()
    os._exit(0)  # skip the engine's teardown (a stage's time limit once ran out in it)


if __name__ == "__main__":
    main()
