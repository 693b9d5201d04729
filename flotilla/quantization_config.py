"""What a config.json's `quantization_config` tells the engine about its linear weights, read without torch: the
scheme it names (`quant_method`), the bits of a weight, GPTQ/AWQ's group size, compressed-tensors' one config
group and its group size, and whether the engine runs the layout it describes (`check_layout`).

The engine runs the scheme the checkpoint's quantization_config names (engine/quantization `resolve_quantization`),
and an --hf-overrides `quantization_config` replaces the checkpoint's whole before that. The engine's scheme modules
(engine/quantization gptq.py, awq.py, compressed_tensors.py) read these fields with the functions here, and the
operator reads an override's with the same ones: the fit check counts the weights at its bits and their scales by
its group size, and the webhook refuses what the engine would refuse at start-up, with the engine's words (the
ValueError these functions raise). The layout rules (`check_layout`: GPTQ's lm_head, AWQ's version,
compressed-tensors' targets, ignore, format, type, strategy and actorder, fp8's weight_block_size, its
activation_scheme and ignored_layers, bitsandbytes' 4-bit type, storage and skipped modules, ModelOpt's quant_algo,
KV algorithm and exclude_modules, fbgemm_fp8's activation_scale_ub and modules_to_not_convert;
`act_order_parallel_problem`: activation order over tensor-parallel ranks) live here for the same reason; the
engine's modules keep the tensor layouts and kernels.

Standard library only (the operator's webhook imports it).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

# The schemes a checkpoint's quantization_config may name for the engine to load (rtn quantizes a dense checkpoint
# at load, and the engine refuses it over a quantized one), and the bits of a weight each loads.
CHECKPOINT_BITS = {"fp8": (8,), "compressed-tensors": (4, 8), "gptq": (4, 8), "awq": (4,), "bitsandbytes": (4,),
                   "modelopt": (8,), "fbgemm_fp8": (8,)}
CHECKPOINT_METHODS = tuple(CHECKPOINT_BITS)
# vLLM's --quantization names of a kernel for a checkpoint format the engine runs, and the format each names: vLLM
# upgrades a gptq / awq checkpoint to its Marlin kernel itself, so either name beside such a checkpoint runs it.
KERNEL_ALIASES = {"gptq_marlin": "gptq", "awq_marlin": "awq"}
# NVIDIA ModelOpt's file beside config.json in its older exports (the same settings under "quantization").
MODELOPT_FILE = "hf_quant_config.json"
# ModelOpt's quant_algo values the engine runs: e4m3 weights with a per-tensor scale and a static per-tensor input
# scale (FP8), or a scale a row and per-token activations (FP8_PER_CHANNEL_PER_TOKEN).
MODELOPT_FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")
# compressed-tensors' formats of 8-bit float weights, and of int8 W8A8 (int8 codes stored as they are).
_FLOAT_FORMATS = ("float-quantized", "naive-quantized")
INT8_W8A8_FORMAT = "int-quantized"
# compressed-tensors' actorder values: GPTQ visited the inputs in activation order and stored the groups in input order
# (null, false or these), or stored each input's group (`weight_g_idx`) for groups of permuted inputs (these).
_CONTIGUOUS_ACTORDER = ("static", "weight")
_PERMUTED_ACTORDER = ("group", "dynamic")
# The decoder's linear layers as a checkpoint names them (layer numbers up to _LAYERS), which an `ignore` entry may
# not leave unquantized: one quant method runs them all.
_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                "mlp.up_proj", "mlp.down_proj")
_LAYERS = 512
_DECODER_LINEARS = [f"model.layers.{i}.{p}" for i in range(_LAYERS) for p in _PROJECTIONS]
_DOTTED_DECODER_LINEARS = [f".{name}." for name in _DECODER_LINEARS]


def describes_checkpoint(qcfg: Any) -> bool:
    """Whether a quantization_config says how the checkpoint's weights are stored: an object, and not gguf's (a model
    transformers read from a GGUF file and saved again keeps `quant_method: gguf`, but its safetensors hold the
    dequantized weights). One without quant_method does (dense weights; `flag_disagrees`)."""
    return isinstance(qcfg, dict) and _method_text(qcfg) != "gguf"


def config_method(qcfg: Any) -> str | None:
    """The scheme a quantization_config names (its quant_method, lower-cased), or None where the engine loads the
    weights as they are: no object, no (or an empty or null) quant_method, or gguf (`describes_checkpoint`)."""
    if not describes_checkpoint(qcfg):
        return None
    return _method_text(qcfg) or None


def flag_disagrees(qcfg: Any, flag: str | None) -> bool:
    """Whether a --quantization `flag` (None: not given) and a quantization_config name different schemes, which
    the engine refuses to start with. One without quant_method names none, and disagrees with any flag, as vLLM's
    config check has it (its quant_method, None, is not the flag's)."""
    return flag is not None and describes_checkpoint(qcfg) and flag_method(flag) != config_method(qcfg)


def flag_method(flag: str | None) -> str | None:
    """The scheme a --quantization value names: a kernel alias's format (`KERNEL_ALIASES`), else the value."""
    return KERNEL_ALIASES.get(flag, flag) if flag is not None else None


def weight_bits(qcfg: Any) -> int | None:
    """Bits of a linear weight under a quantization_config, as the engine loads them: compressed-tensors' config
    group's weights.num_bits (an integer), GPTQ's bits and AWQ's bits or w_bit (int() of the value, so `true` is 1 and
    "8" is 8; 4 when absent), fp8's 8, bitsandbytes' 4 (8 for load_in_8bit alone); None for no scheme or another
    one. ValueError, naming the value, for bits
    that are no number or that the scheme does not load (`CHECKPOINT_BITS`)."""
    method = config_method(qcfg)
    if method in ("fp8", "modelopt", "fbgemm_fp8"):
        return 8
    bits: int | None
    if method == "bitsandbytes":
        bits = 8 if qcfg.get("load_in_8bit") and not qcfg.get("load_in_4bit") else 4
    elif method in ("gptq", "awq"):
        value = _packed_bits_value(qcfg, method)
        bits = _engine_int(value)
        if bits is None:
            raise ValueError(f"{method}'s bits {value!r} is not a number of bits")
    elif method == "compressed-tensors":
        value = compressed_tensors_group(qcfg)["weights"].get("num_bits")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"compressed-tensors: weights' num_bits {value!r} is not a number of bits")
        bits = value
    else:
        return None
    if bits not in CHECKPOINT_BITS[method]:
        raise ValueError(f"{method} with {bits}-bit weights is not supported "
                         f"({' or '.join(map(str, CHECKPOINT_BITS[method]))} bits)")
    return bits


