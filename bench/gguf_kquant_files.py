"""Real llama.cpp k-quant files of the embedded SmolLM2-135M-Instruct, for `--quantization gguf` checks.

Runs under a Python with llama-cpp-python (llama.cpp's own quantizer, `llama_model_quantize`), which this
repository does not depend on: it requantizes the shipped Q4_1 file (`--source`) to each llama.cpp file type asked
for and prints every output's tensor types. SmolLM2's hidden size, 576, is not a multiple of the k-quants' 256, so
llama.cpp falls back to Q5_0/Q5_1/Q8_0 for the tensors of 576 inputs (as it does for such models); the MLP's
`ffn_down` (1,536 inputs) keeps the k-quant. Score the files with bench/quant_fidelity.py
(`--checkpoint NAME=FILE.gguf`).

    /tmp/llama-venv/bin/python bench/gguf_kquant_files.py --source SmolLM2-135M-Instruct.Q4_1.gguf \
        --out /tmp/kquants Q4_K_M Q5_K_M Q6_K
"""

from __future__ import annotations

import argparse
import collections
import ctypes
from pathlib import Path


def requantize(source: Path, out: Path, file_type: str) -> Path:
    """`source` requantized by llama.cpp to `file_type` (e.g. Q4_K_M) at `out/<stem>.<file_type>.gguf`."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.allow_requantize = True  # the source is itself quantized (Q4_1)
    target = out / f"{source.name.split('.')[0]}.{file_type}.gguf"
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed for {file_type}")
    return target


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGUF type the file holds."""
    from gguf import GGUFReader

    return dict(collections.Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="the shipped Q4_1 GGUF")
    parser.add_argument("--out", type=Path, required=True, help="directory for the files")
    parser.add_argument("types", nargs="+", help="llama.cpp file types: Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, ...")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for file_type in args.types:
        target = requantize(args.source, args.out, file_type)
        print(f"{target}: {tensor_types(target)}", flush=True)


if __name__ == "__main__":
    main()
