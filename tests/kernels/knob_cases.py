"""Every launch-knob string the project documents or commits, parsed by each kernel's parser, and the launch each
card resolves from the committed tables: the cases `test_launch_knobs.py` compares with the snapshot taken before the
kernels shared one parser (`launch_knobs_before.json`, written by running this file on that commit:
`python tests/kernels/knob_cases.py > tests/kernels/launch_knobs_before.json`, with no FLOTILLA_* tile variable set).
Rewritten the same way when a card's table changes on purpose (session 29: the H200's own one-row entries).

Each case is `"<parser> <string>"` -> the parsed value (repr) or "refused" (any exception); the resolved launches are
`"<kernel> <card> <shape>"` -> the configuration's repr.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

H100, H200, OTHER = "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB"
CARDS = (None, H100, H200, OTHER)
# Llama-3.1-8B's projections (weight rows x K), and a shape no table names
SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (2048, 8192))

GEMV = [
    "6144x4096:bn=16,bk=512,sk=1,w=2,s=2;4096x4096:bn=8,bk=512,sk=1,w=4,s=3;4096x14336:bn=8,bk=1024,sk=1,w=4,s=2",
    "4096x4096:bn=8,bk=512,w=4,s=2;4096x14336:bn=16", "4096x4096:bn=16,bk=256,sk=1,w=8,s=3;6144x4096:bn=32", "",
    " 4096 x 4096 : bn = 8 ; ", "4096x4096:bn=8;4096x4096:w=2",
    # refused
    "bn=16", "4096x:bn=1", "4096x4096:zz=1", "4096x4096:bn=0", "4096x4096:bn=x", "4096x4096x2:bn=1", ":bn=8",
    "4096x4096:bn", "4096x4096:bn=-1", "ax4096:bn=1",
]
FP8 = [
    "6144x4096:bn=8,p=3;4096x4096:bn=16,bk=1024;4096x14336:bn=16,bk=1024",
    "6144x4096:bn=8,bk=512,w=2,p=3,t=0,d=1;4096x4096:bn=16,bk=1024,w=4,p=3,t=1,d=1;"
    "28672x4096:bn=4,bk=512,w=4,p=2,t=0,d=1;4096x14336:bn=8,bk=1024,w=4,p=2,t=0,d=1",
    "bn=16,bk=512,w=4,p=2,t=0,d=1", "6144x4096:bn=16;4096x4096:bn=8,w=2", "w=2; 6144x4096:bn=16,p=3;28672x4096:bn=8",
    "bn=4,p=1;40x64:bn=8", "40x64:d=0", "6144x4096:bn=256", "6144x4096:w=2", "6144x4096:bn=16,w=8", "", "bn=8,p=3",
    "d=0", "bn=8, bk=1024,w=8,p=3,t=1,d=0",
    # refused
    "stages=3", "6144*4096:bn=16", ":bn=8", "6144x4096:bn=x", "bn=-1", "6144x:bn=1", "bn",
]
GATED = [
    "bn=4,bk=512,w=4,s=3", "bn=4,bk=1024,w=4,s=3", "bn=4, bk=1024,w=8,s=3", "", "bn=8,s=2", "bn=8,bk=512,w=4,s=2",
    # refused
    "bn=8,split=2", "bn=x", "bn", "bn=-1", "4096x4096:bn=4",
]
SKINNY = [
    "4096x4096@64:bn=64,bk=128,sk=1,w=4,s=6,t=1; 6144x4096@32:bn=64;28672x4096@64+silu:sk=2",
    "4096x4096@64:cublas;28672x4096@64+silu:bn=64", "",
    # refused
    "4096x4096@64:zz=1", "4096x4096@64:bn=x", "4096x@64:bn=1", "4096x4096@:bn=1",
]
SKINNY_KNOBS = ["bn=128,bk=64,sk=2,w=4,s=5", "bn=64,bk=128,sk=1,w=4,s=6,t=1", "", "zz=1", "bn=x"]
INT4 = [
    "block_n=16,block_w=128,num_warps=4,num_stages=1;"
    "6144x4096:block_n=16,block_w=128,num_warps=4,num_stages=1,split_k=2,layout=1;"
    "4096x4096:block_n=16,block_w=128,num_warps=4,num_stages=1,split_k=2,layout=1;"
    "28672x4096:block_n=16,block_w=128,num_warps=2,num_stages=1,split_k=1,layout=1;"
    "4096x14336:block_n=32,block_w=128,num_warps=4,num_stages=1,split_k=4,layout=1",
    "6144x4096:block_n=16,block_w=128,split_k=2,num_warps=4,num_stages=1,layout=1;"
    "4096x4096:block_n=16,block_w=128,split_k=2,num_warps=4,num_stages=1,layout=1;"
    "28672x4096:block_n=16,block_w=128,split_k=1,num_warps=4,num_stages=1,layout=1;"
    "4096x14336:block_n=16,block_w=128,split_k=4,num_warps=4,num_stages=1,layout=1",
    "6144x4096:use_dot=1,block_n=128,num_warps=4,num_stages=3;4096x4096:use_dot=1,block_n=128,num_warps=4,"
    "num_stages=3;28672x4096:use_dot=1,block_n=128,num_warps=4,num_stages=3;4096x14336:use_dot=1,block_n=128,"
    "num_warps=4,num_stages=3",
    "6144x4096:block_n=16,block_w=128,num_warps=4,num_stages=1,split_k=2;4096x4096:block_n=16,block_w=128,"
    "num_warps=4,num_stages=1",
    "use_dot=0,block_n=32, block_w=128;4096x4096:use_dot=1,block_n=128",
    "block_n=16,block_w=64;4096x14336:split_k=4,num_stages=2", "4096x4096:block_n=64,split_k=1",
    "6144x4096:block_n=256", "block_n=32,block_w=64", "block_n=32,block_w=128;4096x14336:split_k=4", "",
    "4096x4096:;block_n=8", "block_n=8;",
    # refused
    "4096x4096:block_n=x", "ax4096:block_n=1", "4096x4096:block_n",
]
LM_HEAD = [
    "bn=16,bk=1024,w=4,s=2,dot=0", "bn=16,bk=1024,sk=1,w=4,s=1,dot=0", "", " 0 ", "1",
    "bn=8,bk=1024,w=8,s=3,sk=1,dot=0", "dot=1, bn=64", "bn=256,bk=64,w=4,s=2", "BN=8", "bn=65535",
    # refused
    "2", "on=1", "bn=0", "bn=x", "dot=2", "bn", "bn=65536", "bn=8,w",
]


def _parsed(parse: Any, text: str) -> str:
    try:
        return repr(parse(text))
    except Exception:  # every refusal counts, whatever it raised before
        return "refused"


def parse_cases() -> dict[str, str]:
    """Each parser's result on each string."""
    from flotilla.kernels import (
        dispatch,
        triton_fp8_row_gemv,
        triton_gated_gemv,
        triton_gemv,
        triton_int4_gemv,
        triton_int4_gemv_wide,
        triton_skinny_gemm,
    )

    parsers = {
        "gemv": (triton_gemv.parse_tiles, GEMV + list(triton_gemv.ONE_ROW_TILES.values())),
        "fp8": (triton_fp8_row_gemv.parse_configs, FP8 + list(triton_fp8_row_gemv.MEASURED_CONFIGS.values())),
        "fp8-knobs": (triton_fp8_row_gemv.parse_config, [s for s in FP8 if ":" not in s and ";" not in s]),
        "gated": (triton_gated_gemv.parse_config, GATED + list(triton_gated_gemv.ONE_ROW_CONFIGS.values())),
        "skinny": (triton_skinny_gemm.parse_configs, SKINNY + list(triton_skinny_gemm.MEASURED_CONFIGS.values())),
        "skinny-knobs": (triton_skinny_gemm.parse_config, SKINNY_KNOBS),
        "int4": (triton_int4_gemv._parse_tiles, INT4 + list(triton_int4_gemv_wide.MEASURED_TILES.values())),
        "lm_head": (dispatch.lm_head_gemv_knobs, LM_HEAD),
    }
    return {f"{name} {text!r}": _parsed(parse, text) for name, (parse, texts) in parsers.items() for text in texts}


