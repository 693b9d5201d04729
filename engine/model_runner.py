"""Runs one scheduled step on the device: flattened inputs in, one sampled token per finishing row out.

Owns the model and the KV block pool's tensors. Inputs are unpadded: every scheduled request
contributes its new tokens (a whole prompt, a chunk of one, or the single last token of a decode),
with positions, slots in the pool and a row of the block table.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from flotilla.engine.config import EngineConfig
from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.forward_context import AttentionMetadata, forward_context
from flotilla.engine.input_batch import FlatBatch, flatten
from flotilla.engine.layers.attention import Attention
from flotilla.engine.layers.linear import use_triton_gemv
from flotilla.engine.lora.manager import LoRAManager
from flotilla.engine.lora.slots import lora_slots
from flotilla.engine.memory_profile import (
    GIB,
    GraphSample,
    MemoryProfile,
    MemorySnapshot,
    graph_bytes,
    graph_capture_note,
    graph_estimate,
    graph_sample_indices,
    memory_profile,
    requested_bytes,
)
from flotilla.engine.model_loader import load_model, reload_weights, torch_dtype
from flotilla.engine.models.causal_lm import CausalLM
from flotilla.engine.parallel_state import is_last_stage, min_over_ranks
from flotilla.engine.penalty_counts import PenaltyCounts, table_bytes
from flotilla.engine.quantization.kv_scale_calibration import CALIBRATION_TOKENS, calibrate_kv_scales
from flotilla.engine.request import Request
from flotilla.engine.sampler import SamplerOutput, apply_token_bitmask, sample, token_ranks
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.scheduler import SchedulerOutput
from flotilla.engine.sleep_mode import SleepingWeights
from flotilla.engine.spec_decode.decode_rows import as_decode_rows, max_decode_rows
from flotilla.engine.spec_decode.rejection_sampler import DraftGroup, accepted_prefix, greedy_accepted, verify
from flotilla.engine.staging import device_tensor
from flotilla.kernels.dispatch import greedy_tokens

logger = logging.getLogger(__name__)

LogprobEntry = dict[int, tuple[float, int]]  # {token id: (logprob, rank)}
# Prompt logprobs are computed for this many bytes of float32 logits at a time (rows of the vocabulary's width).
PROMPT_LOGPROBS_SLICE_BYTES = 64 << 20


@dataclass
class ModelInputs:
    """One step's model inputs as device tensors (the eager path; rows to draw stay in the FlatBatch)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata


@dataclass
class StepOutput:
    """What one step produced, keyed by request id."""

    tokens: dict[str, int] = field(default_factory=dict)
    # {token id: (logprob, rank)} for the drawn token and the top-N, per request that asked
    logprobs: dict[str, dict[int, tuple[float, int]]] = field(default_factory=dict)
    # prompt logprobs computed this step: (position of the first prompt token covered, entries)
    prompt_logprobs: dict[str, tuple[int, list[dict[int, tuple[float, int]]]]] = field(default_factory=dict)
    # Requests that had drafts: their accepted drafts then one more token, and those tokens' logprobs
    verified: dict[str, list[int]] = field(default_factory=dict)
    verified_logprobs: dict[str, list[dict[int, tuple[float, int]]]] = field(default_factory=dict)


@dataclass
class LaunchedStep:
    """A step whose work is queued on the device; `ModelRunner.collect` turns it into a StepOutput."""

    start: float
    graphed: bool
    rows: list[SamplingRow]
    graph_tokens: int = 0  # the replayed graph's padded token count (0: eager)
    draft_groups: list[DraftGroup] = field(default_factory=list)
    result: StepOutput = field(default_factory=StepOutput)
    drawn: SamplerOutput | None = None  # host tensors, valid once `copied` has completed
    copied: torch.cuda.Event | None = None
    host_s: float = 0.0
    # Set while the draw waits for the rows' grammar bitmask (structured output): `ModelRunner.draw`.
    hidden: torch.Tensor | None = None


@dataclass
class StepTiming:
    """Where the last step's wall time went, for benchmarks: the host's part of `launch` (input
    preparation and launches) and the time from `launch` to the end of `collect` (with
    asynchronous scheduling, that span includes the next step's launch)."""

    host_s: float = 0.0
    total_s: float = 0.0
    graphed: bool = False
    sync_s: float = 0.0  # of `collect`, waiting for the drawn ids (the device's part beyond the host's)
    graph_tokens: int = 0  # the replayed graph's padded token count (0: eager)


