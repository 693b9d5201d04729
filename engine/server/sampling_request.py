"""A request's sampling fields -> SamplingParams, as vLLM's server builds them.

A field the request leaves out takes the model's generation_config.json value (`--generation-config`), else
vLLM's neutral one; max_tokens is bounded by the context left and by the server's cap; vLLM fields this server
does not implement are refused; a value SamplingParams refuses is a 400 that names its field.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.sampling_params import LOGIT_BIAS_MAX, SamplingParams
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.protocol import _RequestBody, _SamplingFields
from flotilla.engine.server.structured_request import structured_outputs


def max_tokens_cap(generation_config: str, defaults: dict[str, Any], override: dict[str, Any]) -> int | None:
    """vLLM's `override_max_tokens`, a bound on every request's max_tokens (given or not): the default max_tokens of a
    --generation-config folder, else --override-generation-config's max_new_tokens (the model's own
    generation_config.json, with `auto`, only sets the default)."""
    if generation_config not in ("auto", "vllm"):
        return defaults.get("max_tokens")
    return override.get("max_new_tokens")


# Logprob entries one request may hold: the prompt's, prompt tokens x (prompt_logprobs + 1) times the copies the
# reply carries (completions: one per choice, so x n), plus the generated ones, every completion's max_tokens x
# (logprobs + 1). The engine keeps a request's logprobs whole until it ends (its outputs are cumulative, streamed
# or not) and a non-streamed reply is built whole in the API process at ~0.6 KB of Python objects an entry
# (measured: 8 prompts of 4,000 tokens with prompt_logprobs=20, a 0.2 MB body: +405 MB). A body of token ids is ~6
# bytes a token: an 8 MiB body with prompt_logprobs=20 made ~16 GB; and n=128 x max_tokens 128k x 21 is 344M
# generated entries from a 100-byte body. One request could take the server down. 4M entries (~2.5 GB) leave room
# for 20 logprobs on one prompt, or one completion, of 128k tokens. vLLM has no such bound; its --max-logprobs
# (default 20) bounds the entries of one token, which check_logprob_entries applies first.
MAX_LOGPROB_ENTRIES = 1 << 22


def check_logprob_entries(prompt_lens: list[int], params: list[SamplingParams], prompt_copies: int,
                          prompt_param: str, param: str, max_logprobs: int,
                          max_tokens_given: bool = True) -> list[SamplingParams]:
    """`params` (one per prompt) with the request's logprobs within MAX_LOGPROB_ENTRIES: the prompt's (a 400 naming
    `prompt_param` when they alone pass it) plus the generated ones at max_tokens (a 400 naming `param`). First, a
    token's logprobs or prompt_logprobs above `max_logprobs` (--max-logprobs) are vLLM's 400, naming the field.

    Without `max_tokens_given`, max_tokens is the server's choice (the context left, or a default), so it is
    lowered to what fits rather than refused: a request vLLM serves (say n=2 with 20 logprobs on a 128k context)
    is served, its completions ending with finish_reason "length" past ~100k tokens."""
    for sp in params[:1]:
        try:
            sp.check_logprobs(max_logprobs)
        except InvalidParamError as exc:
            raise APIError(400, str(exc), param=prompt_param if exc.param == "prompt_logprobs" else param) from None
    prompt_logprobs = params[0].prompt_logprobs if params else None
    tokens = sum(prompt_lens)
    prompt_entries = 0 if prompt_logprobs is None else tokens * (prompt_logprobs + 1) * prompt_copies
    if prompt_entries > MAX_LOGPROB_ENTRIES:
        raise APIError(400, f"{prompt_param}={prompt_logprobs} on {tokens} prompt tokens" + (
                            f" x n={prompt_copies}" if prompt_copies > 1 else "") + f" would return {prompt_entries} "
                            f"prompt logprob entries; at most {MAX_LOGPROB_ENTRIES} are allowed (ask for fewer, or "
                            "send fewer prompt tokens)", param=prompt_param)
    if not max_tokens_given:
        params = _fitted(params, MAX_LOGPROB_ENTRIES - prompt_entries)
    wanted = [(sp.n, sp.max_tokens or 0, sp.logprobs) for sp in params if sp.logprobs is not None]
    entries = prompt_entries + sum(n * max_tokens * (logprobs + 1) for n, max_tokens, logprobs in wanted)
    if entries > MAX_LOGPROB_ENTRIES:
        completions = sum(n for n, _, _ in wanted)
        raise APIError(400, f"{param}={wanted[0][2]} on {completions} completion"
                            f"{'s' if completions > 1 else ''} of up to {max(t for _, t, _ in wanted)} tokens "
                            f"(max_tokens, or the context left when it is not given) could return {entries} logprob "
                            f"entries" + (f" ({prompt_entries} of them the prompt's)" if prompt_entries else "") +
                            f"; at most {MAX_LOGPROB_ENTRIES} are allowed (ask for fewer logprobs, a lower n or a "
                            "lower max_tokens)", param=param)
    return params


def _fitted(params: list[SamplingParams], room: int) -> list[SamplingParams]:
    """`params` with the max_tokens of those asking for logprobs lowered so that their entries fit `room`
    (never under min_tokens: what still does not fit is refused by the caller)."""
    per_token = sum(sp.n * (sp.logprobs + 1) for sp in params if sp.logprobs is not None)
    if per_token == 0:
        return params
    cap = max(room, 0) // per_token
    return [sp.model_copy(update={"max_tokens": max(cap, sp.min_tokens, 1)})
            if sp.logprobs is not None and sp.max_tokens is not None and sp.max_tokens > max(cap, sp.min_tokens, 1)
            else sp for sp in params]


# vLLM request fields that change what is generated or returned, which this server does not implement: set
# (to anything but their off value) they are refused, where other unknown fields are logged and ignored, since
# ignoring them would answer 200 with output the client asked to be different. Each with why, for the 400.
# (allowed_token_ids and bad_words, once here, are implemented: SamplingParams.) `prompt_embeds`: vLLM embeds them in
# place of (or beside) the prompt's tokens with --enable-prompt-embeds, and refuses them without it; ignored, the
# completion was the `prompt`'s alone. `vllm_xargs` is SamplingParams.extra_args, which only custom extensions read
# (vLLM's --logits-processors plugins): one sent means such an extension is expected. `kv_transfer_params` and
# `ec_transfer_params` drive a disaggregated-serving connector (vLLM's --kv-transfer-config / --ec-transfer-config):
# a P/D proxy sends them to a prefill or decode instance and reads the reply's own back; a server that ignores them
# answers as a whole instance, which the proxy's next step cannot use. `suffix` is OpenAI's completions field (its
# own 400 there, serving.py): vLLM ignores it on chat with a log line, OpenAI refuses it as an unknown argument;
# ignored, the client got text that does not lead up to its suffix.
UNSUPPORTED_VLLM_FIELDS = {
    "use_beam_search": "",
    "logits_processors": "",
    "prompt_embeds": "",
    "vllm_xargs": "it is read by custom extensions (vLLM's logits-processor plugins), and this server loads none",
    "kv_transfer_params": "it drives a disaggregated-prefill KV connector (vLLM's --kv-transfer-config), which this "
                          "server does not have: every request is prefilled and decoded here",
    "ec_transfer_params": "it drives a disaggregated encoder-cache connector (vLLM's --ec-transfer-config), which this "
                          "server does not have",
    "suffix": "it asks for text that ends where the suffix begins (the completions API's insertion), which this "
              "endpoint does not do",
}
# The ones vLLM's Responses request declares too (the others are chat's and completions'), and suffix
RESPONSES_UNSUPPORTED_FIELDS = ("vllm_xargs", "kv_transfer_params", "suffix")


def refuse_unsupported_fields(req: _RequestBody, names: Iterable[str] = tuple(UNSUPPORTED_VLLM_FIELDS)) -> None:
    """400 naming the first of `names` (of `UNSUPPORTED_VLLM_FIELDS`) the request sets (None, false and empty are
    off), and why it is not served."""
    for name in names:
        value = (req.model_extra or {}).get(name)
        if value is not None and value is not False and value != [] and value != {}:
            why = UNSUPPORTED_VLLM_FIELDS[name]
            raise APIError(400, f"{name} is not supported by this server ({why + '; ' if why else ''}leave it out)",
                           param=name)


def sampling_params(req: _SamplingFields, max_tokens: int | None, prompt_len: int, max_model_len: int,
                    logprobs: int | None, prompt_logprobs: int | None = None,
                    defaults: dict[str, Any] | None = None, max_tokens_cap: int | None = None) -> SamplingParams:
    """OpenAI/vLLM request fields -> SamplingParams. A field the request leaves out takes the model's
    generation_config.json value in `defaults` (`--generation-config`), else vLLM's neutral one (temperature 1).
    `max_tokens_cap` bounds max_tokens even when the request gives it (vLLM's `override_max_tokens`)."""
    refuse_unsupported_fields(req)
    room = max_model_len - prompt_len
    defaults = defaults or {}

    def field(value: Any, name: str, neutral: Any) -> Any:
        return value if value is not None else defaults.get(name, neutral)
    # A prompt with no room left is the engine's to refuse (one rule, in LLMEngine._validate_prompt).
    if max_tokens is not None and 0 < room < max_tokens:
        # vLLM's words: clients read the two numbers to retry with a max_tokens that fits
        raise APIError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                            f"context length is {max_model_len} tokens and your request has {prompt_len} input tokens "
                            f"({max_tokens} > {max_model_len} - {prompt_len}).", param="max_tokens")
    # vLLM: the model's max_new_tokens when the request gives none, within the context left
    default_max_tokens = max(min(room, defaults.get("max_tokens", room)), 1)
    wanted = max_tokens if max_tokens is not None else default_max_tokens
    if max_tokens_cap:
        wanted = min(wanted, max_tokens_cap)
    try:
        # vLLM's server clamps each bias to [-100, 100] (OpenAI's range) rather than refusing one beyond it
        bias = {int(k): min(max(v, -LOGIT_BIAS_MAX), LOGIT_BIAS_MAX) for k, v in (req.logit_bias or {}).items()} or None
    except ValueError:
        raise APIError(400, "logit_bias keys must be token ids", param="logit_bias") from None
    try:
        return SamplingParams(
            n=req.n,
            temperature=field(req.temperature, "temperature", 1.0),
            top_p=field(req.top_p, "top_p", 1.0),
            top_k=field(req.top_k, "top_k", 0),
            min_p=field(req.min_p, "min_p", 0.0),
            seed=req.seed,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=field(req.repetition_penalty, "repetition_penalty", 1.0),
            logit_bias=bias,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids or [],
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            max_tokens=wanted,
            min_tokens=req.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            structured_outputs=structured_outputs(req),
            allowed_token_ids=req.allowed_token_ids,
            bad_words=req.bad_words,
        )
    except ValueError as exc:
        raise APIError(400, str(exc), param=getattr(exc, "param", None)) from None
