"""`--speculative-config` as vLLM spells it, refused with the flag's name when wrong; the
vllm:spec_decode_* counters and the acceptance log line."""

from __future__ import annotations

import json
import logging
import re

import pytest

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.server.metrics import EngineMetrics, StatsLogger
from flotilla.engine.spec_decode.config import SpeculativeConfig, parse_speculative_config
from flotilla.engine.spec_decode.policy import step_lookahead
from flotilla.engine.stats import SpecDecodeCounts, StatsSnapshot


def test_vllm_json_keys_parse():
    c = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert c == SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4)
    assert c.lookup_window == (4, 4)  # the missing bound takes the other's value, as vLLM
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 2}).lookup_window == (5, 5)
    draft = parse_speculative_config({"model": "/models/draft", "num_speculative_tokens": 5})
    assert draft is not None and draft.method == "draft_model"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("{not json", "not valid JSON"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, '"model"'),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "<="),
        ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}, "draft_tensor_parallel"),
    ],
)
def test_bad_configs_are_refused_naming_the_flag(value, words):
    with pytest.raises(ValueError, match="--speculative-config") as err:
        parse_speculative_config(value)
    assert words in str(err.value)


def test_engine_config_carries_it_and_refuses_a_foreign_draft(tiny_model_dirs, tmp_path):
    model = str(tiny_model_dirs["llama"])
    config = EngineConfig.from_kwargs(model, speculative_config='{"method": "ngram", "num_speculative_tokens": 2}')
    assert config.speculative is not None and config.speculative.num_speculative_tokens == 2
    with pytest.raises(ConfigError, match="--speculative-config"):
        EngineConfig.from_kwargs(model, speculative_config={"method": "ngram"})
    (tmp_path / "config.json").write_text('{"vocab_size": 7, "architectures": ["LlamaForCausalLM"]}')
    from flotilla.engine.llm import LLM

    with pytest.raises(ConfigError, match="vocabulary"):
        LLM(model, max_model_len=64, speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2})


@pytest.mark.parametrize("parallel", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}])
def test_a_draft_model_with_parallel_workers_is_refused_by_the_config(tiny_model_dirs, parallel):
    """Before anything loads (the workers and the target's weights took minutes before the speculator said so)."""
    model = str(tiny_model_dirs["llama"])
    with pytest.raises(ConfigError, match="--speculative-config with a draft model runs on one GPU, not beside tensor "
                                          "or pipeline parallelism yet"):
        EngineConfig.from_kwargs(model, speculative_config={"model": model, "num_speculative_tokens": 2}, **parallel)
    ngram = EngineConfig.from_kwargs(model, speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                                     **parallel)
    assert ngram.speculative is not None


