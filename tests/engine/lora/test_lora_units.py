"""The LoRA pieces on their own: flags, adapter checks, the registry, the scheduler's cap, the
prefix-cache key and the slot manager's LRU."""

from __future__ import annotations

import json

import pytest
import torch

from flotilla.engine.block_manager import BlockManager
from flotilla.engine.config import ConfigError, EngineConfig, SchedulerConfig
from flotilla.engine.lora.adapter import LoRAAdapterError, read_adapter_config
from flotilla.engine.lora.registry import LoRARegistry, parse_lora_module
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import Scheduler


def test_lora_modules_take_both_vllm_forms():
    assert parse_lora_module("sql=/a/sql").name == "sql"
    m = parse_lora_module('{"name": "chat", "path": "/a/chat", "base_model_name": "base"}')
    assert (m.name, m.path, m.base_model_name) == ("chat", "/a/chat", "base")
    for bad in ("noequals", "=/path", '{"name": "x"}', '{"name": "x", "path": "/p", "extra": 1}', "{bad json"):
        with pytest.raises(ValueError):
            parse_lora_module(bad)


def test_lora_flags_need_enable_lora(tiny_model_dirs):
    model = str(tiny_model_dirs["qwen3"])
    with pytest.raises(ConfigError, match="--max-loras.*--enable-lora"):
        EngineConfig.from_kwargs(model, max_loras=4)
    with pytest.raises(ConfigError, match="--max-cpu-loras"):
        EngineConfig.from_kwargs(model, enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(ConfigError, match="--max-lora-rank"):
        EngineConfig.from_kwargs(model, enable_lora=True, max_lora_rank=12)
    with pytest.raises(ConfigError, match="not supported yet"):
        EngineConfig.from_kwargs(model, enable_lora=True, tensor_parallel_size=2)
    lora = EngineConfig.from_kwargs(model, enable_lora=True, max_loras=3, lora_modules=["a=/x"]).lora
    assert (lora.max_loras, lora.max_cpu_loras, lora.lora_modules) == (3, 3, (("a", "/x", None),))


@pytest.mark.parametrize("change, problem", [
    ({"use_dora": True}, "use_dora"), ({"bias": "all"}, "bias"), ({"r": 64}, "above --max-lora-rank 16"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"), ({"alpha_pattern": {"q_proj": 2}}, "alpha_pattern"),
])
def test_unsupported_peft_features_are_refused_by_name(tmp_path, change, problem):
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "bias": "none", **change}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(LoRAAdapterError, match=problem):
        read_adapter_config(tmp_path, max_rank=16)


def test_registry_gives_each_load_a_fresh_id():
    reg = LoRARegistry(["base"])
    first = reg.new_request("a", "/p")
    reg.add(first)
    with pytest.raises(ValueError, match="already been loaded"):
        reg.new_request("a", "/p")
    with pytest.raises(ValueError, match="base model"):
        reg.new_request("base", "/p")
    assert reg.entries() == [(first, "base")]
    reg.remove("a")
    assert reg.get("a") is None and reg.new_request("a", "/p").lora_int_id != first.lora_int_id


def _request(i: int, lora: LoRARequest | None) -> Request:
    return Request(str(i), list(range(1, 9)), SamplingParams(max_tokens=4), lora_request=lora)


def test_scheduler_caps_distinct_adapters_and_lets_others_pass():
    """--max-loras 2: a third adapter waits, base-model and admitted adapters' requests go past it."""
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=64)
    s = Scheduler(config, BlockManager(64, 4), max_loras=2)
    a, b, c = (LoRARequest(n, i + 1, "/p") for i, n in enumerate("abc"))
    for i, lora in enumerate([a, b, c, None, a]):
        s.add(_request(i, lora))
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["0", "1", "3", "4"]
    assert [r.request_id for r in s.waiting] == ["2"]



def _priority_scheduler(max_num_seqs: int) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256, max_model_len=64,
                             scheduling_policy="priority")
    return Scheduler(config, BlockManager(64, 4), max_loras=1)


def _steps(s: Scheduler, n: int) -> list[list[str]]:
    """Run n steps (every sampled token is 5): the ids each step scheduled."""
    planned = []
    for _ in range(n):
        out = s.schedule()
        planned.append([x.request.request_id for x in out.scheduled])
        s.update(out, {x.request.request_id: 5 for x in out.scheduled})
    return planned


