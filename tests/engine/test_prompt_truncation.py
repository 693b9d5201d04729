"""A text cut to `truncate_prompt_tokens` is tokenized only in its part that holds the kept tokens
(prompt_truncation.truncated_parts): the kept tokens are those of the whole text's tokenization, cut."""

from __future__ import annotations

import asyncio
import random
import string

import pytest

from flotilla.engine.prompt_truncation import truncate_prompt

CONTEXT = 512
VOCAB = 49152


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


def _words(rng: random.Random, chars: int) -> str:
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 9))) for _ in range(500)]
    return " ".join(rng.choice(words) for _ in range(chars // 5))[:chars]


rng = random.Random(29)
CHARS = 150_000  # past the two parts' length at CONTEXT (~104k characters with this tokenizer)
TEXTS = {
    "words": _words(rng, CHARS),
    "unicode": "".join(rng.choice("héllo wörld 日本語 ☃ \n\t.,") for _ in range(CHARS)),
    "digits": "".join(rng.choice(string.digits) for _ in range(CHARS)),
    # single runs the tokenizer reads from their start: a cut moves their alignment
    "spaces": " " * CHARS + "end",
    "newlines": "\n" * CHARS + "end",
    "letters": "a" * CHARS,
    # a run after words and a space (" a" is a token of its own: the run's start must be tokenized in its context)
    "words then letters": _words(rng, 20_000) + " " + "a" * CHARS,
    "code": "def f(x):\n    return {'k': [x, x + 1]}  # ok\n" * (CHARS // 44),
}


@pytest.fixture(scope="module")
def whole(tokenizer):
    """Each text's whole tokenization."""
    return {name: tokenizer.encode(text) for name, text in TEXTS.items()}




def _counting(tokenizer, monkeypatch) -> list[int]:
    """The characters of each text `tokenizer.encode` is given, from now on."""
    tokenized: list[int] = []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text, **kw: tokenized.append(len(text)) or encode(text, **kw))
    return tokenized


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("keep", [CONTEXT, 100, -1])
@pytest.mark.parametrize("name", list(TEXTS))
def test_a_truncated_texts_kept_tokens_are_its_whole_tokenizations(tokenizer, whole, monkeypatch, name, keep, side):
    from flotilla.engine.server.serving import OpenAIServing

    serving = OpenAIServing(None, tokenizer, CONTEXT, VOCAB)  # encode reads no engine
    tokenized = _counting(tokenizer, monkeypatch)
    ids = asyncio.run(serving.encode(TEXTS[name], keep=keep, side=side))
    assert truncate_prompt(ids, keep, CONTEXT, side) == truncate_prompt(whole[name], keep, CONTEXT, side)
    # never whole: the runs (whose two parts disagree, cut on the left) are shortened by whole periods (run_parts)
    assert len(TEXTS[name]) not in tokenized, tokenized


def test_only_the_part_holding_the_kept_tokens_is_tokenized(tokenizer, monkeypatch):
    from flotilla.engine.server.serving import OpenAIServing

    serving = OpenAIServing(None, tokenizer, CONTEXT, VOCAB)
    tokenized = _counting(tokenizer, monkeypatch)
    text = _words(random.Random(1), 2_000_000)
    ids = asyncio.run(serving.encode(text, keep=CONTEXT, side="left"))
    assert len(ids) > CONTEXT and sum(tokenized) < 0.06 * len(text), tokenized
    # a text of the two parts' length or less is tokenized whole
    tokenized.clear()
    asyncio.run(serving.encode(text[:100_000], keep=CONTEXT))
    assert tokenized == [100_000]


@pytest.mark.parametrize(("before", "run", "after"), [("", "a", ""), ("", " ", "end"), ("Hello there. ", "\n", "")])
def test_a_long_run_of_one_character_is_not_tokenized_whole(tokenizer, monkeypatch, before, run, after):
    """5M characters of one run, cut to its last 512 tokens: tokenized whole, ~0.6 s a million characters of one Rust
    call; now two copies of the run shortened by whole RUN_PERIODs (prompt_truncation.run_parts), ~3 % of the text.
    Its kept tokens are those of the same run 200k long (4.8M less: a multiple of 64), tokenized whole."""
    from flotilla.engine.server.serving import OpenAIServing

    serving = OpenAIServing(None, tokenizer, CONTEXT, VOCAB)
    text = before + run * 5_000_000 + after
    tokenized = _counting(tokenizer, monkeypatch)
    ids = asyncio.run(serving.encode(text, keep=CONTEXT, side="left"))
    assert len(ids) >= CONTEXT and sum(tokenized) < 0.05 * len(text), tokenized
    shorter = tokenizer.encode(before + run * 200_000 + after)
    assert truncate_prompt(ids, CONTEXT, CONTEXT) == truncate_prompt(shorter, CONTEXT, CONTEXT)
