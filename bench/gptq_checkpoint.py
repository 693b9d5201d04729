"""A GPTQ-calibrated W4A16 checkpoint of the embedded SmolLM2-135M-Instruct, made by llm-compressor.

What users deploy as W4A16 is GPTQ-calibrated, not round-to-nearest: llm-compressor's `oneshot` with a
`GPTQModifier` over every decoder linear layer (the LM head, tied to the embeddings, stays unquantized),
calibrated on `bench/data/apiary.txt` (an original English text about beekeeping, 3,141 tokens) and
never on the evaluation text `bench/data/harbour.txt`. The text is cut into non-overlapping windows
of `--seq-len` tokens; llm-compressor's sequential pipeline then quantizes one decoder layer at a time,
feeding each layer the previous (already quantized) layers' outputs. The result is saved
compressed (compressed-tensors `pack-quantized`), the format the engine loads from `config.json`.

Groups of 64: SmolLM2's hidden size, 576, is not a multiple of 128, and a partial last group is
refused by the engine (`engine/quantization/packed_int.py`), by compressed-tensors' own forward
("tensor column shape must be divisible by the given group_size") and by llm-compressor at start-up
(`group_size_validation.py`: "no kernel support for non-divisible"). 64 is the largest power of two
that divides every input width (576 and 1536).

llm-compressor 0.14 pins transformers 5.17 and compressed-tensors 0.19, older than the project's, so
it lives in its own directory that is put in front of the project's venv for this script only (the
engine loads the result with the project's own compressed-tensors-free loader):

    pip install --no-deps --target /tmp/llmc-site llmcompressor==0.14.0 transformers==5.17.0 \\
        compressed-tensors==0.19.0 accelerate==1.15.0 auto-round==0.15.1 nvidia-ml-py py-cpuinfo \\
        huggingface_hub==1.33.0 datasets==5.0.1 fsspec==2026.6.0
    OMP_NUM_THREADS=1 PYTHONPATH=/tmp/llmc-site .venv/bin/python bench/gptq_checkpoint.py \\
        --scheme W4A16 --group-size 64 --out /tmp/smollm2-gptq-w4a16-g64
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CALIBRATION = REPO / "bench" / "data" / "apiary.txt"


def calibration_windows(tokenizer, text: str, seq_len: int, stride: int) -> list[list[int]]:
    """Windows of `seq_len` tokens of `text` every `stride` tokens (stride = seq_len: non-overlapping;
    smaller: the same text seen at more positions, more rows for the Hessians)."""
    ids = tokenizer.encode(text)
    return [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, stride)]


def plain_copy(src: Path, dst: Path) -> Path:
    """`src` linked into `dst` with a config.json that drops transformers' `quantization_config`
    (`quant_method: gguf`, left by the embedded model's GGUF conversion although its safetensors are
    plain bf16): oneshot refuses a checkpoint it believes is quantized in another format, and the
    saved checkpoint must carry compressed-tensors' config only."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name != "config.json":
            (dst / item.name).symlink_to(item.resolve())
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheme", default="W4A16", choices=["W4A16", "W4A16_ASYM"],
                        help="llm-compressor preset: symmetric or asymmetric (zero points) int4")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--stride", type=int, help="tokens between window starts (default: --seq-len)")
    parser.add_argument("--observer", default="memoryless_minmax",
                        help="weight observer choosing each group's scale (memoryless_mse searches clipping)")
    parser.add_argument("--dampening", type=float, default=0.01, help="GPTQModifier dampening_frac")
    parser.add_argument("--actorder", default="none", choices=["none", "static", "weight"],
                        help="activation order (none: columns in their stored order)")
    parser.add_argument("--calibration", default=str(CALIBRATION))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    from compressed_tensors.quantization import preset_name_to_scheme
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flotilla.engine.embedded_model import embedded_model_dir

    src = plain_copy(embedded_model_dir(), Path(tempfile.mkdtemp(prefix="smollm2-plain-")))
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    windows = calibration_windows(tokenizer, Path(args.calibration).read_text(), args.seq_len,
                                 args.stride or args.seq_len)
    data = Dataset.from_dict({"input_ids": windows, "attention_mask": [[1] * len(w) for w in windows]})
    scheme = preset_name_to_scheme(args.scheme, ["Linear"])
    scheme.weights.group_size = args.group_size
    scheme.weights.observer = args.observer
    recipe = GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"], dampening_frac=args.dampening,
                          actorder=None if args.actorder == "none" else args.actorder)
    start = time.monotonic()
    oneshot(model=model, tokenizer=tokenizer, dataset=data, recipe=recipe, num_calibration_samples=len(windows),
            max_seq_length=args.seq_len, shuffle_calibration_samples=False, pipeline="sequential")
    seconds = time.monotonic() - start
    out = Path(args.out)
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    made = {"tool": "llmcompressor.oneshot + GPTQModifier", "scheme": args.scheme, "group_size": args.group_size,
            "actorder": args.actorder, "dampening_frac": args.dampening, "calibration": Path(args.calibration).name,
            "windows": len(windows), "seq_len": args.seq_len,
            "stride": args.stride or args.seq_len, "observer": args.observer, "calibration_seconds": round(seconds, 1),
            "torch_threads": torch.get_num_threads()}
    (out / "calibration.json").write_text(json.dumps(made, indent=1) + "\n")
    print(json.dumps(made))


if __name__ == "__main__":
    main()
