"""What config.json (with --hf-overrides) says of a sequence classifier: its labels, how its `score` head is made,
and which activation turns the head's logits into what /classify and /score report. Pure (no torch): the config
builder checks it before anything loads, and the API process reads the labels.

vLLM's rules. The head is `score.weight` `[num_labels, hidden]` from the checkpoint, unless config.json names
`classifier_from_token` and a `method` that builds it from the LM head's rows of those tokens (a causal LM used as
a reranker): `from_2_way_softmax` (two tokens, one label: the row of the second minus the row of the first, so the
label's logit is the two tokens' logit difference) or `no_post_processing` (one label per token, its row).
`is_original_qwen3_reranker: true` on a Qwen3ForSequenceClassification is `from_2_way_softmax`. The number of labels
is config.json's `id2label` length (else `num_labels`, else 2, as transformers' default). The activation follows
`problem_type` as transformers' loss does: none for `regression`, a sigmoid per label for
`multi_label_classification`, else a sigmoid for one label and a softmax over several.
"""

from __future__ import annotations

from typing import Any

FROM_TOKEN_METHODS = ("from_2_way_softmax", "no_post_processing")
_PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")


def head_method(hf_config: dict[str, Any]) -> str | None:
    """How the `score` head is built from the LM head (FROM_TOKEN_METHODS), or None: loaded from the checkpoint."""
    method = hf_config.get("method")
    if method is None and hf_config.get("is_original_qwen3_reranker") and \
            "Qwen3ForSequenceClassification" in (hf_config.get("architectures") or []):
        return "from_2_way_softmax"
    return method


def num_labels(hf_config: dict[str, Any]) -> int:
    """The classes the head scores."""
    method = head_method(hf_config)
    if method == "from_2_way_softmax":
        return 1
    if method == "no_post_processing":
        return len(hf_config["classifier_from_token"])
    if hf_config.get("id2label"):
        return len(hf_config["id2label"])
    return int(hf_config.get("num_labels", 2))


def labels(hf_config: dict[str, Any]) -> list[str]:
    """Each class's name: config.json's `id2label` (keys are strings in JSON), else transformers' `LABEL_i`."""
    count = num_labels(hf_config)
    named = {str(k): str(v) for k, v in (hf_config.get("id2label") or {}).items()}
    if len(named) != count:  # the head was rebuilt with another size (transformers renames them so too)
        named = {}
    return [named.get(str(i), f"LABEL_{i}") for i in range(count)]


def activation(hf_config: dict[str, Any]) -> str:
    """"sigmoid", "softmax" or "identity": what turns the head's logits into /classify's probs and /score's score."""
    problem = hf_config.get("problem_type")
    if problem == "regression":
        return "identity"
    if problem == "multi_label_classification" or num_labels(hf_config) == 1:
        return "sigmoid"
    return "softmax"


def classifier_problem(hf_config: dict[str, Any]) -> str | None:
    """Why config.json's classifier fields cannot build a head, or None (checked before the model loads)."""
    method, tokens = head_method(hf_config), hf_config.get("classifier_from_token")
    if tokens is not None and (not isinstance(tokens, list) or not tokens
                               or not all(isinstance(t, str) for t in tokens)):
        return f"classifier_from_token must be a non-empty list of token strings, not {tokens!r}"
    if tokens is not None and method is None:
        return ("classifier_from_token needs a method (from_2_way_softmax or no_post_processing) or, on "
                "Qwen3ForSequenceClassification, is_original_qwen3_reranker: true")
    if method is not None:
        if method not in FROM_TOKEN_METHODS:
            return f"method {method!r} is not one of {', '.join(FROM_TOKEN_METHODS)}"
        if tokens is None:
            return f"method {method} needs classifier_from_token (the tokens whose LM-head rows make the head)"
        if method == "from_2_way_softmax" and len(tokens) != 2:
            return f"from_2_way_softmax takes two tokens (the false one, then the true one), not {tokens!r}"
    if hf_config.get("problem_type") not in _PROBLEM_TYPES:
        return f"problem_type {hf_config['problem_type']!r} is not one of {', '.join(map(str, _PROBLEM_TYPES[1:]))}"
    if num_labels(hf_config) < 1:
        return "the classifier needs at least one label (num_labels or id2label)"
    return None
