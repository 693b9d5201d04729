"""LoRA on the HTTP server: adapters in /v1/models, the start-up adapters, and vLLM's runtime routes
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (only with VLLM_ALLOW_RUNTIME_LORA_UPDATING
set, as vLLM: anyone who can reach the API could otherwise make the server read any directory)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from flotilla.engine.config import ConfigError, LoRAConfig
from flotilla.engine.engine_call import EngineCall
from flotilla.engine.engine_core import StartupAdapter
from flotilla.engine.errors import LoRAAdapterError
from flotilla.engine.lora.registry import LoRARegistry
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.model_cards import model_card
from flotilla.engine.serving_engine import ServingEngine

logger = logging.getLogger(__name__)


def runtime_lora_updating_allowed() -> bool:
    """vLLM's switch: VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 or true."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


def register_startup_adapters(config: LoRAConfig, loras: LoRARegistry) -> tuple[StartupAdapter, ...]:
    """Name every `--lora-modules` adapter in the server's registry, for `EngineFactory` to load into the
    engine before serving (in the core process); ConfigError names a bad (e.g. repeated) name."""
    adapters = []
    for name, path, parent in config.lora_modules:
        try:
            lora = loras.new_request(name, path)
            loras.add(lora, parent)
        except ValueError as exc:
            raise ConfigError(f"--lora-modules {name}={path}: {exc}") from None
        adapters.append(StartupAdapter(name, path, lora))
    return tuple(adapters)


def adapter_models(loras: LoRARegistry | None, created: int) -> list[dict[str, Any]]:
    """/v1/models entries of the served adapters: `root` is the adapter's directory, `parent` its base."""
    if loras is None:
        return []
    return [model_card(lora.lora_name, created, lora.lora_path, parent) for lora, parent in loras.entries()]


class LoadLoRAAdapterRequest(BaseModel):
    """Body of POST /v1/load_lora_adapter."""

    model_config = ConfigDict(extra="ignore")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    """Body of POST /v1/unload_lora_adapter."""

    model_config = ConfigDict(extra="ignore")
    lora_name: str
    lora_int_id: int | None = None


def add_lora_routes(app: FastAPI, engine: ServingEngine, loras: LoRARegistry) -> None:
    """Register the runtime load and unload routes on `app`."""
    logger.warning("runtime LoRA loading and unloading is enabled (VLLM_ALLOW_RUNTIME_LORA_UPDATING)")

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        name, path = body.lora_name.strip(), body.lora_path.strip()
        if not name or not path:
            raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.", param="lora_name")
        try:
            lora = loras.new_request(name, path)
        except ValueError as exc:
            raise APIError(400, str(exc), param="lora_name") from None
        if not Path(path).is_dir():
            raise APIError(404, f"Loading lora {name} failed: No adapter found for {path}", param="lora_path")
        try:
            await engine.call(EngineCall("add_lora", (lora,)))
        except LoRAAdapterError as exc:
            raise APIError(400, f"Loading lora {name} failed: {exc}", param="lora_path") from None
        try:
            loras.add(lora)
        except ValueError as exc:  # the same name was loaded meanwhile by a concurrent request
            await engine.call(EngineCall("remove_lora", (lora.lora_int_id,)))
            raise APIError(400, str(exc), param="lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        try:
            lora = loras.remove(body.lora_name)
        except KeyError:
            raise APIError(404, f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name") from None
        await engine.call(EngineCall("remove_lora", (lora.lora_int_id,)))
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