def config_weight_bits(qcfg: Any) -> int | None:
    """`weight_bits`, or None where the engine refuses the quantization_config's bits (the fit check's reading: the
    webhook refuses such a spec)."""
    try:
        return weight_bits(qcfg)
    except ValueError:
        return None


def packed_group_size(qcfg: dict[str, Any]) -> int | None:
    """Inputs a GPTQ or AWQ scale group spans, as the engine reads it: int() of group_size (AWQ's also
    q_group_size), -1 for GPTQ and 128 for AWQ when absent; None for one group a row (0 or less). ValueError for a
    value that is no number."""
    if config_method(qcfg) == "awq":
        value = qcfg.get("group_size", qcfg.get("q_group_size", 128))
    else:
        value = qcfg.get("group_size", -1)
    size = _engine_int(value)
    if size is None:
        raise ValueError(f"{config_method(qcfg)}'s group_size {value!r} is not a number of inputs")
    return size if size > 0 else None


def compressed_tensors_group(qcfg: dict[str, Any]) -> dict[str, Any]:
    """compressed-tensors' one config group (its targets, weights and input_activations), whose `weights` is an
    object. ValueError where config_groups holds another number of groups, or the group no weights object."""
    groups = qcfg.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise ValueError(f"compressed-tensors: config_groups is a {type(groups).__name__}, not an object of groups")
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors: {len(groups)} config groups; one group over the linear layers "
                         "is supported")
    name, group = next(iter(groups.items()))
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        raise ValueError(f"compressed-tensors: config group {name!r} has no weights object")
    return group


