"""Tensor and pipeline parallelism on the CPU (gloo, spawned workers): greedy tokens equal HF
transformers under chunked prefill, prefix-cache hits and preemption, and a dead worker fails the
engine at once with an error that names it.

Every engine here spawns its workers (seconds each on a small machine), so each is built once per
module and serves several checks.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch

from flotilla.engine.executor import WorkerDiedError
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy


def _gpus_short(n: int) -> bool:
    """On a CUDA machine the workers take one GPU each (on the CPU any number of gloo ranks run)."""
    return torch.cuda.is_available() and torch.cuda.device_count() < n


pytestmark = pytest.mark.skipif(_gpus_short(2), reason="needs 2 GPUs")
MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
SYSTEM = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103]
# Chunked prefill under a 24-token budget, a 16-block pool too small for the batch (preemption),
# and a shared system prompt (prefix-cache hits): the batching test's hardest setting.
STRESS = dict(
    max_model_len=128,
    block_size=8,
    num_gpu_blocks_override=16,
    enable_chunked_prefill=True,
    max_num_batched_tokens=24,
    max_num_seqs=5,
)


def _prompts(seed: int, n: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    return [SYSTEM + [rng.randrange(3, 49152) for _ in range(rng.randint(5, 45))] for _ in range(n)]


def _engine(model_dir, **parallel):
    llm = LLM(str(model_dir), **STRESS, **parallel)
    yield llm
    llm.engine.shutdown()


@pytest.fixture(scope="module")
def llama_tp2(tiny_model_dirs):
    """Llama 3 with rope scaling and tied embeddings (the vocabulary-parallel head shares the table)."""
    yield from _engine(tiny_model_dirs["llama3-rope-tied"], tensor_parallel_size=2)


@pytest.fixture(scope="module")
def qwen3_tp2(tiny_model_dirs):
    """Qwen3 (q/k norms) with a single KV head: both ranks hold a replica of it."""
    yield from _engine(tiny_model_dirs["qwen3"], tensor_parallel_size=2)


def _check_matches_hf(llm: LLM, model_dir, seed: int) -> None:
    prompts = _prompts(seed)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(model_dir, prompts, MAX_TOKENS)
    engine = llm.engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.prefix_cache_hits > 0
    assert max(engine.stats.step_tokens) <= 24
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "a block leaked"


def test_tensor_parallel_llama_matches_hf(llama_tp2, tiny_model_dirs):
    _check_matches_hf(llama_tp2, tiny_model_dirs["llama3-rope-tied"], seed=1)


def test_tensor_parallel_replicates_a_single_kv_head(qwen3_tp2, tiny_model_dirs):
    _check_matches_hf(qwen3_tp2, tiny_model_dirs["qwen3"], seed=2)


def test_seeded_sampling_n_and_logprobs_match_a_single_rank(qwen3_tp2, tiny_model_dirs):
    """Every rank sees the whole vocabulary's logits, so seeded draws, forks and logprobs are the same."""
    prompts = [SYSTEM[:10], [11, 12, 13]]
    params = [SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=6, ignore_eos=True, logprobs=2),
              SamplingParams(n=2, temperature=0.0, max_tokens=6, ignore_eos=True)]
    single = LLM(str(tiny_model_dirs["qwen3"]), **STRESS).generate(prompts, params, use_tqdm=False)
    parallel = qwen3_tp2.generate(prompts, params, use_tqdm=False)
    for one, two in zip(single, parallel, strict=True):
        assert [o.token_ids for o in one.outputs] == [o.token_ids for o in two.outputs]
    ours = parallel[0].outputs[0].logprobs[0]
    theirs = single[0].outputs[0].logprobs[0]
    assert ours.keys() == theirs.keys()
    assert all(abs(ours[t][0] - theirs[t][0]) < 1e-4 for t in ours)


def test_pipeline_parallel_qwen2_matches_hf(tiny_model_dirs):
    """Qwen2 (QKV biases), its two layers on two stages, two steps in flight (the batch queue)."""
    for llm in _engine(tiny_model_dirs["qwen2"], pipeline_parallel_size=2):
        _check_matches_hf(llm, tiny_model_dirs["qwen2"], seed=4)
        assert llm.engine.batches is not None and llm.engine.batches.peak == 2, "two steps were in flight at once"


def test_pipeline_parallel_tied_llama_matches_hf(tiny_model_dirs):
    """Tied embeddings: the first stage embeds, the last holds the same table as its LM head (loaded twice)."""
    for llm in _engine(tiny_model_dirs["llama3-rope-tied"], pipeline_parallel_size=2):
        _check_matches_hf(llm, tiny_model_dirs["llama3-rope-tied"], seed=6)


def test_tensor_parallel_mixtral_matches_hf(tiny_model_dirs):
    """Mixtral's experts at tp 2: each rank holds every expert's half of the width (and the whole router), and the
    routed sum is reduced over the ranks."""
    for llm in _engine(tiny_model_dirs["mixtral"], tensor_parallel_size=2):
        _check_matches_hf(llm, tiny_model_dirs["mixtral"], seed=7)


def test_pipeline_parallel_qwen3_moe_matches_hf(tiny_model_dirs):
    """Qwen3-MoE on two stages: the first holds the sparse layer, the second the dense one (mlp_only_layers)."""
    for llm in _engine(tiny_model_dirs["qwen3-moe"], pipeline_parallel_size=2):
        _check_matches_hf(llm, tiny_model_dirs["qwen3-moe"], seed=8)


@pytest.mark.slow
@pytest.mark.skipif(_gpus_short(4), reason="needs 4 GPUs")
def test_tensor_times_pipeline_parallel_matches_hf(tiny_model_dirs):
    """tp 2 x pp 2: four workers (one torch thread each on a small machine), one architecture."""
    for llm in _engine(tiny_model_dirs["mistral"], tensor_parallel_size=2, pipeline_parallel_size=2):
        _check_matches_hf(llm, tiny_model_dirs["mistral"], seed=5)


def test_a_dead_worker_fails_the_engine_fast(qwen3_tp2):
    """Runs last on its engine: kills tensor rank 1, then expects a clear error within seconds."""
    executor = qwen3_tp2.engine.runner
    victim = executor.workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
        qwen3_tp2.generate(_prompts(6, n=2), GREEDY, use_tqdm=False)
    assert time.monotonic() - start < 15
    with pytest.raises(WorkerDiedError):  # and it stays failed: health checks report it too
        qwen3_tp2.engine.check_health()
    assert all(w.exitcode is not None for w in executor.workers), "the other workers were stopped"
    manager = qwen3_tp2.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks, "the failed requests' blocks returned"


def _fp8_rounding(parts: int):
    """A forward pre-hook rounding a linear layer's input to fp8 per token, as the engine does, in
    `parts` column blocks with a scale each: a row-parallel layer's input is split over the ranks.
    Decode forwards (one token) are left alone: the engine's decode steps (2 rows) run W8A16, its
    prefill (29 rows, above `FP8_GEMV_MAX_ROWS`) W8A8."""

    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        if args[0].shape[-2] == 1:
            return None
        blocks = []
        for x in args[0].chunk(parts, dim=-1):
            scale = (x.abs().amax(-1, keepdim=True) / 448).clamp(min=1e-12)
            blocks.append((x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale)
        return (torch.cat(blocks, dim=-1),)

    return hook


def _hf_fp8_tp2_greedy(path, prompts: list[list[int]], tokens: int, quantize_weights: bool) -> list[list[int]]:
    """HF greedy with the rounding of fp8 at two ranks: weights per output channel (whole rows),
    activations per token and per rank (o_proj and down_proj see half of each row on each rank)."""
    from transformers import AutoModelForCausalLM

    from flotilla.kernels.fp8_linear import quantize_fp8_rows

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            module.register_forward_pre_hook(_fp8_rounding(2 if name.endswith(("o_proj", "down_proj")) else 1))
            if quantize_weights:
                w8, scale = quantize_fp8_rows(module.weight.data)
                module.weight.data = w8.float() * scale
        if quantize_weights and name.endswith(".experts"):  # stacked experts, W8A16: weights per row only
            for param in (module.gate_up_proj, module.down_proj):
                w8, scale = quantize_fp8_rows(param.data.reshape(-1, param.shape[-1]))
                param.data = (w8.float() * scale).reshape(param.shape)
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens, do_sample=False,
                               eos_token_id=None)
            outs.append(y[0, len(ids):].tolist())
    return outs


@pytest.mark.parametrize("checkpoint", [False, True], ids=["online", "fp8-checkpoint"])
def test_fp8_at_two_ranks_matches_hf_with_the_same_rounding(tiny_model_dirs, tmp_path, checkpoint):
    """fp8 weights at tp=2: a row-parallel layer (o_proj, down) keeps its per-output-channel weight
    scales whole on every rank, read from an fp8 checkpoint (compressed-tensors FP8_DYNAMIC) or
    computed at load (`--quantization fp8`: the row's maximum over both ranks, as at one rank).
    Activations are rounded per token on each rank's half of the row (as vLLM does; no extra
    all-reduce), so the oracle is HF with that rounding, not the tp=1 engine."""
    path, kwargs, hf_path = tiny_model_dirs["llama"], {"quantization": "fp8"}, tiny_model_dirs["llama"]
    if checkpoint:
        from .quant_checkpoints import compressed_tensors_checkpoint

        path, kwargs = compressed_tensors_checkpoint(path, tmp_path / "fp8", "FP8_DYNAMIC"), {}
        hf_path = path / "dequantized"
    prompts, tokens = [[5, 6, 7, 8, 9], [11, 12, 13] * 8], 6
    llm = LLM(str(path), max_model_len=64, tensor_parallel_size=2, **kwargs)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True),
                            use_tqdm=False)
    finally:
        llm.engine.shutdown()
    expected = _hf_fp8_tp2_greedy(hf_path, prompts, tokens, quantize_weights=not checkpoint)
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_fp8_experts_at_two_ranks_match_hf_with_the_same_rounding(tiny_model_dirs):
    """Mixtral's fp8 experts at tp=2: each rank holds half of every expert's width (gate/up rows, down columns) and
    the experts run W8A16, so HF with the weights rounded per whole row gives the tokens. (That down's scale is the
    row's maximum over both ranks is too small a change for these tokens: test_moe_fp8.py checks it directly.)"""
    path = tiny_model_dirs["mixtral"]
    prompts, tokens = [[5, 6, 7, 8, 9], [11, 12, 13] * 8], 6
    llm = LLM(str(path), max_model_len=64, tensor_parallel_size=2, quantization="fp8")
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True),
                            use_tqdm=False)
    finally:
        llm.engine.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == _hf_fp8_tp2_greedy(path, prompts, tokens, quantize_weights=True)


def test_an_activation_order_gptq_checkpoint_over_two_pipeline_stages_matches_hf(tiny_model_dirs, tmp_path):
    """GPTQ desc_act: true (groups of permuted inputs, g_idx) on two stages: each sorts its own layers' inputs at load
    (engine/quantization/packed_int.py); tensor parallelism, which splits o's and down's inputs, refuses it."""
    from .quant_checkpoints import int4_checkpoint

    path = int4_checkpoint(tiny_model_dirs["llama"], tmp_path / "gptq", "gptq", group=16, act_order=True)
    prompts, tokens = [[5, 6, 7, 8, 9], [11, 12, 13] * 8], 6
    llm = LLM(str(path), max_model_len=64, pipeline_parallel_size=2)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True),
                            use_tqdm=False)
    finally:
        llm.engine.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path / "dequantized", prompts, tokens)
