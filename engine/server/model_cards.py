"""The entries of /v1/models, with vLLM's ModelCard fields: `root` (the model or adapter as loaded), `parent` (an
adapter's base), `max_model_len` (base models only) and `permission` (one ModelPermission, vLLM's defaults)."""

from __future__ import annotations

import time
import uuid
from typing import Any


def model_card(name: str, created: int, root: str, parent: str | None = None, max_model_len: int | None = None,
               **extra: Any) -> dict[str, Any]:
    """One model card; `extra` are this server's own fields (a base model's KV dtype and quantization)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "flotilla", "root": root, "parent": parent,
            "max_model_len": max_model_len, "permission": [model_permission()], **extra}


def model_permission() -> dict[str, Any]:
    """vLLM's ModelPermission as it serves it: a fresh id and time per listing, everything a client may do allowed
    but creating engines, search indices and fine-tuning (OpenAI's older field, which some clients still read)."""
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": int(time.time()),
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}
