"""engine/structured_output/compiler.py's cache of compiled grammars: bounded by count and by bytes."""

from __future__ import annotations

import pytest

from flotilla.engine.structured_output.params import StructuredOutputsParams

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


def compiler(tokenizer, **kwargs):
    from flotilla.engine.structured_output.compiler import GrammarCompiler

    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id], **kwargs)


def test_the_cache_drops_the_least_recent_grammars_past_its_bytes_and_keeps_the_newest(tokenizer):
    # A grammar's size grows with its constraint (a choice of 20,000 strings compiles to 25 MB): counted alone,
    # 512 such grammars held 12.6 GB of the engine's memory.
    big = StructuredOutputsParams(choice=[f"option {i}" for i in range(2000)])
    small = StructuredOutputsParams(choice=["yes", "no"])
    roomy = compiler(tokenizer)
    big_bytes = roomy.compile(big).memory_size_bytes
    small_bytes = roomy.compile(small).memory_size_bytes
    assert big_bytes > 10 * small_bytes
    assert roomy.cached_bytes == big_bytes + small_bytes and roomy.num_compiled == 2
    roomy.compile(big)
    assert roomy.num_compiled == 2  # both cached: the repeat cost nothing

    tight = compiler(tokenizer, cache_bytes=big_bytes)  # room for the big one, not for both
    tight.compile(small)
    tight.compile(big)  # the small one goes
    assert tight.cached_bytes == big_bytes
    tight.compile(big)
    assert tight.num_compiled == 2
    tight.compile(small)  # compiled again; the big one goes
    assert tight.num_compiled == 3 and tight.cached_bytes == small_bytes

    alone = compiler(tokenizer, cache_bytes=1)  # the newest stays even past the bound
    alone.compile(big)
    assert alone.cached_bytes == big_bytes
    alone.compile(big)
    assert alone.num_compiled == 1


def test_the_bound_is_vllms_variable_in_mib(tokenizer, monkeypatch):
    assert compiler(tokenizer).cache_bytes == 512 * 1024 * 1024
    monkeypatch.setenv("VLLM_XGRAMMAR_CACHE_MB", "3")
    assert compiler(tokenizer).cache_bytes == 3 * 1024 * 1024