def compressed_tensors_group_size(weights: dict[str, Any]) -> int | None:
    """Inputs a scale group of compressed-tensors' integer weights spans, as the engine reads its config group's
    `weights`: group_size under strategy "group", None (one group a row) under any other. ValueError where strategy
    "group" has no positive integer group_size."""
    if weights.get("strategy") != "group":
        return None
    size = weights.get("group_size")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"compressed-tensors: weights' group_size {size!r} is not a number of inputs "
                         "(strategy group)")
    return size


def ignores_a_decoder_linear(entry: str) -> bool:
    """Whether an `ignore` entry names one of the decoder's linear layers, matched as compressed-tensors does: `re:`
    a regular expression (`re.match`) on the layer's name, else the name itself or its class (`Linear`). Entries
    that name none (the LM head, `re:.*lm_head$`, a mixture-of-experts router `re:.*mlp.gate$`) leave nothing of
    this model unquantized. ValueError for an entry that is no text or no regular expression."""
    if not isinstance(entry, str):
        raise ValueError(f"ignored layer {entry!r} is not a layer name")
    if entry == "Linear":
        return True
    if entry.startswith("re:"):
        try:
            pattern = re.compile(entry[3:])
        except re.error as exc:
            raise ValueError(f"ignored layer {entry!r} is not a regular expression ({exc})") from exc
        return any(pattern.match(f"model.layers.{i}.{p}") for i in range(_LAYERS) for p in _PROJECTIONS)
    return entry.removeprefix("model.").startswith("layers.") and entry.endswith(_PROJECTIONS)


def compressed_tensors_scheme(qcfg: dict[str, Any]) -> tuple[dict[str, Any], Any, str]:
    """compressed-tensors' one config group over the linear layers: its weights, input_activations (None: not
    quantized) and format. ValueError where the group targets more than the linear layers or `ignore` leaves one of
    the decoder's linear layers unquantized."""
    group = compressed_tensors_group(qcfg)
    if group.get("targets") != ["Linear"]:
        raise ValueError(f"compressed-tensors: targets {group.get('targets')}; only [\"Linear\"] is supported")
    unsupported = _decoder_linears_left_out(qcfg, "ignore")
    if unsupported:
        raise ValueError(f"compressed-tensors: ignored layers {unsupported[:3]} are not supported "
                         "(only the LM head may be left unquantized)")
    return group["weights"], group.get("input_activations"), group.get("format") or qcfg.get("format") or ""


def check_layout(qcfg: dict[str, Any]) -> None:
    """ValueError, in the engine's words and in the order it checks them, where the engine does not run the layout a
    checkpoint's quantization_config describes (its bits and group size included); nothing for one it runs. The
    engine calls it before building a scheme's linear method, the webhook for an --hf-overrides one."""
    method = config_method(qcfg)
    if method == "fp8":
        _check_fp8(qcfg)
    elif method == "modelopt":
        modelopt_settings(qcfg)
    elif method == "fbgemm_fp8":
        fbgemm_activation_ub(qcfg)
    elif method == "gptq":
        _check_gptq(qcfg)
    elif method == "awq":
        weight_bits(qcfg)  # 4
        version = str(qcfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"awq {version!r} checkpoints are not supported (4-bit gemm is)")
        packed_group_size(qcfg)
    elif method == "compressed-tensors":
        _check_compressed_tensors(qcfg)
    elif method == "bitsandbytes":
        _check_bnb(qcfg)


def bnb_quant_type(qcfg: dict[str, Any]) -> str:
    """A bitsandbytes 4-bit quantization_config's bnb_4bit_quant_type, lower-cased (fp4 when absent, as transformers'
    BitsAndBytesConfig has it)."""
    return str(qcfg.get("bnb_4bit_quant_type") or "fp4").lower()


