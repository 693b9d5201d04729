"""flotilla/engine_rules.py: the command-line grammar and cross-flag rules the engine and operator share."""

from __future__ import annotations

import pytest

from flotilla.engine_rules import (
    RuleError,
    batch_budget_problem,
    cross_flag_problems,
    default_max_num_batched_tokens,
    parse_argv,
    resolve_max_model_len,
    served_name_problem,
)
from flotilla.flags import flag
from flotilla.validation_messages import describe, dotted


def test_argv_forms_the_engine_parser_reads_alike():
    parsed, problems = parse_argv(["--seed", "-3", "--shutdown-timeout=2.5", "--no-enable-prefix-caching",
                                   "--served-model-name", "a", "-tp", "1"])
    assert problems == []
    assert [(p.flag.name, p.value) for p in parsed] == [
        ("--seed", -3), ("--shutdown-timeout", 2.5), ("--enable-prefix-caching", False),
        ("--served-model-name", ["a"]), ("--tensor-parallel-size", 1)]


# `vllm serve`'s forms of --max-model-len and --max-num-batched-tokens (tests/engine/test_cli.py reads them too):
# k/m/g/t powers of 1,000 (fractions allowed), K/M/G/T powers of 1,024 (whole numbers only).
HUMAN_READABLE_INTS = {"8192": 8192, "32k": 32_000, "25.6k": 25_600, "32K": 32_768, "1M": 1_048_576, " 2k ": 2_000}
NOT_HUMAN_READABLE_INTS = ("1.5K", "32x", "k", "-1k", "1e3")


def test_lengths_in_vllms_human_readable_form():
    for text, value in HUMAN_READABLE_INTS.items():
        parsed, problems = parse_argv(["--max-model-len", text, "--max-num-batched-tokens", text])
        assert problems == [] and [p.value for p in parsed] == [value, value]
    for text in NOT_HUMAN_READABLE_INTS:
        assert parse_argv(["--max-model-len", text])[1] != []
    # only these two, as vLLM: the rest of the int flags stay plain ints
    assert parse_argv(["--max-num-seqs", "1k"])[1] == ["--max-num-seqs: '1k' is not a valid int"]


def test_default_batch_budget():
    assert default_max_num_batched_tokens(4096, chunked_prefill=False) == 8192
    assert default_max_num_batched_tokens(32768, chunked_prefill=False) == 32768
    assert default_max_num_batched_tokens(32768, chunked_prefill=True) == 8192


def test_budget_below_the_length_needs_chunked_prefill():
    assert batch_budget_problem(4096, 8192, chunked_prefill=True) is None
    assert batch_budget_problem(8192, 8192, chunked_prefill=False) is None
    assert batch_budget_problem(4096, 8192, chunked_prefill=False).startswith(
        "--max-num-batched-tokens (4096) is smaller than --max-model-len (8192)")


def test_model_length_limit_with_sliding_window():
    assert resolve_max_model_len({"max_position_embeddings": 32768, "sliding_window": 4096}, None) == 4096
    assert resolve_max_model_len({"max_position_embeddings": 32768, "sliding_window": 4096,
                                  "use_sliding_window": False}, None) == 32768
    with pytest.raises(RuleError, match="--max-model-len=9000 exceeds the model's limit of 8192 tokens"):
        resolve_max_model_len({"max_position_embeddings": 8192}, 9000)


@pytest.mark.parametrize("name", ["--help", "-h", "", "two words", "tab\there", "new\nline"])
def test_served_names_that_break_the_command_line_are_refused(name):
    assert served_name_problem(name) is not None


def test_cross_flag_rules_name_settings_through_the_callers_names():
    names = {"max_num_batched_tokens": "spec.budget", "max_model_len": "spec.len",
             "enable_chunked_prefill": "spec.chunked"}
    problems = cross_flag_problems({"max_num_batched_tokens": 100, "max_model_len": 200}, None, names.__getitem__)
    assert problems[0].startswith("spec.budget (100) is smaller than spec.len (200): without spec.chunked")
    # Without the model's limit and without a length, a budget can't be checked: refused, asking for one.
    assert "set spec.len so that can be checked" in cross_flag_problems(
        {"max_num_batched_tokens": 100}, None, names.__getitem__)[0]
    assert cross_flag_problems({"max_num_batched_tokens": 100, "enable_chunked_prefill": True}, None) == []


def test_contract_ranges_are_stated_in_the_message():
    assert flag("--gpu-memory-utilization").check_value(0.0) == \
        "--gpu-memory-utilization=0.0 is out of range (> 0 and <= 1)"
    assert flag("--max-num-seqs").check_value(True) == "--max-num-seqs=True is not an int"
    assert flag("--gpu-memory-utilization").check_value(float("nan")) == \
        "--gpu-memory-utilization=nan is not a finite number"


