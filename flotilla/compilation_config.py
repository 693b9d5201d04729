"""vLLM's --compilation-config and -O (--optimization-level), read for what they mean here: whether steps replay CUDA
graphs, and of which sizes (engine/cuda_graphs.py).

Flotilla compiles nothing with torch.compile: its graphs capture whole steps (decode steps, and mixed steps that hold
a prefill), which is what vLLM's full graphs do. So of vLLM's compilation settings only the graph ones have a meaning
here: `cudagraph_capture_sizes` (the captured sizes), `max_cudagraph_capture_size` (the largest, as the flag of that
name), `cudagraph_mode` NONE (no graphs) or FULL / FULL_AND_PIECEWISE (graphs of both kinds of step), and `level` /
`mode` 0 (no compilation, hence no graphs, as vLLM) or 3 (vLLM's own compilation and graphs, its default); `-O0`
is no compilation and no graphs, `-O2` (vLLM's default) and `-O3` capture the engine's graphs, and so does `-O1`,
whose PIECEWISE graphs do not exist here (`level_note`). Every other key is refused by name rather than ignored.
Standard library only: the operator checks spec.engineArgs with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FLAG = "--compilation-config"
# cudagraph_mode -> whether steps replay graphs here (both kinds of step, as vLLM's full graphs).
GRAPH_MODES = {"NONE": False, "FULL": True, "FULL_AND_PIECEWISE": True}
# vLLM's modes with no counterpart here, each with why.
REFUSED_MODES = {
    "PIECEWISE": "graphs here capture whole steps, attention included (vLLM's FULL); none are captured piecewise",
    "FULL_DECODE_ONLY": "mixed steps (a prefill beside decodes) replay graphs too here; use "
                        "max_cudagraph_capture_size or cudagraph_capture_sizes to bound them",
}
# level / mode: 0 compiles nothing and captures no graphs; 3 is vLLM's compilation with its graphs (the default).
# 1 and 2 are torch.compile without vLLM's graphs: nothing here maps onto them.
LEVELS = {0: False, 3: True}
# vLLM's CompilationMode names, which `mode` takes as well as the numbers (case-insensitive, as vLLM's validator).
MODE_NAMES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
KEYS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size", "max_capture_size", "cudagraph_mode", "level",
        "mode")


@dataclass(frozen=True)
class GraphPlan:
    """What the flags ask of CUDA graphs: none at all (`eager`), or the captured sizes (None: the engine's ladders,
    up to `max_capture_size` when set)."""

    eager: bool
    max_capture_size: int | None
    capture_sizes: tuple[int, ...] | None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _normalized(value: dict[str, Any]) -> dict[str, Any]:
    """`value` with vLLM's spellings made canonical: cudagraph_mode in any case ("full"), mode by name
    ("VLLM_COMPILE"); vLLM's validators read both so. Anything else stays as given (for the checks to name)."""
    out = dict(value)
    if isinstance(out.get("cudagraph_mode"), str):
        out["cudagraph_mode"] = out["cudagraph_mode"].upper()
    if isinstance(out.get("mode"), str) and out["mode"].upper() in MODE_NAMES:
        out["mode"] = MODE_NAMES[out["mode"].upper()]
    return out


def _key_problem(key: str, item: Any) -> str | None:
    if key not in KEYS:
        return (f"{FLAG}: {key}: not a key this engine maps (it takes {', '.join(KEYS)}): nothing is compiled with "
                "torch.compile here, and the CUDA graphs are all these set")
    if key == "cudagraph_capture_sizes":
        if not isinstance(item, list) or not item or not all(_is_int(s) and s >= 1 for s in item):
            return f"{FLAG}: cudagraph_capture_sizes must be a non-empty list of integers >= 1, not {json.dumps(item)}"
    elif key in ("max_cudagraph_capture_size", "max_capture_size"):
        if not _is_int(item) or item < 1:
            return f"{FLAG}: {key} must be an integer >= 1, not {json.dumps(item)}"
    elif key == "cudagraph_mode":
        if isinstance(item, str) and item in REFUSED_MODES:  # a list or object is unhashable: the message below
            return f"{FLAG}: cudagraph_mode {item} is not supported: {REFUSED_MODES[item]}"
        if not isinstance(item, str) or item not in GRAPH_MODES:
            return f"{FLAG}: cudagraph_mode must be one of {', '.join([*GRAPH_MODES, *REFUSED_MODES])}, not " \
                   f"{json.dumps(item)}"
    elif not _is_int(item) or item not in LEVELS:  # level, mode (an int first: a list or object is unhashable)
        return (f"{FLAG}: {key} {json.dumps(item)} is not supported: 0 (no compilation, no CUDA graphs) or 3 (vLLM's "
                "compilation and graphs; here the engine's graphs) are; 1 and 2 compile without graphs, and nothing "
                "is compiled here")
    return None


