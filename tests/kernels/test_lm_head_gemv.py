"""The one-row LM head on the Triton GEMV (`dispatch.lm_head_linear`, FLOTILLA_LM_HEAD_GEMV): the switch's values, the
GEMV at LM-head-like shapes (many rows, a ragged last tile) and the knobs the switch passes against the reference, the
dispatch rule, and a tiny model's greedy tokens with its LM head on the GEMV."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import DEVICE, linear_case, rel_err, tolerance


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the dispatch decision alone."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_the_switch_is_off_by_default_and_reads_its_values():
    """Unset/"0": cuBLAS (None); "1": the default tiles ({}); knob pairs: `gemv`'s keywords; anything else raises,
    naming the variable."""
    from flotilla.kernels import dispatch

    assert dispatch.lm_head_gemv_knobs("") is None and dispatch.lm_head_gemv_knobs(" 0 ") is None
    assert dispatch.lm_head_gemv_knobs("1") == {}
    assert dispatch.lm_head_gemv_knobs("bn=8,bk=1024,w=8,s=3,sk=1,dot=0") == {
        "block_n": 8, "block_k": 1024, "num_warps": 8, "num_stages": 3, "split_k": 1, "use_dot": False}  # fmt: skip
    assert dispatch.lm_head_gemv_knobs("dot=1, bn=64") == {"use_dot": True, "block_n": 64}
    for bad in ("2", "on=1", "bn=0", "bn=x", "dot=2", "bn"):
        with pytest.raises(ValueError, match="FLOTILLA_LM_HEAD_GEMV"):
            dispatch.lm_head_gemv_knobs(bad)


def _in_fresh_interpreter(code: str, **env: str) -> str:
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k != "FLOTILLA_LM_HEAD_GEMV"} | env
    return subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True,
                          timeout=300).stdout.strip()  # fmt: skip


_PER_CARD = ("from flotilla.kernels import dispatch; "
             "print([dispatch.lm_head_gemv_for(c) for c in (None, 'NVIDIA H100 80GB HBM3', 'NVIDIA H200', 'X')])")


def test_measured_tiles_by_default_in_a_clean_environment():
    """The module default, read in a fresh interpreter without the variable: the GEMV at the tiles session 20's GPU
    sweep chose on every card without an entry (DEFAULT: what every card ran before), the H200's own since session
    29; never cuBLAS."""
    default = {"block_n": 16, "block_k": 1024, "num_warps": 4, "num_stages": 2, "use_dot": False}
    h200 = {"block_n": 8, "block_k": 2048, "split_k": 1, "num_warps": 4, "num_stages": 2, "use_dot": False}
    assert _in_fresh_interpreter(_PER_CARD) == str([default, default, h200, default])


def test_the_variable_replaces_every_cards_knobs():
    """FLOTILLA_LM_HEAD_GEMV, where set (even empty: cuBLAS, as before), is every card's, the H100's too."""
    assert _in_fresh_interpreter(_PER_CARD, FLOTILLA_LM_HEAD_GEMV="0") == str([None] * 4)
    assert _in_fresh_interpreter(_PER_CARD, FLOTILLA_LM_HEAD_GEMV="") == str([None] * 4)
    assert _in_fresh_interpreter(_PER_CARD, FLOTILLA_LM_HEAD_GEMV="bn=8") == str([{"block_n": 8}] * 4)


def test_the_docs_switch_row_names_the_cards_entries_the_table_has():
    """docs/decode-gemm.md's FLOTILLA_LM_HEAD_GEMV row lists the knobs each card runs unset: exactly
    LM_HEAD_GEMV_MEASURED's entries (it once kept an H100 entry the table no longer had)."""
    import re
    from pathlib import Path

    from flotilla.kernels import card_tables, dispatch

    doc = (Path(__file__).resolve().parents[2] / "docs" / "decode-gemm.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `FLOTILLA_LM_HEAD_GEMV` |"))
    listed = row.split("`LM_HEAD_GEMV_MEASURED` entry (", 1)[1].split(");", 1)[0]
    cards = {"DEFAULT": card_tables.DEFAULT, "H100": card_tables.H100, "H200": card_tables.H200}
    named = {cards[name]: knobs for name, knobs in re.findall(r"`?(DEFAULT|H100|H200)`?: `([^`]+)`", listed)}
    assert named == dispatch.LM_HEAD_GEMV_MEASURED


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("knobs", [{}, dict(block_n=8, block_k=64, num_warps=4, num_stages=3),
                                   dict(block_n=16, block_k=128, num_warps=8, num_stages=2),
                                   dict(block_n=64, block_k=32, use_dot=True, num_stages=3)])  # fmt: skip
