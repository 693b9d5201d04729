"""Load an HF model directory's safetensors (possibly sharded) into a Flotilla model.

`load_format="dummy"` (vLLM's `--load-format dummy`) skips the checkpoint and fills the weights
with random values on the device, as HF initialises a fresh model (normal, std
`initializer_range`; norms one, biases zero): benchmarks of a model's shape need only its config.json.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from flotilla.engine.config import ModelConfig
from flotilla.engine.layers.moe import expert_target, is_expert_input_scale, missing_experts
from flotilla.engine.models.causal_lm import CausalLM
from flotilla.engine.models.registry import build_model
from flotilla.engine.pooling.score_head import attach_score_head, score_head_tensors
from flotilla.engine.quantization import (
    attach_quant_method,
    convert_checkpoint,
    linear_method,
    process_quantized_weights,
)
from flotilla.engine.quantization.kv_scales import kv_scale_target, set_kv_scale
from flotilla.engine.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

# Where in a merged parameter a checkpoint tensor goes: a fragment's shard (`packed_modules`: "q", 0) or, in a
# stacked experts' parameter, (expert, part) (`engine/layers/moe.py`).
ShardId = str | int | tuple[int, int]
# A layer's `weight_loader(param, checkpoint tensor, shard id)`: puts the tensor into its place in `param`.
WeightLoader = Callable[[nn.Parameter, torch.Tensor, ShardId | None], None]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config dtype name."""
    return _DTYPES[name]


def load_model(config: ModelConfig, device: torch.device) -> CausalLM:
    """Build the model in the configured dtype on `device` and fill it from the checkpoint."""
    # Layers create their parameters with torch's default dtype, so the loader sets it for the
    # construction only and restores it: nothing after this call sees the change. While it lasts it
    # is process state: two models built at the same moment on two threads would share it, which
    # no caller does (a server builds one engine; `AsyncEngine.build` returns only once it is built).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype(config.dtype))
    try:
        with device:
            model = build_model(config.hf_config)
            if config.convert == "classify":
                attach_score_head(model, config.hf_config)
    finally:
        torch.set_default_dtype(previous)
    logger.debug("model built on %s", device)
    gguf_int4: set[str] = set()
    if config.quantization == "gguf":  # the layer's method follows its tensors' GGUF types
        from flotilla.engine.quantization.gguf import attach_gguf_methods

        with device:
            gguf_int4 = attach_gguf_methods(model, config.model, config.hf_config)
        logger.debug("gguf: %d linear weights load as 4-bit codes", len(gguf_int4))
    elif config.quantization is not None:
        with device:  # the quantized parameters live where the model does (a CPU int4 weight broke CUDA runs)
            attach_quant_method(model, linear_method(config.quantization, config.hf_config))
        logger.debug("%s linear layers attached", config.quantization)
    if config.load_format == "dummy":
        fill_dummy_weights(model, float(config.hf_config.get("initializer_range", 0.02)), config.seed)
        logger.debug("dummy weights filled")
    elif config.quantization == "gguf":
        from flotilla.engine.quantization.gguf import gguf_checkpoint_tensors

        load_state(model, gguf_checkpoint_tensors(config.model, config.hf_config, gguf_int4), where=config.model)
    else:
        tensors = _checkpoint_tensors(Path(config.model))
        if config.convert == "classify":
            tensors = score_head_tensors(tensors, config.hf_config, classifier_token_ids(config))
        if config.quantization is not None:
            tensors = convert_checkpoint(config.quantization, config.hf_config, tensors)
        load_state(model, tensors, where=config.model)
    process_quantized_weights(model)
    if config.quantization == "gguf" and config.load_format != "dummy":
        from flotilla.engine.quantization.gguf import attach_gguf_lm_head

        logger.debug("gguf: LM head as 8-bit codes: %s", attach_gguf_lm_head(model, config.model))
    return model.eval()


