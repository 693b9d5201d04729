"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE): HF's greedy tokens, the experts stacked at load, and
the settings the experts do not support refused by name.

The tiny Mixtral and Qwen3-MoE of the shared fixtures run every per-architecture test (test_correctness.py);
here are the variants those do not cover: Qwen2-MoE's gated shared expert and QKV bias, and a Qwen3-MoE whose
`decoder_sparse_step` leaves every other layer dense and whose top-k weights are not renormalised.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, initializer_range=0.1)


def _save(config, tokenizer_dir: Path, path: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def moe_variants(tmp_path_factory, embedded_model_dir) -> dict[str, Path]:
    """Qwen2-MoE (shared expert of width 96, QKV bias) and a Qwen3-MoE with dense layers 0 and 2
    (decoder_sparse_step 2) and top-k weights as the softmax gives them (norm_topk_prob false)."""
    from transformers import AutoTokenizer, Qwen2MoeConfig, Qwen3MoeConfig

    vocab = len(AutoTokenizer.from_pretrained(embedded_model_dir))
    root = tmp_path_factory.mktemp("moe")
    return {
        "qwen2-moe": _save(Qwen2MoeConfig(**COMMON, vocab_size=vocab, shared_expert_intermediate_size=96),
                           embedded_model_dir, root / "qwen2-moe"),
        "qwen3-moe-step2": _save(Qwen3MoeConfig(**COMMON, vocab_size=vocab, head_dim=32, decoder_sparse_step=2,
                                                norm_topk_prob=False), embedded_model_dir, root / "qwen3-moe-step2"),
    }


def _load(path: Path) -> torch.nn.Module:
    from flotilla.engine.model_loader import load_model

    return load_model(EngineConfig.from_kwargs(str(path), max_model_len=64).model, torch.device("cpu"))


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(rng.randint(3, 40))] for _ in range(n)]


@pytest.mark.parametrize("variant", ["qwen2-moe", "qwen3-moe-step2"])
def test_moe_variants_match_hf(moe_variants, variant):
    path = moe_variants[variant]
    prompts = _prompts(5, seed=3)
    outs = LLM(str(path), max_model_len=256, block_size=8).generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path, prompts, 12)


def test_layers_hold_the_block_their_config_asks_for(moe_variants, tiny_model_dirs):
    from flotilla.engine.layers.moe import SparseMoeBlock
    from flotilla.engine.models.llama import LlamaMLP

    kinds = {}
    for name, path in [("qwen3-moe-step2", moe_variants["qwen3-moe-step2"]),
                       ("qwen3-moe", tiny_model_dirs["qwen3-moe"]), ("mixtral", tiny_model_dirs["mixtral"])]:
        model = _load(path)
        kinds[name] = [type(layer.mlp) for layer in model.layers]
    assert kinds["qwen3-moe-step2"] == [LlamaMLP, SparseMoeBlock, LlamaMLP]  # (i + 1) % 2 == 0 is sparse
    assert kinds["qwen3-moe"] == [SparseMoeBlock, LlamaMLP]  # mlp_only_layers [1]
    assert kinds["mixtral"] == [SparseMoeBlock, SparseMoeBlock]


def test_experts_are_stacked_from_the_checkpoint(tiny_model_dirs):
    # Mixtral's w1 (gate) and w3 (up) of expert e are rows [0, I) and [I, 2I) of w13_weight[e]; w2 is w2_weight[e].
    path = tiny_model_dirs["mixtral"]
    checkpoint: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        checkpoint |= load_file(str(shard))
    model = _load(path)
    experts = model.layers[1].mlp.experts
    inter = experts.intermediate_size
    assert tuple(experts.w13_weight.shape) == (4, 2 * inter, 64) and tuple(experts.w2_weight.shape) == (4, 64, inter)
    for e in range(4):
        prefix = f"model.layers.1.block_sparse_moe.experts.{e}"
        assert torch.equal(experts.w13_weight[e, :inter], checkpoint[f"{prefix}.w1.weight"])
        assert torch.equal(experts.w13_weight[e, inter:], checkpoint[f"{prefix}.w3.weight"])
        assert torch.equal(experts.w2_weight[e], checkpoint[f"{prefix}.w2.weight"])
    assert torch.equal(model.layers[1].mlp.gate.weight, checkpoint["model.layers.1.block_sparse_moe.gate.weight"])


