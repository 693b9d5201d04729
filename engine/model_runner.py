"""Runs one scheduled step on the device: flattened inputs in, one sampled token per finishing row out.

Owns the model and the KV block pool's tensors. Inputs are unpadded: every scheduled request
contributes its new tokens (a whole prompt, a chunk of one, or the single last token of a decode),
with positions, slots in the pool and a row of the block table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from flotilla.engine.config import EngineConfig
from flotilla.engine.forward_context import AttentionMetadata, forward_context
from flotilla.engine.layers.attention import Attention
from flotilla.engine.model_loader import load_model, torch_dtype
from flotilla.engine.request import Request
from flotilla.engine.sampler import SamplerOutput, sample
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class ModelInputs:
    """One step's tensors, plus which rows produce a token (or prompt logprobs) for which request."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    sampling_rows: list[SamplingRow]
    # (request, flattened index of its first prompt position this step, number of positions)
    prompt_logprob_spans: list[tuple[Request, int, int]]


@dataclass
class StepOutput:
    """What one step produced, keyed by request id."""

    tokens: dict[str, int] = field(default_factory=dict)
    # {token id: (logprob, rank)} for the drawn token and the top-N, per request that asked
    logprobs: dict[str, dict[int, tuple[float, int]]] = field(default_factory=dict)
    # prompt logprobs computed this step: (position of the first prompt token covered, entries)
    prompt_logprobs: dict[str, tuple[int, list[dict[int, tuple[float, int]]]]] = field(default_factory=dict)