def test_a_draft_model_shorter_than_max_model_len_is_refused_at_start(tiny_model_dirs, tmp_path):
    """Its rotary table ends at its own context: a longer prompt killed the engine loop (an IndexError on the CPU;
    on a GPU, a read past the table)."""
    import json
    import shutil

    from flotilla.engine.llm import LLM

    target = tiny_model_dirs["llama"]
    draft = tmp_path / "short-draft"
    shutil.copytree(target, draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    spec = {"model": str(draft), "num_speculative_tokens": 2}
    message = ("--speculative-config: the draft model has positions for 64 tokens (its config.json's "
               "max_position_embeddings), fewer than --max-model-len 256; lower --max-model-len to 64 or use a draft "
               f"model with a context at least that long ({draft})")
    with pytest.raises(ConfigError, match=re.escape(message)):
        LLM(str(target), max_model_len=256, speculative_config=spec)
    # unset, the length served is the target's own (and a rope-scaled draft's positions say what they come from)
    (draft / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64,
                                                   "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    own = json.loads((target / "config.json").read_text())["max_position_embeddings"]
    message = ("--speculative-config: the draft model has positions for 128 tokens (its config.json's "
               f"max_position_embeddings 64 x rope_scaling.factor 2), fewer than the target model's length {own}, "
               "which is served while --max-model-len is unset; set --max-model-len to 128 or use a draft model with "
               f"a context at least that long ({draft})")
    with pytest.raises(ConfigError, match=re.escape(message)):
        LLM(str(target), speculative_config=spec)
    (draft / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    llm = LLM(str(target), max_model_len=64, speculative_config=spec)
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    [out] = llm.generate([list(range(100, 160))], greedy, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


def test_load_rule():
    assert step_lookahead(4, None, 500) == 4
    assert step_lookahead(4, 8, 7) == 4
    assert step_lookahead(4, 8, 8) == 0


def test_counters_and_log_line(tiny_model_dirs, caplog):
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64,
                                      speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    metrics = EngineMetrics(config, "tiny")
    metrics.update(StatsSnapshot(spec_decode=SpecDecodeCounts(0, 0, 0, (0, 0, 0))))
    counts = SpecDecodeCounts(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12, accepted_per_pos=(6, 4, 2))
    metrics.update(StatsSnapshot(spec_decode=counts))
    text = metrics.render().decode()
    assert 'vllm:spec_decode_num_drafts_total{model_name="tiny"} 10.0' in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="tiny"} 30.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="tiny"} 12.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="2"} 2.0' in text
    assert counts.mean_acceptance_length == pytest.approx(2.2)
    log = StatsLogger(interval=0.0)
    with caplog.at_level(logging.INFO, logger="flotilla.stats"):
        log.maybe_log(StatsSnapshot(num_running=1, generation_tokens=22, spec_decode=counts))
    assert "Mean acceptance length: 2.20" in caplog.text
    assert "Per-position acceptance rate: 0.600, 0.400, 0.200" in caplog.text


def _with_architecture(src, dst, arch: str):
    import json
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "architectures": [arch]}))
    return dst


def test_a_draft_of_an_unsupported_architecture_is_refused_as_the_target_is(tiny_model_dirs, tmp_path, capsys):
    """As the target's: a usage error naming the architecture and those served, before anything loads (it was a
    ValueError traceback from the draft's build, after the target's weights had loaded)."""
    from flotilla.engine.server.cli import main

    target = tiny_model_dirs["llama"]
    draft = _with_architecture(target, tmp_path / "gpt2-draft", "GPT2LMHeadModel")
    spec = json.dumps({"model": str(draft), "num_speculative_tokens": 2})
    message = (f"--speculative-config: draft model {draft}: unsupported model architecture ['GPT2LMHeadModel']; "
               "supported: LlamaForCausalLM, LlamaForSequenceClassification, MistralForCausalLM, "
               "MistralForSequenceClassification, MixtralForCausalLM, Qwen2ForCausalLM, "
               "Qwen2ForSequenceClassification, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3ForSequenceClassification, "
               "Qwen3MoeForCausalLM")
    with pytest.raises(ConfigError, match=re.escape(message)):
        EngineConfig.from_kwargs(str(target), max_model_len=64, speculative_config=spec)
    assert main([str(target), "--max-model-len", "64", "--speculative-config", spec]) == 2
    assert capsys.readouterr().err.strip().endswith(f"flotilla serve: error: {message}")
    target_message = f"model {draft}: unsupported model architecture ['GPT2LMHeadModel']; supported: "
    assert main([str(draft), "--max-model-len", "64"]) == 2  # the target's refusal, in the same form
    assert f"flotilla serve: error: {target_message}" in capsys.readouterr().err


def test_a_draft_whose_architecture_changed_after_the_config_is_refused_at_start(tiny_model_dirs, tmp_path):
    """The engine checks again when it loads the draft (its directory may be written after the config is built)."""
    import shutil

    from flotilla.engine.llm_engine import LLMEngine

    target = tiny_model_dirs["llama"]
    draft = tmp_path / "draft"
    shutil.copytree(target, draft)
    config = EngineConfig.from_kwargs(str(target), max_model_len=64,
                                      speculative_config={"model": str(draft), "num_speculative_tokens": 2})
    shutil.rmtree(draft)
    _with_architecture(target, draft, "GPT2LMHeadModel")
    with pytest.raises(ConfigError, match=re.escape(f"--speculative-config: draft model {draft}: unsupported model "
                                                    "architecture ['GPT2LMHeadModel']")):
        LLMEngine(config)
