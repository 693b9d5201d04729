"""The step channel's encoding: a request travels whole once, then as updates the workers apply to
their copies, and a request the engine dropped is dropped by the workers too (no processes needed)."""

from __future__ import annotations

import gc

from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput
from flotilla.engine.step_channel import _decode, _SentRequests


def _plan(*requests: Request) -> SchedulerOutput:
    return SchedulerOutput(scheduled=[ScheduledRequest(r, 1, r.num_computed_tokens, True) for r in requests])


def test_known_requests_travel_as_updates_and_dropped_ones_are_forgotten():
    sent, held = _SentRequests(), {}
    parent = Request("a", list(range(3, 2003)), SamplingParams(n=2))
    parent.fork_children = [Request("a#1", parent.prompt_token_ids, parent.sampling_params, index=1)]
    first = sent.encode(_plan(parent))
    copy = _decode(first, held).scheduled[0].request
    assert copy.prompt_token_ids == parent.prompt_token_ids and set(held) == {"a", "a#1"}

    parent.output_token_ids += [7, 8]
    parent.num_computed_tokens, parent.block_ids = 2001, [4, 5, 6]
    update = sent.encode(_plan(parent))
    assert len(update) < len(first) // 10, "the prompt is not sent again"
    again = _decode(update, held).scheduled[0].request
    assert again is copy
    assert (again.output_token_ids, again.num_computed_tokens, again.block_ids) == ([7, 8], 2001, [4, 5, 6])
    assert again.fork_children == [held["a#1"]]

    other = Request("b", [5, 6], SamplingParams())
    del parent
    gc.collect()
    _decode(sent.encode(_plan(other)), held)
    assert set(held) == {"b"}
