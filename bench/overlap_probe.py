"""Does a two-micro-batch overlap pay on this GPU? (issue 19; measured in session 11: no, see docs/decode-gemm.md)

A large pure-decode step runs each layer's GEMMs (compute-bound at hundreds of rows) and then its attention
(memory-bound: every row reads its whole context's K/V) one after the other. Split into two halves A and B, the
attention of one half can run on a second CUDA stream beside the GEMMs of the other, so that the HBM traffic of
attention hides under the tensor-core time of the GEMMs (NanoFlow). The price: each half's GEMMs read the
weights again (at 256 rows a GEMM is only ~1.5x past the H200's ridge), and two kernels share the SMs.

This probe answers in ~30 s, without an engine, at Llama-3.1-8B's layer shapes (bf16; the engine's own kernels
through `flotilla.kernels.dispatch`: Triton RMSNorm, cuBLAS projections, the Triton paged decode attention over
a paged pool of `--cache-layers` layers, cycled) and `--rows` rows x `--ctx` tokens of context:

- `attn_half`, `gemm_half`: `--layers` layers of attention alone, of the GEMM chain alone, at rows/2;
- `both_free`: the two at once on two streams (independent: the best case for overlap);
- `serial_full`: the layer as the engine runs it today: rows rows, GEMMs then attention, one stream;
- `serial_halves`: the same work as two halves on one stream (what splitting costs without overlap);
- `ring`: the engine schedule: half A on the main stream, half B on a side stream, each running whole
  layers; attention calls alternate A(l), B(l), A(l+1), ... (an event chain), so each half's attention runs
  beside the other half's o_proj, MLP and next qkv;
- `ring_att`: every attention on one attention stream, each half's GEMMs on its own stream (the same order);
- `*_prio_eager`: the GEMM streams at high priority, attention at the default (lowest), so the GEMMs take
  SMs first (eager only: a CUDA graph replays its kernels at its launch stream's priority unless
  instantiated with node priorities, which torch does not ask for);
- `ring_chunkN`: the ring with each half's attention launched as N row chunks, so the attention kernel holds
  fewer CTAs at a time (its grid is rows x KV heads: 2,048 programs at 256 rows, more than the SMs hold, so
  one launch takes every SM until it drains);
- `*_carveN`: cuBLAS told to leave N SMs free (`torch._C._set_sm_carveout_experimental`), so that attention
  keeps at least those while a GEMM runs;
- `*_greenN` (only with `--green-sms`): attention on a stream of a CUDA green context of N SMs, plus the carve-out:
  a fixed partition of the SMs. On the H200 (session 11, device call 2) the first of them destroyed the CUDA
  context ("context is destroyed": Triton's kernels are loaded in the primary context) and every variant after it
  failed, so they are off by default and, asked for, run last.

Each is timed as a CUDA graph (median of `--reps` replays, ms) and, where it says so, eagerly. Printed last:
`overlap ratio` = both_free / (attn_half + gemm_half) (0.5 would be perfect overlap of equal halves, 1.0
none) and `ring speed-up` = serial_full / ring (> 1: the engine path can pay; the verdict line says so).

    python bench/overlap_probe.py --json /tmp/probe.json

Measured on the H200 (session 11, device call 2: bench/results/gpu-2026-12-04-s11/call2/): **no overlap**.
attn_half 4.66 ms (4.15 TB/s), gemm_half 6.07 ms (589 TFLOP/s), both_free 10.88 ms: overlap ratio 1.015 where 0.566
was the ideal. The two kernels on two streams ran one after the other: each fills every SM (the attention grid is
2,048 CTAs at 256 rows; cuBLAS's grids cover the GPU), so one only gets SMs as the other drains. serial_full 20.37,
serial_halves 23.17 (+2.8 ms: the weights read twice by GEMMs of half the rows), ring 22.12, ring_att 22.02,
ring_chunk2 / 4 22.29 / 22.41, best ring_carve32 22.00 (x0.926 of serial); eager ring 24.01 vs 20.78, the priority
variants no better. The carve-out is honoured (gemm_half_carve32 6.97 ms) and gives a little overlap
(both_free_carve32 10.95 vs 4.66 + 6.97 = 11.63), not enough to pay for the slower GEMMs. What overlap would need:
attention confined to a few SMs (a persistent grid, or a green context that works with Triton) that still pulls
most of its 4.2 TB/s there, beside GEMMs carved out of those SMs; and even then the halves' second weight read
(~1 ms a step at 512 rows) comes off the gain.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flotilla.kernels.dispatch import linear, paged_attention, rms_norm, silu_and_mul_linear

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, PAGE = 4096, 32, 8, 128, 14336, 16


@dataclass
class Half:
    """One micro-batch's persistent inputs: its hidden rows, residual, block table and lengths."""

    x: torch.Tensor
    res: torch.Tensor
    tables: torch.Tensor
    starts: torch.Tensor
    lens: torch.Tensor


