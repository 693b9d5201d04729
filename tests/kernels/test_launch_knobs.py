"""One parser for every kernel's launch-knob strings (`launch_knobs.py`): each documented and committed string reads as
it did under the kernels' own parsers (the snapshot taken before, `launch_knobs_before.json`), every launch each card
resolves is the same, what was refused is still refused (now always a ValueError naming the variable), and the
per-variable differences (names, values, every-shape entries) hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BEFORE = json.loads((HERE / "launch_knobs_before.json").read_text())
_TILE_VARIABLES = ("FLOTILLA_GEMV_CONFIG", "FLOTILLA_FP8_ROW_GEMV_CONFIG", "FLOTILLA_GATED_GEMV_CONFIG",
                   "FLOTILLA_SKINNY_GEMM_CONFIGS", "FLOTILLA_INT4_GEMV_TILES", "FLOTILLA_INT4_GEMV_WIDE_CONFIG",
                   "FLOTILLA_INT4_WIDE_PDL_CONFIG", "FLOTILLA_LM_HEAD_GEMV")  # fmt: skip


def _clean_env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _TILE_VARIABLES} | extra


def test_every_string_and_every_cards_launch_as_before():
    """`knob_cases.py` in a fresh interpreter without the tile variables: each parser's result on every documented and
    committed string, and each kernel's launch on DEFAULT, the H100, the H200 and a card without tables, equal the
    snapshot the kernels' own parsers gave."""
    out = subprocess.run([sys.executable, str(HERE / "knob_cases.py")], env=_clean_env(), capture_output=True,
                         text=True, check=True, timeout=300).stdout  # fmt: skip
    now = json.loads(out)
    assert now.keys() == BEFORE.keys()
    assert {k: v for k, v in now.items() if v != BEFORE[k]} == {}


def _parsers() -> dict:
    from flotilla.kernels import (
        dispatch,
        triton_fp8_row_gemv,
        triton_gated_gemv,
        triton_gemv,
        triton_int4_gemv,
        triton_skinny_gemm,
    )

    return {"gemv": (triton_gemv.parse_tiles, "FLOTILLA_GEMV_CONFIG"),
            "fp8": (triton_fp8_row_gemv.parse_configs, "FLOTILLA_FP8_ROW_GEMV_CONFIG"),
            "fp8-knobs": (triton_fp8_row_gemv.parse_config, "FLOTILLA_FP8_ROW_GEMV_CONFIG"),
            "gated": (triton_gated_gemv.parse_config, "FLOTILLA_GATED_GEMV_CONFIG"),
            "skinny": (triton_skinny_gemm.parse_configs, "FLOTILLA_SKINNY_GEMM_CONFIGS"),
            "skinny-knobs": (triton_skinny_gemm.parse_config, "FLOTILLA_SKINNY_GEMM_CONFIGS"),
            "int4": (triton_int4_gemv._parse_tiles, "FLOTILLA_INT4_GEMV_TILES"),
            "lm_head": (dispatch.lm_head_gemv_knobs, "FLOTILLA_LM_HEAD_GEMV")}  # fmt: skip


@pytest.mark.parametrize("case", sorted(k for k, v in BEFORE.items() if v == "refused"))
def test_what_was_refused_is_a_value_error_naming_the_variable(case):
    """Every string a kernel's own parser refused (the skinny GEMM's with a bare KeyError or int() error) is refused,
    as a ValueError that names the variable a user set."""
    name, _, text = case.partition(" ")
    parse, variable = _parsers()[name]
    with pytest.raises(ValueError, match=variable):
        parse(eval(text))  # the snapshot's keys hold the string's repr


def test_int4_tile_names_are_checked():
    """A misspelt int4 knob was kept and never read (the kernel looked `block_n` up and took the lead's): now it is
    refused, naming the variable; the old, removed `fast` knob (session 10) too. Fails before the shared parser."""
    from flotilla.kernels.triton_int4_gemv import _parse_tiles

    for bad in ("4096x4096:blok_n=64", "block_n=16,fast=1", "4096x4096:block_n=-1"):
        with pytest.raises(ValueError, match="FLOTILLA_INT4_GEMV_WIDE_CONFIG"):
            _parse_tiles(bad, "FLOTILLA_INT4_GEMV_WIDE_CONFIG")
    env = _clean_env(FLOTILLA_INT4_GEMV_WIDE_CONFIG="4096x4096:blok_n=64")
    code = "import flotilla.kernels.triton_int4_gemv_wide"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "FLOTILLA_INT4_GEMV_WIDE_CONFIG: bad knob 'blok_n=64'" in run.stderr


def test_syntax_differences_are_parameters():
    """The variables differ only where their syntax says: FLOTILLA_GEMV_CONFIG takes no every-shape entry and no 0;
    the fp8 row GEMV takes both; the LM head's sizes are 1..65535 and its dot a 0/1 switch."""
    from flotilla.kernels import dispatch, triton_fp8_row_gemv, triton_gemv

    both = {None: {"trigger": 0}, (6144, 4096): {"block_n": 8}}
    assert triton_fp8_row_gemv.parse_configs("t=0;6144x4096:bn=8") == both
    for bad in ("bn=8", "4096x4096:bn=0"):
        with pytest.raises(ValueError, match="FLOTILLA_GEMV_CONFIG"):
            triton_gemv.parse_tiles(bad)
    with pytest.raises(ValueError, match=r"bad knob 'bn=0' \(expected bn=, bk=, sk=, w=, s= integers >= 1\)"):
        triton_gemv.parse_tiles("4096x4096:bn=0")
    with pytest.raises(ValueError, match=r"integers 1\.\.65535; dot= 0 or 1"):
        dispatch.lm_head_gemv_knobs("dot=2")
    assert dispatch.lm_head_gemv_knobs("bn=65535,dot=1") == {"block_n": 65535, "use_dot": True}


def test_tables_print_as_they_parse():
    """Each kernel's committed tables, printed by its syntax (`table_spec`, `spec`), parse back to themselves; a
    configuration's `spec()` is its full knob list in the syntax's order."""
    from flotilla.kernels import (
        triton_fp8_row_gemv,
        triton_gated_gemv,
        triton_gemv,
        triton_int4_gemv,
        triton_int4_gemv_wide,
        triton_skinny_gemm,
    )

    for knobs, tables in ((triton_gemv.KNOBS, triton_gemv.ONE_ROW_TILES),
                          (triton_fp8_row_gemv.KNOBS, triton_fp8_row_gemv.MEASURED_CONFIGS),
                          (triton_int4_gemv.KNOBS, triton_int4_gemv_wide.MEASURED_TILES)):  # fmt: skip
        for spec in tables.values():
            table = knobs.table(spec)
            assert knobs.table(knobs.table_spec(table)) == table
    cfg = triton_fp8_row_gemv.default_config(6144, 4096, 132)
    assert triton_fp8_row_gemv.default_config(6144, 4096, 132, **triton_fp8_row_gemv.parse_config(cfg.spec())) == cfg
    assert triton_gated_gemv.GatedGemvConfig(8, 512, 4, 2).spec() == "bn=8,bk=512,w=4,s=2"
    skinny = triton_skinny_gemm.SkinnyGemmConfig(block_n=64, split_k=2)
    assert skinny.spec() == "bn=64,bk=64,sk=2,w=4,s=4,t=0" and triton_skinny_gemm.parse_config(skinny.spec()) == skinny
