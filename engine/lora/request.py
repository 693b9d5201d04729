"""Which adapter a request runs with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by served name, a positive id unique for the process's life, and its directory.

    The id (not the name) keys the caches and the prefix cache: an adapter unloaded and loaded again
    under the same name gets a new id, so no block computed with the old weights is ever reused.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be positive, got {self.lora_int_id}")
