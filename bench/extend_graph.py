"""A cached-prefix extend's step, replayed alone: the engine's one-sequence mixed graph of a `new`-token extend over a
`prefix_len`-token cached prefix (issue 19's request: 20 new tokens over 2,000, padded into the 32-row graph), for
bench/tile_sweep.py's `extend` families (the skinny GEMM at 32 rows).

The engine (prefix caching on) runs one request to cache a random prefix, then a request of that prefix and `new`
tokens of its own: its step, as `StepGraphs.run` was given it (token ids, positions, KV slots, the block table), is
recorded. A phase stages that step into the graphs' input buffers and replays the graph `steps` times back to back,
each replay between two CUDA events: the GPU time of the extend's forward pass alone (no host, no sampling), which is
what the GEMM tiles change. A replay writes the same KV slots again (the recorded request's own, freed blocks): no
live request reads them. `recapture` captures that one graph again, after a table changed in-process (a graph holds
the launches of its capture).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

PREFIX_LEN, NEW_TOKENS = 2000, 20
MAX_MODEL_LEN = PREFIX_LEN + NEW_TOKENS + 32  # bench/prefix.py's for its 16 output tokens (prefix7-gpu.sh's engine)


def run_request(engine: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """A greedy request to its end; its output tokens."""
    from flotilla.engine.sampling_params import SamplingParams

    req = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return list(req.output_token_ids)


def copy_step(flat: Any) -> Any:
    """The graph-side fields of a step (`FlatBatch`), copied: the runner's own lists change after the step."""
    from flotilla.engine.input_batch import FlatBatch

    return FlatBatch(input_ids=list(flat.input_ids), positions=list(flat.positions), slots=list(flat.slots),
                     query_start_loc=list(flat.query_start_loc), seq_lens=list(flat.seq_lens),
                     block_tables=[list(b) for b in flat.block_tables], max_query_len=flat.max_query_len)  # fmt: skip


class ExtendGraph:
    """The recorded extend step and its graph (module docstring)."""

    def __init__(self, engine: Any, vocab: int, rng: random.Random, prefix_len: int = PREFIX_LEN,
                 new: int = NEW_TOKENS) -> None:  # fmt: skip
        self.engine, self.vocab, self.prefix_len, self.new = engine, vocab, prefix_len, new
        graphs = engine.runner.graphs
        if graphs is None:
            raise RuntimeError("the engine runs without CUDA graphs: no extend graph to replay")
        self.graphs = graphs
        prefix = [rng.randrange(100, vocab) for _ in range(prefix_len)]
        run_request(engine, prefix + [rng.randrange(100, vocab) for _ in range(new)], 1)  # caches the prefix
        seen: list[Any] = []
        inner = graphs.run

        def run(flat, fill_pending, token_slots=None):
            if flat.num_seqs == 1 and flat.num_tokens == new and flat.max_query_len == new:
                seen.append(copy_step(flat))
            return inner(flat, fill_pending, token_slots)

        graphs.run = run
        try:
            run_request(engine, prefix + [rng.randrange(100, vocab) for _ in range(new)], 1)  # the prefix's hit
        finally:
            del graphs.run
        if not seen:
            raise RuntimeError(f"no {new}-token extend step reached the graphs (prefix caching off?)")
        self.flat = seen[-1]
        self.key = graphs.pick(self.flat)
        if self.key is None or self.key.decode or self.key.seqs != 1:
            raise RuntimeError(f"the extend step runs in {self.key}, not a one-sequence mixed graph")

    @property
    def label(self) -> str:
        """The SWEEP A/B line's name for what is timed."""
        return f"extend {self.new} over {self.prefix_len} cached ({self.key.tokens}-row graph)"

    def describe(self) -> dict:
        """What is replayed: the step's tokens and context, the graph's key."""
        k = self.key
        return {"new_tokens": self.flat.num_tokens, "context": self.flat.seq_lens[0], "graph_tokens": k.tokens,
                "graph_seqs": k.seqs, "graph_width": k.width}  # fmt: skip

    def recapture(self) -> float:
        """Capture the extend's graph again (the tables as they are now); the seconds it took."""
        t0 = time.perf_counter()
        self.graphs._graphs.pop(self.key, None)
        self.graphs.capture([self.key])
        return time.perf_counter() - t0

    def time(self, steps: int, settle: int = 3) -> dict:
        """The recorded step staged, `settle` replays, then `steps` replays each timed by CUDA events: ms median and
        mean a replay."""
        import torch

        graph, _ = self.graphs._graphs[self.key]
        self.graphs._stage(self.flat, self.key)
        torch.cuda.synchronize()
        for _ in range(settle):
            graph.replay()
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in marks:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        ms = [start.elapsed_time(end) for start, end in marks]
        return {"ms_median": statistics.median(ms), "ms_mean": statistics.fmean(ms), "graphed": steps,
                "steps": steps}  # fmt: skip

    def greedy(self, tokens: int = 8) -> list[int]:
        """The greedy tokens of a fixed request whose prefix is cached (its first token from the extend's graph, the
        rest batch-1 decode steps): a fixed prefix cached by a first request, then the same prefix and fixed new
        tokens."""
        fixed = random.Random(1)
        prefix = [fixed.randrange(100, self.vocab) for _ in range(self.prefix_len)]
        suffixes = [[fixed.randrange(100, self.vocab) for _ in range(self.new)] for _ in range(2)]
        run_request(self.engine, prefix + suffixes[0], 1)
        return run_request(self.engine, prefix + suffixes[1], tokens)