def _copy_without(src: Path, dst: Path, drop: str | None = None, reshape: str | None = None) -> Path:
    """The model in `src` as one safetensors file, less tensor `drop`, with tensor `reshape` cut by a row."""
    dst.mkdir()
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors |= load_file(str(shard))
    tensors.pop(drop or "", None)
    if reshape:
        tensors[reshape] = tensors[reshape][:-1].contiguous()
    save_file(tensors, str(dst / "model.safetensors"))
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_missing_expert_tensor_is_named(tiny_model_dirs, tmp_path):
    dropped = "model.layers.0.mlp.experts.2.up_proj.weight"
    path = _copy_without(tiny_model_dirs["qwen3-moe"], tmp_path / "m", drop=dropped)
    with pytest.raises(ValueError, match=r"lacks tensors for: layers\.0\.mlp\.experts\.2\.up_proj\.weight$"):
        LLM(str(path), max_model_len=64)


def test_an_expert_tensor_of_another_shape_is_named(tiny_model_dirs, tmp_path):
    name = "model.layers.0.block_sparse_moe.experts.1.w2.weight"
    path = _copy_without(tiny_model_dirs["mixtral"], tmp_path / "m", reshape=name)
    with pytest.raises(ValueError, match=rf"checkpoint tensor {name} \(63, 128\) does not fit"):
        LLM(str(path), max_model_len=64)


def test_lora_is_refused(tiny_model_dirs):
    for arch in ("mixtral", "qwen3-moe"):
        with pytest.raises(ConfigError, match="--enable-lora is not supported for mixture-of-experts models"):
            EngineConfig.from_kwargs(str(tiny_model_dirs[arch]), max_model_len=64, enable_lora=True)


