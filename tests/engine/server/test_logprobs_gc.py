"""Chat and Responses logprob entries cost the garbage collector nothing once their tokens are known.

A stream of 400 tokens x 1,000 alternatives keeps 400k entries alive until its end. Each carried a `bytes` list, and
lists are always tracked by the collector (so the entry's dict was too): 800k tracked objects, walked by every full
collection while the stream lived (0.26 s each, holding the GIL; bench/gil_stall.py logs them as GC-PAUSE). The
tests prove that a later stream naming tokens seen before keeps only its per-token containers tracked, and that the
JSON is OpenAI's (each alternative's token text, logprob and UTF-8 bytes as an array of ints).
"""

from __future__ import annotations

import gc
import json
import random

import pytest

TOKENS = 40
TOP = 1000


@pytest.fixture(scope="module")
def serving(embedded_model_dir):
    from transformers import AutoTokenizer

    from flotilla.engine.server.serving import OpenAIServing

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    return OpenAIServing(None, tokenizer, 512, len(tokenizer))  # logprobs read no engine


def _engine_entries(seed: int) -> tuple[list[int], list[dict[int, tuple[float, int]]]]:
    """A stream's tokens and their alternatives (the engine's shape: id -> (logprob, rank)), drawn from the same
    few thousand ids each time, as a model's top alternatives repeat."""
    rng = random.Random(seed)
    pool = random.Random(0).sample(range(30000), 2 * TOP)
    entries = []
    for _ in range(TOKENS):
        ids = rng.sample(pool, TOP)
        entries.append({t: (-rng.random() * 20 - rank * 1e-3, rank + 1) for rank, t in enumerate(ids)})
    return [next(iter(e)) for e in entries], entries


def _tracked(content: list[dict]) -> int:
    """How many of the entries' containers the garbage collector tracks."""
    count = 0
    for entry in content:
        count += gc.is_tracked(entry) + gc.is_tracked(entry["bytes"]) + gc.is_tracked(entry["top_logprobs"])
        count += sum(gc.is_tracked(a) + gc.is_tracked(a["bytes"]) for a in entry["top_logprobs"])
    return count


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token-ids"])
def test_a_later_streams_logprob_entries_are_untracked_but_their_per_token_lists(serving, as_ids):
    from flotilla.engine.server.protocol import ChatCompletionRequest

    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=TOP,
                                return_tokens_as_token_ids=as_ids)
    logprobs = serving.logprobs_of(req)
    logprobs(*_engine_entries(seed=1))  # an earlier stream named these tokens
    gc.collect()  # the server's collections between the two
    content = logprobs(*_engine_entries(seed=2))["content"]
    # only each token's entry (it holds its alternatives' list) and that list; 2 x 41k before
    assert _tracked(content) <= 2 * TOKENS


def test_logprob_entries_are_openais_json(serving):
    from flotilla.engine.server.protocol import ChatCompletionRequest

    tokenizer = serving.tokenizer
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=5)
    token_ids, entries = _engine_entries(seed=3)

    def info(token: int, logprob: float) -> dict:
        text = tokenizer.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    expected = [{**info(token, entry[token][0]),
                 "top_logprobs": [info(t, lp) for t, (lp, rank) in entry.items() if rank <= 5]}
                for token, entry in zip(token_ids, entries, strict=True)]
    for _ in range(2):  # the tokens unseen, then known
        content = serving.logprobs_of(req)(token_ids, entries)["content"]
        assert json.dumps(content) == json.dumps(expected)
