"""`flotilla serve [MODEL] [flags]`: load the model, start the engine loop, serve HTTP, drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from types import FrameType

import uvicorn

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, add_flags, flag_values
from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.config import EngineConfig, ServerConfig
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.server.app import ServerState, build_app
from flotilla.engine.server.metrics import EngineMetrics, StatsLogger
from flotilla.engine.server.serving import OpenAIServing
from flotilla.engine.tokenizer import load_tokenizer

logger = logging.getLogger("flotilla.serve")


def build_parser() -> argparse.ArgumentParser:
    """Arguments of `flotilla serve`: MODEL plus every engine and server flag."""
    parser = argparse.ArgumentParser(prog="flotilla serve", description="OpenAI-compatible LLM server")
    parser.add_argument("model", nargs="?", default=None, help="HF model directory (default: the embedded model)")
    add_flags(parser, (*ENGINE_COMPONENTS, "server"))
    return parser


class DrainingServer(uvicorn.Server):
    """uvicorn, except that SIGTERM first drains: 503 to new requests, in-flight ones finish, exit 0."""

    def __init__(self, config: uvicorn.Config, state: ServerState, timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout = timeout
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[override]
        """Remember the loop so the signal handler can schedule the drain on it."""
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First SIGTERM: drain. Anything else: uvicorn's usual shutdown."""
        if sig == signal.SIGTERM and not self.state.draining and self.loop is not None:
            self.state.draining = True
            logger.info("SIGTERM: draining %d in-flight requests (up to %.0f s)", self.state.engine.num_unfinished,
                        self.drain_timeout)
            self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))
            return
        super().handle_exit(sig, frame)

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.state.engine.num_unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.state.engine.num_unfinished:
            logger.warning("drain timeout: aborting %d requests", self.state.engine.num_unfinished)
        self.should_exit = True


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build everything once, serve until shut down."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    try:
        config = EngineConfig.from_kwargs(args.model, **flag_values(args, ENGINE_COMPONENTS))
        server = ServerConfig.from_kwargs(**flag_values(args, ("server",)))
    except ValueError as exc:
        print(f"flotilla serve: error: {exc}", file=sys.stderr)
        return 2
    metrics = EngineMetrics(config, config.model.served_model_name[0])
    stats_log = StatsLogger()

    def on_step(e: LLMEngine) -> None:
        metrics.update(e)
        if not server.disable_log_stats:
            stats_log.maybe_log(e)

    async_engine = AsyncEngine.build(lambda: LLMEngine(config), on_step)
    metrics.set_num_blocks(async_engine.engine.runner.num_blocks)
    state = ServerState(
        engine=async_engine,
        serving=OpenAIServing(async_engine, load_tokenizer(config.model.tokenizer), config.model.max_model_len),
        model_names=config.model.served_model_name,
        metrics=metrics,
        api_key=server.api_key,
        max_model_len=config.model.max_model_len,
        created=int(time.time()),
    )
    uv_config = uvicorn.Config(
        build_app(state), host=server.host or "0.0.0.0", port=server.port, log_level=server.uvicorn_log_level,
        timeout_graceful_shutdown=max(1, int(server.shutdown_timeout)), access_log=False,
    )
    http = DrainingServer(uv_config, state, server.shutdown_timeout)
    logger.info("serving %s as %s on %s:%d", config.model.model, ", ".join(state.model_names),
                server.host or "0.0.0.0", server.port)
    try:
        http.run()
    finally:
        async_engine.shutdown()
    return 0
