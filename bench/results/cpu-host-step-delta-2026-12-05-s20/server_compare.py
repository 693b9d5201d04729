"""The same requests to a server of each of two trees: non-streamed bodies compared byte for byte, streams
per choice once joined (only `created`, `sequence_number` and random ids normalised).

    python server_compare.py MODEL_DIR BASE_TREE NEW_TREE
    SERVER_FLAGS="--reasoning-parser deepseek_r1" python server_compare.py ...   # chat through the parser's stream
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

MODEL = sys.argv[1]
TREES = sys.argv[2:4]
KEY = "k"

def layout(tree):
    root = Path(tempfile.mkdtemp(prefix="delta20-srv-"))
    pkg = root / "flotilla"
    pkg.mkdir()
    for f in (Path(tree) / "flotilla").glob("*.py"):
        (pkg / f.name).write_bytes(f.read_bytes())
    (pkg / "engine").symlink_to(Path(tree) / "engine")
    (pkg / "kernels").symlink_to(Path(tree) / "kernels")
    return root

def start(tree, port):
    env = {**os.environ, "PYTHONPATH": str(layout(tree)), "VLLM_API_KEY": KEY}
    log = Path(tempfile.gettempdir()) / f"server-{port}.log"
    cmd = [sys.executable, "-m", "flotilla.engine.server", MODEL, "--port", str(port), "--host", "127.0.0.1",
           "--served-model-name", "tiny", "--max-model-len", "512", "--disable-log-stats", "--uvicorn-log-level",
           "warning", *os.environ.get("SERVER_FLAGS", "").split()]
    with log.open("w") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd="/tmp")
    deadline = time.time() + 400
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        assert p.poll() is None, log.read_text()[-2000:]
        time.sleep(0.5)
    raise RuntimeError("no start")

P = "Once upon a time in a harbour far away"
MSG = [{"role": "user", "content": P}]
base = dict(model="tiny", max_tokens=300, temperature=1.0, seed=3, n=2)
REQS = []
for stream in (True, False):
    so = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}} if stream else {}
    REQS += [
        ("/v1/completions", dict(base, prompt=P, stream=stream, **so)),
        ("/v1/completions", dict(base, prompt=P, stream=stream, logprobs=3, stop=["e", "the"], **so)),
        ("/v1/completions", dict(base, prompt=P, stream=stream, logprobs=2, stop=["an"],
                                 include_stop_str_in_output=True, echo=True, **so)),
        ("/v1/completions", dict(base, prompt=[P, "A ship"], stream=stream, return_token_ids=True, max_tokens=120,
                                 **so)),
        ("/v1/chat/completions", dict(base, messages=MSG, stream=stream, logprobs=True, top_logprobs=2, **so)),
        ("/v1/chat/completions", dict(base, messages=MSG, stream=stream, stop=["at"], return_token_ids=True, **so)),
        ("/v1/chat/completions", dict(base, messages=MSG, stream=stream, temperature=0, n=1, max_tokens=400, **so)),
        ("/v1/responses", dict(model="tiny", input=P, stream=stream, max_output_tokens=200, temperature=0)),
    ]

def joined(s):
    """A stream's content per choice, chunk boundaries aside (they depend on how far the reader lagged)."""
    out = {}
    for line in s.split("\n"):
        if not line.startswith("data: {"):
            continue
        ev = json.loads(line[6:])
        if ev.get("type", "").startswith("response."):
            if ev["type"] == "response.output_text.delta":
                out.setdefault("text", []).append(ev["delta"])
            elif ev["type"] in ("response.completed", "response.output_text.done"):
                out[ev["type"]] = ev
            continue
        if not ev.get("choices"):
            out["usage"] = ev.get("usage")
            continue
        for ch in ev["choices"]:
            d = out.setdefault(ch["index"], {"text": "", "reasoning": "", "reasoning_content": "", "ids": [], "lp": [],
                                             "end": None})
            delta = ch.get("delta") or {}
            d["text"] += ch.get("text") or delta.get("content") or ""
            d["reasoning"] += delta.get("reasoning") or ""
            d["reasoning_content"] += delta.get("reasoning_content") or ""
            d["ids"] += ch.get("token_ids") or []
            lp = ch.get("logprobs")
            if lp:
                if "content" in lp:  # chat's
                    d["lp"] += lp["content"]
                else:  # completions': text_offset left out (it counts the text sent before each chunk)
                    d["lp"] += list(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True))
            d["end"] = (ch.get("finish_reason"), ch.get("stop_reason"))
    return json.dumps({str(k): ("".join(v) if k == "text" else v) for k, v in out.items()}, sort_keys=True)


def norm(b):
    s = b.decode()
    s = re.sub(r'"created(_at)?": ?\d+(\.\d+)?', '"created": 0', s)
    s = re.sub(r'"sequence_number": \d+', '"sequence_number": 0', s)
    s = re.sub(r'(cmpl|chatcmpl|resp|msg)[-_][0-9a-zA-Z-]+', r'\1-X', s)
    return joined(s) if "data: " in s else s

ports = [18411, 18412]
procs = [start(t, p) for t, p in zip(TREES, ports, strict=True)]
try:
    bodies = [[], []]
    for k, port in enumerate(ports):
        with httpx.Client(timeout=600, headers={"Authorization": f"Bearer {KEY}"}) as c:
            for path, body in REQS:
                # twice: the first warms the prefix cache, the second is compared (numerics as the other's)
                c.post(f"http://127.0.0.1:{port}{path}", json=body)
                bodies[k].append(norm(c.post(f"http://127.0.0.1:{port}{path}", json=body).content))
    same = 0
    for (path, body), a, b in zip(REQS, *bodies, strict=True):
        ok = a == b
        same += ok
        shown = {k: v for k, v in body.items() if k not in ("messages", "prompt", "model")}
        print(("SAME " if ok else "DIFF ") + path + " " + json.dumps(shown), len(a), "bytes")
        if not ok:
            i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            lo = max(0, i - 150)
            print("   first diff at", i, repr(a[lo : i + 150]), "\n   vs", repr(b[lo : i + 150]))
    print(f"{same}/{len(REQS)} identical")
finally:
    for p in procs:
        p.terminate()
        p.wait(30)