def launch_cases() -> dict[str, str]:
    """The launch each kernel resolves on each card from the committed tables (no environment)."""
    from flotilla.kernels import triton_fp8_row_gemv as fp8
    from flotilla.kernels import triton_gated_gemv as gated
    from flotilla.kernels import triton_gemv, triton_int4_gemv, triton_int4_gemv_wide, triton_skinny_gemm

    out = {}
    for card in CARDS:
        for n, k in SHAPES:
            at = f"{card} {n}x{k}"
            for m in (1, 2):
                out[f"gemv m{m} {at}"] = repr(triton_gemv.default_config(m, n, k, 132, card=card))
            out[f"fp8 {at}"] = repr(fp8.default_config(n, k, 132, **fp8.env_knobs(n, k, card)))
            out[f"fp8 gated {at}"] = repr(fp8.default_config(n // 2, k, 132, gated=True, **fp8.env_knobs(n, k, card)))
            out[f"gated {at}"] = repr(gated.default_config(1, n // 2, k, 132, **gated.one_row_knobs(1, card)))
            for pdl in (False, True):
                out[f"int4 wide pdl{pdl} {at}"] = repr(triton_int4_gemv_wide.wide_config(1, n, k, 132, pdl=pdl,
                                                                                          card=card))  # fmt: skip
    for n, k in SHAPES + ((128256, 4096),):
        out[f"int4 {n}x{k}"] = repr(triton_int4_gemv.default_config(1, n, k, 132))
        for m in (32, 64, 128):
            for g in (False, True):
                rows = n // 2 if g else n
                out[f"skinny m{m} gated{g} {n}x{k}"] = repr(triton_skinny_gemm.default_config(m, rows, k, 132, g))
                out[f"skinny cublas m{m} gated{g} {n}x{k}"] = repr(triton_skinny_gemm.cublas_preferred(m, n, k, g))
    return out


def cases() -> dict[str, str]:
    """Parse and launch cases together."""
    return parse_cases() | launch_cases()


if __name__ == "__main__":
    if any(v.startswith("FLOTILLA_") and ("CONFIG" in v or "TILES" in v or v == "FLOTILLA_LM_HEAD_GEMV")
           for v in os.environ):  # fmt: skip
        sys.exit("unset the FLOTILLA_* tile variables first: the cases are the committed tables'")
    json.dump(cases(), sys.stdout, indent=0, sort_keys=True)
    print()