def compilation_problem(value: Any, max_capture_flag: int | None = None, max_num_seqs: int = 256) -> str | None:
    """Why the engine would refuse `value` (--compilation-config's parsed JSON) beside --max-cudagraph-capture-size
    `max_capture_flag` and --max-num-seqs, or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"{FLAG} must be a JSON object"
    value = _normalized(value)
    for key, item in value.items():
        if problem := _key_problem(key, item):
            return problem
    largest = [v for v in (value.get("max_cudagraph_capture_size"), value.get("max_capture_size"), max_capture_flag)
               if v is not None]
    sizes = value.get("cudagraph_capture_sizes")
    if sizes is not None:
        largest.append(max(sizes))
    if len(set(largest)) > 1:
        return (f"{FLAG}: the largest captured size is given as {' and '.join(map(str, sorted(set(largest))))} "
                "(max_cudagraph_capture_size, --max-cudagraph-capture-size, the largest of cudagraph_capture_sizes): "
                "give one")
    if sizes is not None and min(sizes) > max_num_seqs:
        return (f"{FLAG}: cudagraph_capture_sizes has no size up to --max-num-seqs ({max_num_seqs}): no decode step "
                "could replay a graph; add the decode batch sizes to capture")
    return None


def level_note(value: dict[str, Any] | None, optimization_level: int | None, enforce_eager: bool) -> str | None:
    """What the start-up log says where the optimization level means other graphs here than in vLLM, or None.

    vLLM's levels (its OptimizationLevel): -O0 no compilation and no graphs; -O1 PIECEWISE graphs (attention runs
    outside them); -O2 (the default) and -O3 FULL_AND_PIECEWISE (full graphs for decode steps, piecewise ones for
    the rest). Piecewise graphs need vLLM's compiler, which does not exist here, so -O1 gets the nearest graphs there
    are, the whole-step ones -O2 gets: every step vLLM's -O1 would replay from a graph replays one here too, with
    attention inside. The log says so rather than let -O1 pass for vLLM's level.
    """
    if optimization_level != 1 or enforce_eager or any(k in _normalized(value or {}) for k in ("cudagraph_mode",
                                                                                                  "mode", "level")):
        return None
    return ("-O1: vLLM captures PIECEWISE CUDA graphs at this level (attention outside the graphs); there are none "
            "here, so the steps replay the engine's whole-step graphs, as at -O2 (give -O0 for no graphs)")


def graph_plan(value: dict[str, Any] | None, optimization_level: int | None, enforce_eager: bool,
               max_capture_flag: int | None) -> GraphPlan:
    """The CUDA graphs asked for (a value `compilation_problem` accepts). As vLLM: --enforce-eager means none; a key
    the user set wins over the optimization level's default (-O0: none; -O1 to -O3: graphs)."""
    value = _normalized(value or {})
    if "cudagraph_mode" in value:
        graphs = GRAPH_MODES[value["cudagraph_mode"]]
    elif "mode" in value or "level" in value:
        graphs = LEVELS[value["mode"] if "mode" in value else value["level"]]
    else:
        graphs = optimization_level != 0
    sizes = value.get("cudagraph_capture_sizes")
    largest = value.get("max_cudagraph_capture_size", value.get("max_capture_size", max_capture_flag))
    return GraphPlan(eager=enforce_eager or not graphs,
                     max_capture_size=largest if largest is not None else (max(sizes) if sizes else None),
                     capture_sizes=tuple(sorted(set(sizes))) if sizes else None)
