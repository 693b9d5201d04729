"""The pooling pass: prefill only, on the engine's own model and KV pool, blocks returned at once; each prompt's
last hidden state goes through a head (the embedding's normalisation here, the classifier's in classify.py).

Runs on the engine's thread (`AsyncEngine.call`, or the offline `LLM`), between steps, so it never
races a generation step for the model or the block manager. Each batch takes KV blocks for its
prompts, runs one forward pass over them (paged attention writes and reads the prompts' K/V as in
any prefill), pools each prompt's last hidden state and frees the blocks before returning: no block
stays referenced beyond the call, whatever happens in between.

The prefix cache works here as for generation (last-token pooling over causal attention reads the
same K/V): a prompt's full blocks that an earlier pass (or an earlier prompt of the same pass) cached
are taken, not computed, and the blocks this pass fills are indexed for later ones. Every block is
keyed with the request's `cache_salt` (on the first block, as a generate request's), so prompts share
blocks only within one salt: without it, an embedding's blocks would be hits, measurable by their
latency, for a request of another tenant.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from flotilla.engine.errors import EngineBusyError, InvalidParamError
from flotilla.engine.forward_context import AttentionMetadata, forward_context
from flotilla.engine.model_runner import ModelRunner
from flotilla.engine.pooling.output import EmbeddingOutput
from flotilla.engine.pooling.params import PoolingParams, check_dimensions
from flotilla.engine.pooling.pooler import last_token_pool
from flotilla.engine.pooling.prompts import GENERATE_RUNNER_REFUSAL, check_prompt, prompt_batches
from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.staging import device_tensor

if TYPE_CHECKING:
    from flotilla.engine.llm_engine import LLMEngine


# A head: hidden states `[N, H]` (each prompt's last, or every token's) -> the rows its task reports `[N, D]`
# (still on the device).
Head = Callable[[torch.Tensor], torch.Tensor]

# The convert each task needs, and why a model of the other convert refuses it.
_WRONG_CONVERT = {
    "embed": "this model is a classifier (--convert classify): it serves /classify, /score and /rerank, not "
             "embeddings",
    "classify": "this model is an embedding model (--convert embed): it serves embeddings and bi-encoder /score, not "
                "classification (serve a *ForSequenceClassification checkpoint, or --convert classify)",
}


def embed_prompts(engine: LLMEngine, prompts: list[list[int]], params: PoolingParams,
                  cache_salt: str | None = None) -> list[EmbeddingOutput]:
    """Embeddings of token-id prompts, in order (runs on the engine's thread); `cache_salt` keys their
    prefix-cache blocks (see the module docstring)."""
    check_pooling(engine, "embed")
    check_dimensions(params, engine.config.model.hf_config)
    rows = pool_prompts(engine, prompts, lambda last: last_token_pool(last, params), cache_salt)
    return [EmbeddingOutput(vec, len(ids)) for vec, ids in zip(rows, prompts, strict=True)]


def check_pooling(engine: LLMEngine, convert: str) -> None:
    """Refuse a pooling task the engine does not serve: the generate runner, or the other convert."""
    model = engine.config.model
    if model.runner != "pooling":
        raise InvalidParamError(GENERATE_RUNNER_REFUSAL, param="model")
    if model.convert != convert:
        raise InvalidParamError(_WRONG_CONVERT[convert], param="model")


def pool_prompts(engine: LLMEngine, prompts: list[list[int]], head: Head, cache_salt: str | None,
                 all_tokens: bool = False) -> list[Any]:
    """`head`'s rows for token-id prompts, in order: every prompt checked, then batch by batch (one prefill pass
    each, its blocks freed before the next). A prompt's answer is its last token's row, or with `all_tokens` (vLLM's
    ALL pooling: the token_classify task) every token's rows, `[num_tokens, D]`; then no prefix-cache block is taken,
    since a cached token's hidden state is not kept (its blocks are indexed for later passes all the same)."""
    runner = engine.runner
    if not isinstance(runner, ModelRunner):
        raise InvalidParamError("pooling is not supported with tensor or pipeline parallelism yet")
    if engine.is_sleeping():  # sleep mode: the weights and the KV pool may be freed; embed and classify alike
        raise EngineBusyError("the engine is asleep (sleep mode): wake it up first")
    if not prompts:
        raise InvalidParamError("input must not be empty", param="input")
    for i, ids in enumerate(prompts):
        check_prompt(i, ids, engine.config.model.max_model_len, engine.vocab_size)
    scheduler = engine.config.scheduler
    out: list[Any] = []
    for batch in prompt_batches(prompts, scheduler.max_num_batched_tokens, scheduler.max_num_seqs):
        out += _pool_batch(engine, runner, batch, head, cache_salt, all_tokens)
    return out


