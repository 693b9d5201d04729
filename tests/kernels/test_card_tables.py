"""Measured launch tables per card (`card_tables.py`): each kernel family's lookup takes the card's own table, else
DEFAULT's (today's tables: what every card ran before); tensors off CUDA get DEFAULT's, so CPU behaviour is unchanged;
a table set in-process (the in-engine sweep) reaches every card's; the environment's table replaces every card's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_cases import DEVICE, linear_case

from flotilla.kernels.card_tables import DEFAULT, H100, H200, device_card, for_card, shape_knobs

OTHER = "NVIDIA A100-SXM4-80GB"  # a card without tables of its own


def test_lookup_falls_back_to_default_and_cpu_tensors_have_no_card():
    """`for_card`: the card's entry, else DEFAULT's (an unknown card, no card); `device_card` is None off CUDA;
    `shape_knobs` overlays a shape's knobs on every shape's."""
    tables = {DEFAULT: "h100", H200: "h200"}
    assert for_card(tables, H200) == "h200"
    assert for_card(tables, H100) == for_card(tables, OTHER) == for_card(tables, None) == "h100"
    assert device_card(torch.zeros(1)) is None
    if DEVICE.type == "cuda":
        assert device_card(torch.zeros(1, device=DEVICE)) == torch.cuda.get_device_name(DEVICE)
    assert shape_knobs({None: {"a": 1, "b": 2}, (4, 8): {"b": 3}}, 4, 8) == {"a": 1, "b": 3}


def test_int4_wide_o_proj_tile_is_the_h200s_own():
    """The H200 runs o_proj at 8 rows x 256 words without split-K (session 25's in-engine descent); every other card
    and every other shape keeps DEFAULT's (the H100's) tile."""
    from flotilla.kernels.triton_int4_gemv_wide import wide_config

    def knobs(n, k, card):
        c = wide_config(1, n, k, 132, card=card)
        return (c.block_n, c.block_w, c.num_warps, c.num_stages, c.split_k, c.layout)

    assert knobs(4096, 4096, H200) == (8, 256, 4, 1, 1, 1)
    assert knobs(4096, 4096, H100) == knobs(4096, 4096, OTHER) == knobs(4096, 4096, None) == (16, 128, 4, 1, 2, 1)
    for n, k in ((6144, 4096), (28672, 4096), (4096, 14336), (2048, 8192)):
        assert knobs(n, k, H200) == knobs(n, k, None)


def test_int4_set_tiles_reaches_every_card_and_restores(monkeypatch):
    """`set_wide_tiles` (the sweep) changes the shape on every card's table; `restore_wide_tiles` brings each back."""
    from flotilla.kernels import triton_int4_gemv_wide as wide

    monkeypatch.setattr(wide, "_WIDE_TILES", dict(wide._WIDE_TILES))
    monkeypatch.setattr(wide, "_CARD_TILES", {c: dict(t) for c, t in wide._CARD_TILES.items()})
    tile = {"block_n": 32, "block_w": 64, "num_warps": 8, "num_stages": 2, "split_k": 1, "layout": 0}
    previous = wide.set_wide_tiles({(4096, 4096): tile})
    for card in (H200, None):
        c = wide.wide_config(1, 4096, 4096, 132, card=card)
        assert (c.block_n, c.block_w, c.num_warps, c.num_stages, c.split_k, c.layout) == (32, 64, 8, 2, 1, 0)
    wide.restore_wide_tiles(previous)
    assert wide.wide_config(1, 4096, 4096, 132, card=H200).block_n == 8
    assert wide.wide_config(1, 4096, 4096, 132, card=None).block_n == 16


