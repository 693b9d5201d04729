"""LoRA in CUDA graphs: the graph bookkeeping on the CPU (keys, picking, the per-token adapter-slot
buffer, the eager fallback's log) and, on a GPU, captured greedy tokens equal to the eager path's (also with
LoRA on rtn 4-bit layers, whose base product is the packed-code kernel's)."""

from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.input_batch import FlatBatch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))


def _graphs(lora: bool) -> StepGraphs:
    return StepGraphs(nn.Identity(), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=8,
                      device=torch.device("cpu"), lora=lora)


def _decode(n: int, context: int = 10) -> FlatBatch:
    f = FlatBatch()
    for i in range(n):
        f.input_ids.append(5 + i)
        f.positions.append(context - 1)
        f.slots.append(8 * i + context - 1)
        f.query_start_loc.append(i + 1)
        f.seq_lens.append(context)
        f.block_tables.append([i, 10 + i])
    f.max_query_len = 1
    return f


def test_lora_graphs_are_captured_beside_the_base_ones():
    base, lora = _graphs(False).keys(), _graphs(True).keys()
    assert not any(k.lora for k in base)
    assert sorted((k.decode, k.tokens, k.width) for k in lora if k.lora) == \
        sorted((k.decode, k.tokens, k.width) for k in base)
    assert len(lora) == 2 * len(base)


def test_pick_takes_the_lora_variant_only_when_captured():
    flat = _decode(3)
    with_lora = _graphs(True)
    assert with_lora.pick(flat, lora=True).lora and not with_lora.pick(flat).lora
    assert with_lora.pick(flat, lora=True).tokens == 4
    without = _graphs(False)
    assert without.pick(flat, lora=True) is None
    assert without.eager_reason(flat, lora=True) == "LoRA graphs were not captured"


def test_staged_adapter_slots_pad_with_the_base_model():
    """Real tokens get their slot; padding rows (and every row of a base-model step) get -1."""
    graphs = _graphs(True)
    flat = _decode(3)
    key = graphs.pick(flat, lora=True)
    graphs._stage(flat, key, [2, -1, 0])
    assert graphs._lora_slots(key).tolist() == [2, -1, 0, -1]
    graphs._stage(flat, key, None)
    assert graphs._lora_slots(key).tolist() == [-1, -1, -1, -1]
    assert graphs._lora_slots(graphs.pick(flat)) is None  # the base graph skips LoRA altogether


