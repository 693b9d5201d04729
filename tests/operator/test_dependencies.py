"""The operator's image has no torch: no operator module may import the engine or torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import flotilla.operator


def test_operator_imports_neither_engine_nor_torch():
    modules = [f"flotilla.operator.{m.name}" for m in pkgutil.iter_modules(flotilla.operator.__path__)]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'triton', 'transformers')"
            " or n.split('.')[:2] in (['flotilla', 'engine'], ['flotilla', 'kernels']))\nprint(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert len(modules) >= 10
