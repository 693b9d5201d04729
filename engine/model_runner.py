"""Runs one scheduled step on the device: flattened inputs in, one sampled token per finishing row out.

Owns the model and the KV block pool's tensors. Inputs are unpadded: every scheduled request
contributes its new tokens (a whole prompt, a chunk of one, or the single last token of a decode),
with positions, slots in the pool and a row of the block table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from flotilla.engine.config import EngineConfig
from flotilla.engine.forward_context import AttentionMetadata, forward_context
from flotilla.engine.layers.attention import Attention
from flotilla.engine.model_loader import load_model, torch_dtype
from flotilla.engine.sampler import sample
from flotilla.engine.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class ModelInputs:
    """One step's tensors, plus which rows produce a token and for which request."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logits_indices: torch.Tensor
    temperatures: torch.Tensor
    sampling_request_ids: list[str]


class ModelRunner:
    """Loads the model, allocates the KV pool and executes steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device.device)
        self.dtype = torch_dtype(config.model.dtype)
        self.block_size = config.cache.block_size
        torch.manual_seed(config.model.seed)
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
        logits_indices: list[int] = []
        temperatures: list[float] = []
        sampling_ids: list[str] = []
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
                logits_indices.append(len(input_ids) - 1)
                temperatures.append(req.sampling_params.temperature)
                sampling_ids.append(req.request_id)

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
            logits_indices=tensor(logits_indices, torch.long),
            temperatures=tensor(temperatures, torch.float32),
            sampling_request_ids=sampling_ids,
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        """Run the model on the step and sample; returns request id -> next token."""
        inputs = self.prepare_inputs(out)
        with forward_context(inputs.metadata):
            hidden = self.model(inputs.input_ids, inputs.positions)
        self.num_tokens_fed += int(inputs.input_ids.numel())
        if not inputs.sampling_request_ids:
            return {}
        logits = self.model.compute_logits(hidden[inputs.logits_indices]).float()
        tokens = sample(logits, inputs.temperatures).tolist()  # the step's one host sync
        return dict(zip(inputs.sampling_request_ids, tokens, strict=True))


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed pool. On the CPU it comes from calloc (through numpy), so the OS supplies zero pages
    only as blocks are first touched: a 4 GiB pool costs nothing until it fills."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    raw = np.zeros(shape, dtype=np.dtype(f"i{dtype.itemsize}") if dtype.itemsize < 8 else np.int64)
    return torch.from_numpy(raw).view(dtype)
