"""Sleep mode on the GPU (skipped without one): a level-1 sleep frees at least the KV pool and the weights
(torch.cuda.memory_allocated), drops the CUDA graphs, and wake_up captures them again at the new addresses, so the
greedy tokens (decode replayed from graphs) are unchanged; a level-2 sleep, wake_up and reload_weights too."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [list(range(300, 340)), [7, 8, 9] * 5, list(range(40, 43))]


@pytest.fixture(scope="module")
def llm(tiny_model_dirs) -> LLM:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cuda", enable_sleep_mode=True,
               gpu_memory_utilization=0.3)


def _greedy(llm: LLM) -> list[list[int]]:
    tokens = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert llm.engine.runner.last_step.graphed  # the last decode steps replayed a graph
    return tokens


def _weight_bytes(llm: LLM) -> int:
    model = llm.engine.runner.model
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}
    return sum(storages.values())


def test_level_1_frees_kv_and_weights_and_recaptures_graphs(llm):
    runner = llm.engine.runner
    assert runner.graphs is not None
    tokens = _greedy(llm)
    kv_bytes = runner.kv_cache.numel() * runner.kv_cache.element_size()
    weight_bytes = _weight_bytes(llm)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    llm.sleep(level=1)
    freed = before - torch.cuda.memory_allocated()
    assert freed >= kv_bytes + weight_bytes, (freed, kv_bytes, weight_bytes)
    assert runner.graphs is None
    llm.wake_up()
    assert runner.graphs is not None
    assert _greedy(llm) == tokens


def test_level_2_wake_up_reload_then_same_tokens(llm):
    tokens = _greedy(llm)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    llm.collective_rpc("reload_weights")
    llm.wake_up(tags=["kv_cache"])
    assert llm.engine.runner.graphs is not None
    assert _greedy(llm) == tokens
