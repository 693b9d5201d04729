"""--calculate-kv-scales under CUDA graphs: greedy tokens of one engine configuration, as JSON.

The model: bench/model_dirs.py's small Llama with HF's random init, k_proj/v_proj scaled by 1e-3 so its
K and V sit in e4m3's subnormal range at scale 1.0 (scales 1.0 and calculated ones then give different
tokens). Run once per configuration, each in its own process (an engine's KV pool returns to the GPU
only when its process ends), then compare the JSONs:

    python bench/kv_scales_graph_check.py /tmp/kvs-model calc   out/calc.json    # graphs captured
    python bench/kv_scales_graph_check.py /tmp/kvs-model eager  out/eager.json   # --enforce-eager
    python bench/kv_scales_graph_check.py /tmp/kvs-model unit   out/unit.json    # scales 1.0, graphs

The scales are computed before the graphs are captured, so `calc` must equal `eager` token for token
(and differ from `unit`); each reports how many of its steps ran from a graph.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROMPTS = [[1, *range(10 + i, 40 + i)] for i in range(8)]
TOKENS = 32


def make_model(path: Path) -> None:
    """The small Llama (HF random init, seed 0) with k_proj/v_proj weights scaled by 1e-3."""
    from model_dirs import make_model_dir
    from safetensors.torch import load_file, save_file

    make_model_dir("small-llama", path, weights_seed=0)
    for shard in path.glob("*.safetensors"):
        tensors = load_file(str(shard))
        save_file({n: t * 1e-3 if n.endswith(("k_proj.weight", "v_proj.weight")) else t for n, t in tensors.items()},
                  str(shard), metadata={"format": "pt"})


def main() -> None:
    model, mode, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    if not (model / "config.json").is_file():
        make_model(model)
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams

    kwargs = {"calc": {"calculate_kv_scales": True}, "eager": {"calculate_kv_scales": True, "enforce_eager": True},
              "unit": {}}[mode]
    llm = LLM(str(model), dtype="bfloat16", kv_cache_dtype="fp8", max_model_len=512, max_num_seqs=8,
              gpu_memory_utilization=0.3, **kwargs)
    runner = llm.engine.runner
    counts = {True: 0, False: 0}  # steps from a graph / eager
    launch = runner.launch

    def counted(plan):  # wraps ModelRunner.launch
        step = launch(plan)
        counts[step.graphed] += 1
        return step

    runner.launch = counted
    outputs = []
    for prompt in PROMPTS:  # one request at a time: every decode step is a batch-1 graph candidate
        outputs.append(llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True),
                                    use_tqdm=False)[0].outputs[0].token_ids)
    result = {"mode": mode, "tokens": outputs, "graphs": runner.graphs is not None, "graphed_steps": counts[True],
              "eager_steps": counts[False], "scales": [(a.k_scale, a.v_scale) for a in runner.attention_layers]}
    out.write_text(json.dumps(result) + "\n")
    print(mode, "graphs", result["graphs"], "scales[0]", result["scales"][0])


if __name__ == "__main__":
    main()
