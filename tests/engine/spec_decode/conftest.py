"""What the speculative-decoding tests share."""

from __future__ import annotations

import pytest

from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import SamplingParams


def assert_same_completions(want: list[RequestOutput], got: list[RequestOutput], params: SamplingParams) -> None:
    """Speculation changes nothing a request sees: `got` (with it) has `want`'s (without it) tokens, text,
    finish and stop reasons and, when `params` ask for them, logprobs (the same candidates and ranks,
    values within 1e-4)."""
    for w, g in zip(want, got, strict=True):
        w, g = w.outputs[0], g.outputs[0]
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (w.token_ids, w.text, w.finish_reason,
                                                                        w.stop_reason)
        if params.logprobs:
            assert g.logprobs is not None and w.logprobs is not None
            assert [sorted(e) for e in g.logprobs] == [sorted(e) for e in w.logprobs]
            for ge, we in zip(g.logprobs, w.logprobs, strict=True):
                for t in we:
                    assert ge[t][0] == pytest.approx(we[t][0], abs=1e-4) and ge[t][1] == we[t][1]
