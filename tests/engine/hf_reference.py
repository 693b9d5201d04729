"""HF transformers as the oracle: greedy continuations computed one prompt at a time."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch


@cache
def _hf_model(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def hf_greedy(
    model_dir: Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    dtype: torch.dtype = torch.float32,
    stop_at_eos: bool = False,
) -> list[list[int]]:
    """HF `generate` greedy tokens for each prompt: exactly `max_new_tokens` where EOS does not stop
    it (then EOS may still be *generated*, as with vLLM's ignore_eos), else up to and including EOS."""
    return model_greedy(_hf_model(str(model_dir), dtype), prompts, max_new_tokens, stop_at_eos)


def model_greedy(
    model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = False
) -> list[list[int]]:
    """`hf_greedy` on a model already built (one loaded from a GGUF file, or with hooks on its layers)."""
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            eos = None if not stop_at_eos else model.generation_config.eos_token_id
            y = model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs
