"""Block-scaled fp8 checkpoints (vLLM's `weight_block_size`, compressed-tensors FP8_BLOCK): greedy tokens equal HF
transformers run on the dequantized weights (fp8 x block scale written back as a dense fp32 checkpoint).

The engine runs them W8A16 at every row count (engine/quantization/fp8_block.py): the activations are not
rounded, so the engine multiplies by exactly HF's weights, up to fp32 summation order, far below the tiny models'
gaps between the top two logits: the tokens are identical.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch

from flotilla.engine.config import EngineConfig
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams
from flotilla.kernels.fp8_block_linear import dequantize_fp8_blocks
from flotilla.kernels.fp8_linear import FP8_MIN_SCALE

from .fp8_block_checkpoints import fp8_block_checkpoint, quantize_fp8_blocks
from .hf_reference import hf_greedy

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13] * 10]
TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)


def _save_tiny(path: Path, tokenizer_dir: Path, arch: str, **sizes: int) -> Path:
    """A tiny random fp32 model of `arch` (llama or qwen3) with 4 query heads, 2 KV heads and `sizes`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(11)
    common = dict(vocab_size=len(tokenizer), num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.1, bos_token_id=1,
                  eos_token_id=2, **sizes)
    model = LlamaForCausalLM(LlamaConfig(**common)) if arch == "llama" else Qwen3ForCausalLM(Qwen3Config(**common))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def block_models(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> dict[str, Path]:
    """Llama with whole 128 x 128 blocks (hidden 256, head_dim 64, MLP 384), and Qwen3 with partial ones: hidden 320
    ends o_proj's and down's rows and q/k/v's and gate/up's inputs in a block of 64."""
    root = tmp_path_factory.mktemp("fp8-block")
    return {"llama": _save_tiny(root / "llama", embedded_model_dir, "llama", hidden_size=256, intermediate_size=384,
                                head_dim=64),
            "qwen3-partial": _save_tiny(root / "qwen3", embedded_model_dir, "qwen3", hidden_size=320,
                                        intermediate_size=384, head_dim=64)}


def _engine_tokens(path: Path, **kwargs) -> list[list[int]]:
    llm = LLM(str(path), max_model_len=256, **kwargs)
    try:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.engine.shutdown()


def test_the_block_quantizer_writes_a_hand_computed_example():
    """2 x 2 blocks of a 4 x 4 weight (scale = the block's absolute maximum / 448), and a 3 x 3 weight whose last
    row and column of blocks are partial."""
    weight = torch.tensor([[448.0, -224.0, 896.0, 2.0],
                           [1.0, 0.5, -4.0, 0.0],
                           [0.0, 0.0, -28.0, 7.0],
                           [0.0, 0.0, 3.5, 0.0]])  # fmt: skip
    scales = torch.tensor([[1.0, 2.0], [FP8_MIN_SCALE, 0.0625]])  # an all-zero block: the smallest scale
    codes, scale = quantize_fp8_blocks(weight, (2, 2))
    assert torch.equal(scale, scales)
    assert codes.float().tolist() == [[448.0, -224.0, 448.0, 1.0],
                                      [1.0, 0.5, -2.0, 0.0],
                                      [0.0, 0.0, -448.0, 112.0],
                                      [0.0, 0.0, 56.0, 0.0]]  # fmt: skip
    assert torch.equal(dequantize_fp8_blocks(codes, scale, (2, 2)), weight)
    codes, scale = quantize_fp8_blocks(weight[:3, :3], (2, 2))
    assert torch.equal(scale, scales) and codes.shape == (3, 3)
    assert torch.equal(dequantize_fp8_blocks(codes, scale, (2, 2)), weight[:3, :3])
    with pytest.raises(ValueError, match=r"do not cover an \[3, 3\] weight"):
        dequantize_fp8_blocks(codes, scale[:1], (2, 2))


@pytest.mark.parametrize("arch", ["llama", "qwen3-partial"])
def test_vllm_fp8_block_checkpoints_match_hf_on_dequantized_weights(block_models, tmp_path, arch):
    """Qwen3-*-FP8's layout (`weight_block_size` [128, 128], `weight_scale_inv`), detected from config.json."""
    path = fp8_block_checkpoint(block_models[arch], tmp_path / arch)
    assert EngineConfig.from_kwargs(str(path)).model.quantization == "fp8"
    assert _engine_tokens(path) == hf_greedy(path / "dequantized", PROMPTS, TOKENS)


@pytest.mark.parametrize("arch", ["llama", "qwen3-partial"])
def test_compressed_tensors_fp8_block_checkpoints_match_hf_on_dequantized_weights(block_models, tmp_path, arch):
    """llm-compressor's FP8_BLOCK, written and decompressed by the compressed-tensors library (which pads partial
    blocks to compute their scales)."""
    path = fp8_block_checkpoint(block_models[arch], tmp_path / "ct", "compressed-tensors")
    qcfg = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qcfg["config_groups"]["group_0"]["weights"]["strategy"] == "block"
    assert _engine_tokens(path) == hf_greedy(path / "dequantized", PROMPTS, TOKENS)


def _admission_errors(arch: dict, tensor: int, qcfg: dict) -> list[str]:
    """The webhook's errors for a spec of `arch` (spec.model.config) at `tensor` ranks with `qcfg` as --hf-overrides."""
    from flotilla.operator.admission import review

    spec = {"model": {"source": "pvc://m", "config": arch}, "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            "parallelism": {"tensor": tensor}, "scheduling": {"maxModelLen": 4096},
            "engineArgs": ["--hf-overrides", json.dumps({"quantization_config": qcfg})]}
    return review(spec, "m").errors


def test_blocks_split_between_merged_shards_are_refused_by_name_and_by_the_webhook(embedded_model_dir, tmp_path):
    """An MLP of 320: gate's rows end mid-block, so up's first block would need gate's scale and its own. The
    engine refuses it when it builds the model, and the webhook a spec stating the same numbers, in its words."""
    src = _save_tiny(tmp_path / "src", embedded_model_dir, "llama", hidden_size=256, intermediate_size=320,
                     head_dim=64)
    path = fp8_block_checkpoint(src, tmp_path / "fp8")
    with pytest.raises(ValueError, match=r"MergedColumnParallelLinear with \[320, 320\] output rows a shard "
                                         r"\(tensor parallel 1\) splits blocks of 128 rows") as refused:
        LLM(str(path), max_model_len=256)
    config = json.loads((path / "config.json").read_text())
    arch = {"hiddenSize": 256, "numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 2, "headDim": 64,
            "intermediateSize": 320, "vocabSize": config["vocab_size"]}
    words = f"spec.engineArgs: --hf-overrides: quantization_config: {refused.value}"
    assert words in _admission_errors(arch, 1, config["quantization_config"])
    assert not any("block" in e for e in _admission_errors(arch | {"intermediateSize": 384}, 1,
                                                           config["quantization_config"]))


def test_the_webhook_refuses_tensor_parallel_sizes_that_split_blocks():
    """Qwen3-4B-FP8's numbers (MLP 9728 = 76 blocks of 128): whole blocks a rank up to tp 4; at 8, 1216 rows a rank."""
    arch = {"hiddenSize": 2560, "numHiddenLayers": 36, "numAttentionHeads": 32, "numKeyValueHeads": 8, "headDim": 128,
            "intermediateSize": 9728, "vocabSize": 151936}
    qcfg = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    assert not any("block" in e for e in _admission_errors(arch, 4, qcfg))
    assert ("spec.engineArgs: --hf-overrides: quantization_config: fp8 block-scaled weights: MergedColumnParallelLinear"
            " with [1216, 1216] output rows a shard (tensor parallel 8) splits blocks of 128 rows") in \
        " ".join(_admission_errors(arch, 8, qcfg))


def _rank_layers(block: tuple[int, int]) -> dict[str, torch.nn.Module]:
    """Layers at the current rank: q/k/v with 4 heads of 128 (2 KV heads, or 1: replicated), gate/up of 512, and
    row-parallel layers of 512 inputs, one with 320 output rows (a partial block every rank keeps whole)."""
    from flotilla.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    return {"qkv": QKVParallelLinear(256, 128, 4, 2, bias=False),
            "qkv-one-kv-head": QKVParallelLinear(256, 128, 4, 1, bias=False),
            "gate_up": MergedColumnParallelLinear(256, [512, 512]), "down": RowParallelLinear(512, 256),
            "down-partial": RowParallelLinear(512, 320)}


def _checkpoint_tensors(name: str, layer: torch.nn.Module, gen: torch.Generator) -> list[tuple[torch.Tensor, object]]:
    """Full-size dense checkpoint tensors of a layer (built at one rank) and their shard ids."""
    from flotilla.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    cols = layer.in_features
    if isinstance(layer, QKVParallelLinear):
        sizes = [(s, layer.total_heads[s] * layer.head_dim) for s in ("q", "k", "v")]
    elif isinstance(layer, MergedColumnParallelLinear):
        sizes = list(enumerate(layer.out_sizes))
    else:
        sizes = [(None, layer.out_features)]
    return [(torch.randn(rows, cols, generator=gen), shard) for shard, rows in sizes]


def test_tensor_parallel_ranks_load_whole_blocks_of_their_shards(monkeypatch):
    """At tp=2 each rank's fp8 weight times its block scales is exactly the rank's part of the dequantized weight,
    as the dense layers' loaders cut it: q/k/v by heads (a single KV head replicated), gate/up by rows, o/down by
    inputs with every output row's scales."""
    from flotilla.engine import parallel_state
    from flotilla.engine.quantization.fp8_block import Fp8BlockMethod

    block = (128, 128)
    gen = torch.Generator().manual_seed(3)
    tensors = {name: _checkpoint_tensors(name, layer, gen) for name, layer in _rank_layers(block).items()}
    for rank in range(2):
        monkeypatch.setattr(parallel_state, "_RANK", parallel_state.ParallelRank.of(rank, 2, 1))
        quantized, dense = _rank_layers(block), _rank_layers(block)
        for name, layer in quantized.items():
            layer.quant_method = Fp8BlockMethod(block)
            layer.quant_method.create_weights(layer)
            for weight, shard in tensors[name]:
                codes, scale = quantize_fp8_blocks(weight, block)
                layer.weight_loader(layer.weight, codes, shard)
                layer.weight_scale.weight_loader(layer.weight_scale, scale, shard)
                dense[name].weight_loader(dense[name].weight, dequantize_fp8_blocks(codes, scale, block), shard)
            assert torch.equal(dequantize_fp8_blocks(layer.weight, layer.weight_scale, block), dense[name].weight), \
                (name, rank)


def test_tensor_parallel_shards_that_split_a_block_are_refused(monkeypatch):
    """gate/up of 384 rows (192 a rank) and a row-parallel layer of 384 inputs (192 a rank) cut 128-blocks."""
    from flotilla.engine import parallel_state
    from flotilla.engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear
    from flotilla.engine.quantization.fp8_block import Fp8BlockMethod

    monkeypatch.setattr(parallel_state, "_RANK", parallel_state.ParallelRank.of(1, 2, 1))
    method = Fp8BlockMethod((128, 128))
    with pytest.raises(ValueError, match=r"\[192, 192\] output rows a shard \(tensor parallel 2\)"):
        method.create_weights(MergedColumnParallelLinear(256, [384, 384]))
    with pytest.raises(ValueError, match=r"RowParallelLinear with 192 inputs a rank \(tensor parallel 2\)"):
        method.create_weights(RowParallelLinear(384, 256))


def test_block_fp8_at_two_ranks_matches_hf_on_dequantized_weights(tiny_model_dirs, tmp_path):
    """The tiny Llama (hidden 64, 16 rows a KV shard at tp=2) in 16 x 16 blocks, served by two gloo ranks: the
    block scales of every shard load where its rows go; W8A16 adds no rounding per rank, so HF on the dequantized
    weights is the oracle, as at one rank."""
    path = fp8_block_checkpoint(tiny_model_dirs["llama"], tmp_path / "fp8", block=(16, 16))
    assert _engine_tokens(path, tensor_parallel_size=2) == hf_greedy(path / "dequantized", PROMPTS, TOKENS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_block_fp8_greedy_tokens_equal_the_cpu_reference(tmp_path):
    """On CUDA the Triton block GEMM runs every linear layer (swap-AB decode tiles with split K inside the decode CUDA
    graphs, the prefill tiles), in fp32 (exact dots, as the CPU reference): the CPU engine's greedy tokens."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from model_dirs import make_model_dir  # bench/model_dirs.py: hidden 512, head_dim 64, MLP 2048

    path = fp8_block_checkpoint(make_model_dir("small-llama", tmp_path / "src", weights_seed=0), tmp_path / "fp8")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(3, 70))] for _ in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def greedy(llm: LLM) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    cpu = greedy(LLM(str(path), device="cpu", max_model_len=256))
    gpu = LLM(str(path), device="cuda", dtype="float32", max_model_len=256, gpu_memory_utilization=0.3)
    assert gpu.engine.runner.graphs is not None
    assert greedy(gpu) == cpu
