"""The pooling runner against HF: last-token pooled, L2-normalised hidden states of a tiny Qwen3."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7] * 40, [11, 12], list(range(100, 133))]


@pytest.fixture(scope="module")
def qwen3_dir(tiny_model_dirs):
    return tiny_model_dirs["qwen3"]


@pytest.fixture(scope="module")
def pooling_llm(qwen3_dir):
    # A small token budget, so the four prompts run as more than one batch.
    return LLM(str(qwen3_dir), runner="pooling", max_num_batched_tokens=64, max_model_len=64, device="cpu")


def hf_embeddings(model_dir, prompts: list[list[int]]) -> torch.Tensor:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for ids in prompts:  # one at a time: no padding in the oracle
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
            rows.append(torch.nn.functional.normalize(hidden, dim=-1))
    return torch.stack(rows)


def test_embeddings_equal_hf_last_token_normalised(pooling_llm, qwen3_dir):
    blocks = pooling_llm.engine.block_manager
    free_before = blocks.num_free_blocks
    out = pooling_llm.embed(PROMPTS)
    got = torch.tensor([o.embedding for o in out])
    torch.testing.assert_close(got, hf_embeddings(qwen3_dir, PROMPTS), atol=1e-4, rtol=1e-4)
    assert [o.num_prompt_tokens for o in out] == [len(p) for p in PROMPTS]
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(PROMPTS)))
    assert blocks.num_free_blocks == free_before  # prefill only: every block is back
    assert not pooling_llm.engine.has_unfinished_requests()


def test_text_input_is_tokenized_like_the_model_tokenizer(pooling_llm, qwen3_dir):
    ids = pooling_llm.get_tokenizer().encode("harbour lights")
    [by_text] = pooling_llm.embed("harbour lights")
    [by_ids] = pooling_llm.embed([ids])
    assert by_text.embedding == by_ids.embedding


def test_bad_inputs_are_refused_and_leak_nothing(pooling_llm):
    blocks = pooling_llm.engine.block_manager
    free_before = blocks.num_free_blocks
    for bad, param in (([[]], "input"), ([[1, 2], [10**9]], "input"), ([[1] * 65], "input")):
        with pytest.raises(InvalidParamError) as err:
            pooling_llm.embed(bad)
        assert err.value.param == param
    with pytest.raises(InvalidParamError, match="matryoshka") as err:
        pooling_llm.embed([[1, 2]], dimensions=8)
    assert err.value.param == "dimensions"
    assert blocks.num_free_blocks == free_before


def test_generate_on_the_pooling_runner_is_refused(pooling_llm):
    with pytest.raises(InvalidParamError, match="pooling runner"):
        pooling_llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)


def test_matryoshka_dimensions_cut_then_normalise(qwen3_dir, tmp_path):
    model_dir = tmp_path / "matryoshka"
    shutil.copytree(qwen3_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["matryoshka_dimensions"] = [16, 32]
    (model_dir / "config.json").write_text(json.dumps(config))
    llm = LLM(str(model_dir), task="embed", max_model_len=64, device="cpu")
    [full] = llm.embed([PROMPTS[0]])
    [cut] = llm.embed([PROMPTS[0]], dimensions=16)
    assert len(cut.embedding) == 16
    expected = torch.nn.functional.normalize(hf_embeddings(qwen3_dir, [PROMPTS[0]])[0][:16], dim=-1)
    torch.testing.assert_close(torch.tensor(cut.embedding), expected, atol=1e-4, rtol=1e-4)
    assert len(full.embedding) == config["hidden_size"]
    with pytest.raises(InvalidParamError, match=r"only dimensions \[16, 32\]"):
        llm.embed([PROMPTS[0]], dimensions=8)


@pytest.mark.parametrize(("kwargs", "runner"), [
    ({}, "generate"),
    ({"runner": "pooling"}, "pooling"),
    ({"task": "embed"}, "pooling"),
    ({"task": "embedding", "convert": "embed"}, "pooling"),
    ({"runner": "pooling", "convert": "auto"}, "pooling"),
    ({"task": "score"}, "pooling"),  # a bi-encoder: the architecture is not a classifier's
])
def test_runner_flags_resolve_as_vllm(qwen3_dir, kwargs, runner):
    config = EngineConfig.from_kwargs(str(qwen3_dir), device="cpu", **kwargs)
    assert config.model.runner == runner
    assert config.model.convert == ("embed" if runner == "pooling" else "none")


@pytest.mark.parametrize("kwargs", [
    {"task": "embed", "runner": "generate"},
    {"convert": "embed"},
    {"runner": "pooling", "convert": "none"},
    {"convert": "classify"},
    {"runner": "draft"},
    {"task": "score", "convert": "classify"},
])
def test_contradicting_or_unsupported_runner_flags_are_refused(qwen3_dir, kwargs):
    with pytest.raises(ConfigError):
        EngineConfig.from_kwargs(str(qwen3_dir), device="cpu", **kwargs)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"enable_lora": True}, "remove --enable-lora"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, "remove --speculative-config"),
    ({"tensor_parallel_size": 2}, "set --tensor-parallel-size to 1"),
    ({"task": "embed", "pipeline_parallel_size": 2}, "set --pipeline-parallel-size to 1"),
])
def test_pooling_with_adapters_speculation_or_parallelism_refuses_to_start(qwen3_dir, kwargs, named):
    # Each would go unused (or refuse every request) on the pooling pass: refused before anything loads.
    with pytest.raises(ConfigError, match="pooling serves embeddings on one GPU") as refused:
        EngineConfig.from_kwargs(str(qwen3_dir), device="cpu", **{"runner": "pooling", **kwargs})
    assert named in str(refused.value)
    if "task" not in kwargs:  # the same settings on the generate runner are fine
        assert EngineConfig.from_kwargs(str(qwen3_dir), device="cpu", **kwargs).model.runner == "generate"


def test_truncate_prompt_tokens_embeds_the_last_tokens_as_vllm(pooling_llm):
    # vLLM's LLM.embed(truncate_prompt_tokens=N): the last N tokens (-1: the context length), as /v1/embeddings.
    long = list(range(200, 290))  # 90 tokens: over this engine's 64-token context
    [cut] = pooling_llm.embed([long], truncate_prompt_tokens=10)
    [tail] = pooling_llm.embed([long[-10:]])
    assert cut.embedding == tail.embedding and cut.num_prompt_tokens == 10
    [whole] = pooling_llm.embed([long], truncate_prompt_tokens=-1)
    assert whole.embedding == pooling_llm.embed([long[-64:]])[0].embedding
    text = "the quick brown fox jumps over the lazy dog"
    ids = pooling_llm.get_tokenizer().encode(text)
    assert pooling_llm.embed(text, truncate_prompt_tokens=3)[0].embedding == pooling_llm.embed([ids[-3:]])[0].embedding
    for bad in (0, 65):
        with pytest.raises(InvalidParamError) as err:
            pooling_llm.embed([long], truncate_prompt_tokens=bad)
        assert err.value.param == "truncate_prompt_tokens"


def _hits_of(llm: LLM, prompts: list[list[int]], salt: str | None) -> tuple[int, list[list[float]]]:
    """Prefix-cache tokens one pooling call over `prompts` found, and its embeddings."""
    blocks = llm.engine.block_manager
    before = blocks.prefix_cache_hits
    out = llm.engine.embed(prompts, PoolingParams(), salt)
    return blocks.prefix_cache_hits - before, [o.embedding for o in out]


def test_the_pooling_pass_reuses_cached_blocks_within_one_salt_only(pooling_llm, qwen3_dir):
    # Two full 16-token blocks and a tail. Seen first unsalted, then under salt "a": a later call hits those
    # blocks under the same salt only (no salt, "a"), never across (another salt, or none after a salt).
    prompt = list(range(400, 440))
    assert _hits_of(pooling_llm, [prompt], None)[0] == 0
    hits, [unsalted] = _hits_of(pooling_llm, [prompt], None)
    assert hits == 32
    assert _hits_of(pooling_llm, [prompt], "a")[0] == 0  # an unsalted embedding's blocks are no hit for "a"
    hits, [salted] = _hits_of(pooling_llm, [prompt], "a")
    assert hits == 32
    assert _hits_of(pooling_llm, [prompt], "b")[0] == 0
    # The cached prefix's K/V give the vector a full prefill gives (HF's, one prompt at a time).
    expected = hf_embeddings(qwen3_dir, [prompt])
    for got in (unsalted, salted):
        torch.testing.assert_close(torch.tensor([got]), expected, atol=1e-4, rtol=1e-4)
    # A prompt repeated within one call hits the blocks the same forward pass fills.
    fresh = list(range(500, 540))
    hits, [first, second] = _hits_of(pooling_llm, [fresh, fresh], "c")
    assert hits == 32
    torch.testing.assert_close(torch.tensor([first, second]), hf_embeddings(qwen3_dir, [fresh, fresh]),
                               atol=1e-4, rtol=1e-4)


def test_offline_embed_takes_each_prompt_dicts_cache_salt(pooling_llm, qwen3_dir):
    # vLLM's prompt dict key on `LLM.embed`: one call mixing salts keys each prompt by its own and keeps the
    # prompts' order; a repeat hits every prompt's two full blocks under its own salt, a new salt none.
    a, b, c = list(range(800, 840)), list(range(900, 940)), list(range(1000, 1040))
    mixed = [{"prompt_token_ids": a, "cache_salt": "m"}, {"prompt_token_ids": b, "cache_salt": "n"}, c,
             {"prompt_token_ids": a, "cache_salt": "n"}]
    blocks = pooling_llm.engine.block_manager

    def run(prompts) -> tuple[int, list[list[float]]]:
        before = blocks.prefix_cache_hits
        out = pooling_llm.embed(prompts)
        return blocks.prefix_cache_hits - before, [o.embedding for o in out]

    hits, first = run(mixed)
    assert hits == 0  # `a` under "m" is no hit for `a` under "n"
    hits, again = run(mixed)
    assert hits == 4 * 32
    assert run([{"prompt_token_ids": a, "cache_salt": "o"}])[0] == 0
    expected = hf_embeddings(qwen3_dir, [a, b, c, a])
    for got in (first, again):
        torch.testing.assert_close(torch.tensor(got), expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(InvalidParamError, match="input 2 is empty"):  # indexed in the whole call, not its salt's
        pooling_llm.embed(mixed[:2] + [{"prompt_token_ids": [], "cache_salt": "n"}])
    with pytest.raises(ValueError, match="cache_salt"):
        pooling_llm.embed({"prompt": "x", "cache_salt": ""})
    assert blocks.num_free_blocks == blocks.num_blocks


def test_a_pooling_batch_that_finds_no_room_leaves_no_block_held_or_indexed(qwen3_dir):
    # 5 blocks of 16 tokens; two 40-token prompts (3 blocks each) go in one batch: the second finds no room.
    llm = LLM(str(qwen3_dir), runner="pooling", max_num_batched_tokens=128, max_model_len=64,
              num_gpu_blocks_override=5, device="cpu")
    blocks = llm.engine.block_manager
    first, second = list(range(600, 640)), list(range(700, 740))
    with pytest.raises(InvalidParamError, match="no room"):
        llm.engine.embed([first, second], PoolingParams())
    assert blocks.num_free_blocks == blocks.num_blocks
    # The first prompt's blocks were indexed when allocated but never computed: no later call may take them.
    assert _hits_of(llm, [first], None)[0] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_embeddings_from_a_cached_prefix_equal_hf(tmp_path):
    """On the GPU kernels, a pooling pass that takes a cached prefix (within one call, then across calls and
    salts) computes only the rest and still gives HF's vectors; the last prompt's new positions (112..141) straddle
    the prefill kernel's key-split boundary at 128. The tiny Llama of bench/model_dirs.py, as tests/engine/test_gpu.py
    (no embedded model to convert on the GPU machine)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from model_dirs import make_model_dir

    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    prefix = list(range(300, 412))  # 7 full 16-token blocks
    prompts = [prefix + [7, 8, 9], prefix + [10, 11, 12, 13], prefix + list(range(20, 50))]
    expected = hf_embeddings(model, prompts)
    llm = LLM(str(model), runner="pooling", device="cuda", dtype="float32", max_model_len=256,
              gpu_memory_utilization=0.3)
    for salt in (None, None, "a"):
        hits, got = _hits_of(llm, prompts, salt)
        torch.testing.assert_close(torch.tensor(got), expected, atol=1e-3, rtol=1e-3)
        assert hits >= 2 * len(prefix)  # the second and third prompts take the first's blocks at least