def test_priority_preempts_nobody_for_a_request_whose_adapter_could_not_run_anyway():
    """--max-loras 1, two sequence slots: a waiting request of adapter b (priority 1) cannot run beside a running
    request of adapter a with a higher priority (0), so preempting the base-model request of priority 2 for it only
    makes that one recompute its prompt, step after step (it was preempted and taken back every step)."""
    s = _priority_scheduler(max_num_seqs=2)
    high, low, mid = (_request(i, lora) for i, lora in enumerate([LoRARequest("a", 1, "/p"), None,
                                                                   LoRARequest("b", 2, "/p")]))
    high.priority, low.priority, mid.priority = 0, 2, 1
    s.add(high)
    s.add(low)
    _steps(s, 1)
    s.add(mid)
    assert _steps(s, 3) == [["0", "1"]] * 3
    assert s.num_preemptions == 0


def test_priority_preempts_a_lower_request_whose_adapter_keeps_a_higher_one_waiting():
    """--max-loras 1 and slots to spare: a waiting request of adapter b (priority 1) takes the adapter slot of a
    running request of adapter a with a lower priority (2), as it would take its blocks or its sequence slot."""
    s = _priority_scheduler(max_num_seqs=8)
    low, mid = _request(0, LoRARequest("a", 1, "/p")), _request(1, LoRARequest("b", 2, "/p"))
    low.priority, mid.priority = 2, 1
    s.add(low)
    _steps(s, 1)
    s.add(mid)
    assert _steps(s, 1) == [["1"]]
    assert s.num_preemptions == 1 and [r.request_id for r in s.waiting] == ["0"]

def test_prefix_cache_key_includes_the_adapter():
    bm = BlockManager(16, 4)
    base, lora = _request(0, None), _request(1, LoRARequest("a", 7, "/p"))
    assert bm.allocate(base, 8)
    bm.free(base)
    assert bm.find_cached_prefix(lora) == []  # same tokens, other adapter: no hit
    assert bm.find_cached_prefix(_request(2, None)) != []


def test_slot_manager_reuses_slots_lru(tiny_model_dirs, lora_adapters):
    """Two slots, three adapters: the least recently used adapter not in the step gives up its slot."""
    from flotilla.engine.lora.manager import LoRAManager
    from flotilla.engine.model_loader import load_model
    from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput

    config = EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3"]), enable_lora=True, max_loras=2)
    manager = LoRAManager(load_model(config.model, torch.device("cpu")), 2, 16, 2)
    loras = [LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(lora_adapters["qwen3"].items())]

    def step(*chosen):
        return SchedulerOutput([ScheduledRequest(_request(i, lora), 2, 0, True) for i, lora in enumerate(chosen)])

    slots = manager.slot_values(step(loras[0], None, loras[1]))
    slot_a, slot_b = slots[0], slots[4]
    assert slots[2:4] == [-1, -1] and {slot_a, slot_b} == {0, 1}
    assert manager.slot_values(step(None)) is None
    slots = manager.slot_values(step(loras[2], loras[1]))  # c takes a's slot: a is least recent
    assert (slots[0], slots[2], manager.num_slot_loads) == (slot_a, slot_b, 3)
    slots = manager.slot_values(step(loras[1]))  # already resident: no copy
    assert (slots[0], manager.num_slot_loads) == (slot_b, 3)
    manager.slot_values(step(loras[0]))  # back again: c is now the least recent and leaves
    assert manager.num_slot_loads == 4
    with pytest.raises(RuntimeError, match="--max-loras"):
        manager.slot_values(step(*loras))


def test_a_bad_startup_adapter_is_a_config_error_naming_it(tiny_model_dirs, lora_adapters, tmp_path):
    """`--lora-modules` adapters load before serving; one that cannot be served stops the start with a
    message naming it (the CLI prints it and exits 2), and good ones are served with their parent."""
    from flotilla.engine.engine_core import EngineFactory
    from flotilla.engine.llm_engine import LLMEngine
    from flotilla.engine.server.lora_routes import register_startup_adapters

    def load_startup_adapters(engine, config, loras):  # as `flotilla serve` does, in the core process
        EngineFactory.load_adapters(engine, register_startup_adapters(config, loras))

    good = str(lora_adapters["qwen3"]["attn"])
    engine = LLMEngine.from_kwargs(str(tiny_model_dirs["qwen3"]), enable_lora=True, max_lora_rank=8,
                                   lora_modules=[f"attn={good}", json.dumps({"name": "mlp", "path": str(tmp_path)})])
    loras = LoRARegistry(["tiny"])
    with pytest.raises(ConfigError, match=f"--lora-modules mlp={tmp_path}: .*no adapter_config.json"):
        load_startup_adapters(engine, engine.config.lora, loras)
    assert ("attn", "tiny") in [(lora.lora_name, parent) for lora, parent in loras.entries()]
    rank16 = str(lora_adapters["qwen3"]["mlp"])
    with pytest.raises(ConfigError, match="rank 16 above --max-lora-rank 8"):
        load_startup_adapters(engine, engine.config.lora.model_copy(update={"lora_modules": (("m", rank16, None),)}),
                              LoRARegistry(["tiny"]))


