"""generation_config.json's sampling fields as the defaults of requests that leave them out
(`--generation-config auto`, vLLM's default), checked against HF `generate`, which reads the same file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

PROMPT = [5, 17, 230, 4000, 12, 9, 77, 301]
# top_k=1 samples the argmax: HF's sampling and ours pick the same token after the repetition penalty.
MODEL_DEFAULTS = {"do_sample": True, "top_k": 1, "repetition_penalty": 5.0, "max_new_tokens": 12, "temperature": 0.7}


@pytest.fixture(scope="module")
def model_with_defaults(tiny_model_dirs, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gen-config") / "llama"
    shutil.copytree(tiny_model_dirs["llama"], path)
    gen = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps(gen | MODEL_DEFAULTS))
    return path


def _hf_generate(path: Path, prompt: list[int]) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        x = torch.tensor([prompt])
        return model.generate(x, attention_mask=torch.ones_like(x))[0, len(prompt):].tolist()


def test_offline_requests_without_params_take_the_model_defaults(model_with_defaults):
    llm = LLM(str(model_with_defaults), max_model_len=128)
    out = llm.generate(PROMPT, use_tqdm=False)[0].outputs[0]
    expected = _hf_generate(model_with_defaults, PROMPT)
    assert len(expected) == 12  # max_new_tokens, and the penalty changed the greedy choice somewhere:
    assert expected != llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)[0] \
        .outputs[0].token_ids
    assert out.token_ids == expected


def test_generation_config_vllm_keeps_the_neutral_defaults(model_with_defaults):
    llm = LLM(str(model_with_defaults), max_model_len=128, generation_config="vllm")
    out = llm.generate(PROMPT, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == SamplingParams().max_tokens == 16
