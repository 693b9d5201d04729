"""Session 32's review of the day's merges: inputs a vLLM user may send that ended in a traceback or a wrong status."""

from __future__ import annotations

import pytest

from flotilla.engine.config import ConfigError, EngineConfig


@pytest.mark.parametrize("overrides", [{"num_hidden_layers": "2"}, {"max_position_embeddings": None},
                                       {"max_position_embeddings": "big"}])
def test_a_wrong_typed_hf_override_is_a_config_error_naming_the_flag(tiny_model_dirs, overrides):
    # Before: a TypeError traceback from the pipeline-split check, or a bare "invalid literal for int()" that named
    # no flag; the CLI turns a ConfigError into a usage error.
    with pytest.raises(ConfigError, match="--hf-overrides"):
        EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), hf_overrides=overrides)