def test_gemv_with_the_switch_knobs_matches_the_reference(dtype, knobs):
    """An LM-head-like one-row product (1,000 rows: a ragged last row tile; K = 96: a ragged K tile) with each kind of
    knobs the switch passes, against F.linear in fp64; the greedy token (argmax) equal where the margin allows."""
    from flotilla.kernels.triton_gemv import gemv

    x, weight, _ = linear_case(1, 1000, 96, dtype, bias=False, seed=5)
    out = gemv(x, weight, pdl=False, **knobs)
    ref = F.linear(x.double(), weight.double())
    assert out.shape == (1, 1000) and out.dtype == dtype
    assert rel_err(out, ref) < tolerance(dtype)
    top2 = ref[0].topk(2).values
    if float(top2[0] - top2[1]) > 0.05:  # a clear winner: the same token
        assert int(out.argmax()) == int(ref.argmax())


def test_dispatch_takes_the_gemv_only_where_switched_on_for_one_cuda_row(monkeypatch):
    """`lm_head_linear`: CPU tensors and more than one row always take `linear` (bit for bit F.linear here); a CUDA row
    takes the GEMV only where its card's knobs switch it on: the card's own entry by its name, else DEFAULT's (the
    decision, on a tensor that says it is on CUDA of the card named)."""
    from flotilla.kernels import dispatch
    from flotilla.kernels.card_tables import DEFAULT, H200

    x, weight, _ = linear_case(1, 300, 64, torch.float32, bias=False, seed=9)
    x, weight = x.cpu(), weight.cpu()
    fake = x.as_subclass(_FakeCuda)
    for knobs in (None, {}, {"block_n": 8}):
        monkeypatch.setattr(dispatch, "LM_HEAD_GEMV", {DEFAULT: knobs})
        monkeypatch.setattr(dispatch, "device_card", lambda t: "NVIDIA A100-SXM4-80GB")
        assert torch.equal(dispatch.lm_head_linear(x, weight), F.linear(x, weight))
        assert not dispatch.lm_head_gemv_takes(x)
        assert not dispatch.lm_head_gemv_takes(torch.cat([x, x]).as_subclass(_FakeCuda))
        assert dispatch.lm_head_gemv_takes(fake) == (knobs is not None)
        monkeypatch.setattr(dispatch, "LM_HEAD_GEMV", {DEFAULT: knobs, H200: None if knobs is not None else {}})
        monkeypatch.setattr(dispatch, "device_card", lambda t: H200)
        assert dispatch.lm_head_gemv_takes(fake) == (knobs is None)


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the interpreter on CPU tensors stands in for the GPU here")
def test_greedy_tokens_unchanged_with_the_lm_head_on_the_gemv(tiny_model_dirs, monkeypatch):
    """The tiny Llama's greedy tokens with every one-row LM head run by the GEMV at the switch's knobs (the
    interpreter on CPU tensors, patched in at the head's seam where dispatch's CUDA check would send it) equal
    cuBLAS's path; the patch counts its calls, so the test fails if the head stops routing through it."""
    from flotilla.engine.layers import embedding
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.kernels import dispatch
    from flotilla.kernels.triton_gemv import gemv

    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = [5, 17, 99, 1000, 2048, 7]
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, enforce_eager=True)
    plain = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    knobs = dispatch.lm_head_gemv_knobs("bn=256,bk=64,w=4,s=2")
    calls = []

    def head(x, weight):
        if x.dim() == 2 and x.shape[0] == 1:
            calls.append(1)
            return gemv(x, weight, pdl=False, **knobs)
        return dispatch.lm_head_linear(x, weight)

    monkeypatch.setattr(embedding, "lm_head_linear", head)
    tokens = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    assert tokens == plain
    assert len(calls) >= 5  # the 5 one-row decode steps (and a one-row prompt's last token, if it comes alone)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["1", "bn=8,bk=512,w=4,s=3", "bn=4,bk=1024,w=8,s=2", "bn=64,bk=128,w=4,s=3,dot=1"])
def test_llama_head_shape_against_cublas(monkeypatch, spec):
    """On the GPU at Llama-3.1-8B's LM head (128,256 x 4,096, one row) through `lm_head_linear` with the switch's
    knobs: equal to cuBLAS except where the summation order moves a sum across a bf16 rounding boundary, and the same
    greedy token where cuBLAS's margin is clear."""
    from flotilla.kernels import dispatch

    x, weight, _ = linear_case(1, 128256, 4096, torch.bfloat16, bias=False, seed=2)
    ref = F.linear(x, weight)
    monkeypatch.setattr(dispatch, "LM_HEAD_GEMV", {dispatch.DEFAULT: dispatch.lm_head_gemv_knobs(spec)})
    out = dispatch.lm_head_linear(x, weight)
    assert rel_err(out, ref) < 4e-3 and (out == ref).float().mean().item() > 0.9
    top2 = ref[0].float().topk(2).values
    if float(top2[0] - top2[1]) > 0.05:
        assert int(out.argmax()) == int(ref.argmax())
