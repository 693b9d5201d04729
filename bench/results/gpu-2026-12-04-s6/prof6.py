"""Session-6 diagnostics (lead's scratch): kernel-time profiles by group and name.

python3 prof6.py decode --batch 64 --context 512 [--lora 8] [--kw '{"quantization":"fp8"}'] --json x.json
python3 prof6.py offline --kw '{...}' --json x.json   # 1000 x (512/128): profile prefill steps + decode steps
"""

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from decode_profile import group_of
from decode_steps import start_decoding
from model_dirs import SHAPES, make_model_dir

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prof(engine, steps, tag):
    sync()
    comp = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        t0 = time.perf_counter()
        for _ in range(steps):
            s0 = time.perf_counter()
            engine.step()
            ls = getattr(engine.runner, "last_step", None)
            comp.append(
                {
                    "ms": 1e3 * (time.perf_counter() - s0),
                    "graphed": getattr(ls, "graphed", None),
                    "running": len(engine.scheduler.running),
                    "waiting": len(engine.scheduler.waiting),
                }
            )
        sync()
        wall = time.perf_counter() - t0
    k = defaultdict(lambda: [0.0, 0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k[e.name][0] += e.device_time_total
            k[e.name][1] += 1
    groups = defaultdict(float)
    for n, (us, _) in k.items():
        groups[group_of(n)] += us / steps
    top = sorted(k.items(), key=lambda kv: -kv[1][0])[:30]
    r = {
        "tag": tag,
        "steps": steps,
        "wall_us_per_step": 1e6 * wall / steps,
        "busy_us_per_step": sum(v[0] for v in k.values()) / steps,
        "launches_per_step": sum(v[1] for v in k.values()) / steps,
        "groups": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "kernels": [{"name": n[:140], "us_per_step": us / steps, "n_per_step": c / steps} for n, (us, c) in top],
        "step_log": comp,
    }
    print(
        f"== {tag}: wall {r['wall_us_per_step']:.0f} us/step busy {r['busy_us_per_step']:.0f} "
        f"launches {r['launches_per_step']:.0f}; " + ", ".join(f"{g} {u:.0f}" for g, u in r["groups"].items()),
        flush=True,
    )
    for x in r["kernels"][:18]:
        print(f"   {x['us_per_step']:9.1f} us x{x['n_per_step']:.1f} {x['name']}", flush=True)
    return r


def main():
    a = argparse.ArgumentParser()
    a.add_argument("mode")
    a.add_argument("--batch", type=int, default=64)
    a.add_argument("--context", type=int, default=512)
    a.add_argument("--lora", type=int, default=0)
    a.add_argument("--kw", default="{}")
    a.add_argument("--json")
    a.add_argument("--steps", type=int, default=16)
    a.add_argument("--shape", default="llama-3.1-8b")
    a = a.parse_args()
    kw = json.loads(a.kw)
    n_req = int(kw.pop("_n", 1000))
    work = Path(tempfile.mkdtemp())
    model_dir = make_model_dir(a.shape, work / "m")
    rng = random.Random(0)
    vocab = SHAPES[a.shape]["vocab_size"]
    out = {"argv": sys.argv, "profiles": []}
    if a.mode == "decode":
        loras = [None]
        if a.lora:
            from lora import write_adapter

            from flotilla.engine.lora.request import LoRARequest

            loras = [
                LoRARequest(f"a{i}", i + 1, str(write_adapter(SHAPES[a.shape], work / f"ad{i}", 16, i)))
                for i in range(a.lora)
            ]
            kw.update(enable_lora=True, max_loras=a.lora, max_lora_rank=16)
        eng = LLMEngine.from_kwargs(
            str(model_dir),
            load_format="dummy",
            max_model_len=a.context + 256,
            max_num_seqs=max(a.batch, 1),
            enable_prefix_caching=False,
            **kw,
        )
        params = SamplingParams(temperature=0.0, max_tokens=a.steps + 64, ignore_eos=True)
        reqs = [
            eng.add_request(
                [rng.randrange(100, vocab) for _ in range(a.context)],
                params,
                **({"lora_request": loras[i % len(loras)]} if a.lora else {}),
            )
            for i in range(a.batch)
        ]
        start_decoding(eng, reqs)
        out["profiles"].append(prof(eng, a.steps, f"decode b{a.batch} ctx{a.context} lora{a.lora} {a.kw}"))
    else:
        eng = LLMEngine.from_kwargs(
            str(model_dir),
            load_format="dummy",
            max_model_len=4096,
            max_num_seqs=512,
            max_num_batched_tokens=16384,
            **kw,
        )
        params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
        for _ in range(n_req):
            eng.add_request([rng.randrange(100, vocab) for _ in range(512)], params)
        for _ in range(2):
            eng.step()  # warm
        out["profiles"].append(prof(eng, 12, "offline prefill-heavy steps 3-14"))
        while eng.scheduler.waiting:
            eng.step()
        for _ in range(3):
            eng.step()
        out["profiles"].append(prof(eng, 20, "offline decode steps after the last admission"))
        t0 = time.perf_counter()
        n = 0
        while (
            eng.has_unfinished_requests()
            if hasattr(eng, "has_unfinished_requests")
            else (eng.scheduler.running or eng.scheduler.waiting)
        ):
            eng.step()
            n += 1
        out["drain"] = {"steps": n, "s": time.perf_counter() - t0}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


main()