def _merged_layer(max_loras: int = 3, max_rank: int = 8):
    """A gate/up-like projection (two slices of 24 outputs, 32 inputs) wrapped for LoRA, with adapters
    in slots 0 and 2 (slot 1 empty) and its loaded weight."""
    from flotilla.engine.layers.linear import MergedColumnParallelLinear
    from flotilla.engine.lora.adapter import ModuleLayout
    from flotilla.engine.lora.layers import LoRALinear

    g = torch.Generator().manual_seed(3)
    base = MergedColumnParallelLinear(32, [24, 24])
    base.weight.data.copy_(torch.randn(48, 32, generator=g))
    loaded = base.weight.detach().clone()
    layer = LoRALinear(base, ModuleLayout(32, {0: 0, 1: 1}, (24, 24)), max_loras, max_rank)
    for slot in (0, 2):
        layer.set_slot(slot, {i: (torch.randn(max_rank, 32, generator=g), torch.randn(24, max_rank, generator=g))
                              for i in (0, 1)})
    return layer, loaded


def test_stacked_layer_keeps_the_a_stack_in_its_weight_and_adds_the_same_deltas(monkeypatch):
    """Kernel set "stacked": the base weight is the first rows of one tensor whose other rows are the A
    stack (so `set_slot` writes land there), the loaded values survive, and a step's output equals the
    base product plus `lora_apply_ref`'s deltas; with the other sets A stays a tensor of its own."""
    from flotilla.engine.lora.slots import lora_slots
    from flotilla.kernels import dispatch
    from flotilla.kernels.lora import lora_apply_ref

    monkeypatch.setattr(dispatch, "LORA_KERNELS", "stacked")
    layer, loaded = _merged_layer()
    assert layer._stacked is not None and layer._stacked.shape == (48 + 3 * 2 * 8, 32)
    assert layer.base.weight.data_ptr() == layer._stacked.data_ptr() and layer.base.weight.is_contiguous()
    assert torch.equal(layer.base.weight, loaded)
    assert torch.equal(layer._stacked[48:].view(3, 16, 32), layer.lora_a) and layer.lora_a[2].any()
    x = torch.randn(7, 32, generator=torch.Generator().manual_seed(4))
    slots = torch.tensor([0, -1, 2, 2, 0, -1, 2])
    expected = x @ loaded.T
    lora_apply_ref(expected, x, layer.lora_a, layer.lora_b, slots, (24, 24), 8)
    with lora_slots(slots):
        out = layer(x)
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-4)
    assert torch.equal(layer(x), x @ loaded.T)  # no adapter in the step: the base layer alone
    for other in ("segments", "pair"):
        monkeypatch.setattr(dispatch, "LORA_KERNELS", other)
        plain, _ = _merged_layer()
        assert plain._stacked is None and plain.base.weight.data_ptr() != plain.lora_a.data_ptr()
        with lora_slots(slots):
            assert torch.allclose(plain(x), expected, rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(dispatch, "LORA_KERNELS", "stacked")
    monkeypatch.setattr(dispatch, "LORA_STACKED_MAX_BYTES", 3 * 16 * 32 * 4 - 1)  # one byte short
    assert _merged_layer()[0]._stacked is None


def test_lora_kernel_sets_by_number_or_name():
    from flotilla.kernels.dispatch import lora_kernel_set

    assert [lora_kernel_set(v) for v in ("0", "1", "2", " stacked ")] == ["pair", "segments", "stacked", "stacked"]
    with pytest.raises(ValueError, match="FLOTILLA_LORA_KERNELS"):
        lora_kernel_set("3")


def test_a_wrapped_model_is_freed_without_a_garbage_collection(tiny_model_dirs):
    """The manager's forward pre-hook holds no reference back to the manager: a dropped LoRA model (and
    on a GPU its engine's KV cache) is freed by reference counting, not at the next collection (on the
    H200 the next engine of a process found no memory left while a cycle kept the last one alive)."""
    import gc
    import weakref

    from flotilla.engine.lora.manager import LoRAManager
    from flotilla.engine.model_loader import load_model

    config = EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3"]), enable_lora=True, max_loras=2)
    model = load_model(config.model, torch.device("cpu"))
    manager = LoRAManager(model, 2, 16, 2)
    alive = weakref.ref(model)
    gc.collect()
    gc.disable()
    try:
        del model, manager
        assert alive() is None
    finally:
        gc.enable()


def test_an_adapter_that_cannot_be_read_again_fails_its_requests_alone(tiny_model_dirs, lora_adapters, tmp_path):
    """An adapter unloaded while a request still uses it is read again from its directory at the next
    step; if that directory is gone (or now holds something else), that request fails, and the step,
    the engine and the other requests go on (the error used to escape the step and kill the engine)."""
    import shutil

    from flotilla.engine.llm import LLM

    adapter = shutil.copytree(lora_adapters["qwen3"]["attn"], tmp_path / "attn")
    engine = LLM(str(tiny_model_dirs["qwen3"]), enable_lora=True, max_lora_rank=16, max_model_len=128).engine
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.add_request(list(range(5, 20)), greedy, "a", lora_request=LoRARequest("attn", 1, str(adapter)))
    engine.add_request(list(range(25, 40)), greedy, "b")
    engine.step()
    engine.remove_lora(1)  # /v1/unload_lora_adapter
    shutil.rmtree(adapter)
    finals, failures = {}, []
    while engine.has_unfinished_requests():
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
        failures += engine.take_failures()
    assert [f.request_id for f in failures] == ["a"] and "no adapter_config.json" in str(failures[0])
    assert list(finals) == ["b"] and len(finals["b"].outputs[0].token_ids) == 12
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_request_failed_for_its_adapter_leaves_no_uncomputed_blocks_in_the_prefix_cache(
        tiny_model_dirs, lora_adapters, tmp_path):
    """A request whose adapter cannot be read again fails before its step runs; the blocks its prompt was
    given had already been indexed for the prefix cache (a step's blocks are indexed as it is planned).
    Left indexed, they were hit by the next request with that adapter and prompt once the directory was
    back: K/V never computed (32 'cached' tokens), wrong tokens."""
    import shutil

    from flotilla.engine.llm import LLM

    adapter = shutil.copytree(lora_adapters["qwen3"]["attn"], tmp_path / "attn")
    attn, other = LoRARequest("attn", 1, str(adapter)), LoRARequest("mlp", 2, str(lora_adapters["qwen3"]["mlp"]))
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = list(range(5, 45))  # two full blocks of 16, and some

    def run(engine, request_id: str | None):
        if request_id is not None:
            engine.add_request(prompt, greedy, request_id, lora_request=attn)
        finals = {}
        while engine.has_unfinished_requests():
            finals.update((o.request_id, o) for o in engine.step() if o.finished)
        return finals.get(request_id), engine.take_failures()

    def build():
        return LLM(str(tiny_model_dirs["qwen3"]), enable_lora=True, max_lora_rank=16, max_model_len=128,
                   max_cpu_loras=1).engine

    expected, _ = run(build(), "fresh")
    engine = build()
    engine.add_request(prompt, greedy, "first", lora_request=attn)
    engine.add_lora(other)  # --max-cpu-loras 1: evicts `attn` from the CPU cache before its first step
    shutil.move(adapter, tmp_path / "away")  # the directory is being replaced
    _, failures = run(engine, None)  # its first step fails it
    assert [f.request_id for f in failures] == ["first"]
    shutil.move(tmp_path / "away", adapter)  # and is back
    again, failures = run(engine, "again")
    assert not failures
    assert again.outputs[0].token_ids == expected.outputs[0].token_ids
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_an_unreadable_adapter_fails_every_request_that_names_it_not_only_those_sharing_one_object(
        tiny_model_dirs, lora_adapters, tmp_path):
    """Requests of one adapter hold equal but distinct LoRARequest objects when each crossed the pipe to the
    core process. When the adapter could not be read again, only the requests holding the object the step
    happened to look up failed; the others were dropped from the step but left as if it had run (prompt
    counted as computed, a token pending), and their next step died in the runner (KeyError: the engine
    loop ended)."""
    import copy
    import shutil

    from flotilla.engine.llm import LLM

    adapter = shutil.copytree(lora_adapters["qwen3"]["attn"], tmp_path / "attn")
    attn = LoRARequest("attn", 1, str(adapter))
    engine = LLM(str(tiny_model_dirs["qwen3"]), enable_lora=True, max_lora_rank=16, max_model_len=128,
                 max_cpu_loras=1).engine
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request(list(range(5, 45)), greedy, "a", lora_request=attn)
    engine.add_request(list(range(50, 70)), greedy, "b", lora_request=copy.copy(attn))  # as unpickled
    engine.add_request(list(range(70, 90)), greedy, "base")
    engine.add_lora(LoRARequest("mlp", 2, str(lora_adapters["qwen3"]["mlp"])))  # evicts `attn` (CPU cache of 1)
    shutil.move(adapter, tmp_path / "away")
    engine.step()  # `attn` cannot be read: its requests fail
    shutil.move(tmp_path / "away", adapter)  # a moment later its directory is back
    finals, failures = {}, engine.take_failures()
    while engine.has_unfinished_requests():
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
        failures += engine.take_failures()
    assert sorted(f.request_id for f in failures) == ["a", "b"]
    assert list(finals) == ["base"] and len(finals["base"].outputs[0].token_ids) == 8
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
