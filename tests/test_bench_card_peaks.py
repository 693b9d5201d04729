"""bench/card_peaks.py and the rooflines read against it: the decode rooflines of bench/latency.py and
bench/quant_gpu.py at the H200's peaks (the figures the issues' floors quote) and at a card's measured ones, and the
JSON a benchmark writes on the CPU, where no card is measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import card_peaks
import latency
import quant_gpu
from card_peaks import H200, Peaks

BENCH = Path(__file__).resolve().parents[1] / "bench"

LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256}  # fmt: skip
HALF_COPY = Peaks(H200.copy_bytes_per_s / 2, H200.bf16_flops_per_s, "half the H200's copy bandwidth")
HALF_GEMM = Peaks(H200.copy_bytes_per_s, H200.bf16_flops_per_s / 2, "half the H200's GEMM rate")


def test_h200_rooflines_are_the_figures_the_floors_quote() -> None:
    assert abs(latency.roofline_ms(LLAMA_8B, 1, 512) - 3.52) < 0.005  # FACTS: bs1 ctx 512
    assert abs(latency.roofline_ms(LLAMA_8B, 64, 512) - 4.51) < 0.005  # bs64 ctx 512
    assert abs(quant_gpu.roofline_ms(LLAMA_8B, 1, 512, 0.5 + 2 / 128, 2) - 1.10) < 0.005  # int4 bs1 (README)


def test_a_byte_bound_step_scales_with_the_cards_copy_bandwidth_only() -> None:
    h200 = latency.roofline_ms(LLAMA_8B, 1, 512)
    assert latency.roofline_ms(LLAMA_8B, 1, 512, HALF_COPY) == pytest.approx(2 * h200)
    assert latency.roofline_ms(LLAMA_8B, 1, 512, HALF_GEMM) == pytest.approx(h200)
    int4 = quant_gpu.roofline_ms(LLAMA_8B, 1, 512, 0.5 + 2 / 128, 2)
    assert quant_gpu.roofline_ms(LLAMA_8B, 1, 512, 0.5 + 2 / 128, 2, HALF_COPY) == pytest.approx(2 * int4)


def test_a_flop_bound_step_scales_with_the_cards_gemm_rate_only() -> None:
    h200 = latency.roofline_ms(LLAMA_8B, 1024, 1)  # 1,024 rows of 7.5 G params: 19.5 ms of FLOPs, 3.8 of bytes
    assert h200 == pytest.approx(1e3 * 2 * 7_504_658_432 * 1024 / 790e12)
    assert latency.roofline_ms(LLAMA_8B, 1024, 1, HALF_GEMM) == pytest.approx(2 * h200)
    assert latency.roofline_ms(LLAMA_8B, 1024, 1, HALF_COPY) == pytest.approx(h200)


def test_rows_keep_the_h200_columns_and_add_the_cards() -> None:
    row = latency.add_rooflines({"batch": 1, "context": 512, "ms_per_step": 5.7}, LLAMA_8B, HALF_COPY)
    assert row["roofline_ms"] == latency.roofline_ms(LLAMA_8B, 1, 512)
    assert row["x_roofline"] == 5.7 / row["roofline_ms"]
    assert row["roofline_ms_card"] == pytest.approx(2 * row["roofline_ms"])
    assert row["x_roofline_card"] == pytest.approx(row["x_roofline"] / 2)
    bare = latency.add_rooflines({"batch": 1, "context": 512, "ms_per_step": 5.7}, LLAMA_8B, None)
    assert bare["x_roofline"] == row["x_roofline"]
    assert bare["roofline_ms_card"] is None and bare["x_roofline_card"] is None


def test_quant_rows_at_their_own_bytes_and_an_ab_row_without_one_step_figure() -> None:
    int4 = quant_gpu.rooflines({"batch": 1, "context": 512, "ms_per_step": 2.2}, LLAMA_8B, 0.5 + 2 / 128, 2,
                               HALF_COPY)  # fmt: skip
    assert int4["x_roofline"] == pytest.approx(2.2 / 1.10198, rel=1e-4)
    assert int4["x_roofline_card"] == pytest.approx(int4["x_roofline"] / 2)
    ab = quant_gpu.rooflines({"batch": 64, "context": 4096, "a_ms": 9.7, "b_ms": 9.8}, LLAMA_8B, 2.0, 1, None)
    assert ab["roofline_ms"] == quant_gpu.roofline_ms(LLAMA_8B, 64, 4096, 2.0, 1)
    assert ab["x_roofline"] is None and ab["roofline_ms_card"] is None and ab["x_roofline_card"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
def test_without_cuda_nothing_is_measured() -> None:
    assert card_peaks.measured() is None
    peaks = card_peaks.peaks_json(None)
    assert peaks["card"] == {"skipped": "no CUDA device"}
    assert peaks["h200"]["copy_tb_per_s"] == 4.28 and peaks["h200"]["bf16_tflops"] == 790


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_card_is_measured_once_a_process() -> None:
    peaks = card_peaks.measured()
    assert peaks is not None and peaks is card_peaks.measured()
    assert 1e12 < peaks.copy_bytes_per_s < 2e13  # HBM of a data-centre card, read + write counted
    assert 1e14 < peaks.bf16_flops_per_s < 5e15
    assert card_peaks.peaks_json(peaks)["card"]["device"] == torch.cuda.get_device_name()


def test_latency_json_on_the_cpu_has_the_card_columns_empty(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    cmd = [sys.executable, str(BENCH / "latency.py"), "--shape", "tiny-llama", "--batch-sizes", "1",
           "--contexts", "16", "--steps", "2", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["peaks"]["h200"]["copy_bytes_per_s"] == 4.28e12
    (row,) = result["flotilla"]
    assert row["x_roofline"] == pytest.approx(row["ms_per_step"] / row["roofline_ms"])
    if result["device"] == "cpu":
        assert result["peaks"]["card"] == {"skipped": "no CUDA device"}
        assert row["roofline_ms_card"] is None and row["x_roofline_card"] is None
    else:
        assert result["peaks"]["card"]["device"] == result["device"]
        assert row["x_roofline_card"] == pytest.approx(row["ms_per_step"] / row["roofline_ms_card"])
