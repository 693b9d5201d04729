"""The engine's one handle on speculative decoding: how many draft slots a step reserves, filling
them with a proposer's drafts, and counting what verification accepted."""

from __future__ import annotations

from typing import Protocol

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput
from flotilla.engine.spec_decode.config import SpeculativeConfig
from flotilla.engine.spec_decode.ngram_proposer import NgramProposer
from flotilla.engine.spec_decode.policy import step_lookahead
from flotilla.engine.stats import SpecDecodeCounts


class Proposer(Protocol):
    """Guesses the tokens after each listed request's known tokens, at most its lookahead each."""

    def propose(self, plan: SchedulerOutput, speculating: list[ScheduledRequest]) -> list[list[int]]:
        """One list of drafts per entry of `speculating` (possibly empty)."""
        ...


class Speculator:
    """Reserves, fills and accounts draft slots, step by step."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer) -> None:
        self.config = config
        self.proposer = proposer
        k = config.num_speculative_tokens
        self.counts = SpecDecodeCounts(accepted_per_pos=(0,) * k)

    def lookahead(self, num_running: int) -> int:
        """Draft slots per decoding request in the next step (0 above the load rule's batch size)."""
        return step_lookahead(self.config.num_speculative_tokens, self.config.disable_by_batch_size, num_running)

    def propose(self, plan: SchedulerOutput) -> None:
        """Fill the step's reserved slots with drafts; slots left unfilled leave the step."""
        speculating = [s for s in plan.scheduled if s.num_lookahead]
        if not speculating:
            return
        for s, drafts in zip(speculating, self.proposer.propose(plan, speculating), strict=True):
            drafts = drafts[: s.num_lookahead]
            unused = s.num_lookahead - len(drafts)
            s.spec_token_ids = drafts
            s.num_new_tokens -= unused
            s.request.num_computed_tokens -= unused

    def record(self, plan: SchedulerOutput, verified: dict[str, list[int]]) -> None:
        """Count drafts and acceptances (before stops cut a request's tokens)."""
        c = self.counts
        drafts = tokens = accepted = 0
        per_pos = list(c.accepted_per_pos)
        for s in plan.scheduled:
            out = verified.get(s.request.request_id)
            if not s.spec_token_ids or out is None or s.request.status.finished:  # finished: step discarded
                continue
            drafts += 1
            tokens += len(s.spec_token_ids)
            n = len(out) - 1
            accepted += n
            for j in range(n):
                per_pos[j] += 1
        self.counts = SpecDecodeCounts(
            c.num_drafts + drafts, c.num_draft_tokens + tokens, c.num_accepted_tokens + accepted, tuple(per_pos)
        )


def build_speculator(config: EngineConfig, runner: object) -> Speculator | None:
    """The speculator `--speculative-config` asks for, or None without it. A draft model runs in this
    process beside the target's own runner (not beside tensor/pipeline-parallel workers yet)."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        lo, hi = spec.lookup_window
        return Speculator(spec, NgramProposer(spec.num_speculative_tokens, lo, hi))
    from flotilla.engine.model_runner import ModelRunner
    from flotilla.engine.spec_decode.draft_model_proposer import DraftModelProposer

    if not isinstance(runner, ModelRunner):
        raise ConfigError("--speculative-config: a draft model is not supported with tensor or pipeline "
                          "parallelism yet; use the ngram method")
    return Speculator(spec, DraftModelProposer(runner))
