"""Fixtures shared by the whole suite: tiny random HF models of every supported architecture, built
once per run with `save_pretrained`, and the embedded real model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One intra-op thread for torch in this process and in every process the tests start (servers, engine cores, CLIs
# inherit the environment). The tiny models' ops gain nothing from a second thread, and on a two-core machine
# where the test, an API process and an engine core share the cores, OpenMP's second thread spin-waits on a busy
# core: the tiny Llama's 60 decode steps of 8 rows took 0.56 s of CPU on one thread and 4.9 to 8.3 s on two at
# load ~7 (test_feature_mix.py's `one_thread` measured the same). Set before torch is imported, which reads it; an
# explicit OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Triton kernels run under the interpreter on machines without CUDA; this must be set before any
# `triton.jit` decorator executes, so it lives in the root conftest, loaded first.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the operator-only install has no torch
    torch = None

TINY_ARCHS = ["llama", "llama3-rope-tied", "mistral", "qwen2", "qwen3", "mixtral", "qwen3-moe"]


def _tiny_config(arch: str, vocab_size: int):
    from transformers import LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    if arch == "llama3-rope-tied":
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 500000.0,
        }
        return LlamaConfig(**common, tie_word_embeddings=True, rope_parameters=scaling)
    if arch == "mistral":
        return MistralConfig(**common, sliding_window=None, tie_word_embeddings=False)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False)
    if arch == "qwen3":
        return Qwen3Config(**{**common, "num_key_value_heads": 1}, head_dim=32, tie_word_embeddings=False)
    # mixtures of experts: 4 experts, top 2 (Mixtral renormalises always; Qwen3-MoE here too, with layer 1 dense)
    if arch == "mixtral":
        return MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
    if arch == "qwen3-moe":
        return Qwen3MoeConfig(**{**common, "num_key_value_heads": 1}, head_dim=32, num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=64, norm_topk_prob=True, mlp_only_layers=[1],
                              tie_word_embeddings=False)
    raise ValueError(arch)


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as an HF directory (converted once per machine)."""
    from flotilla.engine.embedded_model import embedded_model_dir as find

    return find()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> dict[str, Path]:
    """Tiny fp32 random models (2 layers, hidden 64), one per architecture, sharing the real tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    root = tmp_path_factory.mktemp("tiny-models")
    dirs = {}
    for i, arch in enumerate(TINY_ARCHS):
        torch.manual_seed(1000 + i)
        config = _tiny_config(arch, len(tokenizer))
        config.initializer_range = 0.1  # peaked logits: greedy choices far from ties
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        path = root / arch
        # Small shards prove that sharded checkpoints load.
        model.save_pretrained(path, max_shard_size="2MB")
        tokenizer.save_pretrained(path)
        dirs[arch] = path
    return dirs


# Tiny `*ForSequenceClassification` models (the pooling runner's classify convert): architecture -> labels.
TINY_CLASSIFIERS = {"qwen3": ["negative", "neutral", "positive"], "qwen2": ["spam", "ham"], "llama": ["relevant"]}


@pytest.fixture(scope="session")
def tiny_classifier_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dirs: dict[str, Path]) -> dict[str, Path]:
    """Random HF `*ForSequenceClassification` models of the tiny architectures (TINY_CLASSIFIERS: their id2label),
    saved with save_pretrained beside the same tokenizer."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    root = tmp_path_factory.mktemp("tiny-classifiers")
    dirs = {}
    for seed, (arch, labels) in enumerate(TINY_CLASSIFIERS.items()):
        base, path = tiny_model_dirs[arch], root / arch
        # initializer_range: logits of some spread, so that a wrong row or activation shows
        config = AutoConfig.from_pretrained(base, id2label=dict(enumerate(labels)), architectures=None,
                                            label2id={label: i for i, label in enumerate(labels)},
                                            initializer_range=0.2)
        torch.manual_seed(seed)
        AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).save_pretrained(path)
        AutoTokenizer.from_pretrained(base).save_pretrained(path)
        dirs[arch] = path
    return dirs


@pytest.fixture(params=TINY_ARCHS)
def tiny_model_dir(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path]) -> Path:
    """Each tiny architecture in turn."""
    return tiny_model_dirs[request.param]
