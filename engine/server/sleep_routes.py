"""vLLM's sleep-mode routes, `POST /sleep?level=N`, `POST /wake_up[?tags=weights&tags=kv_cache]`, `GET /is_sleeping`
and `POST /collective_rpc` (`{"method": "reload_weights"}` only: level 2's weights read again): served only in
vLLM's development mode (VLLM_SERVER_DEV_MODE=1), as vLLM does, since any client of the API could otherwise take the
model off the device. They need the API key like every route that is not a probe. The engine does the work
(`LLMEngine.sleep` / `wake_up`, in the engine core's process); without --enable-sleep-mode it refuses (400) where
vLLM's would answer 200 and free nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import os

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from flotilla.engine.engine_call import EngineCall
from flotilla.engine.errors import EngineDeadError
from flotilla.engine.server.errors import APIError
from flotilla.engine.serving_engine import ServingEngine
from flotilla.engine.sleep_args import check_sleep_level, check_sleep_mode

logger = logging.getLogger(__name__)

SLEEP_POLL_S = 0.02  # how often a /sleep that waits asks the engine whether it sleeps yet

def server_dev_mode() -> bool:
    """vLLM's switch for its development routes: VLLM_SERVER_DEV_MODE=1 or true."""
    return os.environ.get("VLLM_SERVER_DEV_MODE", "0").strip().lower() in ("1", "true")


def add_sleep_routes(app: FastAPI, engine: ServingEngine) -> None:
    """Register /sleep, /wake_up and /is_sleeping on `app`."""
    logger.warning("development routes /sleep, /wake_up and /is_sleeping are enabled (VLLM_SERVER_DEV_MODE): do "
                   "not expose this server to untrusted clients")

    @app.post("/sleep")
    async def sleep(request: Request) -> Response:
        level = _level(request.query_params.get("level", "1"))
        mode = request.query_params.get("mode", "abort")
        try:
            check_sleep_mode(mode)
        except ValueError as exc:
            raise APIError(400, str(exc), param="mode") from None
        await _engine_call(engine, EngineCall("sleep", (level, mode)))
        # "wait" (the running requests finish first) and "keep" (the step in flight is collected): answered once
        # the engine sleeps, as vLLM's does; a wake_up meanwhile calls the sleep off and ends the wait too.
        while await engine.call(EngineCall("sleep_pending")):
            await asyncio.sleep(SLEEP_POLL_S)
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(request: Request) -> Response:
        tags = request.query_params.getlist("tags") or None  # none named: wake everything, as vLLM
        logger.info("wake up the engine with tags: %s", tags)
        await _engine_call(engine, EngineCall("wake_up", (tags,)))
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": await engine.call(EngineCall("is_sleeping"))})

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> JSONResponse:
        # vLLM's worker call, for the one method sleep mode needs: level 2's weights read again after a wake-up.
        method = await _rpc_method(request)
        try:
            await engine.call(EngineCall("reload_weights"))
        except EngineDeadError:  # the engine's end: the server's usual 503, not this request's fault
            raise
        except (ValueError, RuntimeError) as exc:  # quantized or LoRA (ValueError); weights still asleep
            raise APIError(400, f"{method}: {exc}", param="method") from None
        return JSONResponse({"results": [None]})  # one result per worker, as vLLM's: this engine has one


async def _rpc_method(request: Request) -> str:
    """The body's `method` (vLLM's {"method": ...}); 400 unless it is reload_weights."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise APIError(400, "the body must be a JSON object naming a method") from None
    method = body.get("method") if isinstance(body, dict) else None
    if method != "reload_weights":
        raise APIError(400, f"collective_rpc supports only the method 'reload_weights', not {method!r}",
                       param="method")
    return method


def _level(text: str) -> int:
    try:
        level = int(text)
        check_sleep_level(level)
    except ValueError:
        raise APIError(400, f"sleep level must be 0, 1 or 2, not {text!r}", param="level") from None
    return level


async def _engine_call(engine: ServingEngine, call: EngineCall) -> None:
    """Run `call`; the engine's refusal (sleep mode off, a bad level or tag: a ValueError) as a 400."""
    try:
        await engine.call(call)
    except ValueError as exc:
        raise APIError(400, str(exc), param=None if call.method == "sleep" else "tags") from None
