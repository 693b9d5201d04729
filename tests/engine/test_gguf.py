"""`--quantization gguf` (engine/quantization/gguf.py): a GGUF file's Q4_0/Q4_1/Q4_K codes served as they are, the
other common types (Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K, Q8_0) dense.

The unpacking is checked against the `gguf` package's own `dequantize` on every linear tensor of the shipped
embedded GGUF and against ggml's published block layout by hand; the engine against HF transformers loading the
same GGUF file (fp32: torch's int4 kernel then computes exactly the file's weights); the embedded model's codes
against the bf16 model the repository has served so far (its weights are the same Q4_1 values rounded to bf16).
The block decoders themselves: tests/engine/test_gguf_blocks.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.llm import LLM
from flotilla.engine.quantization import gguf as gguf_q
from flotilla.engine.sampling_params import SamplingParams

from .gguf_files import write_tiny_llama_gguf
from .hf_reference import model_greedy

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13] * 10]
TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def embedded_gguf() -> Path:
    from flotilla.engine.embedded_model import embedded_gguf_path

    return embedded_gguf_path()


def test_q4_1_block_layout_by_hand():
    """ggml's block_q4_1: fp16 d, fp16 m, then byte j = input j (low nibble) | input j + 16 (high nibble)."""
    head = np.array([1.5, -0.25], dtype=np.float16).view(np.uint8)
    qs = np.array([j | ((15 - j) << 4) for j in range(16)], dtype=np.uint8)
    codes, d, offset = gguf_q.unpack_q4_blocks(np.concatenate([head, qs])[None, :], "Q4_1")
    assert codes[0].tolist() == list(range(16)) + [15 - j for j in range(16)]
    assert d.tolist() == [[1.5]] and offset.tolist() == [[-0.25]]
    codes0, d0, offset0 = gguf_q.unpack_q4_blocks(np.concatenate([head[:2], qs])[None, :], "Q4_0")
    assert torch.equal(codes0, codes) and d0.tolist() == [[1.5]] and offset0.tolist() == [[-12.0]]  # -8 d


def test_unpacking_equals_gguf_dequantize_on_every_linear_tensor_of_the_embedded_gguf(embedded_gguf):
    reader = gguf_q.gguf_reader(str(embedded_gguf))
    linear = [t for t in reader.tensors if t.tensor_type.name == "Q4_1"]
    assert len(linear) == 30 * 7  # every projection of SmolLM2-135M's 30 layers
    for tensor in linear:
        raw = np.asarray(tensor.data)
        codes, d, offset = gguf_q.unpack_q4_blocks(raw, "Q4_1")
        packed = gguf_q.pack_codes(codes, 4)
        ours = gguf_q.dequantize_affine(packed, d, offset, torch.float32)
        assert torch.equal(ours, gguf_q.dequantize_tensor(raw, "Q4_1")), tensor.name


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_q4_0_and_q4_1_unpacking_equals_gguf_dequantize(kind):
    rng = np.random.default_rng(1)
    data = rng.normal(0, 0.1, (8, 128)).astype(np.float32)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    raw = quantize(data, GGMLQuantizationType[kind])
    codes, d, offset = gguf_q.unpack_q4_blocks(raw, kind)
    ours = gguf_q.dequantize_affine(gguf_q.pack_codes(codes, 4), d, offset, torch.float32)
    assert torch.equal(ours, gguf_q.dequantize_tensor(raw, kind))


