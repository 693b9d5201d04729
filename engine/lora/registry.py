"""The adapters a front end serves, by name: `--lora-modules` at start, runtime load and unload.

Names are what clients put in `model`; each load gets a fresh `lora_int_id`, so unloading a name
and loading it again (maybe from a new directory) never mixes the old adapter's KV blocks or slots
with the new one's. Reads and writes may come from different threads, so they take a lock.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass

from flotilla.engine.lora.request import LoRARequest


@dataclass(frozen=True)
class LoRAModulePath:
    """One `--lora-modules` entry: `name=path`, or vLLM's JSON form with an optional parent model."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModulePath:
    """`name=path` or `{"name": ..., "path": ..., "base_model_name": ...}`; ValueError otherwise."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--lora-modules: {text!r} is not valid JSON: {exc}") from None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or \
                not isinstance(value.get("path"), str) or set(value) - {"name", "path", "base_model_name"}:
            raise ValueError(f'--lora-modules: {text!r}: expected {{"name": ..., "path": ..., "base_model_name": ...}}')
        base = value.get("base_model_name")
        if base is not None and not isinstance(base, str):
            raise ValueError(f"--lora-modules: {text!r}: base_model_name must be a string")
        module = LoRAModulePath(value["name"], value["path"], base)
    else:
        name, sep, path = text.partition("=")
        if not sep:
            raise ValueError(f"--lora-modules: {text!r} is neither name=path nor JSON")
        module = LoRAModulePath(name.strip(), path.strip())
    if not module.name or not module.path:
        raise ValueError(f"--lora-modules: {text[:300]!r}: the name and the path must not be empty")
    try:
        check_lora_name(module.name)
    except ValueError as exc:
        raise ValueError(f"--lora-modules: {exc}") from None
    return module


_ids = itertools.count(1)

# A name is what clients put in `model`, and it is shown in /v1/models, in the vllm:lora_requests_info label and in
# the logs: bounded (HF repo ids are at most 96 characters) and printable, so no newline can forge a log line.
MAX_LORA_NAME_CHARS = 256


def check_lora_name(name: str) -> None:
    """ValueError if `name` is longer than MAX_LORA_NAME_CHARS or holds a control character."""
    if len(name) > MAX_LORA_NAME_CHARS:
        raise ValueError(f"the adapter name is {len(name)} characters long; the limit is {MAX_LORA_NAME_CHARS}")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        raise ValueError(f"the adapter name {name[:64]!r} holds a control character")


class LoRARegistry:
    """Served adapter name -> (LoRARequest, parent model name)."""

    def __init__(self, base_model_names: list[str]) -> None:
        self.base_model_names = list(base_model_names)
        self._adapters: dict[str, tuple[LoRARequest, str]] = {}
        self._lock = threading.Lock()

    def new_request(self, name: str, path: str) -> LoRARequest:
        """A request for a not-yet-served name, with a fresh id; ValueError if the name is taken, too long or
        not printable."""
        check_lora_name(name)
        if name in self.base_model_names:
            raise ValueError(f"the name {name!r} is the base model's")
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"The lora adapter '{name}' has already been loaded.")
            return LoRARequest(name, next(_ids), path)

    def add(self, lora: LoRARequest, parent: str | None = None) -> None:
        """Serve `lora` under its name (after the engine has loaded it)."""
        with self._lock:
            if lora.lora_name in self._adapters:
                raise ValueError(f"The lora adapter '{lora.lora_name}' has already been loaded.")
            self._adapters[lora.lora_name] = (lora, parent or self.base_model_names[0])

    def remove(self, name: str) -> LoRARequest:
        """Stop serving `name`; KeyError if it is not served."""
        with self._lock:
            return self._adapters.pop(name)[0]

    def get(self, name: str) -> LoRARequest | None:
        """The adapter served as `name`, if any."""
        with self._lock:
            entry = self._adapters.get(name)
        return entry[0] if entry is not None else None

    def entries(self) -> list[tuple[LoRARequest, str]]:
        """Every served adapter with its parent model's name, in load order."""
        with self._lock:
            return list(self._adapters.values())
