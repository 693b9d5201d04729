"""Can a decode step's GEMMs and its paged attention overlap on this GPU? (issue 19; NanoFlow-style nano-batches)

A large pure-decode step runs each layer's GEMMs (compute-bound at hundreds of rows) and then its attention
(memory-bound: every row reads its whole context's K/V) one after the other; issue 19's FLOP bound assumes the two
overlap. Split into two nano-batches A and B, the attention of one can run on a second CUDA stream beside the GEMMs
of the other, so that the HBM traffic of attention hides under the tensor-core time of the GEMMs (NanoFlow). The
price: each half's GEMMs read the weights again, and two kernels share the SMs.

This probe answers without an engine, at Llama-3.1-8B's layer shapes (random bf16; the engine's own kernels through
`flotilla.kernels.dispatch`: Triton RMSNorm, cuBLAS projections with the SiLU-and-mul, the Triton paged decode
attention over `--cache-layers` paged pools, cycled, block tables shuffled over the pool). For each R of `--rows`
decode rows x `--ctx` tokens of context, `--layers` layers, timed eagerly with CUDA events (median of `--reps`):

- (a) `gemm`: the GEMM chain alone (RMSNorm, qkv, o, RMSNorm, gate_up + SiLU, down) at R rows;
- (b) `attn`: the paged decode attention alone at R rows;
- (c) `serial`: a then b, layer by layer, on one stream (the engine today);
- (d) `two_stream`: two nano-batches of R/2 rows, A's layers on the current stream, B's on a second one;
  attention calls take turns A(l), B(l), A(l+1), ... (an event chain), so each half's attention runs beside the
  other half's o_proj, MLP and next qkv: the half-layer offset of NanoFlow;
- (d') `two_stream_att`: the same order with every attention on one attention stream and each half's GEMMs on a
  stream of its own (NanoFlow's split by operation kind);
- `both_free` (with `gemm_half`, `attn_half`): the GEMM chain of A and the attention of B at R/2 rows on two
  streams with no dependency at all (the best case for overlap);
- (e) `mixed`: a mixed step's shape, the GEMM chain of `--mixed-tokens` tokens on the current stream while
  `--mixed-rows` rows' decode attention runs on a second one, each layer's attention started with that layer's
  GEMMs (`gemm`, `attn`, `concurrent`).

Every R case is also captured in a CUDA graph (multi-stream capture: the side streams fork from the capture stream
and join it by events) and timed as replays. `overlap fraction = (a + b - concurrent) / min(a, b)`: 1 the shorter
one hides entirely under the other, 0 none (serial), < 0 slower than serial (for `two_stream` and `two_stream_att`
a and b are R rows' `gemm` and `attn`, which also charges them the second weight read; for `both_free` the
halves'). `--extras` adds session 11's variants at the first R (below), last. The JSON (`--out`) is rewritten after
every case, so a run cut by a time limit keeps what it measured; a summary block is printed last. `--smoke`: tiny
shapes, two layers, on the CPU where there is no GPU (streams and events are no-ops there, no graphs): the code path
and the JSON's schema (tests/test_bench_overlap_probe.py).

    python bench/overlap_probe.py --out probe.json [--rows 488,244] [--extras]
    OUT=... bash bench/results/probe21-gpu.sh     # the device call (<= 240 s)

`--extras` (session 11's schedules): `serial_halves` (the halves one after the other on one stream: what splitting
costs without overlap), `ring_chunkN` (each half's attention in N row launches, so it holds fewer CTAs at a time),
`both_free_prio` / `ring_att_prio` (eager only: the GEMM streams at high priority; a graph replays its kernels at its
launch stream's priority), `*_carveN` (cuBLAS told to leave N SMs free, `torch._C._set_sm_carveout_experimental`)
and, with `--green-sms`, attention on a stream of a CUDA green context of N SMs (on the H200 in session 11 the first
of them destroyed the CUDA context: Triton's kernels live in the primary one; they run last).

Measured on the H200 (session 11, call 2, bench/results/gpu-2026-12-04-s11/call2/; one R of 512; its `ring` and
`ring_att` are `two_stream` and `two_stream_att`):
**no overlap**. attn_half 4.66 ms (4.15 TB/s), gemm_half 6.07 ms (589 TFLOP/s), both_free 10.88 ms (ideal 6.07).
Each kernel fills every SM (the attention grid is 2,048 CTAs at 256 rows; cuBLAS's grids cover the GPU), so one
only gets SMs as the other drains. serial 20.37, serial_halves 23.17 (the weights read twice), ring 22.12, ring_att
22.02, chunks 22.29 / 22.41, best ring_carve32 22.00 (x0.926 of serial); eager ring 24.01 vs 20.78, priorities no
better. The carve-out is honoured (gemm_half_carve32 6.97 ms) and gives a little overlap, not enough to pay for the
slower GEMMs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from flotilla.kernels.dispatch import linear, paged_attention, rms_norm, silu_and_mul_linear


@dataclass(frozen=True)
class Shapes:
    """One decoder layer's sizes."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    page: int = 16

    def params(self) -> int:
        """Weights of one layer's projections (qkv, o, gate_up, down)."""
        h, d = self.hidden, self.head_dim
        return (self.heads + 2 * self.kv_heads) * d * h + h * self.heads * d + 3 * self.inter * h