@torch.no_grad()
def classifier_token_ids(config: ModelConfig) -> list[int]:
    """The tokenizer's ids of config.json's `classifier_from_token` ([] when it names none), as vLLM's loader reads
    them; a token the vocabulary lacks is an error, not the unknown token's row."""
    tokens = config.hf_config.get("classifier_from_token") or []
    if not tokens:
        return []
    tokenizer = load_tokenizer(config.tokenizer)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    unknown = [t for t, i in zip(tokens, ids, strict=True) if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise ValueError(f"classifier_from_token: {unknown} are not tokens of the vocabulary of {config.tokenizer}")
    return ids


@torch.no_grad()
def reload_weights(model: CausalLM, config: ModelConfig) -> None:
    """Fill `model`'s parameters again, in place, as `load_model` filled them: the checkpoint's tensors (or the dummy
    weights of the same seed). Quantized models are refused: their run-time form is converted at load
    (`process_quantized_weights`), not read."""
    if config.quantization is not None:
        raise ValueError(f"reload_weights reads unquantized checkpoints only, not --quantization {config.quantization}")
    if config.load_format == "dummy":
        fill_dummy_weights(model, float(config.hf_config.get("initializer_range", 0.02)), config.seed)
        return
    tensors = _checkpoint_tensors(Path(config.model))
    if config.convert == "classify":  # the score head made as load_model made it (the LM head's rows, or score.*)
        tensors = score_head_tensors(tensors, config.hf_config, classifier_token_ids(config))
    load_state(model, tensors, where=config.model)


@torch.no_grad()
def fill_dummy_weights(model: nn.Module, std: float, seed: int) -> None:
    """Random weights in place: matrices ~ N(0, std), biases 0, norm weights left at 1. Quantized
    layers' parameters (`engine/quantization`): random packed codes, scales that give the same std."""
    params = list(model.named_parameters())
    generator = torch.Generator(device=params[0][1].device).manual_seed(seed)
    for name, param in params:
        if not param.dtype.is_floating_point:
            param.copy_(torch.randint(-(2**31), 2**31 - 1, param.shape, generator=generator,
                                      device=param.device, dtype=torch.int64).to(param.dtype))
        elif name.endswith("weight_scale"):
            param.fill_(std / 4)  # random codes and zero points: a benchmark reads bytes, not values
        elif param.element_size() == 1:  # an fp8 checkpoint's weight (torch draws no fp8 normals): std / its scale
            param.copy_(torch.randn(param.shape, generator=generator, device=param.device) * 4)
        elif param.dim() >= 2:
            param.normal_(0.0, std, generator=generator)
        elif name.endswith("bias"):
            param.zero_()


def _checkpoint_files(model_dir: Path) -> list[Path]:
    """The checkpoint's files: those model.safetensors.index.json lists when there is one (as HF and vLLM
    load), else every *.safetensors file. Mistral's repos keep consolidated.safetensors (the same weights
    under other names) beside the listed shards."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        listed = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        absent = [name for name in listed if not (model_dir / name).is_file()]
        if absent:
            raise FileNotFoundError(f"model {model_dir}: {index.name} lists missing files: {', '.join(absent)}")
        if listed:
            return [model_dir / name for name in listed]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model {model_dir}: no *.safetensors files")
    return files


def _checkpoint_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in _checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for hf_name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield hf_name, f.get_tensor(hf_name)


def load_state(model: CausalLM, tensors: Iterable[tuple[str, torch.Tensor]], where: str = "state dict") -> None:
    """Copy HF-named tensors (a checkpoint's, or a live HF model's `state_dict().items()`) into `model`."""
    params = dict(model.named_parameters())
    loaders = _weight_loaders(model)
    loaded: set[str] = set()
    shards: dict[str, set[ShardId]] = {}  # merged parameter -> the shards loaded into it
    tied = model.ties_lm_head
    skipped_head: torch.Tensor | None = None
    for hf_name, tensor in tensors:
        if tied and hf_name == "lm_head.weight":
            skipped_head = tensor  # vLLM's rule: a tied model's head is the embedding; compared below
            continue
        name = model.checkpoint_name(hf_name)
        if "rotary_emb.inv_freq" in name:
            continue
        if (kv_scale := kv_scale_target(name)) is not None:
            if model.holds(kv_scale[0]):  # not another pipeline stage's layer
                set_kv_scale(model, *kv_scale, tensor)
            continue
        name, shard_id = checkpoint_target(name, model.packed_modules)
        if is_expert_input_scale(name):  # fp8 experts run W8A16 (engine/layers/moe.py)
            continue
        if not model.holds(name):  # another pipeline stage's layer
            continue
        if name not in params:
            raise ValueError(f"checkpoint tensor {hf_name} has no place in {type(model).__name__}")
        _load_tensor(loaders.get(name, _copy_weight), params[name], tensor, shard_id, hf_name, name)
        loaded.add(name)
        if shard_id is not None:
            shards.setdefault(name, set()).add(shard_id)
    if skipped_head is not None:
        _warn_if_head_differs(skipped_head, params.get("embed_tokens.weight"), where)
    missing = _missing(model, set(params) - loaded - ({"lm_head.weight"} if tied else set()), shards, params)
    if missing:
        raise ValueError(f"checkpoint in {where} lacks tensors for: {', '.join(sorted(missing))}")


def _load_tensor(loader: WeightLoader, param: nn.Parameter, tensor: torch.Tensor, shard_id: ShardId | None,
                 hf_name: str, name: str) -> None:
    """Put checkpoint tensor `hf_name` (in the parameter's dtype) into parameter `name` by its loader; a ValueError
    that names both when the shapes disagree."""
    try:
        loader(param, tensor.to(param.dtype), shard_id)
    except torch.OutOfMemoryError:
        raise
    except (ValueError, RuntimeError) as e:  # torch's own ("exceeds dimension size") names no tensor
        raise ValueError(f"checkpoint tensor {hf_name} {tuple(tensor.shape)} does not fit {name} "
                         f"{tuple(param.shape)} (do config.json and the checkpoint disagree?): {e}") from None


def _missing(model: CausalLM, unloaded: set[str], shards: dict[str, set[ShardId]],
             params: dict[str, nn.Parameter]) -> set[str]:
    """What the checkpoint left empty: the `unloaded` parameters, and the missing parts (by their own names, as
    `q_proj`, `experts.3.up_proj`) of merged parameters it filled in part."""
    missing = set(unloaded)
    # A merged parameter (q/k/v, gate/up, stacked experts) is loaded only when every part is: one missing part
    # would leave its slice uninitialised.
    for name, got in shards.items():
        if any(isinstance(shard, tuple) for shard in got):  # a stacked experts' parameter
            missing |= missing_experts(name, got, int(params[name].shape[0]))
            continue
        for fragment, (merged, shard_id) in model.packed_modules.items():
            if f".{merged}." in name and shard_id not in got:
                missing.add(name.replace(f".{merged}.", f".{fragment}."))
    return missing


def _warn_if_head_differs(head: torch.Tensor, embedding: torch.Tensor | None, where: str) -> None:
    """A tied model (tie_word_embeddings) whose checkpoint also holds an lm_head.weight other than its embedding:
    vLLM ignores that tensor, as here, while transformers 5 then unties and uses it, so the two generate different
    tokens. Say so (transformers warns too). Checked on one rank only: a tensor-parallel embedding is a slice."""
    if embedding is None or embedding.shape != head.shape:
        return
    if not torch.equal(head.to(device=embedding.device, dtype=embedding.dtype), embedding):
        logger.warning("model %s: config.json ties the LM head to the embedding (tie_word_embeddings), but the "
                       "checkpoint's lm_head.weight differs from it; it is ignored, as vLLM does (transformers uses "
                       "it): set tie_word_embeddings false in config.json to use it", where)


def _weight_loaders(model: nn.Module) -> dict[str, WeightLoader]:
    """Each parameter's loader, by parameter name: the `weight_loader` of the layer that owns it
    (sharded and merged layers place a checkpoint tensor in their slice) or the parameter's own;
    others take a plain copy."""
    loaders: dict[str, WeightLoader] = {}
    for prefix, module in model.named_modules():
        loader = getattr(module, "weight_loader", None)
        for name, param in module.named_parameters(prefix=prefix, recurse=False):
            # A parameter's own loader (a quant method's scales) comes before its layer's.
            own = getattr(param, "weight_loader", None) or loader
            if own is not None:
                loaders[name] = own
    return loaders


def _copy_weight(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId | None = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def checkpoint_target(name: str, packed: dict[str, tuple[str, str | int]]) -> tuple[str, ShardId | None]:
    """The parameter a checkpoint tensor (by our name) loads into, and its shard there: one expert's projection
    goes into its layer's stacked experts' parameter (`expert_target`), a fragment into its merged layer
    (`packed_target`)."""
    return expert_target(name) or packed_target(name, packed)


def packed_target(name: str, packed: dict[str, tuple[str, str | int]]) -> tuple[str, str | int | None]:
    """The parameter a checkpoint tensor loads into, and its shard there: a fused layer's name and shard for a
    fragment of `packed` (e.g. `q_proj` -> (`qkv_proj`, "q")), else `name` itself and None."""
    for fragment, (merged, shard_id) in packed.items():
        if f".{fragment}." in name:
            return name.replace(f".{fragment}.", f".{merged}."), shard_id
    return name, None
