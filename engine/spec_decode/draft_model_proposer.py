"""Draft-model proposals: a smaller model with the target's tokenizer guesses k tokens greedily.

The draft keeps its own KV pool, indexed by the same block ids as the target's: the block manager
hands out one set of ids per request, and each id owns a block in both pools (the runner sizes the
pools together: a block's bytes are the target's and the draft's). Whatever the target
computes, the draft computes too, in the same slots, before the target's pass (its "catch-up"); a
speculating request then runs k - 1 more one-token draft passes into its reserved lookahead slots.
Draft tokens are the draft's argmax, a deterministic proposal, which the rejection sampler verifies
exactly at any temperature.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from flotilla.engine.config import ConfigError, EngineConfig, draft_architecture_problem
from flotilla.engine.forward_context import forward_context
from flotilla.engine.input_batch import FlatBatch
from flotilla.engine.model_loader import load_model
from flotilla.engine.models.causal_lm import CausalLM
from flotilla.engine.quantization import resolve_quantization
from flotilla.engine.request import Request
from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput
from flotilla.engine_rules import draft_length_problem, model_len_limit, rope_positions, rope_positions_origin

if TYPE_CHECKING:
    from flotilla.engine.model_runner import ModelRunner


def load_draft_model(config: EngineConfig, device: torch.device) -> CausalLM:
    """The draft model `--speculative-config` names, loaded on `device`. The target's runner loads it beside the
    target, before its memory profile, so its weights, its dummy step and its KV pool are charged to the engine's
    budget (as vLLM's runner loads and profiles its drafter)."""
    spec = config.speculative
    assert spec is not None and spec.model is not None, "built for a draft-model config"
    draft_dir = Path(spec.model)
    if not (draft_dir / "config.json").is_file():
        raise ConfigError(f"--speculative-config: draft model {draft_dir}: no config.json")
    if problem := draft_architecture_problem(draft_dir):  # checked by the config too; written since?
        raise ConfigError(problem)
    hf_config = json.loads((draft_dir / "config.json").read_text())
    target_vocab = config.model.hf_config["vocab_size"]
    if hf_config.get("vocab_size") != target_vocab:
        raise ConfigError(
            f"--speculative-config: the draft model's vocabulary ({hf_config.get('vocab_size')} tokens) "
            f"differs from the target's ({target_vocab}); a draft model must share the target's tokenizer"
        )
    # The draft's own checkpoint says how it is quantized (a dense draft beside a GPTQ target is dense), as vLLM's
    # draft config: the target's scheme, read from its checkpoint or applied at load (fp8, rtn), is not the draft's.
    try:
        quantization = resolve_quantization(None, hf_config)
    except ValueError as exc:
        raise ConfigError(f"--speculative-config: draft model {draft_dir}: {exc}") from None
    # The draft computes every position the target does: past its rotary table (`rope_positions` long, as the model
    # builds it) a step would read beyond it (an IndexError that killed the engine loop on the CPU, an out-of-bounds
    # read on a GPU). Refused from its config.json, before its weights load.
    # --max-model-len equal to the target's own length reads as unset: the message then names the model's length.
    max_model_len = config.model.max_model_len
    origin = f"its config.json's {rope_positions_origin(hf_config)}"
    if problem := draft_length_problem(rope_positions(hf_config), origin, max_model_len,
                                       max_model_len != model_len_limit(config.model.hf_config)):
        raise ConfigError(f"{problem} ({draft_dir})")
    model_config = config.model.model_copy(update={"model": str(draft_dir), "hf_config": hf_config,
                                                   "quantization": quantization})
    return load_model(model_config, device)


class DraftModelProposer:
    """Proposes drafts with the draft model that the target's runner holds (`ModelRunner.draft_model`, with its KV
    pool `draft_kv_cache`): the runner owns every tensor of the engine, so its shutdown frees the draft's too."""

    def __init__(self, runner: ModelRunner) -> None:
        assert runner.draft_model is not None, "the runner loads the draft model of a draft-model config"
        self.runner = runner
        # Per request: how many of its first positions hold valid draft K/V (an upper bound; each
        # step takes the minimum with the target's computed count, which rollback keeps exact), and its
        # preemption count then. Steps without drafts do not call the proposer (the load rule's saving); a
        # request then catches up from here the next time it is drafted for, from 0 if it was preempted
        # since: it resumed in other blocks, which the target may have refilled in steps without drafts.
        self._valid: dict[str, tuple[Request, int, int]] = {}

    @torch.inference_mode()
    def propose(self, plan: SchedulerOutput, speculating: list[ScheduledRequest]) -> list[list[int]]:
        """Catch the draft up on the step's known tokens, then draft each speculating request's slots."""
        self._valid = {rid: v for rid, v in self._valid.items() if not v[0].status.finished}
        self._copy_blocks(plan.block_copies)
        feeds: list[tuple[Request, int, list[int]]] = []
        for s in plan.scheduled:
            req = s.request
            start = min(self._valid_prefix(req), s.num_computed_tokens)
            end = min(s.num_computed_tokens + s.num_new_tokens - s.num_lookahead, req.num_tokens)
            if s.num_lookahead:
                end = req.num_tokens  # through the last known token, whose logits give the first draft
            if end > start:
                feeds.append((req, start, req.token_ids(start, end)))
            self._valid[req.request_id] = (req, max(end, start), req.num_preemptions)
        last_tokens = self._feed(feeds)
        lookahead = {s.request.request_id: s.num_lookahead for s in speculating}
        drafts = {rid: [tok] for (req, _, _), tok in zip(feeds, last_tokens, strict=True)
                  if (rid := req.request_id) in lookahead}
        for j in range(1, max(lookahead.values(), default=0)):
            step = [(s.request, s.request.num_tokens + j - 1, [drafts[s.request.request_id][-1]])
                    for s in speculating if s.request.request_id in drafts and s.num_lookahead > j]
            for (req, pos, _), tok in zip(step, self._feed(step), strict=True):
                drafts[req.request_id].append(tok)
                self._valid[req.request_id] = (req, pos + 1, req.num_preemptions)
        return [drafts.get(s.request.request_id, []) for s in speculating]

    def _valid_prefix(self, req: Request) -> int:
        """How many of the request's first positions hold its draft K/V. A request the draft has not seen yet
        starts at 0, prefix-cache hits included: steps without drafts skip the draft entirely, so the pool's
        blocks may lack its K/V. So does one preempted since it was last seen (its blocks are others now)."""
        seen = self._valid.get(req.request_id)
        return seen[1] if seen is not None and seen[2] == req.num_preemptions else 0

    def _feed(self, feeds: list[tuple[Request, int, list[int]]]) -> list[int]:
        """One draft forward pass over each (request, first position, tokens); the argmax after each
        request's last token."""
        if not feeds:
            return []
        size = self.runner.block_size
        flat = FlatBatch()
        for req, start, tokens in feeds:
            end = start + len(tokens)
            flat.input_ids += tokens
            flat.positions += range(start, end)
            flat.slots += [req.block_ids[p // size] * size + p % size for p in range(start, end)]
            flat.query_start_loc.append(len(flat.input_ids))
            flat.seq_lens.append(end)
            flat.block_tables.append(req.block_ids)
            flat.max_query_len = max(flat.max_query_len, len(tokens))
        inputs = self.runner.prepare_inputs(flat)
        model = self.runner.draft_model
        assert model is not None, "the engine has been shut down"
        with forward_context(inputs.metadata):
            hidden = model(inputs.input_ids, inputs.positions)
        last = torch.tensor([i - 1 for i in flat.query_start_loc[1:]], dtype=torch.long, device=hidden.device)
        return model.compute_logits(hidden[last]).argmax(dim=-1).tolist()

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """The target's copy-on-write copies, mirrored in the draft pool."""
        if copies:
            pool = self.runner.draft_kv_cache
            src = torch.tensor([c[0] for c in copies], dtype=torch.long, device=pool.device)
            dst = torch.tensor([c[1] for c in copies], dtype=torch.long, device=pool.device)
            pool[:, :, dst] = pool[:, :, src]
