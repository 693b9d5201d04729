"""The prefill kernel's prompt half, old loop against new: µs a layer and TFLOP/s, each variant checked.

    python bench/prefill_attention.py --json out.json
    python bench/prefill_attention.py --variants "old;lean;lean,tau=8;lean,launch=128/64/8/3" --shapes step

Two shapes at Llama-3.1-8B heads (32 query / 8 KV / 128), bf16, 16-token pages shuffled in one pool
(bench/mixed_attention.py's `batch`):
  step    the offline run's large mixed step: 448 decode rows at context 576 + 31 prompts of 512 tokens, the prompt
          half only (`skip_decode_rows`: what `kernels/mixed_attention.py` launches; the decode rows get no tile);
  prompt  one uncached prompt of 2,000 tokens (a long prompt's time to first token pays it in every layer).
Variants are `;`-separated, each of fields joined by commas: `old` (FLOTILLA_PREFILL_LEAN=0's loop and
FLOTILLA_PREFILL_DEAD_LAST=0's tile map), `lean` (the defaults: the lean loop, the listed map), `nolist` / `list`
(the map alone: FLOTILLA_PREFILL_DEAD_LAST=0 / 1), `tau=X` (FLOTILLA_PREFILL_LAZY_RESCALE=X), `rcp`
(FLOTILLA_PREFILL_RECIPROCAL=1), `launch=M/N/W/S` (block_m/block_n/warps/stages, as FLOTILLA_PREFILL_LAUNCH). Each
is timed in a CUDA graph (bench/kernels.py `graph_ms`, the step's tile map computed once: the memo) and its output's
prompt rows compared with the first variant's (rel_err; the first's against `paged_attention_ref`). TFLOP/s counts
the causal prompts' useful work: 4 x heads x head_dim x q(q+1)/2 a prompt. Without a GPU it runs each variant once
under the Triton interpreter at a small shape (`--small`): a check of the script, no timing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from mixed_attention import HEAD_DIM, HEADS, LAYERS, batch, layer_timer, rel

from flotilla.kernels.paged_attention import paged_attention_ref

VARIANTS = ("old;lean,nolist;lean;lean,rcp;lean,tau=8;lean,launch=128/64/8/3;lean,launch=128/64/8/2;"
            "lean,launch=256/32/8/3;lean,rcp,launch=256/32/8/3;lean,tau=8,rcp,launch=128/64/8/3")
SHAPES = {"step": (448, 576, 31, 512), "prompt": (0, 0, 1, 2000)}  # decode rows, their context, prompts, length
SMALL = {"step": (6, 40, 3, 48), "prompt": (0, 0, 1, 100)}


def knobs(variant: str) -> dict:
    """`paged_prefill_attention` keyword arguments of one variant (`old,tau=8,launch=128/64/8/3`)."""
    out: dict = {"lean": True, "rescale_tau": 0.0, "reciprocal": False, "dead_last": True}
    for field in variant.split(","):
        name, _, value = field.strip().partition("=")
        if name in ("old", "lean"):
            out["lean"] = out["dead_last"] = name == "lean"
        elif name in ("list", "nolist"):
            out["dead_last"] = name == "list"
        elif name == "rcp":
            out["reciprocal"] = True
        elif name == "tau":
            out["rescale_tau"] = float(value)
        elif name == "launch":
            m, n, w, s = (int(x) for x in value.split("/"))
            out |= {"block_m": m, "block_n": n, "num_warps": w, "num_stages": s}
        else:
            raise SystemExit(f"unknown variant field {field!r} in {variant!r}")
    return out


def causal_flop(prompts: int, prompt_len: int) -> float:
    """Useful FLOPs of the prompts' causal attention (QK^T and PV, 2 FLOPs a multiply-add)."""
    return 4.0 * HEADS * HEAD_DIM * prompts * prompt_len * (prompt_len + 1) / 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=VARIANTS)
    p.add_argument("--shapes", default="step,prompt")
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--replays", type=int, default=7)
    p.add_argument("--small", action="store_true", help="the small shapes (the default without a GPU)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    time_us = layer_timer(gpu, a.calls, a.replays)
    dev = torch.device("cuda" if gpu else "cpu")
    shapes = SMALL if a.small or not gpu else SHAPES
    result: dict = {"command": "python bench/prefill_attention.py " + " ".join(sys.argv[1:]),
                    "device": torch.cuda.get_device_name() if gpu else "cpu", "shapes": {}}  # fmt: skip
    for shape in a.shapes.split(","):
        decode_rows, decode_context, prompts, prompt_len = shapes[shape]
        shape_args = argparse.Namespace(decode_rows=decode_rows, decode_context=decode_context, prompts=prompts,
                                        prompt_len=prompt_len)  # fmt: skip
        torch.manual_seed(0)
        args = batch(shape_args, dev, torch.bfloat16)
        scale = HEAD_DIM**-0.5
        flop = causal_flop(prompts, prompt_len)
        entry: dict = {"decode_rows": decode_rows, "prompts": prompts, "prompt_len": prompt_len, "gflop": flop / 1e9,
                       "variants": {}}  # fmt: skip
        first = None
        for variant in a.variants.split(";"):
            kw = knobs(variant)
            memo: dict = {}
            row: dict = {"knobs": kw}
            try:
                out = paged_prefill_attention(*args, scale, step_memo=memo, skip_decode_rows=True, **kw)
                prompt_rows = slice(decode_rows, None)  # the decode rows come first; they are the decode kernel's
                if first is None:
                    first = out
                    entry["rel_err_vs_ref"] = rel(out[prompt_rows], paged_attention_ref(*args, scale)[prompt_rows])
                row["rel_err_vs_first"] = rel(out[prompt_rows], first[prompt_rows])
                us = time_us(lambda i, m=memo, k=kw, c=args, sc=scale: paged_prefill_attention(
                    *c, sc, step_memo=m, skip_decode_rows=True, **k))  # fmt: skip
                row |= {"us": us, "ms_x32": us * LAYERS / 1e3, "tflops": flop / (us * 1e-6) / 1e12}
            except Exception as exc:  # a launch that does not compile (shared memory, registers) is recorded
                row["error"] = repr(exc)[:300]
            entry["variants"][variant] = row
            print(f"{shape:6s} {variant:34s} " + (f"{row['us']:9.1f} us a layer {row['ms_x32']:7.2f} ms x{LAYERS} "
                  f"{row['tflops']:6.1f} TFLOP/s rel_err {row['rel_err_vs_first']:.1e}" if "us" in row
                  else row["error"]), flush=True)  # fmt: skip
        if "rel_err_vs_ref" in entry:  # absent where the first variant failed
            print(f"{shape:6s} first variant vs reference rel_err {entry['rel_err_vs_ref']:.2e}", flush=True)
        result["shapes"][shape] = entry
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