def _with_config(src: Path, dst: Path, **changes) -> Path:
    """A copy of the model in `src` whose config.json has `changes`."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text()) | changes
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(("qcfg", "message"), [
    # block-scaled fp8 (Qwen3-30B-A3B-FP8's layout): not for the experts yet
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     "fp8 .*not supported for mixture-of-experts models .*as block-scaled fp8 .*fp8 with a scale per row"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
     "gptq .*not supported for mixture-of-experts models .*as gptq: their experts run unquantized or fp8"),
    # llm-compressor's W4A16 (int weights): compressed-tensors runs on MoE for float weights only
    (json.loads((Path(__file__).parent / "data" / "llmcompressor-0.14-gptq-w4a16-g64.json").read_text()),
     "compressed-tensors .*not supported for mixture-of-experts models .*as compressed-tensors: their experts"),
])
def test_a_checkpoint_scheme_the_experts_lack_is_refused(tiny_model_dirs, tmp_path, qcfg, message):
    # the checkpoint's config.json asks for it without the flag: refused all the same, naming what runs (fp8)
    path = _with_config(tiny_model_dirs["mixtral"], tmp_path / "q", quantization_config=qcfg)
    with pytest.raises(ConfigError, match=message):
        EngineConfig.from_kwargs(str(path), max_model_len=64)


def test_rtn_is_refused_naming_fp8(tiny_model_dirs):
    with pytest.raises(ConfigError, match="rtn .*mixture-of-experts.*--quantization fp8 on an unquantized checkpoint"):
        EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3-moe"]), max_model_len=64, quantization="rtn")


def test_an_expert_width_tensor_parallelism_cannot_split_is_refused(tiny_model_dirs, tmp_path):
    # 64 heads' worth of attention splits 4 ways, the experts' width 66 does not
    src = tiny_model_dirs["qwen3-moe"]
    dst = tmp_path / "odd"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text()) | {"moe_intermediate_size": 66, "num_key_value_heads": 4}
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="--tensor-parallel-size 4 does not divide the model's expert width 66"):
        EngineConfig.from_kwargs(str(dst), max_model_len=64, tensor_parallel_size=4)


def test_moe_models_run_eagerly(tiny_model_dirs):
    # the experts' reference path reads expert counts on the host, which a CUDA graph cannot capture
    assert EngineConfig.from_kwargs(str(tiny_model_dirs["mixtral"]), max_model_len=64).model.enforce_eager
    assert not EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64).model.enforce_eager
    # a MoE draft model runs in the target's steps: eager too
    draft = json.dumps({"model": str(tiny_model_dirs["qwen3-moe"]), "num_speculative_tokens": 2})
    assert EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64,
                                    speculative_config=draft).model.enforce_eager


@pytest.mark.parametrize(("spec_fields", "flags", "field"), [
    # (groups of 2 inputs: the dense model below would be refused its default 128 otherwise)
    ({"quantization": "rtn", "pod": {"env": [{"name": "RTN_GROUP_SIZE", "value": "2"}]}}, {"quantization": "rtn"},
     "spec.quantization"),
    ({"lora": {"maxLoras": 1, "maxLoraRank": 8}}, {"enable_lora": True}, "spec.lora"),
    ({"parallelism": {"tensor": 4}, "resources": {"gpusPerReplica": 4}}, {"tensor_parallel_size": 4},
     "spec.parallelism.tensor 4"),
])
def test_admission_refuses_what_the_engine_refuses(tmp_path, tiny_model_dirs, spec_fields, flags, field):
    # the same rule (engine_rules.moe_problem) on both sides, the operator's from spec.model.config's numbers
    from flotilla.operator.admission import review

    src = tiny_model_dirs["qwen3-moe"]
    dst = tmp_path / "m"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text()) | {"moe_intermediate_size": 66, "num_key_value_heads": 4}
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="mixture-of-experts|expert width"):
        EngineConfig.from_kwargs(str(dst), max_model_len=64, **flags)
    numbers = {"hiddenSize": 64, "numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 4, "headDim": 32,
               "intermediateSize": 128, "vocabSize": config["vocab_size"], "numExperts": 4, "moeIntermediateSize": 66}
    errors = review({"model": {"source": "pvc://m", "config": numbers}, **spec_fields}, "m").errors
    assert any(e.startswith(field) and ("mixture-of-experts" in e or "expert width" in e) for e in errors), errors
    # without numExperts the operator takes the model for a dense one and admits it
    del numbers["numExperts"]
    assert not review({"model": {"source": "pvc://m", "config": numbers}, **spec_fields}, "m").errors


@pytest.mark.parametrize(("model", "overrides"), [
    # a dense classifier's name over a MoE checkpoint (vLLM's Qwen3-Reranker overrides on the wrong model)
    ("qwen3-moe", {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                   "is_original_qwen3_reranker": True}),
    ("qwen3-moe", {"architectures": ["Qwen3ForCausalLM"]}),
    ("qwen3", {"architectures": ["Qwen3MoeForCausalLM"]}),
])
def test_an_architecture_that_disagrees_with_the_experts_is_refused(tiny_model_dirs, model, overrides):
    # each built a config, then failed as the weights loaded, in the engine process (the experts' tensors had no
    # place in a dense model; a MoE model over a dense config found no experts)
    with pytest.raises(ConfigError, match="a mixture of experts, but config.json names"):
        EngineConfig.from_kwargs(str(tiny_model_dirs[model]), runner="pooling" if "classifier_from_token" in overrides
                                 else "auto", hf_overrides=overrides)


def test_a_moe_model_embeds_on_the_pooling_runner(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["qwen3-moe"]), runner="pooling", max_model_len=64, device="cpu")
    blocks = llm.engine.block_manager
    out = llm.embed([[1, 2, 3, 4], [5, 6, 7]])
    assert [len(o.embedding) for o in out] == [64, 64]
    assert blocks.num_free_blocks == blocks.num_blocks
