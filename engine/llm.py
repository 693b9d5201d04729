"""The offline API, mirroring vLLM's: `LLM(model, **engine_args).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from flotilla.engine.chat_content import ContentFormatOption
from flotilla.engine.chat_rendering import (
    check_prompt_end,
    chosen_template,
    history_for_template,
    render_trusted,
    template_variables,
)
from flotilla.engine.errors import client_error
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.pooling.classify import classify_prompts, token_classify_prompts
from flotilla.engine.pooling.embed import EmbeddingOutput, embed_prompts
from flotilla.engine.pooling.output import (
    ClassificationOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from flotilla.engine.pooling.pair_scores import ScoreItem, score_pairs
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.pooling.prompts import check_prompt
from flotilla.engine.prompt_truncation import truncate_prompt
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.structured_output.config import with_reasoning_parser

Prompt = str | list[int] | dict[str, Any]


class LLM:
    """Offline batched generation. `model=None` loads the embedded SmolLM2-135M-Instruct."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        """`engine_args` are `vllm serve`'s flags by their Python names (`max_model_len=...`), and vLLM's
        `reasoning_parser`: with it, a constrained request that thinks is constrained only after its thinking, the
        same setting as `structured_outputs_config={"reasoning_parser": ...}` (both given must agree)."""
        parser = engine_args.pop("reasoning_parser", None)
        if parser is not None:
            engine_args["structured_outputs_config"] = with_reasoning_parser(
                engine_args.get("structured_outputs_config"), parser)
        self.engine = LLMEngine.from_kwargs(model, **engine_args)
        # A batch of distinct schemas is this caller's own work, not a flood: queue every compile it needs.
        self.engine.max_pending_compiles = None

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """vLLM's `LLM.sleep` (needs `enable_sleep_mode=True`): level 1 moves the weights to host memory and frees
        the KV cache; level 2 frees the weights too (`wake_up`, then `collective_rpc("reload_weights")`). `mode`
        ("abort", "wait", "keep") says what happens to requests in flight (`LLMEngine.sleep`); `generate` leaves
        none, so here they differ only for requests added to `llm.engine` directly: "wait" steps them to the end
        here (their outputs are not returned)."""
        self.engine.sleep(level, mode)
        while self.engine.sleep_pending():  # nothing else steps this engine: drive it to the sleep
            self.engine.step()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM's `LLM.wake_up`: take back the memory `tags` name ("weights", "kv_cache"; None: all)."""
        self.engine.wake_up(tags)

    def collective_rpc(self, method: str) -> list[Any]:
        """vLLM's worker call, for the one method sleep mode needs: "reload_weights" (the weights read again from
        the model's checkpoint). One result per worker: this engine has one."""
        if method != "reload_weights":
            raise ValueError(f"collective_rpc supports only 'reload_weights', not {method!r}")
        self.engine.reload_weights()
        return [None]

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

        A prompt is text, a list of token ids, or `{"prompt": ...}` / `{"prompt_token_ids": [...]}`; a dict's
        `"cache_salt"` (vLLM's TextPrompt / TokensPrompt key) keeps its prefix-cache blocks apart from other
        salts', as the server's `cache_salt` does. `lora_request` (one for all prompts, or one per prompt, None
        for the base model) needs `enable_lora=True`.
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
                ids.append(self.engine.add_request(_unwrap(prompt), p, prompt_text=text, lora_request=lora,
                                                   cache_salt=_salt_of(prompt)).request_id)
        except BaseException:
            self.engine.abort(ids)  # one bad prompt queues none of the batch
            raise
        return self._run(ids, use_tqdm)

    def embed(self, prompts: Prompt | Sequence[Prompt], dimensions: int | None = None, *,
              truncate_prompt_tokens: int | None = None) -> list[EmbeddingOutput]:
        """Embeddings of every prompt (needs `runner="pooling"`): last-token pooled, L2-normalised,
        cut to `dimensions` on matryoshka models; `truncate_prompt_tokens` (vLLM's) embeds each prompt's
        last N tokens (-1: the context length). A prompt dict's `"cache_salt"` keys its prefix-cache blocks,
        as on `generate`."""
        params = PoolingParams(dimensions=dimensions)
        return self._pool(prompts, truncate_prompt_tokens,
                          lambda ids, salt: embed_prompts(self.engine, ids, params, salt))

    def classify(self, prompts: Prompt | Sequence[Prompt], *, use_activation: bool = True,
                 truncate_prompt_tokens: int | None = None) -> list[ClassificationOutput]:
        """A classifier's (`--convert classify`) class scores of every prompt, vLLM's `LLM.classify`: the `score`
        head on the last token, softmax over the labels (sigmoid for one label) unless `use_activation=False`;
        `truncate_prompt_tokens` and a prompt dict's `"cache_salt"` as on `embed`."""
        return self._pool(prompts, truncate_prompt_tokens,
                          lambda ids, salt: classify_prompts(self.engine, ids, use_activation, salt))

    def score(self, data_1: Prompt | Sequence[Prompt], data_2: Prompt | Sequence[Prompt], /, *,
              use_activation: bool = True, truncate_prompt_tokens: int | None = None) -> list[ScoringRequestOutput]:
        """vLLM's `LLM.score`: the score of each pair of `data_1` and `data_2` (each a prompt or a list of them;
        1 to 1, 1 to N or N to N), one `ScoringRequestOutput` per pair (`.outputs.score`). A one-label classifier
        (a cross-encoder) scores each pair's encoding by the tokenizer (a token-id prompt decoded first), activated
        unless `use_activation=False` (vLLM's `PoolingParams.use_activation`); an embedding model scores the cosine
        similarity of the two prompts' embeddings. `truncate_prompt_tokens` cuts each pair (a cross-encoder, as the
        tokenizer truncates a pair) or each text (an embedding model, its last N tokens)."""
        sides = [[_score_item(p) for p in _as_prompt_list(data)] for data in (data_1, data_2)]
        return score_pairs(self.engine, sides[0], sides[1], use_activation, truncate_prompt_tokens)

    def encode(self, prompts: Prompt | Sequence[Prompt], *, pooling_task: str | None = None,
               use_activation: bool = True, truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
        """vLLM's `LLM.encode`: one `PoolingRequestOutput` per prompt, its `outputs.data` a float32 tensor of the
        `pooling_task` (required, as vLLM's): "token_classify" (a classifier's activated scores at every token,
        `[num_tokens, num_labels]`), "classify" (`[num_labels]`) or "embed" (`[hidden]`). `use_activation` (vLLM's
        `PoolingParams` field) as on `classify`; `truncate_prompt_tokens` and a dict's `"cache_salt"` as on `embed`."""
        runs: dict[str, Callable[[list[list[int]], str | None], list[Any]]] = {
            "token_classify": lambda ids, salt: token_classify_prompts(self.engine, ids, use_activation, salt),
            "classify": lambda ids, salt: [o.probs for o in classify_prompts(self.engine, ids, use_activation, salt)],
            "embed": lambda ids, salt: [o.embedding for o in embed_prompts(self.engine, ids, PoolingParams(), salt)],
        }
        if pooling_task not in runs:
            raise ValueError(f"pooling_task must be one of {', '.join(runs)} (vLLM's token_embed and plugin tasks are "
                             f"not served), not {pooling_task!r}")
        run = runs[pooling_task]
        pooled = self._pool(prompts, truncate_prompt_tokens,
                            lambda ids, salt: list(zip(ids, run(ids, salt), strict=True)))
        return [PoolingRequestOutput(str(i), PoolingOutput(torch.tensor(data, dtype=torch.float32)), ids)
                for i, (ids, data) in enumerate(pooled)]

    def reward(self, prompts: Prompt | Sequence[Prompt], *, use_activation: bool = True,
               truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
        """vLLM's `LLM.reward`: `encode(prompts, pooling_task="token_classify")`, a score per token."""
        return self.encode(prompts, pooling_task="token_classify", use_activation=use_activation,
                           truncate_prompt_tokens=truncate_prompt_tokens)

    def _pool(self, prompts: Prompt | Sequence[Prompt], truncate_prompt_tokens: int | None,
              run: Callable[[list[list[int]], str | None], list[Any]]) -> list[Any]:
        """`run(token ids, cache salt)` over the prompts, tokenized and truncated, once per salt (a call keys all its
        prompts alike), the outputs in prompt order."""
        prompt_list = _as_prompt_list(prompts)
        salts = [_salt_of(p) for p in prompt_list]
        max_len = self.engine.config.model.max_model_len
        token_ids = [truncate_prompt(self.engine.tokenizer.encode(p) if isinstance(p, str) else list(p),
                                     truncate_prompt_tokens, max_len) for p in map(_unwrap, prompt_list)]
        by_salt = _indices_by_salt(salts)
        if len(by_salt) <= 1:
            return run(token_ids, salts[0] if salts else None)
        # Every prompt is checked first, by its index in this call, so a bad one fails the whole call before any
        # is pooled.
        for i, ids in enumerate(token_ids):
            check_prompt(i, ids, max_len, self.engine.vocab_size)
        outputs: dict[int, Any] = {}
        for salt, indices in by_salt.items():
            outputs.update(zip(indices, run([token_ids[i] for i in indices], salt), strict=True))
        return [outputs[i] for i in range(len(token_ids))]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | None = None,
        chat_template: str | None = None,
        chat_template_content_format: ContentFormatOption = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        cache_salt: str | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation (one, or a list of them) with the chat template and generate; vLLM's arguments.

        `chat_template` replaces the model's template (as `chat_template_kwargs["chat_template"]` does). It runs
        unsandboxed, as the model's own template does: this API runs in the caller's process, so the caller's
        template is trusted (the server, by contrast, sandboxes templates sent in requests).
        `chat_template_content_format`: how a message's content reaches the template, "string", "openai" (a list
        of parts) or "auto" (chosen from the template, as the server's --chat-template-content-format).
        `add_generation_prompt` opens the assistant's reply; `continue_final_message` instead leaves the last
        message open for the model to continue (both true is a ValueError, as in vLLM). `tools` (OpenAI function
        definitions) and `chat_template_kwargs` (extra template variables; the renderer's own argument names are
        refused) reach the template. `lora_request` generates with that adapter (needs `enable_lora=True`).
        `cache_salt` keys every conversation's prefix-cache blocks, as a prompt dict's `"cache_salt"` on
        `generate` and the server's chat completions' field (vLLM's `chat` has no such argument).
        """
        check_prompt_end(add_generation_prompt, continue_final_message)
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        template = chosen_template(chat_template, chat_template_kwargs)
        variables = template_variables(chat_template_kwargs) | ({"tools": tools} if tools else {})
        tokenizer = self.get_tokenizer()
        prompts = [
            render_trusted(tokenizer, history_for_template(copy.deepcopy(cast("list[dict[str, Any]]", conv))),
                           template, chat_template_content_format, add_generation_prompt, continue_final_message,
                           variables)
            for conv in conversations
        ]
        # The template already carries the BOS/special tokens: tokenize without adding them again.
        token_lists = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(
            [{"prompt_token_ids": t, "prompt": p, "cache_salt": cache_salt}
             for t, p in zip(token_lists, prompts, strict=True)],
            sampling_params,
            use_tqdm,
            lora_request,
        )

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finals: dict[str, RequestOutput] = {}
        bar = _progress_bar(len(request_ids)) if use_tqdm and len(request_ids) > 1 else None
        try:
            if self.engine.is_sleeping():  # nothing would run: fail rather than wait for a wake_up that cannot come
                raise RuntimeError("the engine is asleep: call wake_up() before generating")
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


def _score_item(prompt: Prompt) -> ScoreItem:
    if isinstance(prompt, dict) and "multi_modal_data" in prompt:
        raise ValueError("multimodal prompts are not supported for scoring")
    return _unwrap(prompt)


def _salt_of(prompt: Prompt) -> str | None:
    """A prompt dict's `cache_salt`, or None; as the server's field, a salt is a non-empty string."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError("a prompt's 'cache_salt' must be a non-empty string")
    return salt


def _indices_by_salt(salts: list[str | None]) -> dict[str | None, list[int]]:
    """Each distinct salt (first seen first) and the indices of the prompts under it."""
    groups: dict[str | None, list[int]] = {}
    for i, salt in enumerate(salts):
        groups.setdefault(salt, []).append(i)
    return groups


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
