"""bitsandbytes 4-bit: checkpoints written by bitsandbytes itself (quantize_4bit and its QuantState serialization, as
transformers saves a `*-bnb-4bit` model) and `--quantization bitsandbytes` over a dense checkpoint. The oracle is HF
transformers on the weights bitsandbytes' dequantize_4bit gives (the engine multiplies by exactly those, fp32 tiny
models), and HF loading the checkpoint itself with bitsandbytes on the CPU: greedy tokens equal token for token."""

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

bnb = pytest.importorskip("bitsandbytes.functional")

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13] * 10]
TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
# unsloth's `*-bnb-4bit` quantization_config, as transformers writes it (compute dtype: the tiny model's).
QCFG = {"quant_method": "bitsandbytes", "_load_in_4bit": True, "_load_in_8bit": False, "load_in_4bit": True,
        "load_in_8bit": False, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8", "llm_int8_enable_fp32_cpu_offload":
        False, "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": ["lm_head"], "llm_int8_threshold": 6.0}


@pytest.fixture(scope="module")
def bnb_llama(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """A tiny random Llama of whole 64-input blocks (hidden 128, MLP 256), fp32."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    torch.manual_seed(11)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, initializer_range=0.1, bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("bnb-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _decoder_linears(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in state if k.startswith("model.layers.") and k.endswith("_proj.weight")]


def bnb_checkpoint(src: Path, dst: Path, quant_type: str, double_quant: bool) -> Path:
    """`src`'s decoder linear weights quantized by bitsandbytes and serialized as its QuantState packs them
    (`weight`, `weight.absmax`, `weight.quant_map`, nested pieces, `weight.quant_state.bitsandbytes__<type>`), into
    `dst`; `dst/dequantized`: the dense model with bitsandbytes' dequantized weights, for the oracle."""
    state = load_file(str(src / "model.safetensors"))
    quantized, dequantized = dict(state), dict(state)
    for name in _decoder_linears(state):
        q, qs = bnb.quantize_4bit(state[name], blocksize=64, quant_type=quant_type, compress_statistics=double_quant)
        del quantized[name]
        quantized[name] = q
        quantized.update({f"{name}.{k}": v for k, v in qs.as_dict(packed=True).items()})
        dequantized[name] = bnb.dequantize_4bit(q, qs)
    config = json.loads((src / "config.json").read_text())
    _write(src, dst, quantized, config | {"quantization_config": QCFG | {"bnb_4bit_quant_type": quant_type,
                                                                         "bnb_4bit_use_double_quant": double_quant}})
    _write(src, dst / "dequantized", dequantized, config)
    return dst


def _write(src: Path, dst: Path, state: dict[str, torch.Tensor], config: dict) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            (dst / f).write_bytes((src / f).read_bytes())


def _engine_tokens(path: Path, **kwargs) -> list[list[int]]:
    llm = LLM(str(path), max_model_len=256, **kwargs)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize(("quant_type", "double_quant"), [("nf4", True), ("fp4", False)])
def test_bnb_checkpoints_match_hf_on_the_dequantized_weights(bnb_llama, tmp_path, quant_type, double_quant):
    """unsloth's layout (nf4, double quantization: the absmax as 8-bit codes of 256-value blocks) and plain fp4:
    greedy tokens equal HF's on bitsandbytes' dequantized weights, and HF's own loading of the checkpoint (its
    bitsandbytes Linear4bit layers, on the CPU); the scheme is found from config.json."""
    path = bnb_checkpoint(bnb_llama, tmp_path, quant_type, double_quant)
    assert EngineConfig.from_kwargs(str(path)).model.quantization == "bitsandbytes"
    ours = _engine_tokens(path)
    assert ours == hf_greedy(path / "dequantized", PROMPTS, TOKENS)
    assert ours == hf_greedy(path, PROMPTS, TOKENS)


def test_in_flight_bitsandbytes_matches_hf_on_bitsandbytes_rounding(bnb_llama, tmp_path):
    """`--quantization bitsandbytes` over a dense checkpoint: nf4 in blocks of 64, each weight rounded as
    bitsandbytes' quantize_4bit rounds it (no double quantization at load); and the rounding is there."""
    state = load_file(str(bnb_llama / "model.safetensors"))
    for name in _decoder_linears(state):
        q, qs = bnb.quantize_4bit(state[name], blocksize=64, quant_type="nf4", compress_statistics=False)
        state[name] = bnb.dequantize_4bit(q, qs)
    _write(bnb_llama, tmp_path, state, json.loads((bnb_llama / "config.json").read_text()))
    ours = _engine_tokens(bnb_llama, quantization="bitsandbytes")
    assert ours == hf_greedy(tmp_path, PROMPTS, TOKENS)
    assert ours != _engine_tokens(bnb_llama)


@pytest.mark.parametrize(("change", "words"), [
    ({"load_in_4bit": False, "load_in_8bit": True}, "bitsandbytes with 8-bit weights is not supported"),
    ({"bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type 'int4'; nf4 or fp4"),
    ({"bnb_4bit_quant_storage": "bfloat16"}, "bnb_4bit_quant_storage 'bfloat16'; uint8"),
    ({"llm_int8_skip_modules": ["lm_head", "model.layers.1.mlp.down_proj"]},
     r"llm_int8_skip_modules \['model.layers.1.mlp.down_proj'\]"),
    ({"llm_int8_skip_modules": ["lm_head", "mlp"]}, r"llm_int8_skip_modules \['mlp'\]"),
])
def test_unsupported_bnb_configs_are_refused_by_name(change, words):
    from flotilla.engine.quantization import resolve_quantization

    assert resolve_quantization(None, {"quantization_config": QCFG}) == "bitsandbytes"
    assert resolve_quantization(None, {"quantization_config": QCFG | {"llm_int8_skip_modules": [
        "lm_head", "vision_tower", "multi_modal_projector"]}}) == "bitsandbytes"
    with pytest.raises(ValueError, match=words):
        resolve_quantization(None, {"quantization_config": QCFG | change})


def test_a_checkpoint_missing_a_piece_or_of_other_blocks_is_refused(bnb_llama, tmp_path):
    """A weight without its absmax names the weight and the piece; a quant state of blocks of 128 is refused where
    the flag disagrees with the checkpoint as elsewhere."""
    path = bnb_checkpoint(bnb_llama, tmp_path, "nf4", True)
    state = load_file(str(path / "model.safetensors"))
    missing = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight.absmax"}
    save_file(missing, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight lacks \['absmax'\]"):
        LLM(str(path), max_model_len=256)
    name = "model.layers.0.self_attn.q_proj.weight"
    q, qs = bnb.quantize_4bit(load_file(str(bnb_llama / "model.safetensors"))[name], blocksize=128,
                              quant_type="nf4", compress_statistics=True)
    state.update({name: q, **{f"{name}.{k}": v for k, v in qs.as_dict(packed=True).items()}})
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="q_proj.weight is nf4 in blocks of 128; the engine loads nf4 .* of 64"):
        LLM(str(path), max_model_len=256)
    with pytest.raises(ConfigError, match="does not match the checkpoint"):
        EngineConfig.from_kwargs(str(path), quantization="fp8")


def test_two_tensor_ranks_load_their_rows_and_blocks(bnb_llama, tmp_path):
    """At tensor parallel 2 the codes and absmax go where their rows go (q/k/v, gate/up by rows; o and down by
    inputs, 64 and 128 a rank: whole blocks): greedy tokens equal HF's on the dequantized weights."""
    path = bnb_checkpoint(bnb_llama, tmp_path, "nf4", True)
    assert _engine_tokens(path, tensor_parallel_size=2) == hf_greedy(path / "dequantized", PROMPTS, TOKENS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bnb_greedy_tokens_equal_the_cpu_reference(bnb_llama, tmp_path):
    """On CUDA the Triton lookup-table GEMM runs every linear layer (swap-AB decode tiles inside the decode CUDA
    graphs, the prefill tiles) in fp32 (exact dots, as the CPU reference): the CPU engine's greedy tokens, from a
    double-quantized nf4 checkpoint and from nf4 made at load on the GPU."""
    path = bnb_checkpoint(bnb_llama, tmp_path, "nf4", True)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(3, 70))] for _ in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def greedy(model: Path, **kwargs) -> list[list[int]]:
        llm = LLM(str(model), max_model_len=256, **kwargs)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    on_gpu = {"device": "cuda", "dtype": "float32", "gpu_memory_utilization": 0.3}
    assert greedy(path, **on_gpu) == greedy(path, device="cpu")
    assert greedy(bnb_llama, quantization="bitsandbytes", **on_gpu) == greedy(bnb_llama, quantization="bitsandbytes",
                                                                              device="cpu")
