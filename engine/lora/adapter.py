"""Read a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors).

The adapter's tensors are named after the HF model's modules (`base_model.model.model.layers.0.
self_attn.q_proj.lora_A.weight`, `[r, in]`; `lora_B.weight`, `[out, r]`). They are mapped onto our
projections, where q/k/v and gate/up are slices of merged layers, and the scaling (`lora_alpha / r`,
or `lora_alpha / sqrt(r)` with rsLoRA) is folded into B. Anything PEFT can express but the engine
would not compute exactly (DoRA, biases, extra trained modules, per-module alphas, embeddings or the
LM head as targets) is refused with a message that names it, never silently dropped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from flotilla.engine.errors import LoRAAdapterError

SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


@dataclass(frozen=True)
class ModuleLayout:
    """What a LoRA-wrapped projection accepts: input size, and each shard's slice of its output."""

    in_features: int
    # shard id (as the model's `packed_modules` names it; None for a plain projection) -> slice index
    shards: Mapping[str | int | None, int]
    slice_sizes: tuple[int, ...]


@dataclass
class LoRAAdapter:
    """An adapter's matrices on the CPU, keyed by our module name and slice index."""

    rank: int
    weights: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]]  # (A [r, in], B [out, r] * scaling)



def read_adapter_config(path: Path, max_rank: int) -> dict[str, Any]:
    """adapter_config.json, checked for what the engine computes exactly."""
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise LoRAAdapterError(f"LoRA adapter {path}: no adapter_config.json (expected a PEFT adapter directory)")
    try:
        config = json.loads(config_file.read_text())
    except ValueError as exc:
        raise LoRAAdapterError(f"LoRA adapter {path}: adapter_config.json is not JSON: {exc}") from None
    problems = []
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        problems.append(f"peft_type {config.get('peft_type')!r} (only LORA)")
    if config.get("use_dora"):
        problems.append("use_dora")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        problems.append(f"bias {config.get('bias')!r} (only 'none')")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save {config['modules_to_save']}")
    if config.get("fan_in_fan_out"):
        problems.append("fan_in_fan_out")
    if config.get("alpha_pattern") or config.get("rank_pattern"):
        problems.append("rank_pattern/alpha_pattern")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        problems.append(f"r {rank!r}")
    elif rank > max_rank:
        problems.append(f"rank {rank} above --max-lora-rank {max_rank}")
    if problems:
        raise LoRAAdapterError(f"LoRA adapter {path}: not supported: {'; '.join(problems)}")
    return config


def load_adapter(
    path: Path,
    layouts: Mapping[str, ModuleLayout],
    module_name: Callable[[str], tuple[str, str | int | None]],
    max_rank: int,
    dtype: torch.dtype,
) -> LoRAAdapter:
    """Read and check an adapter against the model's LoRA layouts.

    `module_name` maps an HF module name (`model.layers.0.self_attn.q_proj`) to our wrapped module
    and the shard id within it (`("layers.0.self_attn.qkv_proj", "q")`).
    """
    config = read_adapter_config(path, max_rank)
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    for hf_module, ab in _pairs(path, _read_tensors(path)).items():
        name, index = _place(path, hf_module, ab, layouts, module_name, rank)
        weights.setdefault(name, {})[index] = (ab["A"].to(dtype), (ab["B"].float() * scaling).to(dtype))
    if not weights:
        raise LoRAAdapterError(f"LoRA adapter {path}: adapter_model.safetensors holds no LoRA weights")
    return LoRAAdapter(rank=rank, weights=weights)


def _pairs(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """The adapter's tensors by HF module name, then "A" / "B"; LoRAAdapterError for any other tensor."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise LoRAAdapterError(f"LoRA adapter {path}: unexpected tensor {key} (only lora_A/lora_B weights)")
        pairs.setdefault(match["module"], {})[match["ab"]] = tensor
    return pairs


def _place(path: Path, hf_module: str, ab: dict[str, torch.Tensor], layouts: Mapping[str, ModuleLayout],
           module_name: Callable[[str], tuple[str, str | int | None]], rank: int) -> tuple[str, int]:
    """Where one module's A and B go in the base model: (our module, the shard's slice index); LoRAAdapterError
    for an unsupported target, a missing half, a module the model lacks, or shapes that do not fit it."""
    target = hf_module.rsplit(".", 1)[-1]
    if target not in SUPPORTED_TARGETS:
        raise LoRAAdapterError(
            f"LoRA adapter {path}: target module {target} ({hf_module}) is not supported "
            f"(supported: {', '.join(SUPPORTED_TARGETS)})"
        )
    if set(ab) != {"A", "B"}:
        raise LoRAAdapterError(f"LoRA adapter {path}: {hf_module} lacks lora_{'B' if 'A' in ab else 'A'}")
    name, shard = module_name(hf_module)
    layout = layouts.get(name)
    if layout is None or shard not in layout.shards:
        raise LoRAAdapterError(f"LoRA adapter {path}: {hf_module} has no place in the base model")
    index = layout.shards[shard]
    a, b = ab["A"], ab["B"]
    expected_a = (rank, layout.in_features)
    expected_b = (layout.slice_sizes[index], rank)
    if tuple(a.shape) != expected_a or tuple(b.shape) != expected_b:
        raise LoRAAdapterError(
            f"LoRA adapter {path}: {hf_module} has A {tuple(a.shape)} and B {tuple(b.shape)}; the base model "
            f"needs A {expected_a} and B {expected_b} (an adapter of another model?)"
        )
    return name, index


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    weights_file = path / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise LoRAAdapterError(f"LoRA adapter {path}: no adapter_model.safetensors")
    try:
        with safe_open(str(weights_file), framework="pt") as f:
            return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open is not a mapping
    except Exception as exc:  # a truncated or foreign file: the adapter's problem, not the server's
        raise LoRAAdapterError(f"LoRA adapter {path}: cannot read adapter_model.safetensors: {exc}") from None
