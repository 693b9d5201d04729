"""bench/throughput.py's bounds: the FLOP/byte bound issue 19's offline floor is stated against, and the serial
estimate beside it (what a layer-serial engine can reach with every kernel at its peak), at the H200's peaks and at
a card's (bench/card_peaks.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import throughput
from card_peaks import Peaks

LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256}
ISSUE_19 = [[0] * 512] * 1000  # 1,000 x (512 in / 128 out)


def test_bound_is_the_compute_term_for_issue_19s_workload() -> None:
    b = throughput.bound_seconds(LLAMA_8B, ISSUE_19, 128, 512)
    assert b["bound_s"] == b["compute_s"] > b["memory_s"]
    assert 12.2 < b["bound_s"] < 12.4  # the 12.30 s every README row quotes


def test_serial_estimate_adds_kv_reads_and_elementwise_bytes_to_the_gemms() -> None:
    s = throughput.bound_seconds(LLAMA_8B, ISSUE_19, 128, 512)["serial"]
    assert s["serial_s"] == s["gemm_s"] + s["kv_read_s"] + s["elementwise_s"]
    # 1,000 requests read 512..639 positions of 131,072-byte K/V each at 4.28 TB/s
    assert abs(s["kv_read_s"] - 1000 * 131072 * sum(range(512, 640)) / 4.28e12) < 1e-9


def test_serial_estimate_counts_the_lm_head_for_sampled_tokens_only() -> None:
    wide = dict(LLAMA_8B, vocab_size=LLAMA_8B["vocab_size"] + 1000)
    narrow_s = throughput.bound_seconds(LLAMA_8B, ISSUE_19, 128, 512)
    wide_s = throughput.bound_seconds(wide, ISSUE_19, 128, 512)
    extra_serial = wide_s["serial"]["gemm_s"] - narrow_s["serial"]["gemm_s"]
    extra_bound = wide_s["compute_s"] - narrow_s["compute_s"]
    assert abs(extra_serial - 2 * 1000 * 4096 * 1000 * 128 / 790e12) < 1e-9
    assert abs(extra_bound - 2 * 1000 * 4096 * 1000 * 640 / 790e12) < 1e-9


def test_the_cards_bound_beside_the_h200s() -> None:
    slow_gemm = Peaks(4.28e12, 395e12, "half the H200's GEMM rate")
    f = throughput.fractions(LLAMA_8B, ISSUE_19, 128, 512, 20.0, slow_gemm)
    bound, card = f["bound"], f["bound"]["card"]
    assert f["fraction_of_bound"] == bound["bound_s"] / 20.0  # the H200's, as before
    assert card["compute_s"] == pytest.approx(2 * bound["compute_s"]) and card["memory_s"] == bound["memory_s"]
    assert card["serial"]["gemm_s"] == pytest.approx(2 * bound["serial"]["gemm_s"])
    assert card["serial"]["kv_read_s"] == bound["serial"]["kv_read_s"]
    assert f["fraction_of_bound_card"] == pytest.approx(2 * f["fraction_of_bound"])
    assert f["fraction_of_serial_card"] == card["serial"]["serial_s"] / 20.0


def test_without_a_measured_card_its_bound_is_null() -> None:
    f = throughput.fractions(LLAMA_8B, ISSUE_19, 128, 512, 20.0, None)
    assert f["bound"]["card"] is None and f["fraction_of_bound_card"] is None and f["fraction_of_serial_card"] is None
    assert f["fraction_of_serial"] == f["bound"]["serial"]["serial_s"] / 20.0
