"""Issue 17.1 on the device the engine picks (CUDA on the H200): killer requests, seeded draws, finite logprobs."""
import math
import sys
from pathlib import Path

sys.path.insert(0, "bench")
from model_dirs import make_model_dir

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

d = make_model_dir("tiny-llama", Path("/tmp/m"), weights_seed=0)
llm = LLM(str(d), max_model_len=256)
print("device", llm.engine.runner.device)
seeded = SamplingParams(max_tokens=8, seed=4611686018427387904, n=2)
a, b = (llm.generate([[5, 6, 7]], seeded, use_tqdm=False)[0] for _ in range(2))
assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs], "seeded draws differ"
print("huge seed ok", [c.token_ids for c in a.outputs])
for kwargs in ({"top_k": 2**70}, {"min_tokens": 2, "stop_token_ids": [1000000000]}):
    try:
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, **kwargs), use_tqdm=False)
        raise SystemExit(f"not refused: {kwargs}")
    except InvalidParamError as exc:
        print("refused", exc.param)
edge = [SamplingParams(max_tokens=6, logprobs=20, repetition_penalty=0.01, temperature=1.5, min_tokens=6),
        SamplingParams(max_tokens=6, logprobs=5, repetition_penalty=100.0, temperature=1e-30),
        SamplingParams(max_tokens=6, logprobs=5, top_k=llm.engine.vocab_size, seed=-(2**63))]
outs = llm.generate([[5, 6, 7, 5, 6, 7]] * 3, edge, use_tqdm=False)
for o in outs:
    for entry in o.outputs[0].logprobs:
        assert all(math.isfinite(lp) and -9999.0 <= lp <= 0.0 for lp, _ in entry.values()), entry
print("finite logprobs ok")
m = llm.engine.block_manager
assert m.num_free_blocks == m.num_blocks
print("GPU CHECK OK")