class Probe:
    """Weights, a paged KV pool and the schedules to time."""

    def __init__(
        self, rows: int, ctx: int, layers: int, cache_layers: int, weight_sets: int, device: str = "cuda"
    ) -> None:
        dev, dt = torch.device(device), torch.bfloat16
        self.layers = layers
        g = torch.Generator(device=dev).manual_seed(0)

        def rand(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device=dev, dtype=dt, generator=g) * 0.02).contiguous()

        self.weights = [dict(qkv=rand((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), o=rand(HIDDEN, HEADS * HEAD_DIM),
                             gate_up=rand(2 * INTER, HIDDEN), down=rand(HIDDEN, INTER))
                        for _ in range(weight_sets)]  # fmt: skip
        self.norm = torch.ones(HIDDEN, device=dev, dtype=dt)
        blocks_per_seq = -(-ctx // PAGE)
        num_blocks = rows * blocks_per_seq + 1
        # K and V of `cache_layers` layers; each sequence's blocks scattered over the pool as an allocator
        # leaves them after many requests
        self.caches = [(rand(num_blocks, PAGE, KV_HEADS, HEAD_DIM), rand(num_blocks, PAGE, KV_HEADS, HEAD_DIM))
                       for _ in range(cache_layers)]  # fmt: skip
        perm = torch.randperm(num_blocks - 1, device=dev, generator=g).to(torch.int32) + 1
        tables = perm[: rows * blocks_per_seq].view(rows, blocks_per_seq)
        lens = torch.full((rows,), ctx, dtype=torch.int32, device=dev)
        starts = torch.arange(rows + 1, dtype=torch.int32, device=dev)
        x, res = rand(rows, HIDDEN), rand(rows, HIDDEN)
        self.full = Half(x, res, tables, starts, lens)
        h = rows // 2
        # a decode step's query start locations are 0..n, so the second half's are the first n/2 + 1 of them too
        self.halves = [Half(x[:h], res[:h], tables[:h], starts[: h + 1], lens[:h]),
                       Half(x[h:], res[h:], tables[h:], starts[: rows - h + 1], lens[h:])]  # fmt: skip
        self.scale = HEAD_DIM**-0.5

    # --- one layer's parts ----------------------------------------------------------------------

    def gemms_pre(self, half: Half, layer: int) -> torch.Tensor:
        """RMSNorm + qkv projection; returns the query `[rows, heads, dim]`."""
        w = self.weights[layer % len(self.weights)]
        x, _ = rms_norm(half.x, self.norm, 1e-5, half.res)
        return linear(x, w["qkv"])[:, : HEADS * HEAD_DIM].reshape(-1, HEADS, HEAD_DIM)

    def attention(self, half: Half, q: torch.Tensor, layer: int, chunks: int = 1) -> torch.Tensor:
        """Paged decode attention of the half's rows over this layer's pool, in `chunks` launches."""
        k, v = self.caches[layer % len(self.caches)]
        n = q.shape[0]
        if chunks == 1:
            return paged_attention(q, k, v, half.tables, half.starts, half.lens, self.scale, max_query_len=1)
        step = -(-n // chunks)
        outs = [paged_attention(q[i : i + step], k, v, half.tables[i : i + step], half.starts[: min(step, n - i) + 1],
                                half.lens[i : i + step], self.scale, max_query_len=1)
                for i in range(0, n, step)]  # fmt: skip
        return torch.cat(outs)

    def gemms_post(self, half: Half, attn: torch.Tensor, layer: int) -> None:
        """o_proj, RMSNorm, gate/up + SiLU, down; the result becomes the half's next hidden rows."""
        w = self.weights[layer % len(self.weights)]
        o = linear(attn.reshape(-1, HEADS * HEAD_DIM), w["o"])
        x, _ = rms_norm(o, self.norm, 1e-5, half.res)
        out = linear(silu_and_mul_linear(x, w["gate_up"]), w["down"])
        half.x.copy_(out)  # persistent rows: a graph replays on the same buffers

    def layer(self, half: Half, layer: int) -> None:
        """One whole layer of one (micro-)batch, as the engine runs it."""
        q = self.gemms_pre(half, layer)
        self.gemms_post(half, self.attention(half, q, layer), layer)

    # --- schedules ------------------------------------------------------------------------------

    def attn_only(self, half: Half) -> None:
        q = torch.zeros(half.x.shape[0], HEADS, HEAD_DIM, device=half.x.device, dtype=half.x.dtype)
        for layer in range(self.layers):
            self.attention(half, q, layer)

    def gemm_only(self, half: Half) -> None:
        for layer in range(self.layers):
            q = self.gemms_pre(half, layer)
            self.gemms_post(half, q, layer)  # the query stands in for attention's output (same shape)

    def serial(self, halves: list[Half]) -> None:
        for layer in range(self.layers):
            for half in halves:
                self.layer(half, layer)

    def both_free(self, attn_stream: torch.cuda.Stream, gemm_stream: torch.cuda.Stream | None = None) -> None:
        """Attention of half B on `attn_stream` beside the GEMMs of half A (on `gemm_stream`, else the current
        stream): no dependency between them, the best case for overlap."""
        main = torch.cuda.current_stream()
        gemm = gemm_stream or main
        for s in {attn_stream, gemm}:
            if s != main:
                s.wait_stream(main)
        with torch.cuda.stream(attn_stream):
            self.attn_only(self.halves[1])
        with torch.cuda.stream(gemm):
            self.gemm_only(self.halves[0])
        for s in {attn_stream, gemm}:
            if s != main:
                main.wait_stream(s)

    def ring(self, side: torch.cuda.Stream, chunks: int = 1) -> None:
        """Half A's layers on the current stream, half B's on `side` (the engine's schedule); attention calls
        alternate A(l), B(l), A(l+1), ... (each waits for the one before), so each half's attention runs beside
        the other half's o_proj, MLP and next qkv. No tensor crosses streams."""
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        streams = (main, side)
        last: torch.cuda.Event | None = None
        for layer in range(self.layers):
            for half, stream in zip(self.halves, streams, strict=True):
                with torch.cuda.stream(stream):
                    q = self.gemms_pre(half, layer)
                    if last is not None:
                        stream.wait_event(last)
                    attn = self.attention(half, q, layer, chunks)
                    last = torch.cuda.Event()
                    last.record(stream)
                    self.gemms_post(half, attn, layer)
        main.wait_stream(side)

    def ring_att(
        self, att: torch.cuda.Stream, gemm: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None, chunks: int = 1
    ) -> None:
        """Every attention on one stream `att` (so they run one after another, A(l), B(l), A(l+1), ...), each
        half's GEMMs on its own stream (default: the current one and a fresh one), joined by events; with
        `att` at low priority and the GEMM streams high, the GEMMs take the SMs first."""
        main = torch.cuda.current_stream()
        gemm = gemm or (main, torch.cuda.Stream())
        for s in {att, *gemm}:
            if s != main:
                s.wait_stream(main)
        for layer in range(self.layers):
            for half, g in zip(self.halves, gemm, strict=True):
                with torch.cuda.stream(g):
                    q = self.gemms_pre(half, layer)
                att.wait_stream(g)
                with torch.cuda.stream(att):
                    out = self.attention(half, q, layer, chunks)
                q.record_stream(att)  # q was made on g and read on att; out the other way round
                g.wait_stream(att)
                with torch.cuda.stream(g):
                    self.gemms_post(half, out, layer)
                out.record_stream(g)
        for s in {att, *gemm}:
            if s != main:
                main.wait_stream(s)


def time_graph(fn: Callable[[], None], reps: int) -> float:
    """Median ms of `reps` replays of `fn` captured as one CUDA graph."""
    fn()  # compile and warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _median_ms(graph.replay, reps)


def time_eager(fn: Callable[[], None], reps: int) -> float:
    """Median ms of `reps` eager calls of `fn` (GPU time between events; the launches must keep ahead)."""
    fn()
    torch.cuda.synchronize()
    return _median_ms(fn, reps)


def _median_ms(fn: Callable[[], None], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def carved(fn: Callable[[], None], sms: int) -> Callable[[], None]:
    """`fn` with cuBLAS told to leave `sms` SMs free (its SM count target; an experimental torch API)."""

    def call() -> None:
        torch._C._set_sm_carveout_experimental(sms)
        try:
            fn()
        finally:
            torch._C._set_sm_carveout_experimental(None)

    return call


def carve_variants(probe: Probe, run: Callable[..., None], sms: int, side: torch.cuda.Stream) -> None:
    """The GEMMs leave `sms` SMs to attention (which may still take any SM)."""
    run(f"gemm_half_carve{sms}", carved(lambda: probe.gemm_only(probe.halves[0]), sms))
    run(f"both_free_carve{sms}", carved(lambda: probe.both_free(side), sms))
    run(f"ring_carve{sms}", carved(lambda: probe.ring(side), sms))


def green_variants(probe: Probe, run: Callable[..., None], sms: int, side: torch.cuda.Stream) -> None:
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

    for eager in (True, False):  # eager first: a failed capture can leave the device unusable for what follows
        tail = "_eager" if eager else ""
        run(f"attn_half_green{sms}{tail}", attn_green, eager)
        run(f"both_free_green{sms}{tail}", carved(lambda: probe.both_free(green), sms), eager)
        run(
            f"ring_att_green{sms}{tail}",
            carved(lambda: probe.ring_att(green, (torch.cuda.current_stream(), side)), sms),
            eager,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=512, help="the whole step's decode rows (halves: rows/2)")
    p.add_argument("--ctx", type=int, default=576, help="context tokens a row")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--cache-layers", type=int, default=8, help="distinct KV pools, cycled (~1.2 GB each at 512 rows)")
    p.add_argument("--weight-sets", type=int, default=4, help="distinct layer weights, cycled (436 MB each)")
    p.add_argument("--chunks", default="2,4", help="attention row chunks to try in the ring")
    p.add_argument("--sms", default="16,32,48", help="SMs cuBLAS leaves to attention (its SM carve-out)")
    p.add_argument("--green-sms", default="", help="SMs of attention's green context (crashed the H200's context)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    probe = Probe(a.rows, a.ctx, a.layers, a.cache_layers, a.weight_sets)
    side, side2 = torch.cuda.Stream(), torch.cuda.Stream()
    # (least, greatest): the default stream is the least
    low, high = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
    gemm_hi = (torch.cuda.Stream(priority=high), torch.cuda.Stream(priority=high))
    A, B = probe.halves
    r: dict[str, float] = {}

    def run(name: str, fn: Callable[[], None], eager: bool = False) -> None:
        try:
            r[name] = time_eager(fn, a.reps) if eager else time_graph(fn, a.reps)
        except Exception as e:
            print(f"{name}: failed: {type(e).__name__}: {e}"[:300], flush=True)
            return
        print(f"{name:24s} {r[name]:8.3f} ms", flush=True)
        save(r)  # after each schedule: a run cut short keeps what it measured

    def save(results: dict) -> None:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(args=vars(a), device=torch.cuda.get_device_name(), results=results), f, indent=1)

    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, stream priorities {low}..{high}; "
        f"{a.rows} rows x {a.ctx} ctx, {a.layers} layers",
        flush=True,
    )
    run("attn_half", lambda: probe.attn_only(B))
    run("gemm_half", lambda: probe.gemm_only(A))
    run("attn_full", lambda: probe.attn_only(probe.full))
    run("gemm_full", lambda: probe.gemm_only(probe.full))
    run("both_free", lambda: probe.both_free(side))
    run("serial_full", lambda: probe.serial([probe.full]))
    run("serial_halves", lambda: probe.serial(probe.halves))
    run("ring", lambda: probe.ring(side))
    run("ring_att", lambda: probe.ring_att(side, (torch.cuda.current_stream(), side2)))
    for c in [int(x) for x in a.chunks.split(",") if x]:
        run(f"ring_chunk{c}", lambda c=c: probe.ring(side, c))
    run("serial_full_eager", lambda: probe.serial([probe.full]), eager=True)
    run("ring_eager", lambda: probe.ring(side), eager=True)
    run("both_free_eager", lambda: probe.both_free(side), eager=True)
    run("both_free_prio_eager", lambda: probe.both_free(side, gemm_hi[0]), eager=True)
    run("ring_att_eager", lambda: probe.ring_att(side, (side2, torch.cuda.Stream())), eager=True)
    run("ring_att_prio_eager", lambda: probe.ring_att(side, gemm_hi), eager=True)
    for n in [int(x) for x in a.sms.split(",") if x]:
        carve_variants(probe, run, n, side)
    for n in [int(x) for x in a.green_sms.split(",") if x]:  # last: they may leave the device unusable
        green_variants(probe, run, n, side2)
    summary: dict[str, float | str] = dict(r)
    if "attn_half" in r and "gemm_half" in r and "both_free" in r:
        summary["overlap_ratio"] = r["both_free"] / (r["attn_half"] + r["gemm_half"])
        summary["overlap_ideal"] = max(r["attn_half"], r["gemm_half"]) / (r["attn_half"] + r["gemm_half"])
    for base, eager in (("serial_full", False), ("serial_full_eager", True)):
        overlapped = {k: v for k, v in r.items() if k.startswith("ring") and k.endswith("_eager") == eager}
        if base in r and overlapped:
            best = min(overlapped, key=overlapped.get)
            tag = "_eager" if eager else ""
            summary[f"best_ring{tag}"] = best
            summary[f"ring_speedup{tag}"] = r[base] / overlapped[best]
    params = (HEADS + 2 * KV_HEADS) * HEAD_DIM * HIDDEN + HIDDEN * HEADS * HEAD_DIM + 3 * INTER * HIDDEN
    for name, rows in (("half", a.rows // 2), ("full", a.rows)):
        if f"attn_{name}" in r and f"gemm_{name}" in r:
            gbs = rows * a.ctx * KV_HEADS * HEAD_DIM * 4 * a.layers / r[f"attn_{name}"] / 1e6
            tflops = 2 * rows * params * a.layers / r[f"gemm_{name}"] / 1e9
            summary[f"attn_{name}_gbs"], summary[f"gemm_{name}_tflops"] = gbs, tflops
            print(f"rates at {rows} rows: attention {gbs:.0f} GB/s, GEMM chain {tflops:.0f} TFLOP/s")
    for k in ("overlap_ratio", "overlap_ideal", "ring_speedup", "ring_speedup_eager"):
        if k in summary:
            print(f"{k:24s} {summary[k]:8.3f}")
    for tag in ("", "_eager"):
        if f"ring_speedup{tag}" in summary:
            gain, best, base = summary[f"ring_speedup{tag}"], summary[f"best_ring{tag}"], f"serial_full{tag}"
            verdict = "PAYS" if gain > 1.05 else "MARGINAL" if gain > 1.0 else "DOES NOT PAY"
            print(
                f"VERDICT{tag} overlap {verdict}: {base} {r[base]:.3f} ms vs {best} {r[best]:.3f} ms "
                f"(x{gain:.3f}) at {a.rows} rows x {a.ctx} ctx, {a.layers} layers"
            )
    save(summary)


if __name__ == "__main__":
    main()