LLAMA_8B = Shapes(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336)
SMOKE = Shapes(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128)
# --smoke's arguments (tiny, CPU-sized) and the GPU defaults
SMOKE_ARGS = dict(rows="8,4", ctx=40, layers=2, cache_layers=2, weight_sets=2, mixed_tokens=32, mixed_rows=6, reps=2)
GPU_ARGS = dict(rows="488,244", ctx=576, layers=32, cache_layers=8, weight_sets=4, mixed_tokens=16384, mixed_rows=449,
                reps=10)  # fmt: skip


class NoStream:
    """A CPU stand-in for a CUDA stream or event: the CPU runs every op in order, so waits and records are no-ops."""

    def wait_stream(self, other: Any) -> None:
        """No-op."""

    def wait_event(self, event: Any) -> None:
        """No-op."""

    def record(self, stream: Any = None) -> None:
        """No-op."""


class Lanes:
    """Streams and events on the probe's device: CUDA's, or `NoStream`s on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def stream(self, priority: int = 0) -> Any:
        return torch.cuda.Stream(priority=priority) if self.cuda else NoStream()

    def current(self) -> Any:
        return torch.cuda.current_stream() if self.cuda else NoStream()

    def on(self, stream: Any) -> AbstractContextManager:
        return torch.cuda.stream(stream) if self.cuda else nullcontext()

    def event(self) -> Any:
        return torch.cuda.Event() if self.cuda else NoStream()

    def keep(self, t: torch.Tensor, stream: Any) -> None:
        """Tell the caching allocator that `t` is used on `stream` too (CUDA only)."""
        if self.cuda:
            t.record_stream(stream)


@dataclass
class Half:
    """One (nano-)batch's persistent inputs: its hidden rows, residual, block table and lengths."""

    x: torch.Tensor
    res: torch.Tensor
    tables: torch.Tensor
    starts: torch.Tensor
    lens: torch.Tensor


