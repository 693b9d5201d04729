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


def test_missing_model_directory(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        EngineConfig.from_kwargs(str(tmp_path))


def test_prompt_longer_than_max_model_len(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=32)
    with pytest.raises(ValueError, match="prompt is 40 tokens long.*maximum context length is 32"):
        llm.generate([[5, 6, 7], list(range(3, 43))], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_model_len": 100_000}, "--max-model-len=100000 exceeds the model's limit of 512"),
        ({"block_size": 12}, r"--block-size=12 is not one of: 8, 16, 32, 64, 128"),
        ({"dtype": "int4"}, "--dtype='int4' is not one of"),
        ({"quantization": "fp8"}, "--quantization is not implemented yet"),
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
        ({"temperature": -1}, "temperature: Input should be greater than or equal to 0"),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"min_tokens": 9, "max_tokens": 3}, "min_tokens \\(9\\) must be <= max_tokens \\(3\\)"),
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
