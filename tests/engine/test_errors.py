"""Bad input gets a clear error that names the problem."""

from __future__ import annotations

import json

import pytest

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams


def test_unknown_architecture_is_named(tmp_path, tiny_model_dirs):
    src = tiny_model_dirs["llama"]
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unsupported model architecture \['GPT2LMHeadModel'\].*LlamaForCausalLM"):
        LLM(str(tmp_path))


def test_an_activation_the_decoder_does_not_compute_is_named(tmp_path, tiny_model_dirs):
    """The decoder's MLP is SiLU-gated; config.json's hidden_act was never read, so a Llama with another activation
    (HF computes it) loaded and generated other tokens than HF's, silently."""
    src = tiny_model_dirs["llama"]
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((src / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        LLM(str(tmp_path))


def test_missing_model_directory(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        EngineConfig.from_kwargs(str(tmp_path))


def test_prompt_longer_than_max_model_len(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=32)
    with pytest.raises(ValueError, match="context length is 32 tokens. However, your request has 40 input tokens"):
        llm.generate([[5, 6, 7], list(range(3, 43))], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_model_len": 100_000}, "--max-model-len=100000 exceeds the model's limit of 512"),
        ({"block_size": 12}, r"--block-size=12 is not one of: 8, 16, 32, 64, 128"),
        ({"dtype": "int4"}, "--dtype='int4' is not one of"),
        ({"quantization": "int8"}, "--quantization='int8' is not supported yet"),
        ({"tensor_parallel_size": 3}, "tensor parallel size 3 does not divide the model's 4 attention heads"),
        ({"pipeline_parallel_size": 3}, "pipeline parallel size 3 exceeds the model's 2 layers"),
        ({"gpu_memory_utilization": 1.5}, r"--gpu-memory-utilization=1.5 is out of range \(> 0 and <= 1\)"),
        ({"max_num_seqs": 0}, r"--max-num-seqs=0 is out of range \(>= 1\)"),
        ({"max_num_batched_tokens": 64}, "--max-num-batched-tokens \\(64\\) is smaller than --max-model-len"),
        ({"max_num_batch_tokens": 64}, "unknown engine argument\\(s\\): --max-num-batch-tokens"),
    ],
)
def test_invalid_engine_arguments(tiny_model_dirs, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), **kwargs)


def test_kv_pool_too_small_for_one_sequence(tiny_model_dirs):
    with pytest.raises(ValueError, match="fewer than one sequence of --max-model-len 256"):
        LLM(str(tiny_model_dirs["llama"]), max_model_len=256, num_gpu_blocks_override=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature: temperature must be non-negative, got -1.0."),
        ({"temperature": 2.5}, "temperature: temperature must be in \\[0, 2\\], got 2.5."),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"min_tokens": 9, "max_tokens": 3},
         "min_tokens: min_tokens must be less than or equal to max_tokens=3, got 9\\."),
        ({"top_q": 0.5}, "top_q: Extra inputs are not permitted"),
    ],
)
def test_invalid_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_out_of_vocabulary_token_ids(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64)
    with pytest.raises(ValueError, match=r"outside the vocabulary"):
        llm.generate([[1, 2, 10**9]], use_tqdm=False)


def test_out_of_vocabulary_id_after_a_cached_prefix(tiny_model_dirs):
    """Ids inside prompt blocks the prefix cache holds are not checked again (the request that computed them had
    its ids checked); the others are: a bad id after a cached prefix is still refused, in the block after it too,
    and the refused request leaves nothing behind in the block manager. The look-up for the check counts no
    prefix-cache query, and its hashes serve the scheduler's."""
    from flotilla.engine.request import Request

    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=128, block_size=16, enable_prefix_caching=True)
    engine, manager = llm.engine, llm.engine.block_manager
    one = SamplingParams(max_tokens=1)
    prefix = list(range(3, 51))  # three whole blocks
    llm.generate([prefix + [60, 61]], one, use_tqdm=False)
    probe = Request("probe", prefix + [7], one)
    queries, hits = manager.prefix_cache_queries, manager.prefix_cache_hits
    assert manager.cached_prompt_tokens(probe) == 48
    assert (manager.prefix_cache_queries, manager.prefix_cache_hits) == (queries, hits)
    # Prompt logprobs: every prompt position is computed, so every id is checked (none counts as cached).
    assert manager.cached_prompt_tokens(Request("p2", prefix + [7], SamplingParams(prompt_logprobs=1))) == 0
    manager.free(probe)
    for bad, prompt in ((10**9, prefix + [5, 10**9]), (-1, prefix[:32] + [-1] + prefix[33:] + [5]),
                        (-1, [-1] + prefix)):  # after the cached blocks, in the third block, in the first
        with pytest.raises(ValueError, match=rf"token id\(s\) \[{bad}\] are outside the vocabulary"):
            engine.add_request(prompt, one, request_id="bad")
    assert not manager._hashes and not engine.has_unfinished_requests() and not engine._detokenizers
    assert (manager.prefix_cache_queries, manager.prefix_cache_hits) == (queries, hits)
    out = llm.generate([prefix + [70, 71]], one, use_tqdm=False)
    assert out[0].num_cached_tokens == 48  # the hashes the check computed serve the scheduler's look-up
    assert manager.num_free_blocks == manager.num_blocks and not manager._hashes


def test_a_request_id_taken_by_a_running_completion_is_refused(tiny_model_dirs):
    """`a#1` is the second completion of request `a` once its prompt is done: a new request with that id is
    refused (it would take the completion's place in the scheduler and its detokenizer), and `a` runs to the end
    undisturbed."""
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, enable_prefix_caching=True)
    engine = llm.engine
    engine.add_request(list(range(3, 40)), SamplingParams(n=2, max_tokens=4, ignore_eos=True), request_id="a")
    engine.step()  # the prompt: its completions fork
    assert "a#1" in engine.scheduler.requests
    detokenizer = engine._detokenizers["a#1"]
    with pytest.raises(ValueError, match=r"duplicate request id 'a#1'"):
        engine.add_request(list(range(3, 40)), SamplingParams(max_tokens=1), request_id="a#1")
    assert engine._detokenizers["a#1"] is detokenizer and "a#1" not in engine._groups
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [len(c.token_ids) for c in outputs[-1].outputs] == [4, 4]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize(("first", "second"), [
    (("a", 2), ("a#1", 1)),  # `a`'s second completion is not forked yet (its prompt still waits)
    (("a#1", 1), ("a", 2)),  # a new request whose second completion would take a live request's id
])
def test_a_request_id_that_a_queued_completion_holds_is_refused(tiny_model_dirs, first, second):
    """Every completion id of a new request must be free, including completions not forked yet: else
    one detokenizer replaces another and, once the prompt forks, the scheduler's entry of one request
    is overwritten by the other's (and the second finish of that id fails the engine loop)."""
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64)
    engine = llm.engine
    (first_id, first_n), (second_id, second_n) = first, second
    engine.add_request(list(range(3, 40)), SamplingParams(n=first_n, max_tokens=4, ignore_eos=True),
                       request_id=first_id)
    detokenizers = dict(engine._detokenizers)
    with pytest.raises(ValueError, match=r"duplicate request id 'a#1'"):
        engine.add_request(list(range(5, 30)), SamplingParams(n=second_n, max_tokens=4, ignore_eos=True),
                           request_id=second_id)
    assert engine._detokenizers == detokenizers and list(engine._groups) == [first_id]
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [len(c.token_ids) for c in outputs[-1].outputs] == [4] * first_n
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
