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
`multi_label_classification`, a sigmoid for one label and a softmax over several for `single_label_classification`.
Without a problem_type, a sentence-transformers cross-encoder's own activation decides (vLLM's `get_act_fn`):
config.json's `sentence_transformers.activation_fn` (sentence-transformers 4 and later), else the older
`sbert_ce_default_activation_function`, a class of `torch.nn.modules` (nothing else is imported), built without
arguments. `Identity` leaves the logits; `Sigmoid` and `Softmax` mean the default (a sigmoid for one label, a softmax
over several, whichever was named, as vLLM's `PoolerActivation.wraps`); any other class (`Tanh`) is applied as it is.
Without either, the default.
"""

from __future__ import annotations

from typing import Any

FROM_TOKEN_METHODS = ("from_2_way_softmax", "no_post_processing")
# Where a sentence-transformers activation may come from (vLLM's rule, for safety: config.json names code to run).
ST_ACTIVATION_PACKAGE = "torch.nn.modules."
# The sentence-transformers activations that mean the default one (the label count picks sigmoid or softmax).
_DEFAULT_ST_ACTIVATIONS = ("Sigmoid", "Softmax")
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
    """"sigmoid", "softmax", "identity" or a `torch.nn.modules` class's qualified name (sentence-transformers' own,
    applied as it is): what turns the head's logits into /classify's probs and /score's score."""
    problem = hf_config.get("problem_type")
    if problem == "regression":
        return "identity"
    if problem == "multi_label_classification":
        return "sigmoid"
    named = sentence_transformers_activation(hf_config) if problem is None else None
    if named is not None:
        kind = named.rpartition(".")[2]
        if kind == "Identity":
            return "identity"
        if kind not in _DEFAULT_ST_ACTIVATIONS:
            return named
    return "sigmoid" if num_labels(hf_config) == 1 else "softmax"


def sentence_transformers_activation(hf_config: dict[str, Any]) -> str | None:
    """The activation class a sentence-transformers cross-encoder saved in config.json (None: none):
    `sentence_transformers.activation_fn` when that key is there (even null), else
    `sbert_ce_default_activation_function`."""
    saved = hf_config.get("sentence_transformers")
    if isinstance(saved, dict) and "activation_fn" in saved:
        return saved["activation_fn"]
    return hf_config.get("sbert_ce_default_activation_function")


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
    named = sentence_transformers_activation(hf_config)
    if named is not None and not (isinstance(named, str) and named.startswith(ST_ACTIVATION_PACKAGE)
                                  and named.rpartition(".")[2].isidentifier()):
        return (f"the sentence-transformers activation {named!r} is not a class of {ST_ACTIVATION_PACKAGE.rstrip('.')} "
                "(only those are loaded, as vLLM)")
    if hf_config.get("problem_type") not in _PROBLEM_TYPES:
        return f"problem_type {hf_config['problem_type']!r} is not one of {', '.join(map(str, _PROBLEM_TYPES[1:]))}"
    if num_labels(hf_config) < 1:
        return "the classifier needs at least one label (num_labels or id2label)"
    return None