class Model:
    """What every batch shares: the shapes, `weight_sets` layers' weights (cycled), the streams."""

    def __init__(self, shapes: Shapes, layers: int, weight_sets: int, device: torch.device) -> None:
        self.shapes, self.layers, self.device = shapes, layers, device
        self.lanes = Lanes(device.type == "cuda")
        self.gen = torch.Generator(device=device).manual_seed(0)
        s = shapes
        self.weights = [dict(qkv=self.rand((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
                             o=self.rand(s.hidden, s.heads * s.head_dim), gate_up=self.rand(2 * s.inter, s.hidden),
                             down=self.rand(s.hidden, s.inter))
                        for _ in range(weight_sets)]  # fmt: skip
        self.norm = torch.ones(s.hidden, device=device, dtype=torch.bfloat16)

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=torch.bfloat16, generator=self.gen) * 0.02

    def rows(self, n: int) -> Half:
        """`n` rows for the GEMM chain only (no attention: empty table)."""
        empty = torch.zeros(0, dtype=torch.int32, device=self.device)
        return Half(self.rand(n, self.shapes.hidden), self.rand(n, self.shapes.hidden), empty, empty, empty)

    def gemms_pre(self, half: Half, layer: int) -> torch.Tensor:
        """RMSNorm + qkv projection; returns the query `[rows, heads, dim]`."""
        s, w = self.shapes, self.weights[layer % len(self.weights)]
        x, _ = rms_norm(half.x, self.norm, 1e-5, half.res)
        return linear(x, w["qkv"])[:, : s.heads * s.head_dim].reshape(-1, s.heads, s.head_dim)

    def gemms_post(self, half: Half, attn: torch.Tensor, layer: int) -> None:
        """o_proj, RMSNorm, gate/up + SiLU, down; the result becomes the half's next hidden rows."""
        w = self.weights[layer % len(self.weights)]
        o = linear(attn.reshape(attn.shape[0], -1), w["o"])
        x, _ = rms_norm(o, self.norm, 1e-5, half.res)
        half.x.copy_(linear(silu_and_mul_linear(x, w["gate_up"]), w["down"]))  # a graph replays on the same buffers

    def gemm_only(self, half: Half) -> None:
        """(a) The GEMM chain of every layer; the query stands in for attention's output (the same shape)."""
        for layer in range(self.layers):
            self.gemms_post(half, self.gemms_pre(half, layer), layer)


class Probe:
    """`rows` decode rows x `ctx` tokens over `cache_layers` paged K/V pools, and the schedules to time."""

    def __init__(self, model: Model, rows: int, ctx: int, cache_layers: int) -> None:
        self.model, s, dev = model, model.shapes, model.device
        blocks_per_seq = -(-ctx // s.page)
        num_blocks = rows * blocks_per_seq + 1
        # each sequence's blocks scattered over the pool as an allocator leaves them after many requests
        pool = (num_blocks, s.page, s.kv_heads, s.head_dim)
        self.caches = [(model.rand(*pool), model.rand(*pool)) for _ in range(cache_layers)]
        perm = torch.randperm(num_blocks - 1, device=dev, generator=model.gen).to(torch.int32) + 1
        tables = perm[: rows * blocks_per_seq].view(rows, blocks_per_seq)
        lens = torch.full((rows,), ctx, dtype=torch.int32, device=dev)
        starts = torch.arange(rows + 1, dtype=torch.int32, device=dev)
        x, res = model.rand(rows, s.hidden), model.rand(rows, s.hidden)
        self.full = Half(x, res, tables, starts, lens)
        h = rows // 2
        # a decode step's query start locations are 0..n, so the second half's are the first n/2 + 1 of them too
        self.halves = [Half(x[:h], res[:h], tables[:h], starts[: h + 1], lens[:h]),
                       Half(x[h:], res[h:], tables[h:], starts[: rows - h + 1], lens[h:])]  # fmt: skip
        self.scale = s.head_dim**-0.5

    def attention(self, half: Half, q: torch.Tensor, layer: int, chunks: int = 1) -> torch.Tensor:
        """Paged decode attention of the half's rows over this layer's pool, in `chunks` launches."""
        k, v = self.caches[layer % len(self.caches)]
        n = q.shape[0]
        step = -(-n // chunks)
        outs = [paged_attention(q[i : i + step], k, v, half.tables[i : i + step], half.starts[: min(step, n - i) + 1],
                                half.lens[i : i + step], self.scale, max_query_len=1)
                for i in range(0, n, step)]  # fmt: skip
        return outs[0] if chunks == 1 else torch.cat(outs)

    def layer(self, half: Half, layer: int) -> None:
        """One whole layer of one (nano-)batch, as the engine runs it."""
        q = self.model.gemms_pre(half, layer)
        self.model.gemms_post(half, self.attention(half, q, layer), layer)

    def attn_only(self, half: Half) -> None:
        """(b) Every layer's attention (a zero query: the values do not change the time)."""
        s = self.model.shapes
        q = torch.zeros(half.x.shape[0], s.heads, s.head_dim, device=half.x.device, dtype=half.x.dtype)
        for layer in range(self.model.layers):
            self.attention(half, q, layer)

    def serial(self, halves: list[Half]) -> None:
        """(c) The layers one after the other on one stream, each (nano-)batch in turn."""
        for layer in range(self.model.layers):
            for half in halves:
                self.layer(half, layer)

    def both_free(self, attn_stream: Any, gemm_stream: Any = None) -> None:
        """Attention of half B on `attn_stream` beside the GEMMs of half A (on `gemm_stream`, else the current
        stream): no dependency between them, the best case for overlap."""
        lanes = self.model.lanes
        main = lanes.current()
        gemm = gemm_stream or main
        for s in {attn_stream, gemm} - {main}:
            s.wait_stream(main)
        with lanes.on(attn_stream):
            self.attn_only(self.halves[1])
        with lanes.on(gemm):
            self.model.gemm_only(self.halves[0])
        for s in {attn_stream, gemm} - {main}:
            main.wait_stream(s)

    def ring(self, side: Any, chunks: int = 1) -> None:
        """(d) Half A's layers on the current stream, half B's on `side`; attention calls alternate A(l), B(l),
        A(l+1), ... (each waits for the one before), so each half's attention runs beside the other half's o_proj,
        MLP and next qkv. No tensor crosses streams."""
        lanes, model = self.model.lanes, self.model
        main = lanes.current()
        side.wait_stream(main)
        last = None
        for layer in range(model.layers):
            for half, stream in zip(self.halves, (main, side), strict=True):
                with lanes.on(stream):
                    q = model.gemms_pre(half, layer)
                    if last is not None:
                        stream.wait_event(last)
                    attn = self.attention(half, q, layer, chunks)
                    last = lanes.event()
                    last.record(stream)
                    model.gemms_post(half, attn, layer)
        main.wait_stream(side)

    def ring_att(self, att: Any, gemm: tuple[Any, Any] | None = None, chunks: int = 1) -> None:
        """Every attention on one stream `att` (so they run one after another, A(l), B(l), A(l+1), ...), each
        half's GEMMs on its own stream (default: the current one and a fresh one), joined by events; with
        `att` at low priority and the GEMM streams high, the GEMMs take the SMs first."""
        lanes, model = self.model.lanes, self.model
        main = lanes.current()
        gemm = gemm or (main, lanes.stream())
        for s in {att, *gemm} - {main}:
            s.wait_stream(main)
        for layer in range(model.layers):
            for half, g in zip(self.halves, gemm, strict=True):
                with lanes.on(g):
                    q = model.gemms_pre(half, layer)
                att.wait_stream(g)
                with lanes.on(att):
                    out = self.attention(half, q, layer, chunks)
                lanes.keep(q, att)  # q was made on g and read on att; out the other way round
                g.wait_stream(att)
                with lanes.on(g):
                    model.gemms_post(half, out, layer)
                lanes.keep(out, g)
        for s in {att, *gemm} - {main}:
            main.wait_stream(s)

    def mixed(self, big: Half, att: Any) -> None:
        """(e) `big`'s GEMM chain on the current stream; this probe's rows' attention on `att`, each layer's
        started when that layer's GEMMs start (as a nano-batched mixed step would pair them)."""
        lanes, model, s = self.model.lanes, self.model, self.model.shapes
        main = lanes.current()
        att.wait_stream(main)
        q = torch.zeros(self.full.x.shape[0], s.heads, s.head_dim, device=big.x.device, dtype=big.x.dtype)
        for layer in range(model.layers):
            start = lanes.event()
            start.record(main)
            with lanes.on(att):
                att.wait_event(start)
                self.attention(self.full, q, layer)
            model.gemms_post(big, model.gemms_pre(big, layer), layer)
        main.wait_stream(att)


# --- timing ---------------------------------------------------------------------------------------------------------


def time_eager(fn: Callable[[], None], reps: int, cuda: bool) -> float:
    """Median ms of `reps` calls of `fn` after two warm ones: GPU time between CUDA events (the launches must keep
    ahead), or wall time on the CPU."""
    fn()
    fn()
    if not cuda:
        return statistics.median(_wall_ms(fn) for _ in range(reps))
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _wall_ms(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_graph(fn: Callable[[], None], reps: int) -> float:
    """Median ms of `reps` replays of `fn` captured as one CUDA graph (its side streams fork from the capture
    stream and join it)."""
    fn()  # compile and warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_eager(graph.replay, reps, cuda=True)


def carved(fn: Callable[[], None], sms: int) -> Callable[[], None]:
    """`fn` with cuBLAS told to leave `sms` SMs free (its SM count target; an experimental torch API)."""

    def call() -> None:
        torch._C._set_sm_carveout_experimental(sms)
        try:
            fn()
        finally:
            torch._C._set_sm_carveout_experimental(None)

    return call


# --- the run --------------------------------------------------------------------------------------------------------


class Run:
    """The results, the JSON file they are rewritten to after every case, and the timing switches."""

    def __init__(self, args: argparse.Namespace, model: Model) -> None:
        self.args, self.model, self.cuda = args, model, model.lanes.cuda
        self.results: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if self.cuda else "cpu", "torch": torch.__version__,
            "smoke": args.smoke, "args": {k: v for k, v in vars(args).items() if k != "out"},
            "rows": {}, "mixed": {}, "extras": {}, "overlap": {}, "summary": [],
        }  # fmt: skip

    def time(self, where: dict, name: str, fn: Callable[[], None], graph: bool = True) -> None:
        """`where[name]` = {"eager": ms, "graph": ms or None}; a failure is printed and recorded as None."""
        modes = {"eager": lambda: time_eager(fn, self.args.reps, self.cuda)}
        if graph and self.cuda:
            modes["graph"] = lambda: time_graph(fn, self.args.reps)
        row = where.setdefault(name, {"eager": None, "graph": None})
        for mode, timer in modes.items():
            try:
                row[mode] = timer()
            except Exception as e:
                print(f"{name} {mode}: failed: {type(e).__name__}: {e}"[:300], flush=True)
        print(f"  {name:22s} eager {_ms(row['eager'])}  graph {_ms(row['graph'])}", flush=True)
        self.save()

    def save(self) -> None:
        """The summary as it stands, then the JSON file (a run cut short keeps both)."""
        self.results["summary"] = summary(self)
        if self.args.out:
            with open(self.args.out, "w") as f:
                json.dump(self.results, f, indent=1)


def _ms(v: float | None) -> str:
    return f"{v:9.3f} ms" if v is not None else "        - ms"


def overlap_fraction(a: float | None, b: float | None, both: float | None) -> float | None:
    """(a + b - both) / min(a, b): 1 the shorter of a and b hides entirely under the other, 0 none, < 0 slower than
    running them one after the other; None where a time is missing."""
    if a is None or b is None or both is None:
        return None
    return (a + b - both) / min(a, b)


def run_rows(run: Run, rows: int) -> None:
    """Cases (a)-(d) and both_free at `rows` decode rows, eager and graphed; their overlap fractions."""
    a, model = run.args, run.model
    probe = Probe(model, rows, a.ctx, a.cache_layers)
    side, side2 = model.lanes.stream(), model.lanes.stream()
    rec = run.results["rows"][str(rows)] = {}
    print(f"R={rows} x ctx {a.ctx}, {a.layers} layers (halves {rows // 2} / {rows - rows // 2})", flush=True)
    run.time(rec, "gemm", lambda: model.gemm_only(probe.full))
    run.time(rec, "attn", lambda: probe.attn_only(probe.full))
    run.time(rec, "serial", lambda: probe.serial([probe.full]))
    run.time(rec, "two_stream", lambda: probe.ring(side))
    run.time(rec, "two_stream_att", lambda: probe.ring_att(side, (model.lanes.current(), side2)))
    run.time(rec, "gemm_half", lambda: model.gemm_only(probe.halves[0]))
    run.time(rec, "attn_half", lambda: probe.attn_only(probe.halves[1]))
    run.time(rec, "both_free", lambda: probe.both_free(side))
    fr = run.results["overlap"][str(rows)] = {}
    for mode in ("eager", "graph"):
        for case in ("two_stream", "two_stream_att"):
            fr[f"{case}_{mode}"] = overlap_fraction(rec["gemm"][mode], rec["attn"][mode], rec[case][mode])
        fr[f"both_free_{mode}"] = overlap_fraction(rec["gemm_half"][mode], rec["attn_half"][mode],
                                                   rec["both_free"][mode])  # fmt: skip
    run.save()


def run_mixed(run: Run) -> None:
    """Case (e): the mixed step's GEMM chain of `--mixed-tokens` tokens beside `--mixed-rows` rows' attention."""
    a, model = run.args, run.model
    probe = Probe(model, a.mixed_rows, a.ctx, a.cache_layers)
    big = model.rows(a.mixed_tokens)
    side = model.lanes.stream()
    rec = run.results["mixed"]
    print(f"mixed: {a.mixed_tokens}-token GEMM chain beside {a.mixed_rows} rows x ctx {a.ctx} attention", flush=True)
    run.time(rec, "gemm", lambda: model.gemm_only(big), graph=False)
    run.time(rec, "attn", lambda: probe.attn_only(probe.full), graph=False)
    run.time(rec, "concurrent", lambda: probe.mixed(big, side), graph=False)
    run.results["overlap"]["mixed_eager"] = overlap_fraction(rec["gemm"]["eager"], rec["attn"]["eager"],
                                                             rec["concurrent"]["eager"])  # fmt: skip
    run.save()


def run_extras(run: Run, rows: int) -> None:
    """Session 11's variants (see the module docstring) at `rows` rows, into results["extras"]."""
    a, model, lanes = run.args, run.model, run.model.lanes
    probe = Probe(model, rows, a.ctx, a.cache_layers)
    rec = run.results["extras"]
    side, side2 = lanes.stream(), lanes.stream()
    run.time(rec, "serial_halves", lambda: probe.serial(probe.halves))
    for c in [int(x) for x in a.chunks.split(",") if x]:
        run.time(rec, f"ring_chunk{c}", lambda c=c: probe.ring(side, c))
    if lanes.cuda:
        _, high = torch.cuda.Stream.priority_range()  # (least, greatest): the default stream is the least
        gemm_hi = (lanes.stream(high), lanes.stream(high))
        run.time(rec, "both_free_prio", lambda: probe.both_free(side, gemm_hi[0]), graph=False)
        run.time(rec, "ring_att_prio", lambda: probe.ring_att(side, gemm_hi), graph=False)
        for n in [int(x) for x in a.sms.split(",") if x]:
            run.time(rec, f"gemm_half_carve{n}", carved(lambda: model.gemm_only(probe.halves[0]), n))
            run.time(rec, f"both_free_carve{n}", carved(lambda: probe.both_free(side), n))
            run.time(rec, f"ring_carve{n}", carved(lambda: probe.ring(side), n))
        for n in [int(x) for x in a.green_sms.split(",") if x]:  # last: they may leave the device unusable
            green_variants(run, probe, n, side2)


def green_variants(run: Run, probe: Probe, sms: int, side: Any) -> None:
    """Attention on a stream of a green context of `sms` SMs and cuBLAS told to leave them: the two kernels
    partition the GPU instead of taking SMs from each other wave by wave. Beta torch APIs (and Triton's kernels
    are loaded in the primary context): a failure is printed and skipped."""
    try:
        from torch.cuda.green_contexts import GreenContext

        green = GreenContext.create(num_sms=sms).Stream()
    except Exception as e:
        print(f"green{sms}: no green context: {type(e).__name__}: {e}"[:300], flush=True)
        return

    def attn_green() -> None:
        main = torch.cuda.current_stream()
        green.wait_stream(main)
        with torch.cuda.stream(green):
            probe.attn_only(probe.halves[1])
        main.wait_stream(green)

    rec = run.results["extras"]
    run.time(rec, f"attn_half_green{sms}", attn_green)
    run.time(rec, f"both_free_green{sms}", carved(lambda: probe.both_free(green), sms))
    run.time(rec, f"ring_att_green{sms}", carved(lambda: probe.ring_att(green, (torch.cuda.current_stream(), side)),
                                                 sms))  # fmt: skip


def summary(run: Run) -> list[str]:
    """The lines a reader can quote: per R the four cases, rates, fractions and a verdict; the mixed step."""
    a, s, res = run.args, run.model.shapes, run.results
    lines = [f"=== overlap probe: {res['device']}, torch {res['torch']}, {a.layers} layers, ctx {a.ctx}, "
             f"median of {a.reps}{' (SMOKE: tiny shapes)' if a.smoke else ''}"]  # fmt: skip
    for rows, rec in res["rows"].items():
        fr = res["overlap"].get(rows, {})
        for mode in ("eager", "graph"):
            t = {k: rec.get(k, {}).get(mode) for k in ("gemm", "attn", "serial", "two_stream", "two_stream_att",
                                                       "gemm_half", "attn_half", "both_free")}  # fmt: skip
            if None in t.values():  # a case failed, or is still to run
                continue
            gain = t["serial"] / min(t["two_stream"], t["two_stream_att"])
            verdict = "PAYS" if gain > 1.05 else "MARGINAL" if gain > 1.0 else "DOES NOT PAY"
            lines.append(f"R={rows} {mode}: (a) gemm {t['gemm']:.3f} ms, (b) attn {t['attn']:.3f}, (c) serial "
                         f"{t['serial']:.3f}, (d) two-stream {t['two_stream']:.3f} (overlap fraction "
                         f"{_frac(fr.get(f'two_stream_{mode}'))}), (d') attention stream {t['two_stream_att']:.3f} "
                         f"({_frac(fr.get(f'two_stream_att_{mode}'))}): best x{gain:.3f} of serial, {verdict}; "
                         f"halves free {_frac(fr.get(f'both_free_{mode}'))} ({t['gemm_half']:.3f} + "
                         f"{t['attn_half']:.3f} -> {t['both_free']:.3f})")  # fmt: skip
        if rec.get("attn", {}).get("eager") and rec.get("gemm", {}).get("eager"):
            gbs = int(rows) * a.ctx * s.kv_heads * s.head_dim * 4 * a.layers / rec["attn"]["eager"] / 1e6
            tflops = 2 * int(rows) * s.params() * a.layers / rec["gemm"]["eager"] / 1e9
            lines.append(f"R={rows} rates (eager): attention {gbs:.0f} GB/s of K+V, GEMM chain {tflops:.0f} TFLOP/s")
    m = {k: v["eager"] for k, v in res["mixed"].items()}
    if len(m) == 3 and None not in m.values() and "mixed_eager" in res["overlap"]:
        lines.append(f"(e) mixed eager: gemm {a.mixed_tokens} tokens {m['gemm']:.3f} ms, attn {a.mixed_rows} rows "
                     f"{m['attn']:.3f}, concurrent {m['concurrent']:.3f} (serial sum {m['gemm'] + m['attn']:.3f}) -> "
                     f"overlap fraction {_frac(res['overlap']['mixed_eager'])}")  # fmt: skip
    lines.append("overlap fraction = (a + b - concurrent) / min(a, b): 1 = the shorter fully hidden, 0 = serial")
    return lines


def _frac(v: float | None) -> str:
    return f"{v:.3f}" if v is not None else "-"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", "--json", dest="out", default=None, help="JSON results, rewritten after every case")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (the CPU without a GPU): the code path only")
    p.add_argument("--rows", help="decode rows R of cases (a)-(d), comma-separated (halves: R/2); default 488,244")
    p.add_argument("--ctx", type=int, help="context tokens a row (576)")
    p.add_argument("--layers", type=int, help="layers a timed call runs (32)")
    p.add_argument("--cache-layers", type=int, help="distinct K/V pools, cycled (8: ~1.15 GB each at 488 rows)")
    p.add_argument("--weight-sets", type=int, help="distinct layer weights, cycled (4: 436 MB each)")
    p.add_argument("--mixed-tokens", type=int, help="case (e)'s GEMM chain tokens (16,384); 0: no case (e)")
    p.add_argument("--mixed-rows", type=int, help="case (e)'s decode rows (449)")
    p.add_argument("--reps", type=int, help="timed calls or replays a case (10)")
    p.add_argument("--extras", action="store_true", help="session 11's variants at the first R, after the rest")
    p.add_argument("--chunks", default="2,4", help="--extras: attention row chunks to try in the ring")
    p.add_argument("--sms", default="16,32,48", help="--extras: SMs cuBLAS leaves to attention (its SM carve-out)")
    p.add_argument("--green-sms", default="", help="--extras: SMs of attention's green context (crashed the H200)")
    a = p.parse_args(argv)
    for k, v in (SMOKE_ARGS if a.smoke else GPU_ARGS).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def main(argv: list[str] | None = None) -> dict | None:
    """Run the probe; returns the results (None where it was skipped)."""
    a = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not a.smoke:
        print("skipped: needs a CUDA GPU (or --smoke)")
        return None
    model = Model(SMOKE if a.smoke else LLAMA_8B, a.layers, a.weight_sets, torch.device("cuda" if cuda else "cpu"))
    run = Run(a, model)
    for rows in [int(r) for r in a.rows.split(",") if r]:
        run_rows(run, rows)
        if cuda:
            torch.cuda.empty_cache()
    if a.mixed_tokens:
        run_mixed(run)
    if a.extras:  # last: the brief's cases first, should a time limit cut the run
        run_extras(run, int(a.rows.split(",")[0]))
    run.save()
    print("\n".join(run.results["summary"]), flush=True)
    return run.results


if __name__ == "__main__":
    main()
