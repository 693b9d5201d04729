"""The offline `LLM`'s `cache_salt` (vLLM's prompt-dict key): prompts share prefix-cache blocks within one salt only,
read from the block manager's hit count (the server's field is tests/engine/server/test_dropin_requests.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)
CONVERSATION = [{"role": "system", "content": "You are a harbour pilot. Answer in one short sentence."},
                {"role": "user", "content": "Which ship leaves first on the morning tide, and why?"}]


@pytest.fixture(scope="module")
def llm(tiny_model_dirs) -> LLM:
    return LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu")


def _hits(llm: LLM, call: Callable[[], object]) -> int:
    """Prefix-cache tokens (`vllm:prefix_cache_hits`) that one offline call found."""
    blocks = llm.engine.block_manager
    before = blocks.prefix_cache_hits
    call()
    return blocks.prefix_cache_hits - before


def test_generate_shares_cached_blocks_within_one_salt_only(llm):
    # Two full 16-token blocks and a tail: a repeat under the same salt (or none) hits both, never across salts.
    ids = list(range(400, 440))

    def run(salt: str | None) -> int:
        prompt = {"prompt_token_ids": ids} | ({"cache_salt": salt} if salt is not None else {})
        return _hits(llm, lambda: llm.generate(prompt, ONE_TOKEN, use_tqdm=False))

    assert run("tenant-a") == 0
    assert run("tenant-a") == 32
    assert run("tenant-b") == 0
    assert run(None) == 0  # a salted request's blocks are no hit for an unsalted one
    assert run(None) == 32
    assert run("tenant-b") == 32


def test_a_text_prompt_takes_its_salt_too(llm):
    text = "The harbour master counted every mast in the bay before the fog came in from the sea, " * 2

    def run(salt: str) -> int:
        return _hits(llm, lambda: llm.generate({"prompt": text, "cache_salt": salt}, ONE_TOKEN, use_tqdm=False))

    first = run("x")
    assert first == 0
    assert run("x") > 0
    assert run("y") == 0


def test_chat_salts_every_conversation(llm):
    def run(salt: str | None) -> int:
        return _hits(llm, lambda: llm.chat(CONVERSATION, ONE_TOKEN, use_tqdm=False, cache_salt=salt))

    assert run("a") == 0
    repeat = run("a")
    assert repeat >= 16  # the rendered conversation fills at least one block
    assert run("b") == 0
    assert run(None) == 0
    assert run(None) == repeat


@pytest.mark.parametrize("salt", ["", 7, b"a"])
def test_a_salt_that_is_not_a_non_empty_string_is_refused_and_queues_nothing(llm, salt):
    good = {"prompt_token_ids": list(range(10, 30))}
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate([good, {"prompt_token_ids": list(range(30, 50)), "cache_salt": salt}], ONE_TOKEN,
                     use_tqdm=False)
    blocks = llm.engine.block_manager
    assert not llm.engine.has_unfinished_requests()
    assert blocks.num_free_blocks == blocks.num_blocks
