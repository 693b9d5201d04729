"""`flotilla generate`: offline generation from the command line (the embedded model by default)."""

from __future__ import annotations

import argparse
import sys

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, FlagParser, add_flags, flag_values


def build_parser() -> argparse.ArgumentParser:
    """The `flotilla generate` argument parser."""
    parser = FlagParser(prog="flotilla generate", description=__doc__)
    parser.add_argument("model", nargs="?", default=None, help="HF model directory (default: the embedded model)")
    parser.add_argument("-p", "--prompt", action="append", help="a prompt (repeatable)")
    parser.add_argument("--chat", action="store_true", help="treat each prompt as a user chat message")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per prompt")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    add_flags(parser, ENGINE_COMPONENTS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Generate for the given prompts and print each completion."""
    args = build_parser().parse_args(argv)
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams

    prompts = args.prompt or ["What is the capital of France?"]
    try:
        llm = LLM(args.model, **flag_values(args, ENGINE_COMPONENTS))
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    except ValueError as exc:
        print(f"flotilla generate: error: {exc}", file=sys.stderr)
        return 2
    if args.chat or (args.model is None and not args.prompt):
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        print(f"### {prompt}\n{out.outputs[0].text}\n")
    return 0
