"""`--dtype auto` on the CPU: bf16 checkpoints run in float32 where the CPU has no bf16 arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from flotilla.engine.config import _resolve_dtype, cpu_native_bf16

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"


def _cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "native"), [(AVX2_ONLY, False), (AVX512_BF16, True), (ARM_BF16, True), ("processor\t: 0\n", None)]
)
def test_cpu_native_bf16_reads_the_flags(tmp_path: Path, text: str, native: bool | None) -> None:
    assert cpu_native_bf16(_cpuinfo(tmp_path, text)) is native


def test_cpu_native_bf16_unknown_without_cpuinfo(tmp_path: Path) -> None:
    assert cpu_native_bf16(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("text", "device", "checkpoint", "expected"),
    [
        (AVX2_ONLY, "cpu", "bfloat16", "float32"),  # emulated bf16 matmul: fp32 is faster
        (AVX512_BF16, "cpu", "bfloat16", "bfloat16"),
        (AVX2_ONLY, "cuda", "bfloat16", "bfloat16"),  # the host's flags say nothing about the GPU
        (AVX2_ONLY, "cpu", "float16", "float16"),
        ("processor\t: 0\n", "cpu", "bfloat16", "bfloat16"),  # unknown: keep the checkpoint's
    ],
)
def test_auto_dtype_on_cpu(tmp_path: Path, text: str, device: str, checkpoint: str, expected: str) -> None:
    assert _resolve_dtype("auto", {"torch_dtype": checkpoint}, device, None, _cpuinfo(tmp_path, text)) == expected


def test_quantized_model_keeps_bf16(tmp_path: Path) -> None:
    # torch's packed int4/int8 CPU kernels take bf16 activations; in fp32 the layers fall back to dequantizing
    avx2_only = _cpuinfo(tmp_path, AVX2_ONLY)
    assert _resolve_dtype("auto", {"torch_dtype": "bfloat16"}, "cpu", "rtn", avx2_only) == "bfloat16"


def test_explicit_dtype_is_kept(tmp_path: Path) -> None:
    avx2_only = _cpuinfo(tmp_path, AVX2_ONLY)
    assert _resolve_dtype("bfloat16", {"torch_dtype": "bfloat16"}, "cpu", None, avx2_only) == "bfloat16"


@pytest.mark.parametrize(
    ("text", "device", "runner", "expected"),
    [
        (AVX512_BF16, "cuda", "generate", "bfloat16"),  # vLLM: a float32 checkpoint is downcast on the GPU
        (AVX2_ONLY, "cuda", "pooling", "float16"),  # vLLM prefers float16 for pooling models
        (AVX512_BF16, "cpu", "generate", "float32"),  # the CPU keeps it (Flotilla's difference; README)
        (AVX2_ONLY, "cpu", "pooling", "float32"),
    ],
)
def test_auto_dtype_downcasts_a_float32_checkpoint_on_the_gpu_as_vllm(tmp_path: Path, text: str, device: str,
                                                                       runner: str, expected: str) -> None:
    got = _resolve_dtype("auto", {"torch_dtype": "float32"}, device, None, _cpuinfo(tmp_path, text), runner=runner)
    assert got == expected
    # an explicit float32 is kept everywhere
    assert _resolve_dtype("float32", {"torch_dtype": "float32"}, device, None, runner=runner) == "float32"
