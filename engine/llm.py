"""The offline API, mirroring vLLM's: `LLM(model, **engine_args).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flotilla.engine.errors import client_error
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.pooling.embed import EmbeddingOutput, embed_prompts
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.prompt_truncation import truncate_prompt
from flotilla.engine.sampling_params import SamplingParams

Prompt = str | list[int] | dict[str, Any]


class LLM:
    """Offline batched generation. `model=None` loads the embedded SmolLM2-135M-Instruct."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine.from_kwargs(model, **engine_args)
        # A batch of distinct schemas is this caller's own work, not a flood: queue every compile it needs.
        self.engine.max_pending_compiles = None

    def get_tokenizer(self) -> Any:
        """The engine's HF tokenizer."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order.

        A prompt is text, a list of token ids, or `{"prompt": ...}` / `{"prompt_token_ids": [...]}`.
        `lora_request` (one for all prompts, or one per prompt, None for the base model) needs
        `enable_lora=True`.
        """
        prompt_list = _as_prompt_list(prompts)
        # Offline callers see only final outputs, so the engine need not build one per step.
        params = [p.model_copy(update={"output_kind": "final_only"})
                  for p in _as_params_list(sampling_params, len(prompt_list), self.engine.default_sampling)]
        loras = list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * len(prompt_list)
        ids = []
        try:
            for prompt, p, lora in zip(prompt_list, params, loras, strict=True):
                text = prompt.get("prompt") if isinstance(prompt, dict) else None
                ids.append(self.engine.add_request(_unwrap(prompt), p, prompt_text=text, lora_request=lora).request_id)
        except BaseException:
            self.engine.abort(ids)  # one bad prompt queues none of the batch
            raise
        return self._run(ids, use_tqdm)

    def embed(self, prompts: Prompt | Sequence[Prompt], dimensions: int | None = None, *,
              truncate_prompt_tokens: int | None = None) -> list[EmbeddingOutput]:
        """Embeddings of every prompt (needs `runner="pooling"`): last-token pooled, L2-normalised,
        cut to `dimensions` on matryoshka models; `truncate_prompt_tokens` (vLLM's) embeds each prompt's
        last N tokens (-1: the context length)."""
        ids = [_unwrap(p) for p in _as_prompt_list(prompts)]
        max_len = self.engine.config.model.max_model_len
        token_ids = [truncate_prompt(self.engine.tokenizer.encode(p) if isinstance(p, str) else list(p),
                                     truncate_prompt_tokens, max_len) for p in ids]
        return embed_prompts(self.engine, token_ids, PoolingParams(dimensions=dimensions))

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them) and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        prompts = [
            tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
            for conv in conversations
        ]
        # The template already carries the BOS/special tokens: tokenize without adding them again.
        token_lists = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(
            [{"prompt_token_ids": t, "prompt": p} for t, p in zip(token_lists, prompts, strict=True)],
            sampling_params,
            use_tqdm,
        )

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finals: dict[str, RequestOutput] = {}
        bar = _progress_bar(len(request_ids)) if use_tqdm and len(request_ids) > 1 else None
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finals[output.request_id] = output
                        if bar is not None:
                            bar.update(1)
                failures = self.engine.take_failures()
                if failures:
                    raise client_error(failures[0])
        except BaseException:
            self.engine.abort(request_ids)  # leave no request (and no KV block) behind
            raise
        finally:
            if bar is not None:
                bar.close()
        return [finals[i] for i in request_ids]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str | dict):
        return [prompts]
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], int):
        return [prompts]
    return list(prompts)


def _as_params_list(params: SamplingParams | Sequence[SamplingParams] | None, n: int,
                    defaults: dict[str, Any]) -> list[SamplingParams]:
    if params is None:  # as vLLM's LLM: the model's generation_config.json defaults (--generation-config)
        return [SamplingParams(**defaults)] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} sampling params for {n} prompts")
    return list(params)


def _unwrap(prompt: Prompt) -> str | list[int]:
    if not isinstance(prompt, dict):
        return prompt
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