def test_eager_fallback_says_why_once(caplog):
    graphs = _graphs(True)
    big = _decode(6)  # above the largest decode graph (4)
    assert graphs.pick(big, lora=True) is None
    with caplog.at_level(logging.INFO, logger="flotilla.engine.cuda_graphs"):
        graphs.log_eager(big, lora=True)
        graphs.log_eager(big, lora=True)
        graphs.log_eager(_decode(7), lora=True)  # same kind, other size: DEBUG only
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["a LoRA step runs eagerly: 6 decode rows, above the largest decode graph (4)"]
    long_context = _decode(1, context=70)  # 9 blocks, the widest table holds 8
    assert "longer than the widest graph" in graphs.eager_reason(long_context)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_lora_tokens_equal_eager(tmp_path):
    """Tiny Llama (fp32), four rank-8 adapters on all seven projections in two slots, a batch mixing
    them with the base model: greedy tokens from the captured graphs equal the eager path's, and the
    decode steps replay graphs."""
    from lora import write_adapter
    from model_dirs import SHAPES, make_model_dir

    from flotilla.engine.llm import LLM
    from flotilla.engine.lora.request import LoRARequest
    from flotilla.engine.sampling_params import SamplingParams

    model = make_model_dir("tiny-llama", tmp_path / "model", weights_seed=0)
    config = SHAPES["tiny-llama"]
    loras = [LoRARequest(f"a{k}", k + 1, str(write_adapter(config, tmp_path / f"a{k}", 8, k, scale=0.2)))
             for k in range(4)]
    prompts = [[(37 * i + 11 * j) % 1000 + 3 for j in range(5 + 7 * i)] for i in range(10)]
    chosen = [None if i % 5 == 0 else loras[i % 4] for i in range(10)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = {}
    for eager in (True, False):
        llm = LLM(str(model), device="cuda", dtype="float32", max_model_len=256, enforce_eager=eager,
                  gpu_memory_utilization=0.3,
                  enable_lora=True, max_loras=2, max_lora_rank=8, max_num_seqs=16)
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=chosen)
        tokens[eager] = [o.outputs[0].token_ids for o in outs]
        assert llm.engine.runner.last_step.graphed is not eager
        if eager:  # the oracle's own check: the adapters change some row's tokens
            base = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            assert any(b != t for b, t, c in zip(base, tokens[True], chosen, strict=True) if c is not None)
        del llm
        gc.collect()  # whatever cycle an engine may hold: the next one needs its KV memory
        torch.cuda.empty_cache()
    assert tokens[False] == tokens[True]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_new_lora_kernels_give_the_per_token_pairs_tokens(tmp_path, monkeypatch):
    """Tiny Llama (fp32, eager), built with the default kernel set (stacked: the A stack in the base
    weight): the stacked GEMM + expand (steps of 2-256 tokens), the segment kernels (prefill steps of
    >= 16 tokens) and the shrink + GEMV-epilogue path (decode of one request) give the same greedy
    tokens as the per-token pair (FLOTILLA_LORA_KERNELS=0), for a batch mixing two adapters with the
    base model and for one request."""
    from lora import write_adapter
    from model_dirs import SHAPES, make_model_dir

    from flotilla.engine.llm import LLM
    from flotilla.engine.lora.request import LoRARequest
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.kernels import dispatch

    model = make_model_dir("tiny-llama", tmp_path / "model", weights_seed=0)
    config = SHAPES["tiny-llama"]
    loras = [LoRARequest(f"a{k}", k + 1, str(write_adapter(config, tmp_path / f"a{k}", 8, k, scale=0.2)))
             for k in range(2)]
    prompts = [[(37 * i + 11 * j) % 1000 + 3 for j in range(9 + 7 * i)] for i in range(6)]
    chosen = [None if i % 3 == 0 else loras[i % 2] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = LLM(str(model), device="cuda", dtype="float32", max_model_len=256, enforce_eager=True,
              gpu_memory_utilization=0.3,
              enable_lora=True, max_loras=2, max_lora_rank=8, max_num_seqs=8, enable_prefix_caching=False)
    assert dispatch.LORA_KERNELS == "stacked"
    tokens = {}
    for kernels in ("pair", "segments", "stacked"):  # read at every call; the weights stay stacked
        monkeypatch.setattr(dispatch, "LORA_KERNELS", kernels)
        batch = llm.generate(prompts, params, use_tqdm=False, lora_request=chosen)
        single = llm.generate(prompts[-1:], params, use_tqdm=False, lora_request=loras[1])
        tokens[kernels] = [o.outputs[0].token_ids for o in batch + single]
    assert tokens["segments"] == tokens["pair"] and tokens["stacked"] == tokens["pair"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_lora_on_rtn4_layers(tmp_path, monkeypatch, dtype):
    """Tiny Llama, rtn 4-bit groups of 32 on CUDA (bf16: the Triton int4 kernels), two adapters and the base model in
    one batch: greedy tokens of the captured graphs equal the eager path's, the adapters change tokens, and in fp32
    the packed codes and scales equal the CPU engine's bit for bit and the tokens equal its tokens (whose LoRA on
    packed layers test_lora_quantized.py checks against PEFT)."""
    from lora import write_adapter
    from model_dirs import SHAPES, make_model_dir

    from flotilla.engine.llm import LLM
    from flotilla.engine.lora.request import LoRARequest
    from flotilla.engine.sampling_params import SamplingParams

    monkeypatch.setenv("RTN_NUM_BITS", "4")
    monkeypatch.setenv("RTN_GROUP_SIZE", "32")
    model = make_model_dir("tiny-llama", tmp_path / "model", weights_seed=0)
    loras = [LoRARequest(f"a{k}", k + 1, str(write_adapter(SHAPES["tiny-llama"], tmp_path / f"a{k}", 8, k, scale=0.2)))
             for k in range(2)]
    prompts = [[(37 * i + 11 * j) % 1000 + 3 for j in range(5 + 7 * i)] for i in range(6)]
    chosen = [None if i % 3 == 0 else loras[i % 2] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    common = {"quantization": "rtn", "dtype": dtype, "max_model_len": 256, "enable_lora": True, "max_loras": 2,
              "max_lora_rank": 8}
    tokens, quantized = {}, {}
    for eager in (True, False):
        llm = LLM(str(model), device="cuda", enforce_eager=eager, gpu_memory_utilization=0.3, max_num_seqs=8, **common)
        assert all(not hasattr(layer.base, "weight") for layer in llm.engine.runner.lora.layers.values())
        quantized = _packed_weights(llm)
        tokens[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False,
                                                                      lora_request=chosen)]
        assert llm.engine.runner.last_step.graphed is not eager
        if eager:
            base = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            assert any(b != t for b, t, c in zip(base, tokens[True], chosen, strict=True) if c is not None)
        del llm
        gc.collect()  # the next engine needs the KV memory
        torch.cuda.empty_cache()
    assert tokens[False] == tokens[True]
    if dtype == "float32":
        cpu = LLM(str(model), device="cpu", **common)
        # the same model on both devices (session 20: CUDA's rtn gave a third of the groups another extreme code)
        want_weights = _packed_weights(cpu)
        assert quantized.keys() == want_weights.keys()
        for name, tensor in want_weights.items():
            assert torch.equal(quantized[name], tensor), name
        ranked = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
        want = [o.outputs[0] for o in cpu.generate(prompts, ranked, use_tqdm=False, lora_request=chosen)]
        for got, ref in zip(tokens[True], want, strict=True):
            _agree_up_to_a_near_tie(got, ref.token_ids, ref.logprobs)


def _packed_weights(llm) -> dict[str, torch.Tensor]:
    """Each LoRA-wrapped layer's packed codes and scales (on the CPU), by layer name."""
    return {f"{name}.{what}": getattr(layer.base, what).cpu() for name, layer in llm.engine.runner.lora.layers.items()
            for what in ("weight_packed", "weight_scale")}


def _agree_up_to_a_near_tie(got: list[int], want: list[int], logprobs: list[dict[int, tuple[float, int]]]) -> None:
    """Greedy tokens equal until the first position where the reference's two best tokens are within fp32 summation
    noise, and there the other side chose the reference's second best. The CUDA int4 kernels fold the zero point as
    `s * (sum q x - z sum x)` (the wide GEMV through `16 + c/16` nibble floats), the CPU reference multiplies the
    dequantized weight: both fp32, in another order. Measured on this model and these prompts with the kernels under
    the Triton interpreter in the CPU engine (session 20): chosen-token log-probs within 1.5e-6 (the GEMV) and 9.1e-6
    (the wide GEMV, one row) of the reference's, ~100x under 1e-3; the paths' smallest top-2 gap is 1.2e-3."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            (best, _), (second, _) = sorted(logprobs[i].values(), key=lambda lr: lr[1])[:2]
            assert best - second < 1e-3 and g in logprobs[i], (i, g, w, logprobs[i])
            return
