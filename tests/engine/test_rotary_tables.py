"""The rotary cos/sin tables are shared by the layers of live models and go with the last model that holds them: a
process that builds engines of different shapes one after another does not keep every shape's table."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

from flotilla.engine.layers.rotary import RotaryEmbedding
from flotilla.engine.llm import LLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_dirs import make_model_dir


def test_layers_of_one_shape_share_a_table_that_goes_with_the_last_of_them():
    first, second = RotaryEmbedding(16, 64, 10000.0, None), RotaryEmbedding(16, 64, 10000.0, None)
    assert first.cos_sin_cache is second.cos_sin_cache
    other = RotaryEmbedding(16, 128, 10000.0, None)
    assert other.cos_sin_cache is not first.cos_sin_cache and other.cos_sin_cache.shape == (128, 16)
    table = weakref.ref(first.cos_sin_cache)
    gc.disable()  # freed by reference counting alone
    try:
        del first
        assert table() is not None  # `second` still holds it
        del second
        assert table() is None
    finally:
        gc.enable()
    assert RotaryEmbedding(16, 64, 10000.0, None).cos_sin_cache.shape == (64, 16)  # made again when asked for


def test_a_dropped_engine_takes_its_rotary_table_with_it(tmp_path):
    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    llm = LLM(str(model), device="cpu", max_model_len=128)
    rotary = next(m for m in llm.engine.runner.model.modules() if isinstance(m, RotaryEmbedding))
    table = weakref.ref(rotary.cos_sin_cache)
    del rotary, llm
    gc.collect()
    assert table() is None
