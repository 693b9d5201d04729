"""`LLM.chat(lora_request=...)` generates with the adapter: HF + PEFT's greedy tokens for the rendered prompt."""

from __future__ import annotations

from flotilla.engine.llm import LLM
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.sampling_params import SamplingParams

from .peft_reference import peft_greedy

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_chat_with_an_adapter_matches_peft(tiny_model_dirs, lora_adapters):
    model, adapter = tiny_model_dirs["qwen3"], lora_adapters["qwen3"]["all7"]
    llm = LLM(str(model), enable_lora=True, max_lora_rank=16, max_model_len=256)
    conversation = [{"role": "user", "content": "Name a ship."}]
    (tuned,) = llm.chat(conversation, GREEDY, use_tqdm=False, lora_request=LoRARequest("all7", 1, str(adapter)))
    (base,) = llm.chat(conversation, GREEDY, use_tqdm=False)
    assert tuned.prompt_token_ids == base.prompt_token_ids
    assert tuned.outputs[0].token_ids == peft_greedy(model, adapter, [tuned.prompt_token_ids], MAX_TOKENS)[0]
    assert base.outputs[0].token_ids == peft_greedy(model, None, [base.prompt_token_ids], MAX_TOKENS)[0]
    assert tuned.outputs[0].token_ids != base.outputs[0].token_ids