def _check_bnb(qcfg: dict[str, Any]) -> None:
    """bitsandbytes 4-bit (load_in_4bit) nf4 or fp4 weights in uint8 storage, with or without double quantization,
    every decoder linear layer quantized (llm_int8_skip_modules may name the LM head and modules this engine does not
    build; engine/quantization/bnb.py). 8-bit (LLM.int8()) is refused."""
    weight_bits(qcfg)  # 4: load_in_8bit alone is 8, refused there
    if not qcfg.get("load_in_4bit"):
        raise ValueError("bitsandbytes: load_in_4bit is not true; 4-bit checkpoints (load_in_4bit) are supported")
    if bnb_quant_type(qcfg) not in ("nf4", "fp4"):
        raise ValueError(f"bitsandbytes: bnb_4bit_quant_type {qcfg.get('bnb_4bit_quant_type')!r}; nf4 or fp4 is "
                         "supported")
    storage = str(qcfg.get("bnb_4bit_quant_storage") or "uint8")
    if storage != "uint8":
        raise ValueError(f"bitsandbytes: bnb_4bit_quant_storage {storage!r}; uint8 is supported")
    entries = qcfg.get("llm_int8_skip_modules") or []
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"bitsandbytes: llm_int8_skip_modules {entries!r} is not a list of module names")
    kept = [e for e in entries if _skips_a_decoder_linear(e)]
    if kept:
        raise ValueError(f"bitsandbytes checkpoints with unquantized decoder layers (llm_int8_skip_modules "
                         f"{kept[:3]}) are not supported; only the LM head and other modules may be left out")


def _skips_a_decoder_linear(entry: str) -> bool:
    """Whether a llm_int8_skip_modules entry keeps one of the decoder's linear layers dense, matched as transformers
    does: the entry is a whole dotted part of the layer's name (`down_proj`, `mlp`, `layers.3.mlp.down_proj`)."""
    dotted = f".{entry.strip('.')}."
    return any(dotted in f".model.layers.{i}.{p}." for i in range(_LAYERS) for p in _PROJECTIONS)


def _check_fp8(qcfg: dict[str, Any]) -> None:
    """vLLM's own fp8 checkpoints: e4m3 weights with per-tensor scales, or block-scaled ones (Qwen3-*-FP8, DeepSeek:
    weight_block_size, `weight_scale_inv`) with dynamic activations (vLLM's rule)."""
    kept = _decoder_linears_left_out(qcfg, "ignored_layers")
    if kept:  # their bf16 weights would be cast into the fp8 parameters, unscaled
        raise ValueError(f"fp8 checkpoints with unquantized decoder layers (ignored_layers {kept[:3]}) are not "
                         "supported; only the LM head may be left out")
    if fp8_block_size(qcfg) is not None and qcfg.get("activation_scheme", "dynamic") != "dynamic":
        raise ValueError(f"fp8 checkpoints with weight_block_size and activation_scheme "
                         f"{qcfg.get('activation_scheme')!r} are not supported; block-scaled ones take dynamic")


def fp8_block_size(qcfg: Any) -> tuple[int, int] | None:
    """The `[block_n, block_k]` of a block-scaled fp8 quantization_config (fp8's weight_block_size, compressed-tensors'
    float weights under strategy "block": block_structure), None for another layout. ValueError where the block is
    not two positive integers."""
    method = config_method(qcfg)
    if method == "fp8":
        block, name = qcfg.get("weight_block_size"), "fp8's weight_block_size"
        if block is None:
            return None
    elif method == "compressed-tensors":
        try:
            weights = compressed_tensors_group(qcfg)["weights"]
        except ValueError:
            return None
        if weights.get("type") != "float" or weights.get("strategy") != "block":
            return None
        block, name = weights.get("block_structure"), "compressed-tensors: weights' block_structure"
    else:
        return None
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ValueError(f"{name} {block!r} is not two block sizes [rows, inputs]")
    return block[0], block[1]


def fp8_block_split_problem(block: tuple[int, int], layer: str, rows: list[int], last_whole: bool,
                            inputs: int | None, tp: int) -> str | None:
    """Why the engine cannot hold a linear layer's block-scaled fp8 weight (engine/quantization/fp8_block.py), or
    None: each shard of its output `rows` on a rank (a merged layer's parts; `last_whole`: the last is its whole
    checkpoint tensor, whose partial block is its own) a multiple of block_n, and a row-parallel rank's `inputs` (None:
    not split) a multiple of block_k; `layer` names its class, `tp` the tensor-parallel size."""
    inner = rows[:-1] if last_whole else rows
    if any(size % block[0] for size in inner):
        return (f"fp8 block-scaled weights: {layer} with {rows} output rows a shard (tensor parallel {tp}) splits "
                f"blocks of {block[0]} rows (weight_block_size {list(block)}); each shard needs a multiple of "
                f"{block[0]}")
    if inputs is not None and inputs % block[1]:
        return (f"fp8 block-scaled weights: {layer} with {inputs} inputs a rank (tensor parallel {tp}) splits blocks "
                f"of {block[1]} inputs (weight_block_size {list(block)}); each rank needs a multiple of {block[1]}")
    return None


