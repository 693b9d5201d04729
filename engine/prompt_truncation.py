"""vLLM's `truncate_prompt_tokens`: keep a prompt's last N tokens (the start is cut, so the end the model
continues from stays), for the offline API and the server alike; or, with vLLM's pooling `truncation_side`
"right", its first N."""

from __future__ import annotations

from typing import Literal

from flotilla.engine.errors import InvalidParamError


def truncate_prompt(token_ids: list[int], keep: int | None, max_model_len: int,
                    side: Literal["left", "right"] = "left") -> list[int]:
    """The last `keep` tokens of a prompt (the first with `side` "right": the right side is cut); -1 keeps up to
    `max_model_len`, None keeps everything.

    0 and a `keep` over the context length are refused (InvalidParamError on `truncate_prompt_tokens`:
    a 400 on the server), as vLLM's `_validate_truncation_size` refuses the latter."""
    if keep is None:
        return token_ids
    keep = kept_tokens(keep, max_model_len)
    return token_ids[:keep] if side == "right" else token_ids[-keep:]


def kept_tokens(keep: int, max_model_len: int) -> int:
    """How many tokens `truncate_prompt_tokens` = `keep` keeps (-1: `max_model_len`); InvalidParamError for 0 and for
    more than the context length."""
    if keep == -1:
        return max_model_len
    if keep == 0:
        raise InvalidParamError("truncate_prompt_tokens must be at least 1, or -1 for the model's maximum "
                                "context length", param="truncate_prompt_tokens")
    if keep > max_model_len:
        raise InvalidParamError(f"truncate_prompt_tokens={keep} is larger than this model's maximum context "
                                f"length ({max_model_len} tokens)", param="truncate_prompt_tokens")
    return keep


# Tokens a text's cut part holds beyond the kept ones: near the cut its tokens may differ from the whole text's (a word
# cut in two), and the kept ones lie past them.
CUT_SLACK_TOKENS = 64


def truncated_parts(text: str, keep: int, side: Literal["left", "right"], longest_token_chars: int) -> list[str]:
    """Two parts of `text` that hold its kept tokens (its last `keep`, or its first with `side` "right"), cut at two
    places; none when the text is short enough to tokenize whole at about the same cost.

    A token stands for at most `longest_token_chars` characters, so the first part tokenizes to `keep +
    CUT_SLACK_TOKENS` tokens or more (unless a normalizer drops characters: `tokenized_part` counts them), its kept
    ones past its first CUT_SLACK_TOKENS, away from the cut. They are the whole text's once the tokenization after the
    cut is back in step with the whole text's (at the next word, for the usual tokenizers). Within one long run that
    the tokenizer splits from its start (spaces, newlines) it may never be: the run's tokens are aligned by its length.
    The second part, cut CUT_SLACK_TOKENS tokens' characters and one character further, shifts that alignment: the two
    parts' kept tokens agree where the cut did not reach them. Their agreement is the evidence, not a proof
    (tests/engine/test_prompt_truncation.py: words, code, Unicode and digits agree with the whole text, and so do long
    runs cut at their end; cut at their start, runs of spaces, newlines and one letter disagree: `run_parts`)."""
    chars = (keep + CUT_SLACK_TOKENS) * longest_token_chars
    further = chars + CUT_SLACK_TOKENS * longest_token_chars + 1
    if len(text) <= 2 * further:  # the two parts would cost about what the whole text does
        return []
    return [text[-chars:], text[-further:]] if side == "left" else [text[:chars], text[:further]]


# A run of one character shortened by a multiple of this many characters keeps its last tokens: tokenized from its
# start, a run repeats its tokens, of a few lengths (4 for letters and newlines, 64 for spaces and dashes with the
# embedded SmolLM2's tokenizer). 20,160 = 2^6 * 3^2 * 5 * 7 is a multiple of each length up to 10 and of 12, 14, 16,
# 18, 20, 24, 28, 32, 48 and 64.
RUN_PERIOD = 20_160


def run_parts(text: str, keep: int, side: Literal["left", "right"], longest_token_chars: int) -> list[str]:
    """Two shortened copies of `text` that hold its last `keep` tokens when `truncated_parts`' cut falls in a long run
    of one character (`"a" * 5_000_000`, spaces, newlines: its parts disagree there): the run loses as many whole
    RUN_PERIODs as lie before the cut (the second copy one fewer), and the text before the run is kept for
    CUT_SLACK_TOKENS tokens' characters, so that the run starts as in the whole text. If the run's tokens repeat
    with a period dividing RUN_PERIOD, both copies end in the whole text's tokens; their agreement
    (`tokenized_part`) is the evidence, as for `truncated_parts`. None for the right side (a run at the start
    tokenizes from its start in any part), or when the cut is not that deep in a run."""
    chars = (keep + CUT_SLACK_TOKENS) * longest_token_chars
    cut = len(text) - chars
    if side == "right" or cut < RUN_PERIOD:
        return []
    head = text[:cut]
    start = len(head.rstrip(text[cut]))  # where the run holding the cut begins
    removed = (cut - start) // RUN_PERIOD * RUN_PERIOD
    if removed == 0:
        return []
    before = text[max(0, start - CUT_SLACK_TOKENS * longest_token_chars):start]
    parts = [before + text[start + removed:], before + text[start + removed - RUN_PERIOD:]]
    return parts if len(parts[0]) + len(parts[1]) < len(text) else []  # else the whole text costs less


def tokenized_part(parts_ids: list[list[int]], keep: int, side: Literal["left", "right"]) -> list[int] | None:
    """The first part's tokens (`truncated_parts`, tokenized) when its kept ones are the whole text's: past enough
    tokens from its cut (a normalizer that drops characters can leave fewer), and the same in both parts. None: the
    whole text must be tokenized."""
    first, second = parts_ids
    if len(first) < keep + CUT_SLACK_TOKENS:
        return None
    kept = (lambda ids: ids[:keep]) if side == "right" else (lambda ids: ids[-keep:])
    return first if kept(first) == kept(second) else None
