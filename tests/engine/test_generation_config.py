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


def test_config_json_eos_does_not_stop_when_generation_config_json_sets_it(tiny_model_dirs, tmp_path):
    # HF generate stops on generation_config.json's eos_token_id; config.json's counts only when that file is absent
    # (GenerationConfig.from_model_config). vLLM: the tokenizer's eos plus the same generation config's. Flotilla
    # also stopped on config.json's, cutting a continuation that HF and vLLM go on with.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf_reference import hf_greedy, model_greedy

    path = tmp_path / "llama"
    shutil.copytree(tiny_model_dirs["llama"], path)
    free = hf_greedy(path, [PROMPT], 8)[0]
    eos = free[3]  # a token the greedy continuation produces, not the tokenizer's eos nor generation_config's
    assert eos not in free[:3] and eos != AutoTokenizer.from_pretrained(path).eos_token_id
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] != eos
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"eos_token_id": eos}))
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # reads the new config.json
    assert hf_model.config.eos_token_id == eos
    hf = model_greedy(hf_model, [PROMPT], 8, stop_at_eos=True)[0]
    assert hf == free
    llm = LLM(str(path), max_model_len=128)
    ours = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert ours.token_ids == hf
    # without generation_config.json config.json's eos stops (transformers' from_model_config; vLLM alike)
    (path / "generation_config.json").unlink()
    llm = LLM(str(path), max_model_len=128)
    ours = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert ours.token_ids == free[:4]


def test_a_generation_config_folder_gives_the_eos_ids_too(tiny_model_dirs, tmp_path):
    # vLLM reads the whole generation config from --generation-config DIR (ModelConfig.try_get_generation_config):
    # its eos_token_id stops generation as the model's own file would. Flotilla took only the sampling fields
    # from DIR and the eos ids still from the model's generation_config.json.
    from .hf_reference import hf_greedy

    free = hf_greedy(tiny_model_dirs["llama"], [PROMPT], 8)[0]
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": free[3]}))
    assert free[3] not in free[:3]
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=128, generation_config=str(folder))
    ours = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert ours.token_ids == free[:4]
