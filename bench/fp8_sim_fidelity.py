"""FP8 W8A8 fidelity of SmolLM2-135M by plain simulated quantization in PyTorch: is the engine's figure
the scheme's or a bug? (issue 22)

Runs Hugging Face transformers' Llama on the embedded model, teacher-forced over bench/data/harbour.txt
(the text of bench/quant_fidelity.py), with every decoder linear (not the LM head or the embeddings)
replaced by vLLM's dynamic fp8 scheme written out in a few lines of torch: e4m3 weights with one scale
per output channel (amax / 448), activations quantized per token (amax / 448) at run time, both rounded
by torch's round-to-nearest-even cast after a clamp to +-448, the product in fp32, times both scales.
Each variant's top-1 next token and perplexity are compared with the unquantized model at the same
dtype; "bf16 vs fp32" shows how many positions are near-ties that mere bf16 rounding already flips, and
the per-layer-type rows show where the loss comes from.

    python bench/fp8_sim_fidelity.py --json bench/results/quant-fp8-sim-fidelity-cpu-2026-12-03.json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded through e4m3 with one fp32 scale per row (amax / 448), back in fp32."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


class SimFp8Linear(torch.nn.Module):
    """A linear layer with fp8 weights (per output channel) and/or fp8 activations (per token)."""

    def __init__(self, linear: torch.nn.Linear, weights: bool, activations: bool):
        super().__init__()
        self.weight = fp8_rows(linear.weight.data) if weights else linear.weight.data.float()
        self.bias = linear.bias
        self.activations = activations
        self.out_dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        rows = fp8_rows(rows) if self.activations else rows.float()
        out = rows @ self.weight.t()
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(self.out_dtype).reshape(*shape[:-1], -1)


def load(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").eval()


def quantize(model, select, weights: bool = True, activations: bool = True) -> None:
    """Swap the selected decoder linears (`select(layer_index, name)`) for simulated fp8 ones."""
    for i, layer in enumerate(model.model.layers):
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear) and select(i, name):
                    setattr(parent, name, SimFp8Linear(child, weights, activations))


@torch.no_grad()
def score(model, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    logits = model(ids[None]).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[1:])
    return logits.argmax(-1), math.exp(nll.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--per-layer", action="store_true", help="also quantize one decoder layer at a time")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from flotilla.engine.embedded_model import embedded_model_dir

    src = embedded_model_dir()
    model_dir = Path(tempfile.mkdtemp(prefix="fp8-sim-"))
    for f in src.iterdir():  # HF would read the GGUF note in quantization_config as a request to load GGUF
        shutil.copy(f, model_dir / f.name)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("quantization_config", None)
    (model_dir / "config.json").write_text(json.dumps(config))
    dtype = getattr(torch, args.dtype)
    ids = torch.tensor(AutoTokenizer.from_pretrained(model_dir).encode((REPO / "bench/data/harbour.txt").read_text()))
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ref_top1, ref_ppl = score(load(model_dir, dtype), ids)
    results: dict[str, dict] = {"tokens": len(ids), "dtype": args.dtype, "unquantized": {"perplexity": ref_ppl}}
    print(f"unquantized {args.dtype}: perplexity {ref_ppl:.3f}", flush=True)

    def row(name: str, model) -> None:
        top1, ppl = score(model, ids)
        agree = (top1 == ref_top1).float().mean().item()
        results[name] = {"top1_agreement": agree, "perplexity": ppl, "perplexity_ratio": ppl / ref_ppl}
        print(f"{name}: top-1 {agree:.2%}, perplexity {ppl:.3f} ({ppl / ref_ppl - 1:+.2%})", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")

    variants = {
        "fp8 W8A8 (all decoder linears)": (lambda i, n: True, True, True),
        "fp8 weights only (W8A16)": (lambda i, n: True, True, False),
        "fp8 activations only": (lambda i, n: True, False, True),
        "W8A8 q/k/v only": (lambda i, n: n in ("q_proj", "k_proj", "v_proj"), True, True),
        "W8A8 o_proj only": (lambda i, n: n == "o_proj", True, True),
        "W8A8 gate/up only": (lambda i, n: n in ("gate_proj", "up_proj"), True, True),
        "W8A8 down_proj only": (lambda i, n: n == "down_proj", True, True),
    }
    for name, (select, w, a) in variants.items():
        model = load(model_dir, dtype)
        quantize(model, select, w, a)
        row(name, model)
    if args.dtype == "float32":  # last: bf16 matmuls are slow on a CPU
        row("bf16 (unquantized) vs fp32", load(model_dir, torch.bfloat16))
    if args.per_layer:
        for layer in range(len(load(model_dir, dtype).model.layers)):
            model = load(model_dir, dtype)
            quantize(model, lambda i, n, layer=layer: i == layer)
            row(f"W8A8 layer {layer} only", model)


if __name__ == "__main__":
    main()
