"""Offline batched generation with Flotilla's vLLM-style API (the embedded model unless a path is given).

    python examples/offline.py [MODEL_DIR]
"""

import sys

from flotilla.engine import LLM, SamplingParams


def main() -> None:
    llm = LLM(sys.argv[1] if len(sys.argv) > 1 else None)
    prompts = [
        "The harbour at dawn was",
        "Three things every sailor knows:",
        "A lighthouse keeper once said",
    ]
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=48, seed=0)
    for out in llm.generate(prompts, params):
        print(f"{out.prompt!r} -> {out.outputs[0].text!r}")

    chat = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                    SamplingParams(temperature=0, max_tokens=32))
    print(chat[0].outputs[0].text)


if __name__ == "__main__":
    main()