def test_environment_table_replaces_every_cards():
    """FLOTILLA_INT4_GEMV_WIDE_CONFIG (read at import) is the table on the H200 too."""
    env = dict(os.environ, FLOTILLA_INT4_GEMV_WIDE_CONFIG="4096x4096:block_n=64,split_k=1")
    code = ("from flotilla.kernels.triton_int4_gemv_wide import wide_config; "
            "print(wide_config(1, 4096, 4096, 132, card='NVIDIA H200').block_n)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=300).stdout  # fmt: skip
    assert out.split() == ["64"]


def test_fp8_row_knobs_per_card(monkeypatch):
    """The fp8 row GEMV's measured knobs come from the card's table, else DEFAULT's (session 16's H100 winners); the
    environment's knobs still win."""
    from flotilla.kernels import triton_fp8_row_gemv as row

    assert row.env_knobs(6144, 4096) == {"block_n": 8, "prefetch": 3}
    assert row.env_knobs(6144, 4096, OTHER) == row.env_knobs(6144, 4096)
    monkeypatch.setattr(row, "_MEASURED", {**row._MEASURED, H200: row.parse_configs("6144x4096:bn=16,w=8")})
    assert row.env_knobs(6144, 4096, H200) == {"block_n": 16, "num_warps": 8}
    h100 = {"block_n": 8, "block_k": 512, "num_warps": 2, "prefetch": 3, "trigger": 0, "use_pdl": 1}  # session 25
    assert row.env_knobs(6144, 4096, H100) == h100
    monkeypatch.setattr(row, "ENV_CONFIGS", row.parse_configs("6144x4096:w=2"))
    assert row.env_knobs(6144, 4096, H200) == {"block_n": 16, "num_warps": 2}


def test_gated_one_row_knobs_per_card(monkeypatch):
    """The gated GEMV's one-row knobs: the card's entry (the H100's since session 25), else the lead; it applies at
    one row only, under FLOTILLA_GATED_GEMV_CONFIG's."""
    from flotilla.kernels import triton_gated_gemv as gated

    assert gated.one_row_knobs(1, OTHER) == gated.one_row_knobs(1, None) == {}
    for card in (H100, H200):  # session 25's and session 29's in-engine descents chose the same knobs
        assert gated.one_row_knobs(1, card) == {"block_n": 4, "block_k": 1024, "num_warps": 4, "num_stages": 3}
    monkeypatch.setattr(gated, "_ONE_ROW", {DEFAULT: {}, H200: gated.parse_config("bn=8,s=2")})
    assert gated.one_row_knobs(1, H200) == {"block_n": 8, "num_stages": 2}
    assert gated.one_row_knobs(2, H200) == {} and gated.one_row_knobs(1, OTHER) == {}


def test_bf16_one_row_table_parsing():
    """FLOTILLA_GEMV_CONFIG's syntax (`NxK:bn=,bk=,sk=,w=,s=`) round-trips through `tiles_spec`; bad shapes and knobs
    are ValueErrors naming the variable."""
    from flotilla.kernels.triton_gemv import parse_tiles, tiles_spec

    spec = "4096x4096:bn=16,bk=256,sk=1,w=8,s=3;6144x4096:bn=32"
    table = parse_tiles(spec)
    assert table == {(4096, 4096): {"block_n": 16, "block_k": 256, "split_k": 1, "num_warps": 8, "num_stages": 3},
                     (6144, 4096): {"block_n": 32}}  # fmt: skip
    assert parse_tiles(tiles_spec(table)) == table and parse_tiles("") == {}
    for bad in ("bn=16", "4096x:bn=1", "4096x4096:zz=1", "4096x4096:bn=0", "4096x4096:bn=x"):
        with pytest.raises(ValueError, match="FLOTILLA_GEMV_CONFIG"):
            parse_tiles(bad)


def test_bf16_one_row_table_applies_at_one_row_of_bf16_weights_only(monkeypatch):
    """Empty tables keep `default_config`'s lead (CPU and every card: unchanged); an entry set in-process applies to
    its shape at one row of a 2-byte weight, not at two rows or to fp8 weights; given knobs win; restoring brings the
    lead back."""
    from flotilla.kernels import triton_gemv
    from flotilla.kernels.triton_gemv import default_config, restore_one_row_tiles, set_one_row_tiles

    lead = default_config(1, 4096, 4096, 132)
    assert (lead.block_n, lead.block_k, lead.split_k, lead.num_warps, lead.num_stages) == (8, 512, 1, 4, 2)
    assert default_config(1, 4096, 4096, 132, card=OTHER) == lead
    h200 = default_config(1, 4096, 4096, 132, card=H200)  # session 29's descent: three stages
    assert (h200.block_n, h200.block_k, h200.split_k, h200.num_warps, h200.num_stages) == (8, 512, 1, 4, 3)
    monkeypatch.setattr(triton_gemv, "_ONE_ROW", {c: dict(t) for c, t in triton_gemv._ONE_ROW.items()})
    previous = set_one_row_tiles({(4096, 4096): {"block_n": 32, "block_k": 256, "split_k": 2, "num_warps": 8}})
    for card in (None, H200, OTHER):
        c = default_config(1, 4096, 4096, 132, card=card)
        assert (c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages) == (32, 256, 2, 8, 2)
    assert default_config(2, 4096, 4096, 132) == default_config(2, 4096, 4096, 132, card=H200)  # two rows: the lead
    assert default_config(1, 4096, 4096, 132, weight_bytes=1).block_k == 512  # fp8: its own tiles
    assert default_config(1, 4096, 4096, 132, block_n=8).block_n == 8
    assert not triton_gemv.fuses_lora(1, 4096, 4096, 132)  # the table's split-K: no LoRA epilogue
    restore_one_row_tiles(previous)
    assert default_config(1, 4096, 4096, 132) == lead


def test_bf16_table_reaches_the_launch_and_the_rope_check(monkeypatch):
    """A one-row table entry is what `gemv` launches without knobs (bit-equal to the explicit knobs), and what
    `fuses_rope` checks: a qkv tile wider than a head turns the rope form off."""
    from flotilla.kernels import triton_gemv
    from flotilla.kernels.triton_gemv import gemv, set_one_row_tiles
    from flotilla.kernels.triton_gemv_rope import fuses_rope

    monkeypatch.setattr(triton_gemv, "_ONE_ROW", {c: dict(t) for c, t in triton_gemv._ONE_ROW.items()})
    x, weight, _ = linear_case(1, 48, 320, torch.bfloat16, bias=False)
    knobs = {"block_n": 16, "block_k": 64, "split_k": 2, "num_warps": 2, "num_stages": 1}
    set_one_row_tiles({(48, 320): knobs})
    assert torch.equal(gemv(x, weight, pdl=False), gemv(x, weight, pdl=False, **knobs))
    qx, qw, _ = linear_case(1, 6144, 4096, torch.bfloat16, bias=False)
    assert fuses_rope(qx, qw, 128)
    set_one_row_tiles({(6144, 4096): {"block_n": 256, "split_k": 1}})
    assert not fuses_rope(qx, qw, 128)
