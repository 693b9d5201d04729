"""Session 32's review of the day's merges: inputs a vLLM user may send that ended in a traceback or a wrong status."""

from __future__ import annotations

import numpy as np
import pytest

from flotilla.compilation_config import compilation_problem
from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.pooling.scoring import cosine_scores
from flotilla.operator.engine_args import unsupported
from flotilla.operator.spec import InferenceServiceSpec


@pytest.mark.parametrize("overrides", [{"num_hidden_layers": "2"}, {"max_position_embeddings": None},
                                       {"max_position_embeddings": "big"}, {"rope_scaling": 5},
                                       {"rope_parameters": [1]}])
def test_a_wrong_typed_hf_override_is_a_config_error_naming_the_flag(tiny_model_dirs, overrides):
    # Before: a TypeError traceback from the pipeline-split check, or a bare "invalid literal for int()" that named
    # no flag; the CLI turns a ConfigError into a usage error.
    with pytest.raises(ConfigError, match="--hf-overrides"):
        EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), hf_overrides=overrides)


@pytest.mark.parametrize("value", [{"level": [3]}, {"mode": {}}, {"cudagraph_mode": ["FULL"]},
                                   {"cudagraph_mode": {"FULL": 1}}])
def test_an_unhashable_compilation_config_value_is_a_problem_not_a_type_error(value):
    # Before: `item in LEVELS` / `item in REFUSED_MODES` raised "unhashable type" (a traceback from `flotilla serve
    # -cc '{"level": [3]}'`, and from the operator's check of spec.engineArgs, which shares this function).
    problem = compilation_problem(value)
    assert problem is not None and problem.startswith("--compilation-config: ") and next(iter(value)) in problem


def test_a_cosine_score_stays_in_minus_one_to_one():
    # Before: a vector against itself (or its negation) scored 1.0000000000000002 (or below -1) for some vectors,
    # outside the [-1, 1] docs/embeddings.md promises for /score and /rerank.
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(64).astype(np.float32).tolist() for _ in range(200)]
    negated = [[-x for x in v] for v in vectors]
    same, opposite = cosine_scores(vectors, vectors), cosine_scores(vectors, negated)
    assert max(same) <= 1.0 and min(opposite) >= -1.0
    np.testing.assert_allclose(same, 1.0, atol=1e-12)
    np.testing.assert_allclose(opposite, -1.0, atol=1e-12)


def test_the_operator_refuses_an_unhashable_compilation_config_in_engine_args():
    # The operator checks spec.engineArgs with the same function: before, this InferenceService's check raised
    # TypeError (unhashable type: 'list') instead of listing the problem.
    spec = InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"},
                                                "engineArgs": ["-cc", '{"level": [3]}']})
    assert any(problem.startswith("--compilation-config: level [3] is not supported")
               for problem in unsupported(spec, "x"))


@pytest.mark.parametrize("dimensions", [5, "12", [8, "x"], [0]])
def test_an_unreadable_matryoshka_dimensions_is_refused_at_start(tiny_model_dirs, dimensions):
    # Before: the config was accepted and each /v1/embeddings request with `dimensions` was a 500 ("'int' object is
    # not iterable"; "12" allowed sizes 1 and 2). Seen on `flotilla serve --runner pooling --hf-overrides
    # '{"matryoshka_dimensions": 5}'` with {"input": "a", "dimensions": 4}.
    with pytest.raises(ConfigError, match="matryoshka_dimensions must be a list of positive integers"):
        EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3"]), runner="pooling",
                                 hf_overrides={"matryoshka_dimensions": dimensions})
