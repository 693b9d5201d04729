"""bitsandbytes 4-bit at admission: the engine's blocks of 64 inputs on every tensor rank, and the fit check's
bytes of a spec whose --hf-overrides quantization_config is a bitsandbytes one."""

from __future__ import annotations

import json

from flotilla.kernels.nf4_linear import BLOCK
from flotilla.operator.admission import review
from flotilla.operator.fit import BNB_BLOCK, weight_bytes
from flotilla.operator.spec import InferenceServiceSpec

# Llama-2-7B: MLP 11008 inputs, 1376 a rank at tensor 8 (21.5 blocks of 64)
LLAMA_2_7B = {"hiddenSize": 4096, "numHiddenLayers": 32, "numAttentionHeads": 32, "numKeyValueHeads": 32,
              "headDim": 128, "intermediateSize": 11008, "vocabSize": 32000, "maxPositionEmbeddings": 4096}
NF4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
       "bnb_4bit_use_double_quant": True, "llm_int8_skip_modules": ["lm_head"]}


def _spec(tensor: int, **extra) -> dict:
    return {"model": {"source": "pvc://m", "config": LLAMA_2_7B}, "parallelism": {"tensor": tensor},
            "resources": {"gpusPerReplica": tensor, "gpuProduct": "NVIDIA-H200"}, **extra}


def test_the_block_is_the_engines():
    assert BNB_BLOCK == BLOCK


def test_ranks_of_partial_blocks_are_refused_for_bitsandbytes_only():
    assert review(_spec(4, quantization="bitsandbytes"), "x").errors == []
    assert review(_spec(8, quantization="bitsandbytes"), "x").errors == [
        "spec.quantization: a bitsandbytes 4-bit layer takes its inputs in blocks of 64 on every GPU, but "
        "intermediateSize / tensor = 1376 is not a multiple of 64; choose another tensor size or quantization"]
    assert review(_spec(8), "x").errors == []
    # a checkpoint's bitsandbytes quantization_config given by --hf-overrides is the scheme the engine runs
    override = ["--hf-overrides", json.dumps({"quantization_config": NF4})]
    assert review(_spec(8, engineArgs=override), "x").errors[0].startswith("spec.quantization: a bitsandbytes")


def test_the_fit_check_counts_half_a_byte_and_a_float32_absmax_a_block():
    spec = InferenceServiceSpec.model_validate(_spec(1, engineArgs=["--hf-overrides", json.dumps(
        {"quantization_config": NF4})]))
    arch = spec.architecture
    assert arch is not None and spec.weight_quantization == "bitsandbytes"
    linear = 32 * (4096 * 4096 * 4 + 3 * 4096 * 11008)
    embeddings = 2 * 32000 * 4096 * 2
    assert weight_bytes(arch, "bitsandbytes", "bfloat16", quantization_config=NF4) == (
        linear // 2 + linear // 64 * 4 + embeddings)
    fit = review(_spec(1, quantization="bitsandbytes"), "x").fit
    assert fit is not None and fit.weight_bytes == linear // 2 + linear // 64 * 4 + embeddings