class ModelRunner:
    """Loads the model, allocates the KV pool and executes steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device.device)
        self.dtype = torch_dtype(config.model.dtype)
        # --kv-cache-dtype fp8 (= fp8_e4m3): one byte per element, so about twice the blocks.
        self.kv_dtype = torch.float8_e4m3fn if config.cache.kv_cache_dtype.startswith("fp8") else self.dtype
        self.block_size = config.cache.block_size
        # Streams for requests without a seed of their own (CPU: drawing seeds must not sync the GPU).
        # The runner's only randomness; dummy weights draw from their own seeded generator, so the
        # process-wide torch seed is left alone.
        self.generator = torch.Generator().manual_seed(config.model.seed)
        # The penalised requests' token counts, kept on the device and updated with new tokens only.
        self.penalty_counts = PenaltyCounts(self.device, config.scheduler.max_num_seqs)
        # The device before this engine adds anything: what is held then is not charged to its budget.
        self.start_memory = self._memory_at_start()
        self.memory_profile: MemoryProfile | None = None  # the start-up profile's accounting (GPU, no override)
        # What the profile's graph captures left held after they were dropped (the kernels they loaded, cuBLAS's
        # workspace for the capture stream): the real capture finds it done, and the estimate charged it.
        self.graph_profile_kept = 0
        started = time.perf_counter()
        self.model = load_model(config.model, self.device)
        logger.info("model loaded in %.1f s (%s weights%s)", time.perf_counter() - started,
                    config.model.load_format, f", {config.model.quantization}" if config.model.quantization else "")
        lc = config.lora  # wrapped before profiling, so the adapter slots count against the memory budget
        self.lora = LoRAManager(self.model, lc.max_loras, lc.max_lora_rank, lc.max_cpu_loras) if lc.enable_lora \
            else None
        use_triton_gemv(self.model, config.device.triton_gemv_max_rows)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        # A draft model (speculative decoding) is loaded before the profile too: its weights, dummy step and KV pool
        # count against the same budget, as vLLM's runner loads and profiles its drafter.
        self.draft_model = self._load_draft_model()
        self.draft_layers = [m for m in self.draft_model.modules() if isinstance(m, Attention)] \
            if self.draft_model is not None else []
        self.num_blocks = self._decide_num_blocks()
        self.kv_cache = self._allocate_kv_cache()
        self.draft_kv_cache = self._allocate_draft_kv_cache()
        if config.cache.calculate_kv_scales:  # before any graph capture: graphs bake the scales in
            self._calibrate_kv_scales()
        self.num_tokens_fed = 0  # tokens that went through the model, for tests and stats
        self.last_step = StepTiming()
        # The last launch's drawn ids on the device, and each drawing request's row in them.
        self._last_drawn = torch.empty(0, dtype=torch.long, device=self.device)
        self._last_rows: dict[str, int] = {}
        # Decode and small prefill/extend steps from CUDA graphs on the GPU. (The CPU path stays eager;
        # tests attach an uncaptured StepGraphs there to check the padded inputs against the eager path.)
        self.graphs: StepGraphs | None = None
        spec = config.speculative
        # A verification step runs as a decode step of one row per token (`as_decode_rows`).
        self.verify_query_len = 1 + spec.num_speculative_tokens if spec is not None else 1
        self.asleep: set[str] = set()  # sleep mode's tags whose memory is freed now
        self._sleeping: list[SleepingWeights] = []
        self.graph_bytes = 0  # what the capture took on the device (the profile charged an estimate of it)
        if self._captures_graphs:
            self.graphs, self.graph_bytes = self._measured_capture()
            self._log_graph_memory()

    @property
    def _captures_graphs(self) -> bool:
        return self.device.type == "cuda" and not self.config.model.enforce_eager

    def _step_graphs(self) -> StepGraphs:
        """The graphs this runner captures (not captured yet)."""
        sched, spec = self.config.scheduler, self.config.speculative
        rows = sched.max_num_seqs if spec is None else \
            max_decode_rows(sched.max_num_seqs, spec.num_speculative_tokens, spec.disable_by_batch_size)
        return StepGraphs(
            self.model, sched.max_num_seqs, sched.max_num_batched_tokens, self.config.model.max_model_len,
            self.block_size, self.device, lora=self.lora is not None, max_decode_rows=rows,
            max_capture_size=self.config.model.max_cudagraph_capture_size,
            sizes=self.config.model.compilation_config.get("cudagraph_capture_sizes"),
        )

    def _profile_graph_memory(self) -> int:
        """What capturing the CUDA graphs will take on the device, estimated before the KV pool is sized
        (`graph_estimate`): some of the graphs (`graph_sample_indices`: each kind's largest and two more) are captured
        in the real capture's order over a pool of one block and dropped again. The capture's steps are all padding,
        which reads and writes no KV, so what the graphs take (their pool, kept outputs, input buffers and the
        driver's share) does not depend on the pool."""
        if not self._captures_graphs:
            return 0
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        start = MemorySnapshot.measure(self.device)
        self.kv_cache = self._allocate_kv_cache(num_blocks=1)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = MemorySnapshot.measure(self.device)
        graphs = self._step_graphs()
        keys = graphs.keys()
        picked = graph_sample_indices([key.kind for key in keys])
        samples, kinds = [], set()
        for key in (keys[i] for i in picked):
            graphs.capture([key])
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the eager warm-up pass's activations: charged with the dummy step's peak
            after = MemorySnapshot.measure(self.device)
            samples.append(GraphSample(key.tokens, graph_bytes(before, after), graphs.output_bytes(key),
                                       key.kind in kinds))
            kinds.add(key.kind)
            before = after
        del graphs
        self.kv_cache = self._release_kv_cache()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.graph_profile_kept = graph_bytes(start, MemorySnapshot.measure(self.device))
        sampled = set(picked)
        estimate = graph_estimate(samples, [key.tokens for i, key in enumerate(keys) if i not in sampled])
        logger.info("CUDA graph memory: %.2f GiB estimated for %d graphs from %d captured first (%s MiB, %s MiB of "
                    "it outputs)", estimate / GIB, len(keys), len(samples),
                    [round(s.cost / 2**20, 1) for s in samples], [round(s.output / 2**20, 1) for s in samples])
        return estimate

    def _measured_capture(self) -> tuple[StepGraphs, int]:
        """The captured graphs and what building and capturing them took on the device (`graph_bytes`)."""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = MemorySnapshot.measure(self.device)
        graphs = self._step_graphs()
        graphs.capture()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the eager warm-up passes' activations: charged with the dummy step's peak
        return graphs, graph_bytes(before, MemorySnapshot.measure(self.device))

    def _log_graph_memory(self) -> None:
        """Say what the real capture took against what the memory profile charged for it (a warning when more)."""
        profile = self.memory_profile
        if profile is None:  # no profile sized the pool (--num-gpu-blocks-override)
            logger.info("CUDA graph memory: %.2f GiB on the device", self.graph_bytes / GIB)
            return
        over = self.graph_bytes + self.graph_profile_kept > profile.cuda_graphs
        logger.log(logging.WARNING if over else logging.INFO, "CUDA graph memory: %s",
                   graph_capture_note(profile.cuda_graphs, self.graph_bytes, self.graph_profile_kept,
                                      self.bytes_per_block))

    # --- KV pool --------------------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block takes over all layers (K and V), the draft model's included: a block id owns a block in
        both pools."""
        target = self._block_bytes(self.attention_layers, self.kv_dtype)
        return target + self._block_bytes(self.draft_layers, self.dtype)

    def _block_bytes(self, layers: list[Attention], dtype: torch.dtype) -> int:
        if not layers:
            return 0
        elem = torch.empty(0, dtype=dtype).element_size()
        return len(layers) * 2 * self.block_size * layers[0].num_kv_heads * layers[0].head_dim * elem

    def _load_draft_model(self) -> CausalLM | None:
        """The draft model of `--speculative-config`'s draft-model method, or None. Not on tensor/pipeline-parallel
        workers: the engine refuses a draft model with them (`build_speculator`)."""
        spec, parallel = self.config.speculative, self.config.parallel
        if spec is None or spec.method != "draft_model" or \
                parallel.tensor_parallel_size * parallel.pipeline_parallel_size > 1:
            return None
        from flotilla.engine.spec_decode.draft_model_proposer import load_draft_model

        started = time.perf_counter()
        model = load_draft_model(self.config, self.device)
        logger.info("draft model loaded in %.1f s", time.perf_counter() - started)
        return model

    def _decide_num_blocks(self) -> int:
        cache = self.config.cache
        per_seq = -(-self.config.model.max_model_len // self.block_size)
        if cache.num_gpu_blocks_override is not None:
            num_blocks = cache.num_gpu_blocks_override
        elif self.device.type == "cuda":
            num_blocks = self._profile_gpu_blocks(per_seq)
        else:
            wanted = self.config.scheduler.max_num_seqs * per_seq
            num_blocks = min(cache.cpu_kv_cache_bytes // self.bytes_per_block, wanted)
        num_blocks = min_over_ranks(num_blocks)  # one block table serves every rank: the tightest decides
        if num_blocks < per_seq:
            raise ValueError(
                f"the KV cache holds {num_blocks} blocks of {self.block_size} tokens, fewer than one "
                f"sequence of --max-model-len {self.config.model.max_model_len} needs ({per_seq}); "
                "lower --max-model-len or give the cache more memory"
            )
        logger.info(
            "KV cache: %d blocks x %d tokens, %s (%.2f GiB%s); max concurrency at %d tokens per request: %.1f",
            num_blocks,
            self.block_size,
            str(self.kv_dtype).removeprefix("torch."),
            num_blocks * self.bytes_per_block / 2**30,
            ", the draft model's pool included" if self.draft_layers else "",
            self.config.model.max_model_len,
            num_blocks * self.block_size / self.config.model.max_model_len,
        )
        return num_blocks

    def _memory_at_start(self) -> MemorySnapshot | None:
        """The device's memory before loading (CUDA, when a profile will size the pool), after collecting what
        unreachable objects (an engine dropped in a reference cycle, say) still hold; raises at once when less than
        --gpu-memory-utilization of the device is free, before the weights take a minute to load."""
        if self.device.type != "cuda" or self.config.cache.num_gpu_blocks_override is not None:
            return None
        gc.collect()
        torch.cuda.empty_cache()
        start = MemorySnapshot.measure(self.device)
        requested_bytes(start, self.config.cache.gpu_memory_utilization)
        return start

    def _profile_gpu_blocks(self, per_seq: int) -> int:
        """vLLM's start-up rule (engine/memory_profile.py): the KV pool gets what is left of this engine's
        `gpu_memory_utilization` budget after its weights, the peak of a dummy step at the full token budget, the
        growth of memory outside torch, and, on the stage that draws, the penalties' tables
        (engine/penalty_counts.py), made at the first penalised draw and kept beside every later step's peak, which
        the dummy step's does not hold. Memory held before the engine started is not charged."""
        assert self.start_memory is not None
        torch.cuda.synchronize()
        loaded = MemorySnapshot.measure(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        n = self.config.scheduler.max_num_batched_tokens
        logger.info("memory profile: a dummy step of %d tokens", n)  # a start-up cut short says where it was
        started = time.perf_counter()
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        with torch.inference_mode(), forward_context(None):
            if self.draft_model is not None:  # it runs before the target's pass, on the step's tokens
                draft_hidden = self.draft_model(ids, torch.arange(n, device=self.device))
                self.draft_model.compute_logits(draft_hidden[-self.config.scheduler.max_num_seqs :]).argmax(dim=-1)
                del draft_hidden
            hidden = self.model(ids, torch.arange(n, device=self.device))
            logits = None
            penalties = 0
            if is_last_stage():  # the only stage that holds the LM head and draws
                logits = self.model.compute_logits(hidden[-self.config.scheduler.max_num_seqs :]).float()
                logits.softmax(dim=-1).sort(dim=-1)  # the sampler's largest intermediates
                penalties = table_bytes(self.penalty_counts.max_requests, logits.shape[1])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device)
        del ids, hidden, logits
        torch.cuda.empty_cache()
        end = MemorySnapshot.measure(self.device)
        graphs = self._profile_graph_memory()
        utilization = self.config.cache.gpu_memory_utilization
        self.memory_profile = profile = memory_profile(self.start_memory, loaded, end, peak, utilization, penalties,
                                                       graphs)
        figures = profile.describe(utilization, end.total)
        logger.info("memory profile: %s (dummy step of %d tokens, %.1f s)", figures, n, time.perf_counter() - started)
        num_blocks = max(profile.kv_cache // self.bytes_per_block, 0)
        if num_blocks < per_seq:
            raise ValueError(
                f"one sequence of --max-model-len {self.config.model.max_model_len} needs "
                f"{per_seq * self.bytes_per_block / GIB:.2f} GiB of KV cache, more than is left: {figures}; lower "
                "--max-model-len, --max-num-batched-tokens or --max-num-seqs, or raise --gpu-memory-utilization"
            )
        return num_blocks

    def _allocate_draft_kv_cache(self) -> torch.Tensor:
        """The draft model's pool: as many blocks as the target's, indexed by the same block ids (empty without a
        draft model)."""
        if not self.draft_layers:
            return torch.empty(0, dtype=self.dtype, device=self.device)
        first = self.draft_layers[0]
        shape = (len(self.draft_layers), 2, self.num_blocks, self.block_size, first.num_kv_heads, first.head_dim)
        pool = _zeros(shape, self.dtype, self.device)
        for i, attn in enumerate(self.draft_layers):
            attn.k_cache, attn.v_cache = pool[i, 0], pool[i, 1]
        return pool

    def _allocate_kv_cache(self, num_blocks: int | None = None) -> torch.Tensor:
        """The target's pool of `num_blocks` (by default the runner's), bound to its attention layers."""
        layer = self.attention_layers[0]
        num_blocks = self.num_blocks if num_blocks is None else num_blocks
        shape = (len(self.attention_layers), 2, num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
        kv_cache = _zeros(shape, self.kv_dtype, self.device)
        for i, attn in enumerate(self.attention_layers):
            attn.k_cache, attn.v_cache = kv_cache[i, 0], kv_cache[i, 1]
            if self.kv_dtype != torch.float8_e4m3fn:  # checkpoint KV scales apply to fp8 caches only
                attn.k_scale = attn.v_scale = 1.0
        return kv_cache

    def release(self) -> None:
        """Give the KV pools, the CUDA graphs, the penalties' tables and the draft model back to the device (the
        runner cannot run a step afterwards): a shut-down engine frees them though something (a caller, a reference
        cycle) still holds it. Dropping the last reference to an engine frees them too."""
        self.graphs = None
        self.kv_cache = self._release_kv_cache()
        for attn in self.draft_layers:
            attn.k_cache = attn.v_cache = torch.empty(0, device=self.device)
        self.draft_kv_cache = torch.empty(0, dtype=self.dtype, device=self.device)
        self.draft_model, self.draft_layers = None, []  # the draft's weights: nothing else holds them
        self.penalty_counts = PenaltyCounts(self.device, self.config.scheduler.max_num_seqs)
        self._last_drawn = torch.empty(0, dtype=torch.long, device=self.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- sleep mode (engine/sleep_mode.py) ---------------------------------------------------------

    def sleep(self, level: int) -> None:
        """Give the device the KV pools (contents forgotten) and the weights (level 1: copied to host memory first;
        level 2: discarded, but the buffers) and drop the CUDA graphs, which replay the freed addresses. What is
        asleep already stays as it is."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # nothing launched may still read what is freed
        self.graphs = None
        if "kv_cache" not in self.asleep:
            self.kv_cache = self._release_kv_cache()
            for attn in self.draft_layers:
                attn.k_cache = attn.v_cache = torch.empty(0, device=self.device)
            self.draft_kv_cache = torch.empty(0, dtype=self.dtype, device=self.device)
            self.asleep.add("kv_cache")
        if "weights" not in self.asleep:
            self._sleeping = [SleepingWeights([self.model], keep_weights=level == 1)]
            if self.draft_model is not None:  # kept at level 2 too: reload_weights refills the target only
                self._sleeping.append(SleepingWeights([self.draft_model], keep_weights=True))
            self.asleep.add("weights")
        if self.device.type == "cuda":
            gc.collect()  # the dropped graphs' pools go back only with the graph objects
            torch.cuda.empty_cache()  # the freed blocks back to the device, for others to use

    def wake_up(self, tags: Iterable[str]) -> None:
        """Take back what `tags` name ("weights", "kv_cache") of what is asleep; once nothing is, capture the CUDA
        graphs again."""
        if "weights" in tags and "weights" in self.asleep:
            for weights in self._sleeping:
                weights.restore()
            self._sleeping = []
            self.asleep.discard("weights")
        if "kv_cache" in tags and "kv_cache" in self.asleep:
            self.kv_cache = self._allocate_kv_cache()
            self.draft_kv_cache = self._allocate_draft_kv_cache()
            self.asleep.discard("kv_cache")
        if not self.asleep and self._captures_graphs and self.graphs is None:
            started = time.perf_counter()
            self.graphs, self.graph_bytes = self._measured_capture()
            logger.info("wake-up: CUDA graphs captured again in %.2f s (%.2f GiB)", time.perf_counter() - started,
                        self.graph_bytes / GIB)

    def reload_weights(self) -> None:
        """Fill the target model's weights again from where start-up read them (after a level-2 sleep)."""
        if "weights" in self.asleep:
            raise RuntimeError("the weights are asleep: wake_up(tags=['weights']) before reload_weights")
        if self.lora is not None:  # the adapters' wrappers rename the layers the checkpoint's tensors load into
            raise ValueError("reload_weights does not support --enable-lora yet")
        reload_weights(self.model, self.config.model)

    def _release_kv_cache(self) -> torch.Tensor:
        """Unbind the target's pool from its attention layers; returns the empty tensor that takes its place."""
        for attn in self.attention_layers:
            attn.k_cache = attn.v_cache = torch.empty(0, device=self.device)
        return torch.empty(0, dtype=self.kv_dtype, device=self.device)

    def _calibrate_kv_scales(self) -> None:
        sched = self.config.scheduler
        length = min(CALIBRATION_TOKENS, sched.max_num_batched_tokens, self.config.model.max_model_len)
        calibrate_kv_scales(self.model, self.attention_layers, self.config.model.hf_config["vocab_size"], length,
                            self.block_size, self.device)

    # --- one step ---------------------------------------------------------------------------------

    def prepare_inputs(self, flat: FlatBatch) -> ModelInputs:
        """The flattened step as tensors, unpadded."""
        max_blocks = max(len(t) for t in flat.block_tables)
        block_tables = [t + [0] * (max_blocks - len(t)) for t in flat.block_tables]

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return device_tensor(values, dtype, self.device)

        metadata = AttentionMetadata(
            slot_mapping=tensor(flat.slots, torch.long),
            block_tables=tensor(block_tables, torch.int32),
            query_start_loc=tensor(flat.query_start_loc, torch.int32),
            seq_lens=tensor(flat.seq_lens, torch.int32),
            max_query_len=flat.max_query_len,
            max_seq_len=max(flat.seq_lens),
        )
        return ModelInputs(
            input_ids=tensor(flat.input_ids, torch.long),
            positions=tensor(flat.positions, torch.long),
            metadata=metadata,
        )

    def execute(self, out: SchedulerOutput,
                bitmask_for: Callable[[list[SamplingRow]], torch.Tensor | None] | None = None) -> StepOutput:
        """Run one step to the end: launch it, draw (masked by `bitmask_for(rows)` when a row has a
        grammar), then wait for its tokens."""
        step = self.launch(out)
        if step.hidden is not None:
            self.draw(step, bitmask_for(step.rows) if bitmask_for is not None else None)
        return self.collect(step)

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> LaunchedStep:
        """Queue the step's work on the device (from a CUDA graph when one holds it) up to the drawn
        ids' copy to the host, without waiting for it: the host may schedule and launch the next
        step meanwhile. Inputs still being drawn by the previous launch come from its device ids."""
        start = time.perf_counter()
        self._copy_blocks(out.block_copies)
        flat = as_decode_rows(flatten(out, self.block_size), self.verify_query_len)
        # Each token's adapter slot (None: no token uses one); LoRA graphs read them from their buffer.
        token_slots = self.lora.slot_values(out) if self.lora is not None else None
        hidden = self.graphs.run(flat, self._fill_pending, token_slots) if self.graphs is not None else None
        graphed = hidden is not None
        if hidden is None:
            if self.graphs is not None:
                self.graphs.log_eager(flat, token_slots is not None)
            inputs = self.prepare_inputs(flat)
            self._fill_pending(inputs.input_ids, flat)
            slots = None if token_slots is None else device_tensor(token_slots, torch.long, self.device)
            with forward_context(inputs.metadata), lora_slots(slots):
                hidden = self.model(inputs.input_ids, inputs.positions)
        self.num_tokens_fed += len(flat.input_ids)
        step = LaunchedStep(start=start, graphed=graphed, rows=flat.rows, draft_groups=flat.draft_groups,
                            graph_tokens=self.graphs.last_tokens if graphed and self.graphs is not None else 0)
        last_stage = is_last_stage()  # earlier pipeline stages pass their hidden states on, and draw nothing
        if flat.prompt_spans and last_stage:  # rare (prompt_logprobs): synchronous
            self._prompt_logprobs(hidden, flat.positions, flat.prompt_spans, step.result)
        if flat.rows and last_stage and any(r.request.grammar is not None for r in flat.rows):
            step.hidden = hidden
        elif flat.rows and last_stage:
            self._draw(hidden, step)
        step.host_s = time.perf_counter() - start
        return step

    @torch.inference_mode()
    def draw(self, step: LaunchedStep, bitmask: torch.Tensor | None) -> None:
        """Queue a launched step's deferred draw, its logits masked by `bitmask` (host int32, one row per
        sampling row; None = unconstrained)."""
        if step.hidden is None:
            return
        start = time.perf_counter()
        hidden, step.hidden = step.hidden, None
        self._draw(hidden, step, bitmask)
        step.host_s += time.perf_counter() - start

    def collect(self, step: LaunchedStep) -> StepOutput:
        """Wait for a launched step's drawn ids (the step's one host sync) and return its output."""
        result = step.result
        sync_s = 0.0
        if step.drawn is not None:
            if step.copied is not None:
                waited = time.perf_counter()
                step.copied.synchronize()
                sync_s = time.perf_counter() - waited
            tokens = step.drawn.token_ids.tolist()
            entries = self._token_logprobs(step.drawn, step.rows, tokens)
            drafted = self._verified(step, tokens, entries, result)
            for i, row in enumerate(step.rows):
                rid = row.request.request_id
                if rid not in drafted:
                    result.tokens[rid] = tokens[i]
                    entry = entries[i]
                    if entry is not None:
                        result.logprobs[rid] = entry
        self.last_step = StepTiming(step.host_s, time.perf_counter() - step.start, step.graphed, sync_s,
                                    step.graph_tokens)
        return result

    def _draw(self, hidden: torch.Tensor, step: LaunchedStep, bitmask: torch.Tensor | None = None) -> None:
        """Queue the rows' draws and the copy of their ids (and logprobs) to pinned host memory."""
        rows = step.rows
        indices = [r.logits_index for r in rows]
        first = indices[0]
        if indices == list(range(first, first + len(rows))):  # decode rows, or one prompt's last token: a view
            selected = hidden[first : first + len(rows)]
        else:
            selected = hidden[device_tensor(indices, torch.long, self.device)]
        logits = self.model.compute_logits(selected)
        if bitmask is not None:
            logits = apply_token_bitmask(logits, bitmask.to(self.device, non_blocking=True))
        if step.draft_groups and all(_plain_greedy(r) for r in rows):
            # Greedy verification is argmax equality: only the ids go to the host, which judges the drafts.
            drawn = SamplerOutput(token_ids=greedy_tokens(logits))
        elif step.draft_groups:
            batch = build_sampling_batch(rows, logits.shape[1], self.device, self.generator,
                                         self.config.model.logprobs_mode, self.penalty_counts)
            drawn = verify(logits.float(), batch, step.draft_groups)
        elif all(_plain_greedy(r) for r in rows):
            drawn = SamplerOutput(token_ids=greedy_tokens(logits))  # bf16 argmax = fp32 argmax, ties too
        else:
            logits = logits.float()
            batch = build_sampling_batch(rows, logits.shape[1], self.device, self.generator,
                                         self.config.model.logprobs_mode, self.penalty_counts)
            drawn = sample(logits, batch)
        # The next launch reads these ids on the device for inputs it does not know yet.
        self._last_drawn = drawn.token_ids
        self._last_rows = {r.request.request_id: i for i, r in enumerate(rows)}
        step.drawn = _to_host(drawn)
        if self.device.type == "cuda":
            step.copied = torch.cuda.Event()
            step.copied.record()

    def _fill_pending(self, input_ids: torch.Tensor, flat: FlatBatch) -> None:
        """Put the previous launch's drawn ids, still on the device, into this step's inputs."""
        if not flat.pending:
            return
        dst = device_tensor([i for i, _ in flat.pending], torch.long, self.device)
        src = device_tensor([self._last_rows[rid] for _, rid in flat.pending], torch.long, self.device)
        input_ids[dst] = self._last_drawn[src]

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give a request its own copy of a shared, partly filled block."""
        if copies:
            src = device_tensor([c[0] for c in copies], torch.long, self.device)
            dst = device_tensor([c[1] for c in copies], torch.long, self.device)
            # As bytes: torch has no fp8 indexing kernels on every device.
            pool = self.kv_cache.view(torch.uint8) if self.kv_cache.element_size() == 1 else self.kv_cache
            pool[:, :, dst] = pool[:, :, src]

    @staticmethod
    def _verified(
        step: LaunchedStep, tokens: list[int], entries: list[LogprobEntry | None], result: StepOutput
    ) -> set[str]:
        """Each drafting request's output tokens (and their logprobs); returns their ids."""
        if not step.draft_groups:
            return set()
        assert step.drawn is not None, "collect() calls this once the step was drawn"
        judged = step.drawn.accepted  # None: greedy rows, judged here
        accepted = judged.tolist() if judged is not None else greedy_accepted(tokens, step.draft_groups)
        for group in step.draft_groups:
            rid = step.rows[group.first_row].request.request_id
            kept = accepted_prefix(tokens, accepted, group)
            result.verified[rid] = kept
            if entries[group.first_row] is not None:
                span = entries[group.first_row : group.first_row + len(kept)]
                result.verified_logprobs[rid] = [e for e in span if e is not None]
        return set(result.verified)

    def _token_logprobs(
        self, drawn: SamplerOutput, rows: list[SamplingRow], tokens: list[int]
    ) -> list[LogprobEntry | None]:
        """Each row's logprob entry (None for rows that did not ask, or when the sampler computed none)."""
        entries: list[LogprobEntry | None] = [None] * len(rows)
        if drawn.logprobs is None or drawn.ranks is None or drawn.top_ids is None or drawn.top_logprobs is None:
            return entries
        chosen, ranks = drawn.logprobs.tolist(), drawn.ranks.tolist()
        top_ids, top_values = drawn.top_ids.tolist(), drawn.top_logprobs.tolist()
        for i, row in enumerate(rows):
            n = row.request.sampling_params.logprobs
            if n is not None:
                entries[i] = logprob_entry(tokens[i], chosen[i], ranks[i], top_ids[i][:n], top_values[i][:n])
        return entries

    def _prompt_logprobs(
        self,
        hidden: torch.Tensor,
        positions: list[int],
        spans: list[tuple[Request, int, int]],
        result: StepOutput,
    ) -> None:
        """Log-probabilities of each next prompt token under the raw model distribution, computed for a slice of
        the span's tokens at a time: the logits and their float copies are `[tokens, vocab]` each, and for a
        whole step's prompt tokens at once (8,192 x a 128k vocabulary: ~11 GB) they overflowed the memory that
        the KV-cache sizing leaves."""
        rows = max(1, PROMPT_LOGPROBS_SLICE_BYTES // (4 * self.config.model.hf_config["vocab_size"]))
        for req, first, count in spans:
            start = positions[first]
            n = req.sampling_params.prompt_logprobs
            assert n is not None, "flatten() spans only requests that ask for prompt logprobs"
            entries = []
            for offset in range(0, count, rows):
                size = min(rows, count - offset)
                logits = self.model.compute_logits(hidden[first + offset : first + offset + size])
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                begin = start + 1 + offset
                targets = torch.tensor(req.prompt_token_ids[begin : begin + size], device=self.device)
                chosen = logprobs.gather(1, targets.unsqueeze(1))
                ranks = token_ranks(logprobs, chosen).tolist()
                top = logprobs.topk(n, dim=-1)
                chosen_values, top_ids = chosen.squeeze(1).tolist(), top.indices.tolist()
                top_values = top.values.tolist()
                entries += [
                    logprob_entry(target, chosen_values[j], ranks[j], top_ids[j], top_values[j])
                    for j, target in enumerate(targets.tolist())
                ]
            result.prompt_logprobs[req.request_id] = (start + 1, entries)


def _to_host(drawn: SamplerOutput) -> SamplerOutput:
    """The same tensors, copied asynchronously into pinned host memory when they live on a GPU.

    (A plain `.tolist()` later would wait for everything queued by then, the next step included.)
    """

    def host(t: torch.Tensor) -> torch.Tensor:
        if not t.is_cuda:
            return t
        pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return pinned.copy_(t, non_blocking=True)

    def maybe_host(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else host(t)

    return SamplerOutput(
        token_ids=host(drawn.token_ids),
        logprobs=maybe_host(drawn.logprobs),
        ranks=maybe_host(drawn.ranks),
        top_ids=maybe_host(drawn.top_ids),
        top_logprobs=maybe_host(drawn.top_logprobs),
        accepted=maybe_host(drawn.accepted),
    )


def _plain_greedy(row: SamplingRow) -> bool:
    """True when the sampler would reduce to argmax: greedy, no penalties, bias, bans, token masks
    (allowed_token_ids, bad_words) or logprobs (`Request.argmax_from`, made once per request).

    `min_tokens` bans stop ids and EOS until reached (`build_sampling_batch`); with `ignore_eos` and no
    stop ids it bans nothing (benchmark clients send it so), and the row stays on the argmax path.
    """
    return row.output_index >= row.request.argmax_from


def logprob_entry(
    token: int, logprob: float, rank: int, top_ids: list[int], top_values: list[float]
) -> dict[int, tuple[float, int]]:
    """vLLM's per-position logprobs: the top-N tokens by rank, plus the actual token with its rank. A token of
    the top-N keeps its top-N position, as vLLM's dict (its rank counts ties, `token_ranks`: on a tie the two
    differ)."""
    entry = {t: (v, r + 1) for r, (t, v) in enumerate(zip(top_ids, top_values, strict=True))}
    entry.setdefault(token, (logprob, rank))
    return entry


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed pool. On the CPU it comes from calloc (through numpy), so the OS supplies zero pages
    only as blocks are first touched: a 4 GiB pool costs nothing until it fills."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    raw = np.zeros(shape, dtype=np.dtype(f"i{dtype.itemsize}") if dtype.itemsize < 8 else np.int64)
    return torch.from_numpy(raw).view(dtype)