def test_validation_messages_name_the_location_the_caller_chooses():
    errors = [{"loc": ("scheduling", "maxModelLen"), "msg": "Input should be a valid integer"},
              {"loc": ("tolerations", 0, "key"), "msg": "Value error, bad"}, {"loc": (), "msg": "whole"}]
    assert describe(errors) == ["scheduling.maxModelLen: Input should be a valid integer", "tolerations[0].key: bad",
                                "whole"]
    assert describe(errors[:1], lambda loc: "spec." + dotted(loc)) == [
        "spec.scheduling.maxModelLen: Input should be a valid integer"]


def test_async_scheduling_with_pipeline_parallelism_is_refused_by_the_shared_rule():
    from flotilla.engine_rules import async_pipeline_problem, cross_flag_problems

    assert async_pipeline_problem(True, 1) is None and async_pipeline_problem(False, 2) is None
    problem = async_pipeline_problem(True, 2)
    assert problem is not None and "--async-scheduling" in problem and "--pipeline-parallel-size" in problem
    assert problem in cross_flag_problems({"async_scheduling": True, "pipeline_parallel_size": 2}, None)


def test_a_draft_model_with_parallel_workers_is_refused_by_the_shared_rule():
    from flotilla.engine_rules import cross_flag_problems, draft_model_parallel_problem

    draft = {"method": "draft_model", "model": "/d", "num_speculative_tokens": 2}
    assert draft_model_parallel_problem(draft, 1, 1) is None
    assert draft_model_parallel_problem({"method": "ngram", "num_speculative_tokens": 2}, 2, 1) is None
    problem = draft_model_parallel_problem({"model": "/d"}, 1, 2)  # vLLM's: a model without a method is a draft
    assert problem is not None and "--speculative-config with a draft model" in problem
    assert problem == draft_model_parallel_problem(draft, 2, 1)
    assert problem in cross_flag_problems({"speculative_config": draft, "tensor_parallel_size": 2}, None)


def test_structured_outputs_keys_are_the_engines():
    from flotilla.engine.structured_output.config import StructuredOutputsConfig
    from flotilla.engine_rules import STRUCTURED_OUTPUTS_KEYS, structured_outputs_problem

    assert set(STRUCTURED_OUTPUTS_KEYS) == set(StructuredOutputsConfig.model_fields)
    # What the rule admits, the engine's model takes.
    for value in ({}, {"backend": "xgrammar", "disable_any_whitespace": True, "compile_timeout_s": 0.5},
                  {"compile_timeout_s": 30}, {"warm_up": False},
                  {"reasoning_parser": "qwen3", "enable_in_reasoning": True}, {"reasoning_parser": None}):
        assert structured_outputs_problem(value) is None
        StructuredOutputsConfig(**value)
    for value in ([1], "x", {"bogus": 1}, {"backend": "outlines"}, {"disable_any_whitespace": "yes"},
                  {"compile_timeout_s": 0}, {"compile_timeout_s": True}, {"compile_timeout_s": float("inf")},
                  {"warm_up": "no"}, {"warm_up": 0}, {"reasoning_parser": "granite"}, {"enable_in_reasoning": 1}):
        assert structured_outputs_problem(value) is not None


def test_generation_override_keys_are_the_engines_sampling_fields():
    from flotilla.engine.generation_defaults import SAMPLING_FIELDS
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.engine_rules import GENERATION_OVERRIDE_KEYS, override_generation_config_problem

    assert set(GENERATION_OVERRIDE_KEYS) == set(SAMPLING_FIELDS)
    # What the rule admits, SamplingParams takes (max_new_tokens is its max_tokens); other keys are ignored (vLLM).
    good = {"temperature": 2, "top_p": 1, "top_k": -1, "min_p": 0.5, "repetition_penalty": 1.5, "max_new_tokens": 1,
            "do_sample": True, "top_a": "x"}
    assert override_generation_config_problem(good) is None and override_generation_config_problem(None) is None
    SamplingParams(**{("max_tokens" if k == "max_new_tokens" else k): v for k, v in good.items()
                      if k in GENERATION_OVERRIDE_KEYS})
    for value in ([1], "x", {"temperature": -1}, {"temperature": 2.5}, {"top_p": 0}, {"top_k": 1.5},
                  {"max_new_tokens": 0}, {"max_new_tokens": True}, {"min_p": 2}, {"temperature": float("nan")}):
        problem = override_generation_config_problem(value)
        assert problem is not None and "--override-generation-config" in problem
        assert problem in cross_flag_problems({"override_generation_config": value}, None)


def test_default_chat_template_kwargs_are_an_object_of_template_variables():
    from flotilla.engine_rules import default_chat_template_kwargs_problem

    assert default_chat_template_kwargs_problem({"enable_thinking": False}) is None
    assert default_chat_template_kwargs_problem(None) is None
    for value, why in (([1], "must be a JSON object"),
                       ({"tokenize": True, "tools": []}, "may not set tokenize, tools")):
        problem = default_chat_template_kwargs_problem(value)
        assert problem is not None and problem.startswith("--default-chat-template-kwargs") and why in problem
        assert problem in cross_flag_problems({"default_chat_template_kwargs": value}, None)