class ModelRunner:
    """Loads the model, allocates the KV pool and executes steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device.device)
        self.dtype = torch_dtype(config.model.dtype)
        self.block_size = config.cache.block_size
        torch.manual_seed(config.model.seed)
        # Streams for requests without a seed of their own (CPU: drawing seeds must not sync the GPU).
        self.generator = torch.Generator().manual_seed(config.model.seed)
        self.model = load_model(config.model, self.device)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.num_blocks = self._decide_num_blocks()
        self.kv_cache = self._allocate_kv_cache()
        self.num_tokens_fed = 0  # tokens that went through the model, for tests and stats

    # --- KV pool --------------------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block takes over all layers (K and V)."""
        layer = self.attention_layers[0]
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return len(self.attention_layers) * 2 * self.block_size * layer.num_kv_heads * layer.head_dim * elem

    def _decide_num_blocks(self) -> int:
        cache = self.config.cache
        per_seq = -(-self.config.model.max_model_len // self.block_size)
        if cache.num_gpu_blocks_override is not None:
            num_blocks = cache.num_gpu_blocks_override
        elif self.device.type == "cuda":
            num_blocks = self._profile_gpu_blocks()
        else:
            wanted = self.config.scheduler.max_num_seqs * per_seq
            num_blocks = min(cache.cpu_kv_cache_bytes // self.bytes_per_block, wanted)
        if num_blocks < per_seq:
            raise ValueError(
                f"the KV cache holds {num_blocks} blocks of {self.block_size} tokens, fewer than one "
                f"sequence of --max-model-len {self.config.model.max_model_len} needs ({per_seq}); "
                "lower --max-model-len or give the cache more memory"
            )
        logger.info(
            "KV cache: %d blocks x %d tokens (%.2f GiB)",
            num_blocks,
            self.block_size,
            num_blocks * self.bytes_per_block / 2**30,
        )
        return num_blocks

    def _profile_gpu_blocks(self) -> int:
        """vLLM's start-up rule: what is left of `gpu_memory_utilization` after weights and a peak step."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        n = self.config.scheduler.max_num_batched_tokens
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        with torch.inference_mode(), forward_context(None):
            hidden = self.model(ids, torch.arange(n, device=self.device))
            self.model.compute_logits(hidden[-self.config.scheduler.max_num_seqs :])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        non_torch = total - free - torch.cuda.memory_reserved()
        budget = total * self.config.cache.gpu_memory_utilization - peak - max(non_torch, 0)
        torch.cuda.empty_cache()
        return max(int(budget // self.bytes_per_block), 0)

    def _allocate_kv_cache(self) -> torch.Tensor:
        layer = self.attention_layers[0]
        shape = (len(self.attention_layers), 2, self.num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
        kv_cache = _zeros(shape, self.dtype, self.device)
        for i, attn in enumerate(self.attention_layers):
            attn.k_cache, attn.v_cache = kv_cache[i, 0], kv_cache[i, 1]
        return kv_cache

    # --- one step ---------------------------------------------------------------------------------

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInputs:
        """Flatten the scheduled requests into the step's tensors."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        rows: list[SamplingRow] = []
        prompt_spans: list[tuple[Request, int, int]] = []
        max_blocks = max(len(s.request.block_ids) for s in out.scheduled)
        block_tables: list[list[int]] = []
        for s in out.scheduled:
            req, start, end = s.request, s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            input_ids += req.token_ids(start, end)
            positions += range(start, end)
            blocks = req.block_ids
            slots += [blocks[p // bs] * bs + p % bs for p in range(start, end)]
            query_start_loc.append(len(input_ids))
            seq_lens.append(end)
            block_tables.append(blocks + [0] * (max_blocks - len(blocks)))
            if s.samples:
                rows += [SamplingRow(r, len(input_ids) - 1) for r in (req, *req.fork_children)]
            if req.sampling_params.prompt_logprobs is not None and start < req.num_prompt_tokens - 1:
                count = min(end, req.num_prompt_tokens - 1) - start
                prompt_spans.append((req, len(input_ids) - (end - start), count))

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        metadata = AttentionMetadata(
            slot_mapping=tensor(slots, torch.long),
            block_tables=tensor(block_tables, torch.int32),
            query_start_loc=tensor(query_start_loc, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            max_query_len=max(s.num_new_tokens for s in out.scheduled),
            max_seq_len=max(seq_lens),
        )
        return ModelInputs(
            input_ids=tensor(input_ids, torch.long),
            positions=tensor(positions, torch.long),
            metadata=metadata,
            sampling_rows=rows,
            prompt_logprob_spans=prompt_spans,
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepOutput:
        """Run the model on the step and draw the next tokens."""
        self._copy_blocks(out.block_copies)
        inputs = self.prepare_inputs(out)
        with forward_context(inputs.metadata):
            hidden = self.model(inputs.input_ids, inputs.positions)
        self.num_tokens_fed += int(inputs.input_ids.numel())
        result = StepOutput()
        if inputs.prompt_logprob_spans:
            self._prompt_logprobs(hidden, inputs, result)
        if not inputs.sampling_rows:
            return result
        indices = torch.tensor([r.logits_index for r in inputs.sampling_rows], device=self.device)
        logits = self.model.compute_logits(hidden[indices]).float()
        batch = build_sampling_batch(inputs.sampling_rows, logits.shape[1], self.device, self.generator)
        drawn = sample(logits, batch)
        ids = [r.request.request_id for r in inputs.sampling_rows]
        result.tokens = dict(zip(ids, drawn.token_ids.tolist(), strict=True))  # the step's one host sync
        if drawn.logprobs is not None:
            self._token_logprobs(drawn, inputs.sampling_rows, result)
        return result

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give a request its own copy of a shared, partly filled block."""
        if copies:
            src = torch.tensor([c[0] for c in copies], device=self.device)
            dst = torch.tensor([c[1] for c in copies], device=self.device)
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    def _token_logprobs(self, drawn: SamplerOutput, rows: list[SamplingRow], result: StepOutput) -> None:
        chosen, ranks = drawn.logprobs.tolist(), drawn.ranks.tolist()
        top_ids, top_values = drawn.top_ids.tolist(), drawn.top_logprobs.tolist()
        for i, row in enumerate(rows):
            n = row.request.sampling_params.logprobs
            if n is None:
                continue
            token = result.tokens[row.request.request_id]
            result.logprobs[row.request.request_id] = logprob_entry(
                token, chosen[i], ranks[i], top_ids[i][:n], top_values[i][:n]
            )

    def _prompt_logprobs(self, hidden: torch.Tensor, inputs: ModelInputs, result: StepOutput) -> None:
        """Log-probabilities of each next prompt token under the raw model distribution."""
        for req, first, count in inputs.prompt_logprob_spans:
            start = int(inputs.positions[first])
            logprobs = torch.log_softmax(self.model.compute_logits(hidden[first : first + count]).float(), dim=-1)
            targets = torch.tensor(req.prompt_token_ids[start + 1 : start + 1 + count], device=self.device)
            chosen = logprobs.gather(1, targets.unsqueeze(1))
            ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
            n = req.sampling_params.prompt_logprobs
            top_values, top_ids = logprobs.topk(n, dim=-1)
            chosen_values, top_ids, top_values = chosen.squeeze(1).tolist(), top_ids.tolist(), top_values.tolist()
            entries = [
                logprob_entry(target, chosen_values[j], ranks[j], top_ids[j], top_values[j])
                for j, target in enumerate(targets.tolist())
            ]
            result.prompt_logprobs[req.request_id] = (start + 1, entries)


def logprob_entry(
    token: int, logprob: float, rank: int, top_ids: list[int], top_values: list[float]
) -> dict[int, tuple[float, int]]:
    """vLLM's per-position logprobs: the top-N tokens by rank, plus the actual token with its rank."""
    entry = {t: (v, r + 1) for r, (t, v) in enumerate(zip(top_ids, top_values, strict=True))}
    entry[token] = (logprob, rank)
    return entry


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed pool. On the CPU it comes from calloc (through numpy), so the OS supplies zero pages
    only as blocks are first touched: a 4 GiB pool costs nothing until it fills."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    raw = np.zeros(shape, dtype=np.dtype(f"i{dtype.itemsize}") if dtype.itemsize < 8 else np.int64)
    return torch.from_numpy(raw).view(dtype)
