"""A GGUF file as the model: whether a path names one, its architecture, and the HF config transformers reads from
its metadata. No torch here: the API process validates the flags with these (the weights are `gguf.py`'s).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

GGUF_ARCHITECTURES = ("llama",)


def is_gguf_file(model: str | Path) -> bool:
    """Whether `model` names a GGUF file (by its name, as vLLM decides)."""
    return str(model).endswith(".gguf") and Path(model).is_file()


@lru_cache(maxsize=2)
def gguf_reader(path: str) -> Any:
    """The `gguf` package's reader of the file at `path` (the last two kept open)."""
    from gguf import GGUFReader

    return GGUFReader(path)


def gguf_architecture(path: str | Path) -> str:
    """`general.architecture` of a GGUF file."""
    field = gguf_reader(str(path)).fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def gguf_hf_config(path: str | Path) -> dict[str, Any]:
    """The HF config of a GGUF file (transformers reads its metadata), or ValueError for an architecture this
    path does not serve."""
    arch = gguf_architecture(path)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r}; --quantization gguf serves "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    from transformers import AutoConfig

    path = Path(path)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_diff_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config.setdefault("dtype", "bfloat16")  # the int4 CPU kernel's fast dtype; --dtype still chooses
    return dict(config)
