"""Process RSS per round of offline requests: shows how much of it is the CPU KV pool being touched.

On the CPU the KV pool is calloc'ed (engine/model_runner.py `_zeros`): the OS supplies its pages only
as blocks are first written, so RSS climbs round after round until every block has been used once, then
stays flat. With a pool small enough to be touched in the first round, RSS is flat from round one; with
the default 4 GiB budget it climbs by the pool's size. A leak would climb in both cases.

    OMP_NUM_THREADS=1 python bench/kv_pool_rss.py                                   # default pool
    OMP_NUM_THREADS=1 python bench/kv_pool_rss.py --max-model-len 512 --max-num-seqs 8  # ~190 MB pool
"""

import argparse
import random

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams


def rss_mib() -> int:
    """This process's resident set size (VmRSS) in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    """Run --rounds rounds of --requests one-token requests on the embedded model, printing RSS."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    args = ap.parse_args()
    limits = {k: v for k, v in (("max_model_len", args.max_model_len), ("max_num_seqs", args.max_num_seqs)) if v}
    llm = LLM(dtype="float32", **limits)
    print(f"start: {rss_mib()} MiB")
    for r in range(args.rounds):
        prompts = [f"Tell me {random.random()} about item {i}" for i in range(args.requests)]
        llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
        print(f"round {r + 1}: {rss_mib()} MiB", flush=True)


if __name__ == "__main__":
    main()
