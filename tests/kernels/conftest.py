"""Kernel tests run the Triton entry points: compiled on a CUDA GPU, under the interpreter elsewhere.

Triton reads TRITON_INTERPRET when a `@triton.jit` decorator runs, so it is set here, at import,
before any test imports a kernel module (the tests import them inside the test functions, so an
earlier import of `flotilla.kernels.dispatch` by another test directory cannot define a kernel
first: dispatch imports Triton only on its CUDA path).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# pytest runs with --import-mode=importlib, which puts no test folder on sys.path; the shared case
# builders (kernel_cases.py) are imported by name, so this folder goes on it.
sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("TRITON_INTERPRET") == "1":
    from interpreter_patches import skip_nested_lang_patches

    # The interpreter's nested `tl` re-patching is a third to a half of an interpreted launch's CPU time
    # (see interpreter_patches.py); the kernels compute the same either way.
    skip_nested_lang_patches()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu`-marked tests skip without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
