"""Why fp8 KV with scales 1.0 misses issue 22's floor on SmolLM2-135M, and what per-layer scales give.

Part 1 (plain torch + HF transformers, fp32): runs the embedded SmolLM2-135M-Instruct over
bench/data/harbour.txt once and reads every layer's cached K (after rotary, as the engine stores it)
and V. Per layer and tensor: the largest magnitude, the share of elements below e4m3's smallest
normal (2^-6, where the format loses relative precision) and above its largest finite value (448,
saturated), and the relative RMS error of an e4m3 round trip (x / s -> e4m3 -> x s) at three scales:
1.0, amax/448, and vLLM's `--calculate-kv-scales` heuristic (K: amax/200, V: amax/100).

Part 2 (the engine's reference path, fp32): top-1 agreement and perplexity against the unquantized
engine for fp8 KV with each layer's k_scale/v_scale set to 1.0 or from the same text's maxima (an
"oracle" no deployment has). `--calculate-kv-scales` itself is a variant of bench/quant_fidelity.py.

    python bench/kv_fp8_scale_study.py --json bench/results/kv-fp8-scale-study-cpu-2026-12-03.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0**-6


def e4m3_round_trip(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x stored in an e4m3 cache at `scale` and read back (saturating, as the engine's write)."""
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


def rel_rms(x: torch.Tensor, scale: float) -> float:
    return float((e4m3_round_trip(x, scale) - x).norm() / x.norm())


def layer_stats(x: torch.Tensor, heuristic: float) -> dict:
    amax = float(x.abs().max())
    return {
        "amax": amax,
        "share_below_2^-6": float((x.abs() < E4M3_MIN_NORMAL).float().mean()),
        "share_above_448": float((x.abs() > E4M3_MAX).float().mean()),
        "rel_rms_err_scale_1": rel_rms(x, 1.0),
        "rel_rms_err_amax_448": rel_rms(x, amax / E4M3_MAX),
        "rel_rms_err_vllm": rel_rms(x, amax / heuristic),
    }


def hf_kv(base: Path, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    with torch.inference_mode():
        cache = model(torch.tensor([ids]), use_cache=True).past_key_values
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys[0].float(), layer.values[0].float()) for layer in layers]
    return [(cache.key_cache[i][0].float(), cache.value_cache[i][0].float()) for i in range(len(cache.key_cache))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--skip-engine", action="store_true", help="part 1 only")
    args = parser.parse_args()
    from quant_fidelity import score
    from transformers import AutoTokenizer

    from flotilla.engine.embedded_model import embedded_model_dir

    base = embedded_model_dir()
    ids = AutoTokenizer.from_pretrained(base).encode((REPO / "bench" / "data" / "harbour.txt").read_text())
    kv = hf_kv(base, ids)
    per_layer = [{"k": layer_stats(k, 200.0), "v": layer_stats(v, 100.0)} for k, v in kv]
    results: dict = {"tokens": len(ids), "layers": per_layer}
    for which in ("k", "v"):
        rows = [p[which] for p in per_layer]
        summary = {key: [min(r[key] for r in rows), sum(r[key] for r in rows) / len(rows), max(r[key] for r in rows)]
                   for key in rows[0]}
        results[f"{which}_summary_min_mean_max"] = summary
        print(f"{which.upper()} over {len(rows)} layers (min / mean / max):")
        for key, (lo, mean, hi) in summary.items():
            print(f"  {key:24s} {lo:10.4g} {mean:10.4g} {hi:10.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if args.skip_engine:
        return

    oracle_k = [p["k"]["amax"] for p in per_layer]
    oracle_v = [p["v"]["amax"] for p in per_layer]
    ref_top1, ref_ppl = score(str(base), "float32")
    results["unquantized_perplexity"] = ref_ppl
    variants = {
        "scales 1.0": None,
        "oracle amax/448": ([a / E4M3_MAX for a in oracle_k], [a / E4M3_MAX for a in oracle_v]),
        "oracle vLLM (K amax/200, V amax/100)": ([a / 200 for a in oracle_k], [a / 100 for a in oracle_v]),
    }
    results["fidelity"] = {}
    for name, scales in variants.items():
        top1, ppl = score(str(base), "float32", kv_cache_dtype="fp8", kv_scales=scales)
        agreement = sum(a == b for a, b in zip(top1, ref_top1, strict=True)) / len(ref_top1)
        results["fidelity"][name] = {"top1_agreement": agreement, "perplexity": ppl,
                                     "perplexity_ratio": ppl / ref_ppl}
        print(f"fp8 KV, {name}: top-1 {agreement:.2%}, perplexity {ppl:.3f} ({ppl / ref_ppl - 1:+.2%})", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    assert not math.isnan(ref_ppl)


if __name__ == "__main__":
    main()