def _hf_greedy_from_gguf(path: Path) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model_greedy(model, PROMPTS, TOKENS)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_a_gguf_file_matches_hf_on_the_same_file(tmp_path, embedded_model_dir, kind):
    """A .gguf model (quantization implied) in fp32: 4-bit codes dequantized once (fp32 keeps the file's values
    exactly), the Q8_0 LM head dense, Q/K rows un-permuted: greedy tokens equal transformers' on the file's
    dequantized weights; in bf16 the layers take torch's int4 kernel."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(embedded_model_dir))
    path = write_tiny_llama_gguf(tmp_path / f"tiny-{kind}.gguf", vocab, linear=kind)
    llm = LLM(str(path), tokenizer=str(embedded_model_dir), dtype="float32", max_model_len=256)
    assert llm.engine.config.model.quantization == "gguf"
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m.__dict__.get("quant_method"),
                                                                         gguf_q.GgufInt4Method)]
    assert len(layers) == 2 * 4 and all(m.dense_weight is not None for m in layers)  # qkv, o, gate_up, down
    ours = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert ours == _hf_greedy_from_gguf(path)
    bf16 = LLM(str(path), tokenizer=str(embedded_model_dir), dtype="bfloat16", max_model_len=256)
    model = bf16.engine.runner.model
    int4 = [m for m in model.modules() if getattr(m, "cpu_int_weight", None) is not None and m is not model.lm_head]
    assert len(int4) == 2 * 4
    assert model.lm_head.cpu_int_weight is not None and model.lm_head.cpu_int_weight.planes == 2  # the Q8_0 head


def test_the_embedded_models_q4_1_codes_give_the_bf16_models_greedy_tokens(embedded_model_dir):
    """No model + --quantization gguf: the shipped Q4_1 file's codes, bf16 activations, torch's int4 kernel
    (scale d and bias m + 8 d rounded to bf16; the Q8_0 head's codes with d rounded to bf16). The bf16 model
    holds each weight d q + m rounded to bf16, so the two differ by bf16 rounding only: the same greedy tokens
    on these prompts."""
    prompts = ["The capital of France is", "Once upon a time, there was a", "def fibonacci(n):"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    codes = LLM(quantization="gguf", max_model_len=256)
    assert codes.engine.config.model.dtype == "bfloat16"
    assert codes.engine.config.model.model.endswith(".gguf")
    int4 = [m for m in codes.engine.runner.model.modules() if getattr(m, "cpu_int_weight", None) is not None]
    assert len(int4) == 30 * 4 + 1  # and the tied Q8_0 LM head as 8-bit codes
    ours = [o.outputs[0].token_ids for o in codes.generate(prompts, params, use_tqdm=False)]
    dense = LLM(str(embedded_model_dir), max_model_len=256)
    assert ours == [o.outputs[0].token_ids for o in dense.generate(prompts, params, use_tqdm=False)]


# A Q4_K_M-like mix (layer 0: Q4_K with Q6_K attn_v and ffn_down, as llama.cpp's Q4_K_M writes them) and every
# other served type; merged layers are 4-bit only when all their parts are (Q4_0 + Q4_K is).
MIXED_TYPES = {"token_embd.weight": "Q4_K", "output.weight": "Q6_K",
               **{f"blk.0.{n}.weight": t for n, t in [("attn_q", "Q4_K"), ("attn_k", "Q4_K"), ("attn_v", "Q6_K"),
                                                       ("attn_output", "Q4_K"), ("ffn_gate", "Q4_K"),
                                                       ("ffn_up", "Q4_K"), ("ffn_down", "Q6_K")]},
               **{f"blk.1.{n}.weight": t for n, t in [("attn_q", "Q4_K"), ("attn_k", "Q4_K"), ("attn_v", "Q4_K"),
                                                       ("attn_output", "Q5_K"), ("ffn_gate", "Q5_0"),
                                                       ("ffn_up", "Q5_1"), ("ffn_down", "Q3_K")]},
               **{f"blk.2.{n}.weight": t for n, t in [("attn_q", "Q5_K"), ("attn_k", "Q2_K"), ("attn_v", "Q3_K"),
                                                       ("attn_output", "Q4_K"), ("ffn_gate", "Q4_0"),
                                                       ("ffn_up", "Q4_K"), ("ffn_down", "Q2_K")]}}
MIXED_INT4 = ["layers.0.self_attn.o_proj", "layers.0.mlp.gate_up_proj", "layers.1.self_attn.qkv_proj",
              "layers.2.self_attn.o_proj", "layers.2.mlp.gate_up_proj"]


def test_a_k_quant_mix_matches_hf_on_the_same_file(tmp_path, embedded_model_dir):
    """Q4_K layers as 4-bit codes (exact in fp32), the mixed and other types dense: greedy tokens equal
    transformers' on the same file (it dequantizes every type with gguf-py); in bf16 the Q4_K layers take torch's
    int4 kernel and the Q6_K head stays dense."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(embedded_model_dir))
    path = write_tiny_llama_gguf(tmp_path / "tiny-Q4_K_M.gguf", vocab, hidden=256, inter=512, layers=3,
                                 types=MIXED_TYPES)
    llm = LLM(str(path), tokenizer=str(embedded_model_dir), dtype="float32", max_model_len=256)
    model = llm.engine.runner.model
    int4 = sorted(n for n, m in model.named_modules() if isinstance(m.__dict__.get("quant_method"),
                                                                      gguf_q.GgufInt4Method))
    assert int4 == sorted(MIXED_INT4)
    ours = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert ours == _hf_greedy_from_gguf(path)
    bf16 = LLM(str(path), tokenizer=str(embedded_model_dir), dtype="bfloat16", max_model_len=256).engine.runner.model
    kernel = sorted(n for n, m in bf16.named_modules() if getattr(m, "cpu_int_weight", None) is not None)
    assert kernel == sorted(MIXED_INT4)  # the Q6_K LM head is dense


def test_a_linear_tensor_of_another_type_is_refused_by_name(tmp_path, embedded_model_dir):
    path = write_tiny_llama_gguf(tmp_path / "tiny-mxfp4.gguf", 256, linear="MXFP4")
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight .* is MXFP4; --quantization gguf serves linear "
                                         r"weights stored as Q4_0/Q4_1/Q4_K \(4-bit codes\) or Q8_0/F16/BF16/F32/"
                                         r"Q5_0/Q5_1/Q2_K/Q3_K/Q5_K/Q6_K \(dense\)"):
        LLM(str(path), tokenizer=str(embedded_model_dir), dtype="float32", max_model_len=256)


def test_gguf_flag_combinations_are_checked(tmp_path, embedded_model_dir):
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", 256)
    with pytest.raises(ConfigError, match="is not a .gguf file"):
        EngineConfig.from_kwargs(str(embedded_model_dir), quantization="gguf")
    with pytest.raises(ConfigError, match="--quantization rtn: a .gguf model serves its own"):
        EngineConfig.from_kwargs(str(path), quantization="rtn")
    assert EngineConfig.from_kwargs(str(path), quantization="gguf").model.quantization == "gguf"
    other = write_tiny_llama_gguf(tmp_path / "tiny-other.gguf", 256, arch="gpt2")
    with pytest.raises(ConfigError, match="GGUF architecture 'gpt2'"):
        EngineConfig.from_kwargs(str(other))
    # The embedded model without the flag is the bf16 directory, as before.
    assert EngineConfig.from_kwargs().model.quantization is None
