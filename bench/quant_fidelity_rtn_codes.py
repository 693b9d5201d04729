"""Which RTN codes session 20's scale rounding changed on the embedded SmolLM2-135M-Instruct (4 bits, groups of 32).

The scale was `amax * 2.0 / 15` (on the CPU an exact division) and is now `amax * (2.0 / 15)` (CUDA's value, one
fp32 product). A group's extreme weight sits on a tie at 7.5 steps, so the scale's last bit picks its code. Counts,
over every decoder linear weight, the codes that differ between the two, the groups holding one, and how many are a
most negative weight that moved from -8 steps (exact) to -7 (off by half a step): the reason
bench/quant_fidelity.py's "RTN W4 g32" scores lower than before (docs/quantization.md).

    python bench/quant_fidelity_rtn_codes.py --json bench/results/quant-fidelity-cpu-2026-12-05-s21-rtn-codes.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

BITS, GROUP = 4, 32


def former_codes(weight: torch.Tensor) -> torch.Tensor:
    """The codes of the former CPU rounding: the scale as `amax * 2.0 / (2^bits - 1)`, an exact fp32 division."""
    groups = weight.float().reshape(weight.shape[0], -1, GROUP)
    scale = groups.abs().amax(dim=-1, keepdim=True) * 2.0 / (2**BITS - 1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = (groups / scale).round() + 2 ** (BITS - 1)
    return codes.clamp(0, 2**BITS - 1).to(torch.uint8).reshape(weight.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args()
    from flotilla.engine.embedded_model import embedded_model_dir
    from flotilla.engine.quantization.rtn import rtn_quantize

    counts = {"codes": 0, "changed_codes": 0, "groups": 0, "changed_groups": 0, "minus8_to_minus7": 0}
    for path in sorted(Path(embedded_model_dir()).glob("*.safetensors")):
        for name, weight in load_file(path).items():
            if weight.ndim != 2 or not name.endswith("proj.weight"):  # decoder linears: RTN's layers
                continue
            now, _ = rtn_quantize(weight, BITS, GROUP)
            before = former_codes(weight)
            changed = now != before
            counts["codes"] += changed.numel()
            counts["changed_codes"] += int(changed.sum())
            by_group = changed.reshape(weight.shape[0], -1, GROUP).any(dim=-1)
            counts["groups"] += by_group.numel()
            counts["changed_groups"] += int(by_group.sum())
            counts["minus8_to_minus7"] += int(((before == 0) & (now == 1)).sum())
    print(f"codes changed {counts['changed_codes']:,} of {counts['codes']:,}; groups with one "
          f"{counts['changed_groups']:,} of {counts['groups']:,}; -8 -> -7 steps: {counts['minus8_to_minus7']:,}")
    if args.json:
        Path(args.json).write_text(json.dumps(counts, indent=1) + "\n")


if __name__ == "__main__":
    main()
