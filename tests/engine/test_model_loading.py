"""Model loading and config reading against HF transformers: checkpoints laid out as the Hub lays them out,
and config.json fields a claimed architecture allows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [5, 17, 230, 4000, 12, 9]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _greedy(path: Path, **kwargs) -> list[int]:
    llm = LLM(str(path), max_model_len=128, **kwargs)
    return llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_index_json_names_the_shards_to_load(tiny_model_dirs, tmp_path):
    # Mistral's Hub repos hold the HF shards (listed in model.safetensors.index.json) beside
    # consolidated.safetensors, the same weights under mistral-inference's names. HF and vLLM load only the
    # files the index lists; loading every *.safetensors file met names with no place in the model.
    path = _copy(tiny_model_dirs["mistral"], tmp_path / "mistral")
    assert (path / "model.safetensors.index.json").is_file()
    save_file({"tok_embeddings.weight": torch.zeros(4, 64), "layers.0.attention.wq.weight": torch.zeros(64, 64)},
              str(path / "consolidated.safetensors"))
    assert _greedy(path) == hf_greedy(path, [PROMPT], 8)[0]
