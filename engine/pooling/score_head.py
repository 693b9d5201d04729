"""The sequence classifier's head (`--convert classify`): a float32 `score` linear `[num_labels, hidden]` on the
decoder's last hidden state, in place of the LM head, and the activation over its logits.

`attach_score_head` swaps the heads on a built model; `score_head_tensors` feeds the loader: a
`*ForSequenceClassification` checkpoint's `score.weight` passes through, or (config.json's `classifier_from_token`)
the head is made from the LM head's rows of those tokens as the checkpoint streams by (classifier_config.py says
how). Either way no `lm_head.*` tensor reaches the model, which no longer has one (vLLM drops them too).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from flotilla.engine.pooling.classifier_config import ST_ACTIVATION_PACKAGE, activation, head_method, num_labels

_BUILT_IN = ("sigmoid", "softmax", "identity")


def attach_score_head(model: nn.Module, hf_config: dict[str, Any]) -> None:
    """Replace the model's LM head with the classifier's `score` head (uninitialised until loaded); a
    sentence-transformers activation config.json names is built here, so that one torch lacks refuses to load."""
    how = activation(hf_config)
    if how not in _BUILT_IN:
        activation_module(how)
    model.lm_head = nn.Identity()
    model.score = nn.Linear(int(hf_config["hidden_size"]), num_labels(hf_config), bias=False, dtype=torch.float32)


def score_head_tensors(tensors: Iterable[tuple[str, torch.Tensor]], hf_config: dict[str, Any],
                       token_ids: list[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors for a classifier: `lm_head.*` dropped; with a from-token `method`, `score.weight`
    made from the LM head's rows `token_ids` (the embedding's, when config.json ties them)."""
    method = head_method(hf_config)
    source = "model.embed_tokens.weight" if hf_config.get("tie_word_embeddings") else "lm_head.weight"
    for name, tensor in tensors:
        if method is not None and name == source:
            yield "score.weight", _head_from_rows(tensor, token_ids, method)
        if not name.startswith("lm_head."):
            yield name, tensor


def _head_from_rows(vocab_head: torch.Tensor, token_ids: list[int], method: str) -> torch.Tensor:
    rows = vocab_head[token_ids].float()
    if method == "from_2_way_softmax":  # one label: the true token's logit minus the false token's
        return rows[1:2] - rows[0:1]
    return rows


def activate(logits: torch.Tensor, how: str) -> torch.Tensor:
    """`[B, num_labels]` logits through classifier_config.activation's choice."""
    if how == "sigmoid":
        return torch.sigmoid(logits)
    if how == "softmax":
        return torch.softmax(logits, dim=-1)
    if how == "identity":
        return logits
    return activation_module(how)(logits)


@functools.cache
def activation_module(qualname: str) -> nn.Module:
    """The `torch.nn.modules` class `qualname` names (sentence-transformers' activation), built without arguments,
    as vLLM's `resolve_obj_by_qualname`; ValueError when torch has no such module class."""
    package, _, name = qualname.rpartition(".")
    if not qualname.startswith(ST_ACTIVATION_PACKAGE):  # classifier_config refused it already; never import it
        raise ValueError(f"the activation {qualname!r} is not a class of {ST_ACTIVATION_PACKAGE.rstrip('.')}")
    try:
        found = getattr(importlib.import_module(package), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"config.json's sentence-transformers activation {qualname!r} is not a torch module class"
                         ) from exc
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise ValueError(f"config.json's sentence-transformers activation {qualname!r} is not a torch module class")
    try:
        module = found()
    except TypeError as exc:  # a class that needs arguments (Linear): sentence-transformers builds it with none
        raise ValueError(f"config.json's sentence-transformers activation {qualname!r} cannot be built without "
                         f"arguments ({exc})") from None
    # A module with weights of its own (PReLU) would score with untrained values the checkpoint never saved; eval()
    # keeps a Dropout from making the same pair score differently from call to call.
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise ValueError(f"config.json's sentence-transformers activation {qualname!r} has weights of its own, which "
                         "the checkpoint does not hold; name a parameter-free activation (Sigmoid, Identity, Tanh)")
    return module.eval()
