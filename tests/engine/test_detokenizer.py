"""The streamed detokenizer (Rust `DecodeStream`, one decode per token) gives exactly the deltas of the
window decoding it replaced, and the whole text `tokenizer.decode` gives."""

from __future__ import annotations

import random

import pytest

from flotilla.engine.detokenizer import IncrementalDetokenizer

TEXT = "Ships 🚢 sail: 日本語のテキスト, café, 🏳️‍🌈 done. Über naïve façades — 你好，世界。"


@pytest.fixture(scope="module")
def tok(embedded_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


def _deltas(tok, prompt: list[int], ids: list[int], chunk: int, skip: bool, stream: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip, decode_stream=stream)
    deltas = [detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.text
    return deltas


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("source", ["text", "random-ids", "special-tokens"])
def test_streamed_deltas_equal_the_window_decoding(tok, source, chunk, skip):
    rng = random.Random(7)
    if source == "text":
        ids = tok.encode(TEXT, add_special_tokens=False)
    elif source == "random-ids":  # byte tokens in any order: incomplete characters held back and flushed
        ids = [rng.randrange(len(tok)) for _ in range(300)]
    else:
        ids = tok.encode("Hi", add_special_tokens=False) + [tok.eos_token_id] + tok.encode(" there")
    prompt = tok.encode("Answer: ")
    streamed = _deltas(tok, prompt, ids, chunk, skip, stream=True)
    window = _deltas(tok, prompt, ids, chunk, skip, stream=False)
    if chunk == 1:  # the engine streams one token per step: the same deltas, call for call
        assert streamed == window
    else:  # several tokens at once: the window holds a whole chunk back for its last incomplete
        # character, the stream only that character; the text is the same
        assert "".join(streamed) == "".join(window)
    if source != "random-ids":  # random bytes decode to U+FFFD differently when split; text does not
        assert "".join(streamed) == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("text", ["Ω≈ç√∫˜µ≤≥÷", "tail ẞ", "x 🧑\u200d🚀"])
def test_a_prompt_that_ends_inside_a_character_leaks_nothing_into_the_output(tok, text):
    """A token-id prompt cut inside a multi-byte character: the stream, primed with the prompt's tail, held that
    tail back as incomplete and emitted it with the first output token ('Ω≈ç�{ hello' for the output '{ hello')."""
    ids = tok.encode(text, add_special_tokens=False)
    output = tok.encode("{ hello world", add_special_tokens=False)
    cuts = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd")]
    assert cuts
    for k in cuts:
        streamed = _deltas(tok, ids[:k], output, 1, True, stream=True)
        assert streamed == _deltas(tok, ids[:k], output, 1, True, stream=False)
        assert "".join(streamed) == "{ hello world"


def _text(tok, ids: list[int], chunk: int, stream: bool, spaced: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, tok.encode("hello"), skip_special_tokens=False, decode_stream=stream,
                                   spaces_between_special_tokens=spaced)
    return [detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)] + [detok.flush()]


@pytest.mark.parametrize("chunk", [1, 4])
@pytest.mark.parametrize("stream", [True, False])
def test_without_spaces_between_special_tokens_two_added_tokens_touch_as_vllm(chunk, stream):
    """vLLM's rule (its fast detokenizer): an added token right after another is its bare text; the first one, and
    the text after the last, keep the decoder's spacing. WordPiece's decoder spaces every token."""
    from .spaced_tokenizer import wordpiece_tokenizer

    tok = wordpiece_tokenizer()
    ids = tok.encode("ships [A] [B] [A] sailed", add_special_tokens=False)
    assert "".join(_text(tok, ids, chunk, stream, spaced=True)) == " ships [A] [B] [A] sailed"
    unspaced = _text(tok, ids, chunk, stream, spaced=False)
    assert "".join(unspaced) == " ships [A][B][A] sailed"
    if chunk == 1:
        assert unspaced[:5] == [" ships", " [A]", "[B]", "[A]", " sail"]


def test_spaces_between_special_tokens_changes_nothing_for_a_byte_level_tokenizer(tok):
    # Byte-level BPE (the tiny models' SmolLM2 tokenizer) puts no space between tokens: as vLLM, the same text.
    ids = [tok.convert_tokens_to_ids("<|im_start|>"), tok.eos_token_id, *tok.encode(" hi", add_special_tokens=False)]
    assert _text(tok, ids, 1, True, spaced=False) == _text(tok, ids, 1, True, spaced=True)