def fp8_block_decoder_problem(block: tuple[int, int], hidden: int, heads: int, kv_heads: int, head_dim: int,
                              intermediate: int, tp: int) -> str | None:
    """`fp8_block_split_problem` of a dense decoder's linear layers as the engine builds them at `tp` ranks (q/k/v by
    heads, a KV head replicated where the ranks outnumber them; gate/up by rows; o and down by inputs), or None."""
    kv_rank = max(kv_heads // tp, 1) * head_dim
    split = tp > 1
    layers = (("QKVParallelLinear", [heads * head_dim // tp, kv_rank, kv_rank], kv_rank == kv_heads * head_dim, None),
              ("RowParallelLinear", [hidden], True, heads * head_dim // tp if split else None),
              ("MergedColumnParallelLinear", [intermediate // tp] * 2, not split, None),
              ("RowParallelLinear", [hidden], True, intermediate // tp if split else None))
    for layer, rows, last_whole, inputs in layers:
        if problem := fp8_block_split_problem(block, layer, rows, last_whole, inputs, tp):
            return problem
    return None


def _decoder_linears_left_out(qcfg: dict[str, Any], key: str) -> list[str]:
    """The entries of the layers a quantization_config leaves unquantized (`key`: compressed-tensors' ignore, fp8's
    ignored_layers) that name a decoder linear layer. ValueError, naming the scheme, where it is no list of names."""
    entries = qcfg.get(key) or []
    try:
        if not isinstance(entries, list):
            raise ValueError(f"{key} {entries!r} is not a list of layer names")
        return [name for name in entries if ignores_a_decoder_linear(name)]
    except ValueError as exc:
        raise ValueError(f"{config_method(qcfg)}: {exc}") from exc


def _check_gptq(qcfg: dict[str, Any]) -> None:
    """GPTQ in group order or activation order (desc_act, `act_order`) with a dense LM head, 4 or 8 bits."""
    weight_bits(qcfg)
    if qcfg.get("lm_head"):  # GPTQModel's quantized LM head: lm_head.qweight, which the dense head cannot load
        raise ValueError("gptq with a quantized LM head (lm_head: true) is not supported")
    packed_group_size(qcfg)


def _check_compressed_tensors(qcfg: dict[str, Any]) -> None:
    """FP8 float-quantized W8A8 / W8A16 per tensor or channel and W8A16 in blocks, int4 / int8 pack-quantized W4A16 /
    W8A16 per channel or in contiguous groups, int8 int-quantized W8A8 (`_check_int8_w8a8`)."""
    weights, activations, fmt = compressed_tensors_scheme(qcfg)
    bits, kind = weight_bits(qcfg), weights.get("type")
    if kind == "float" and bits == 8 and fmt in _FLOAT_FORMATS:
        if weights.get("strategy", "tensor") not in ("tensor", "channel", "block"):
            raise ValueError(f"compressed-tensors: fp8 weight strategy {weights['strategy']!r} is not supported; "
                             "per-tensor, per-channel and block are")
        if activations is not None and (not isinstance(activations, dict) or activations.get("type") != "float"
                                        or activations.get("num_bits") != 8):
            raise ValueError("compressed-tensors: fp8 weights need fp8 activations or none")
        if fp8_block_size(qcfg) is not None and activations is not None and not activations.get("dynamic"):
            # block weights run W8A16 (engine/quantization/fp8_block.py); a static input_scale has no place
            raise ValueError("compressed-tensors: fp8 block weights with static activation scales are not "
                             "supported; dynamic or none are")
        return
    if kind == "int" and bits == 8 and fmt == INT8_W8A8_FORMAT:
        _check_int8_w8a8(weights, activations)
        return
    if kind == "int" and bits in (4, 8) and fmt == "pack-quantized":
        if activations is not None:
            raise ValueError("compressed-tensors: pack-quantized integer weights with quantized activations are not "
                             "supported; W4A16 and W8A16 are (int8 W8A8 is format int-quantized)")
        strategy = weights.get("strategy")
        if strategy not in ("group", "channel"):
            raise ValueError(f"compressed-tensors: integer strategy {strategy!r}; group or channel is supported")
        _permuted_groups(weights)  # any actorder it names (group, dynamic: the inputs sorted at load)
        compressed_tensors_group_size(weights)
        return
    raise ValueError(f"compressed-tensors: {bits}-bit {kind} weights in format {fmt!r} are not supported "
                     "(supported: FP8 float-quantized W8A8 / W8A16, int4 / int8 pack-quantized W4A16 / W8A16, "
                     "int8 int-quantized W8A8)")


def compressed_tensors_int8_w8a8(qcfg: dict[str, Any]) -> bool:
    """Whether compressed-tensors' one config group is int8 W8A8 (integer weights in format int-quantized): the
    engine's int8 method (engine/quantization/int8.py) and the fit check's int8 codes with a float32 scale a row."""
    group = compressed_tensors_group(qcfg)
    fmt = group.get("format") or qcfg.get("format") or ""
    return group["weights"].get("type") == "int" and fmt == INT8_W8A8_FORMAT


def _check_int8_w8a8(weights: dict[str, Any], activations: Any) -> None:
    """llm-compressor's W8A8 (int8): symmetric int8 weights per channel or per tensor, symmetric int8 activations
    per token (dynamic) or per tensor (static). Zero points (asymmetric weights or activations) are not run."""
    if not weights.get("symmetric", True):
        raise ValueError("compressed-tensors: asymmetric int8 weights (weight_zero_point) are not supported; "
                         "symmetric W8A8 is")
    if weights.get("strategy") not in ("channel", "tensor"):
        raise ValueError(f"compressed-tensors: int8 W8A8 weight strategy {weights.get('strategy')!r}; channel or "
                         "tensor is supported")
    if not isinstance(activations, dict) or activations.get("type") != "int" or activations.get("num_bits") != 8:
        raise ValueError("compressed-tensors: int-quantized int8 weights need int8 input activations")
    if not activations.get("symmetric", True):
        raise ValueError("compressed-tensors: asymmetric int8 activations (input_zero_point) are not supported; "
                         "symmetric W8A8 is")
    dynamic, strategy = activations.get("dynamic"), activations.get("strategy")
    if not ((dynamic is True and strategy == "token") or (dynamic is False and strategy == "tensor")):
        raise ValueError(f"compressed-tensors: int8 activations {strategy!r} with dynamic {dynamic!r} are not "
                         "supported; dynamic per token or static per tensor is")


def act_order(qcfg: Any) -> bool:
    """Whether a quantization_config's integer groups follow a permutation of the inputs that the checkpoint stores
    as each input's group (GPTQ's `desc_act: true` with `g_idx`, compressed-tensors' actorder group / dynamic with
    `weight_g_idx`): the engine sorts the inputs by group at load and gathers the activations' columns to match
    (engine/quantization/packed_int.py). compressed-tensors' static / weight order only changed GPTQ's calibration
    and stores contiguous groups, as null does."""
    method = config_method(qcfg)
    if method == "gptq":
        return bool(qcfg.get("desc_act"))
    if method == "compressed-tensors":
        try:
            weights = compressed_tensors_group(qcfg)["weights"]
            return (weights.get("type") == "int" and not compressed_tensors_int8_w8a8(qcfg)  # W8A8: a scale a row
                    and _permuted_groups(weights))
        except ValueError:
            return False
    return False


def _permuted_groups(weights: dict[str, Any]) -> bool:
    """Whether compressed-tensors' integer `weights` store each input's group (actorder group or dynamic, and true,
    which compressed-tensors read as group; any case) rather than contiguous groups (null, false, static, weight).
    ValueError for another actorder."""
    actorder = weights.get("actorder")
    if actorder is None or isinstance(actorder, bool):
        return bool(actorder)
    name = str(actorder).lower()
    if name not in (*_CONTIGUOUS_ACTORDER, *_PERMUTED_ACTORDER):
        raise ValueError(f"compressed-tensors: actorder {actorder!r} is not one of "
                         f"{', '.join((*_CONTIGUOUS_ACTORDER, *_PERMUTED_ACTORDER))} or null")
    return name in _PERMUTED_ACTORDER


def act_order_parallel_problem(qcfg: Any, tensor_parallel_size: int,
                               flag: str = "--tensor-parallel-size") -> str | None:
    """Why the engine refuses an activation-order checkpoint (`act_order`) over `tensor_parallel_size` ranks (`flag`
    names where that is set), or None: the row-parallel layers (o_proj, down_proj) split their inputs over the ranks,
    and a rank's share of inputs, sorted by group, no longer makes whole groups of the size the kernels read."""
    if tensor_parallel_size <= 1 or not act_order(qcfg):
        return None
    return (f"{config_method(qcfg)} activation-order checkpoints (desc_act: true / actorder group: groups of permuted "
            f"inputs, g_idx) run with {flag} 1 only, not {tensor_parallel_size}: the row-parallel layers would split "
            "the permuted inputs over the ranks (pipeline parallelism runs them)")


def override_method_problem(qcfg: Any, quantization: str, field: str = "spec.quantization") -> str | None:
    """Why the engine would refuse to start with an --hf-overrides `quantization_config` of `qcfg` beside the
    --quantization it is given (`quantization`, "none" for none; `field` names where it is set), or None."""
    method = config_method(qcfg)
    flag = None if quantization == "none" else quantization
    if method is None:
        if not flag_disagrees(qcfg, flag):
            return None
        return (f"--hf-overrides: quantization_config has no quant_method, which does not match {field} "
                f"{quantization}; the engine refuses to start with both: leave {field} out or name the scheme in "
                "quant_method")
    if method not in CHECKPOINT_METHODS:
        return (f"--hf-overrides: quantization_config's quant_method {method!r} is not one the engine loads a "
                f"checkpoint with (supported: {', '.join(CHECKPOINT_METHODS)})")
    if flag_disagrees(qcfg, flag):  # checked first, as the engine does
        return (f"--hf-overrides: quantization_config's quant_method {method!r} does not match {field} "
                f"{quantization}; the engine refuses to start with both: leave {field} out or make them agree")
    try:
        check_layout(qcfg)
    except ValueError as exc:  # the engine's own refusal of it, in its words
        return f"--hf-overrides: quantization_config: {exc}"
    return None


def _method_text(qcfg: dict[str, Any]) -> str:
    """quant_method lower-cased, "" where it is absent, empty or null; "modelopt" for ModelOpt's hf_quant_config.json
    (no quant_method, its producer named modelopt), as vLLM reads it."""
    producer = qcfg.get("producer")
    if not qcfg.get("quant_method") and isinstance(producer, dict) and producer.get("name") == "modelopt":
        return "modelopt"
    return str(qcfg.get("quant_method") or "").lower()


def _packed_bits_value(qcfg: dict[str, Any], method: str) -> Any:
    """GPTQ's `bits`, AWQ's `bits` or `w_bit`, 4 when absent."""
    return qcfg.get("bits", qcfg.get("w_bit", 4)) if method == "awq" else qcfg.get("bits", 4)


def _engine_int(value: Any) -> int | None:
    """`int(value)` as the engine takes GPTQ/AWQ numbers (so `true` is 1 and "4" is 4), None where that fails."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def with_modelopt_file(hf_config: dict[str, Any], model_files: dict[str, Any] | None) -> dict[str, Any]:
    """`hf_config` with ModelOpt's `hf_quant_config.json` (`model_files`: its parsed text, None where the model has
    none) as its quantization_config where config.json has none, as vLLM reads an older ModelOpt export."""
    if model_files is None or "quantization_config" in hf_config:
        return hf_config
    return {**hf_config, "quantization_config": model_files}


def modelopt_settings(qcfg: dict[str, Any]) -> tuple[str, str | None]:
    """A ModelOpt quantization_config's weight algorithm and KV-cache algorithm (None: none), upper-cased, read as
    vLLM does: under `quantization` (hf_quant_config.json's layout: quant_algo, kv_cache_quant_algo, exclude_modules)
    or at the top (config.json's: quant_algo, kv_cache_quant_algo or an 8-bit float kv_cache_scheme, exclude_modules
    or ignore). ValueError for algorithms the engine does not run (`MODELOPT_FP8_ALGOS` it does) or an excluded decoder
    linear layer."""
    nested = qcfg.get("quantization")
    settings = nested if isinstance(nested, dict) else qcfg
    algo = str(settings.get("quant_algo") or "").upper()
    if algo not in MODELOPT_FP8_ALGOS:
        raise ValueError(f"modelopt quant_algo {settings.get('quant_algo')!r} is not supported; FP8 (per-tensor e4m3 "
                         "weights, static input scales) and FP8_PER_CHANNEL_PER_TOKEN are")
    kv = settings.get("kv_cache_quant_algo")
    scheme = settings.get("kv_cache_scheme")
    if kv is None and isinstance(scheme, dict) and scheme.get("type") == "float" and scheme.get("num_bits") == 8:
        kv = "FP8"
    if kv is not None and str(kv).upper() != "FP8":
        raise ValueError(f"modelopt kv_cache_quant_algo {kv!r} is not supported; FP8 or null is")
    key = "exclude_modules" if "exclude_modules" in settings else "ignore"
    entries = settings.get(key) or []
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"modelopt: {key} {entries!r} is not a list of layer names")
    kept = [e for e in entries if _modelopt_excludes_a_decoder_linear(e)]
    if kept:  # one method runs every decoder linear layer
        raise ValueError(f"modelopt checkpoints with unquantized decoder layers ({key} {kept[:3]}) are not "
                         "supported; only the LM head may be left out")
    return algo, None if kv is None else "FP8"


def _modelopt_excludes_a_decoder_linear(entry: str) -> bool:
    """Whether a ModelOpt exclude_modules entry names one of the decoder's linear layers, as vLLM matches them: a
    wildcard (`fnmatch`) on the layer's name or on a module above it, or whole dotted parts of the name (`self_attn`,
    `model.layers.3`; `lm_head` and a mixture-of-experts router's `model.layers.0.mlp.gate` name none: vLLM's plain
    substring test would take the router's for `mlp.gate_proj` of a dense model, where no such entry is written)."""
    dotted = f".{entry}."
    return (any(dotted in name for name in _DOTTED_DECODER_LINEARS)
            or bool(fnmatch.filter(_DECODER_LINEARS, entry) or fnmatch.filter(_DECODER_LINEARS, f"{entry}.*")))


def fbgemm_activation_ub(qcfg: dict[str, Any]) -> float:
    """fbgemm_fp8's upper bound on a token's activation absolute maximum (`activation_scale_ub`): its per-token
    scale is min(amax, bound) / 448. ValueError where it is no positive number, or where modules_to_not_convert
    leaves a decoder linear layer unquantized."""
    bound = qcfg.get("activation_scale_ub")
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0:
        raise ValueError(f"fbgemm_fp8's activation_scale_ub {bound!r} is not a positive number")
    kept = _decoder_linears_left_out(qcfg, "modules_to_not_convert")
    if kept:  # Meta's Llama-3.1-405B-FP8 keeps attention in bf16: a dense method a layer is not built yet
        raise ValueError(f"fbgemm_fp8 checkpoints with unquantized decoder layers (modules_to_not_convert "
                         f"{kept[:3]}) are not supported; only the LM head may be left out")
    return float(bound)


def checkpoint_kv_cache_dtype(kv_cache_dtype: str, qcfg: Any) -> str:
    """The KV-cache dtype the engine runs for --kv-cache-dtype `kv_cache_dtype`: `auto` over a ModelOpt checkpoint
    whose KV-cache algorithm is FP8 is fp8_e4m3 (vLLM's reading: the checkpoint's k_scale / v_scale were calibrated
    for it); any other value as given."""
    if kv_cache_dtype != "auto" or config_method(qcfg) != "modelopt":
        return kv_cache_dtype
    try:
        return "fp8_e4m3" if modelopt_settings(qcfg)[1] == "FP8" else kv_cache_dtype
    except ValueError:  # refused where the scheme is resolved
        return kv_cache_dtype