def _pool_batch(engine: LLMEngine, runner: ModelRunner, batch: list[list[int]], head: Head,
                cache_salt: str | None, all_tokens: bool) -> list[Any]:
    blocks = engine.block_manager
    # Every token's row needs every token computed: the block manager takes no cached prefix for a request that
    # asks for prompt logprobs (the same need), so the holders ask for them (nothing reads them).
    params = SamplingParams(max_tokens=1, prompt_logprobs=0 if all_tokens else None)
    holders = [Request(f"pooling-{i}", ids, params, cache_salt=cache_salt) for i, ids in enumerate(batch)]
    taken: list[Request] = []
    computed = False
    try:
        for holder in holders:
            # After the previous holder's allocation: a prompt repeated in one batch hits the blocks the same
            # forward pass fills (each layer writes every token's K/V before any attends).
            cached = blocks.find_cached_prefix(holder)
            holder.num_cached_tokens = len(cached) * blocks.block_size
            if not blocks.allocate(holder, holder.num_tokens - holder.num_cached_tokens, cached):
                blocks.free(holder)  # drops the prompt's block hashes
                raise InvalidParamError("the KV cache has no room for this input now; retry or send fewer inputs",
                                        param="input")
            blocks.record_lookup(holder, len(cached))
            taken.append(holder)
        pooled = _forward(runner, holders, head, all_tokens)
        computed = True
    finally:
        for holder in taken:
            if not computed:  # indexed as if computed: a later prompt must not take K/V never written
                blocks.uncache(holder, holder.num_cached_tokens)
            blocks.free(holder)
    return pooled


@torch.inference_mode()
def _forward(runner: ModelRunner, holders: list[Request], head: Head, all_tokens: bool) -> list[Any]:
    """One prefill pass over the prompts' tokens past their cached prefix (eager: CUDA graphs hold decode-sized
    steps), and `head` on each prompt's last hidden state (a row per prompt), or on all of them (rows per prompt)."""
    size = runner.block_size
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    for holder in holders:
        prompt, first = holder.prompt_token_ids, holder.num_cached_tokens
        ids += prompt[first:]
        positions += range(first, len(prompt))
        slots += [holder.block_ids[p // size] * size + p % size for p in range(first, len(prompt))]
        starts.append(len(ids))
    lens = [len(h.prompt_token_ids) for h in holders]
    width = max(len(h.block_ids) for h in holders)
    tables = [h.block_ids + [0] * (width - len(h.block_ids)) for h in holders]
    device = runner.device
    metadata = AttentionMetadata(
        slot_mapping=device_tensor(slots, torch.long, device),
        block_tables=device_tensor(tables, torch.int32, device),
        query_start_loc=device_tensor(starts, torch.int32, device),
        seq_lens=device_tensor(lens, torch.int32, device),
        max_query_len=max(n - h.num_cached_tokens for n, h in zip(lens, holders, strict=True)),
        max_seq_len=max(lens),
    )
    with forward_context(metadata):
        hidden = runner.model(device_tensor(ids, torch.long, device), device_tensor(positions, torch.long, device))
    runner.num_tokens_fed += len(ids)
    if all_tokens:
        rows = head(hidden).cpu()
        return [rows[start:end].tolist() for start, end in itertools.pairwise(starts)]
    last = device_tensor([s - 1 for s in starts[1:]], torch.long, device)
    return head(hidden.index_select(0, last)).cpu().tolist()
