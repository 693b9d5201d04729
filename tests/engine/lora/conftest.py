"""Random nonzero PEFT adapters for the tiny qwen3 model, built once per run."""

from __future__ import annotations

from pathlib import Path

import pytest

from .peft_reference import ADAPTERS, make_adapter


@pytest.fixture(scope="session")
def lora_adapters(tiny_model_dirs, tmp_path_factory) -> dict[str, dict[str, Path]]:
    """The three adapters of ADAPTERS, by name, for the qwen3 tiny model (q/k norms, head_dim 32 with
    hidden 64 and 4 heads, one KV head)."""
    root = tmp_path_factory.mktemp("lora-adapters")
    result: dict[str, dict[str, Path]] = {}
    for arch in ("qwen3",):
        result[arch] = {
            name: make_adapter(tiny_model_dirs[arch], root / arch / name, *spec, seed=i)
            for i, (name, spec) in enumerate(ADAPTERS.items())
        }
    return result
