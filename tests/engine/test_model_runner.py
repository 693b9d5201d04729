"""The model runner owns its settings: the GEMV threshold reaches every linear layer, and building a
runner leaves process-wide torch state (the global RNG, the default dtype) as it found it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from flotilla.engine.layers.linear import _Linear
from flotilla.engine.llm import LLM
from flotilla.flags import flag

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_dirs import make_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir("tiny-llama", tmp_path_factory.mktemp("tiny-llama"), weights_seed=0)


def _gemv_thresholds(llm: LLM) -> set[int]:
    return {m.gemv_max_rows for m in llm.engine.runner.model.modules() if isinstance(m, _Linear)}


def test_triton_gemv_max_rows_reaches_every_linear_layer(tiny_dir):
    default = flag("--triton-gemv-max-rows").default
    assert _gemv_thresholds(LLM(str(tiny_dir), device="cpu", max_model_len=64)) == {default}
    assert _gemv_thresholds(LLM(str(tiny_dir), device="cpu", max_model_len=64, triton_gemv_max_rows=3)) == {3}


def test_building_a_runner_leaves_the_global_rng_and_default_dtype_alone(tiny_dir):
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    LLM(str(tiny_dir), device="cpu", max_model_len=64, dtype="bfloat16", seed=7, load_format="dummy")
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.get_default_dtype() == torch.float32
