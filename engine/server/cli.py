"""`flotilla serve [MODEL] [flags]`: load the model, start the engine loop, serve HTTP, drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, FlagParser, add_flags, flag_values
from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.config import ConfigError, EngineConfig, ServerConfig
from flotilla.engine.engine_core import EngineFactory, freeze_startup_heap
from flotilla.engine.engine_core_client import EngineCoreClient
from flotilla.engine.generation_defaults import default_sampling_fields
from flotilla.engine.lora.registry import LoRARegistry
from flotilla.engine.pooling.classifier_config import activation, labels
from flotilla.engine.server.access_log import uvicorn_log_config
from flotilla.engine.server.app import PUBLIC_PATHS, ServerState, build_app
from flotilla.engine.server.config_file import ConfigFileError, ConfigFileParser, apply_config_file
from flotilla.engine.server.http_protocol import head_deadline_protocol
from flotilla.engine.server.lora_routes import register_startup_adapters
from flotilla.engine.server.metrics import EngineMetrics, StatsLogger
from flotilla.engine.server.sampling_request import max_tokens_cap
from flotilla.engine.server.server_chat_template import load_chat_template
from flotilla.engine.server.serving import OpenAIServing
from flotilla.engine.server.start_signals import StartSignals, StartStopped
from flotilla.engine.serving_engine import ServingEngine
from flotilla.engine.stats import StatsSnapshot
from flotilla.engine.tokenizer import import_tokenizer_classes, load_tokenizer, tokenizer_bytes, tokenizer_from_bytes
from flotilla.flags import CONFIG_FLAG, FLAGS, MODEL_FLAG

logger = logging.getLogger("flotilla.serve")
# uvicorn's own graceful-shutdown wait, after the drain: only connections that are not engine
# requests (a /metrics scrape, a request still being tokenized) can still be open by then.
UVICORN_GRACE_S = 5


def _default_sampling(config: EngineConfig) -> dict[str, Any]:
    """Requests' default sampling fields from generation_config.json (a .gguf model's is beside its tokenizer)."""
    gen_dir = config.model.tokenizer if config.model.quantization == "gguf" else config.model.model
    return default_sampling_fields(config.model.generation_config, gen_dir,
                                   config.model.override_generation_config)


def build_parser(parser_class: type[argparse.ArgumentParser] = FlagParser) -> argparse.ArgumentParser:
    """Arguments of `flotilla serve`: MODEL, --config, plus every engine and server flag."""
    parser = parser_class(prog="flotilla serve", description="OpenAI-compatible LLM server")
    parser.add_argument("model", nargs="?", default=None, help="HF model directory (default: the embedded model)")
    parser.add_argument(MODEL_FLAG, dest="model_option", default=None, metavar="MODEL",
                        help="the same as MODEL (vLLM's --model); given with MODEL, the two must agree")
    parser.add_argument(CONFIG_FLAG, default=None, metavar="FILE",
                        help="vLLM's YAML file of flags (`max-model-len: 4096`, a list for a list flag, true for a "
                             "boolean one); a flag on the command line wins over the file's")
    add_flags(parser, (*ENGINE_COMPONENTS, "server"))
    return parser


def _set_log_level(name: str) -> None:
    """VLLM_LOGGING_LEVEL, as vLLM's: the level of this process's `flotilla` loggers (DEBUG adds, among others,
    the prompts of --enable-log-requests); other libraries stay at INFO. ValueError for an unknown name."""
    level = logging.getLevelName(name.strip().upper())
    if not isinstance(level, int):
        raise ValueError(f"VLLM_LOGGING_LEVEL={name!r} is not a log level (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    logging.getLogger("flotilla").setLevel(level)


def _model_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """MODEL, given as the positional or as --model (vLLM takes either); both given and different: a usage error."""
    if args.model is not None and args.model_option is not None and args.model != args.model_option:
        parser.error(f"MODEL {args.model!r} and {MODEL_FLAG} {args.model_option!r} differ: give the model once")
    if args.model is None and args.model_option is None:
        _refuse_swallowed_model(parser, args)
    return args.model if args.model is not None else args.model_option


def _refuse_swallowed_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error when no MODEL was given but a list flag's last value is a directory: MODEL written after a
    flag that takes several values (`--api-key KEY /models/llama`) is read as one more of them, as in vLLM, and
    the embedded model would be served in its place (with the path as a key or a served name)."""
    for f in FLAGS:
        values = getattr(args, f.dest, None) if f.type == "list" else None
        if values and len(values) > 1 and os.path.isdir(values[-1]):
            parser.error(f"{f.name} took {values[-1]!r} as one of its values, and no MODEL was given: write MODEL "
                         f"before the flags, or as {MODEL_FLAG} {values[-1]}")


class DrainingServer(uvicorn.Server):
    """uvicorn, except that SIGTERM first drains: 503 to new requests, in-flight ones get `timeout`
    seconds to finish, then the rest are aborted (each answered with an error) and the process exits 0.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState, timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout = timeout
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        """Remember the loop so the signal handler can schedule the drain on it."""
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First SIGTERM: drain. Anything else: uvicorn's usual shutdown."""
        if sig == signal.SIGTERM and not self.state.draining and self.loop is not None:
            self.state.draining = True
            logger.info("SIGTERM: draining %d in-flight requests (up to %g s)", self.state.engine.num_unfinished,
                        self.drain_timeout)
            self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))
            return
        super().handle_exit(sig, frame)

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        engine, state = self.state.engine, self.state
        # Engine requests, and /v1 answers still being computed or sent (e.g. embeddings, engine calls).
        while (engine.num_unfinished or state.in_flight) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if engine.num_unfinished or state.in_flight:
            logger.warning("drain timeout (%g s): aborting %d requests (%d answers open)", self.drain_timeout,
                           engine.num_unfinished, state.in_flight)
            # Stopping the loop aborts every request and hands each waiter an EngineDeadError, which
            # the routes answer with a final error event and [DONE] (streams) or a 503 (the rest).
            await asyncio.to_thread(engine.shutdown)
        self.should_exit = True


def _uvicorn_config(app: FastAPI, server: ServerConfig) -> uvicorn.Config:
    """uvicorn with the connection limits of `server`, on asyncio's event loop and the h11 protocol that
    times request heads."""
    return uvicorn.Config(
        app,
        host=server.host or "0.0.0.0",
        port=server.port,
        log_level=server.uvicorn_log_level,
        # vLLM's: a line per request, on unless --disable-uvicorn-access-log (access_log.py).
        access_log=not server.disable_uvicorn_access_log,
        log_config=uvicorn_log_config(server.disable_access_log_for_endpoints),
        # Both pinned: uvicorn's "auto" would take uvloop/httptools whenever something else installs them
        # (test clients do), and the request limits are built on and tested under asyncio with h11.
        loop="asyncio",
        http=head_deadline_protocol(server.header_read_timeout),
        limit_concurrency=server.limit_concurrency,
        root_path=server.root_path or "",
        ssl_certfile=server.ssl_certfile,
        ssl_keyfile=server.ssl_keyfile,
        ssl_ca_certs=server.ssl_ca_certs,
        ssl_cert_reqs=server.ssl_cert_reqs,
        timeout_keep_alive=server.timeout_keep_alive,  # type: ignore[arg-type]  # a float works: call_later
        h11_max_incomplete_event_size=server.h11_max_incomplete_event_size,
        # Only a backstop: by the time uvicorn stops, the drain has answered every engine request.
        timeout_graceful_shutdown=UVICORN_GRACE_S,
    )


# The GIL's switch interval in the API server's process (Python's default: 5 ms). A large reply is built on a worker
# thread (json_reply.py) in Python that holds the GIL, and every other thread (the event loop's after each epoll
# wait, the engine-output thread after each pipe read) waited up to the interval for it at each wake-up. Beside a
# build of a Responses end's logprobs, a 1 ms sleep woke 11 ms late (p50) at 5 ms, 0.8-3.1 ms at 0.5 ms
# (bench/gil_handoff.py); during a big stream, /health p50 7.5 -> 3.4 ms and small requests' tokens/s 53 -> 70
# (bench/gil_stall.py); ordinary throughput (bench/serve.py, tiny Llama, 256 prompts, concurrency 32) 2,020 ->
# 2,334 tokens/s (means of 3), no cost seen (bench/results/gil29-cpu-2026-12-06.txt). Not yet measured on a GPU at
# hundreds of streams: FLOTILLA_API_SWITCH_INTERVAL (seconds; 0.005 is Python's own) sets it for an A/B run.
SWITCH_INTERVAL = 0.0005
SWITCH_INTERVAL_ENV = "FLOTILLA_API_SWITCH_INTERVAL"


def switch_interval() -> float:
    """The API process's switch interval: FLOTILLA_API_SWITCH_INTERVAL's seconds, else SWITCH_INTERVAL. Checked here,
    at start-up, with the flags: a bad value was a traceback (`abc`, `0`, `-1`), or silently 2**63 ns (`nan`: every
    thread waits for the one holding the GIL to block) or 0 (`inf`)."""
    text = os.environ.get(SWITCH_INTERVAL_ENV)
    if text is None:
        return SWITCH_INTERVAL
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 1e-6 <= seconds <= 1.0:  # (nan fails it too)
        raise ValueError(f"{SWITCH_INTERVAL_ENV} is seconds from 0.000001 to 1 (Python's own is 0.005), not {text!r}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build everything once, serve until shut down."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config is not None:
        try:
            args = apply_config_file(args, build_parser(ConfigFileParser))
        except ConfigFileError as exc:
            parser.error(str(exc))
    args.model = _model_argument(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    try:
        _set_log_level(os.environ.get("VLLM_LOGGING_LEVEL", "INFO"))
        config = EngineConfig.from_kwargs(args.model, **flag_values(args, ENGINE_COMPONENTS))
        server = ServerConfig.from_kwargs(**flag_values(args, ("server",)))
        config, server = share_reasoning_parser(config, server)
        chat_template = load_chat_template(server.chat_template)
        interval = switch_interval()
    except ValueError as exc:
        print(f"flotilla serve: error: {exc}", file=sys.stderr)
        return 2
    metrics = EngineMetrics(config, config.model.served_model_name[0])
    stats_log = StatsLogger()

    def on_step(snapshot: StatsSnapshot) -> None:
        metrics.update(snapshot)
        if not server.disable_log_stats:
            stats_log.maybe_log(snapshot)

    loras = LoRARegistry(config.model.served_model_name) if config.lora.enable_lora else None
    signals = StartSignals()
    if engine_in_own_process():  # an engine built on this process's thread cannot look: the default action stays
        signals.install()
    try:
        factory = EngineFactory(config, register_startup_adapters(config.lora, loras) if loras is not None else ())
        async_engine, tokenizer = _start_engine(factory, on_step, signals)
    except StartStopped as exc:
        logger.info("%s: the engine core is stopped, nothing was served", exc)
        return 0
    except ConfigError as exc:  # a bad --lora-modules name
        print(f"flotilla serve: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        if isinstance(exc.__cause__, ConfigError):  # a bad --lora-modules adapter: a usage error
            print(f"flotilla serve: error: {exc.__cause__}", file=sys.stderr)
            return 2
        raise
    state = _server_state(config, server, async_engine, tokenizer, loras, metrics,
                          model_path=args.model if args.model is not None else config.model.model,
                          chat_template=chat_template)
    http = DrainingServer(_uvicorn_config(build_app(state, server), server), state, server.shutdown_timeout)
    freeze_startup_heap()  # the event loop's collections skip what start-up built (the core does the same)
    signals.restore()  # uvicorn's own handlers from http.run on
    if signals.received is not None:
        logger.info("%s while starting: the engine is shut down, nothing was served", signals.received.name)
        async_engine.shutdown()
        return 0
    sys.setswitchinterval(interval)
    logger.info("serving %s as %s on %s:%d", config.model.model, ", ".join(state.model_names),
                server.host or "0.0.0.0", server.port)
    logger.info(f"API key: required on every path but {', '.join(PUBLIC_PATHS)}" if server.api_key is not None
                else "no API key: every path is open")
    try:
        http.run()
    finally:
        async_engine.shutdown()
    return 0


def share_reasoning_parser(config: EngineConfig, server: ServerConfig) -> tuple[EngineConfig, ServerConfig]:
    """One reasoning parser for the server's replies and the engine's grammars (which start after the thinking),
    given as `--reasoning-parser` or as `--structured-outputs-config`'s `reasoning_parser` (vLLM takes both);
    ValueError when the two name different parsers."""
    flag, key = server.reasoning_parser, config.structured_outputs.reasoning_parser
    if flag is not None and key is not None and flag != key:
        raise ValueError(f"--reasoning-parser {flag} and --structured-outputs-config's reasoning_parser {key} differ")
    name = flag or key
    structured = config.structured_outputs.model_copy(update={"reasoning_parser": name})
    return (config.model_copy(update={"structured_outputs": structured}),
            server.model_copy(update={"reasoning_parser": name}))


def _server_state(config: EngineConfig, server: ServerConfig, engine: ServingEngine, tokenizer: Any,
                  loras: LoRARegistry | None, metrics: EngineMetrics, model_path: str,
                  chat_template: str | None = None) -> ServerState:
    """What the routes share (app.ServerState): the started engine, the OpenAI serving on top of it with the
    model's sampling defaults, and what the routes report of the model (`model_path`: MODEL as given, else the
    model directory served; `chat_template`: --chat-template's text)."""
    defaults = _default_sampling(config)
    vocab_size = int(config.model.hf_config["vocab_size"])
    return ServerState(
        engine=engine,
        serving=OpenAIServing(engine, tokenizer, config.model.max_model_len, vocab_size,
                              server.trust_request_chat_template,
                              loras=loras, enable_auto_tool_choice=server.enable_auto_tool_choice,
                              exclude_tools_when_tool_choice_none=server.exclude_tools_when_tool_choice_none,
                              tool_call_parser=server.tool_call_parser,
                              reasoning_parser=server.reasoning_parser,
                              enable_prompt_tokens_details=server.enable_prompt_tokens_details,
                              force_include_usage=server.enable_force_include_usage,
                              default_sampling=defaults,
                              chat_template_content_format=server.chat_template_content_format,
                              chat_template=chat_template,
                              default_chat_template_kwargs=server.default_chat_template_kwargs,
                              max_logprobs=config.model.logprobs_cap,
                              log_requests=server.enable_log_requests, max_log_len=server.max_log_len,
                              response_role=server.response_role,
                              return_tokens_as_token_ids=server.return_tokens_as_token_ids,
                              grammar_after_thinking=not config.structured_outputs.enable_in_reasoning,
                              max_tokens_cap=max_tokens_cap(config.model.generation_config, defaults,
                                                            config.model.override_generation_config)),
        model_names=config.model.served_model_name,
        metrics=metrics,
        api_keys=server.api_key,
        max_model_len=config.model.max_model_len,
        vocab_size=vocab_size,
        # the runner's rule (fp8 caches are e4m3, else the model dtype), named as its start-up log does
        kv_cache_dtype="float8_e4m3fn" if config.cache.kv_cache_dtype.startswith("fp8") else config.model.dtype,
        quantization=config.model.quantization,
        runner=config.model.runner,
        convert=config.model.convert,
        labels=labels(config.model.hf_config) if config.model.convert == "classify" else [],
        activation=activation(config.model.hf_config) if config.model.convert == "classify" else "softmax",
        created=int(time.time()),
        model_path=model_path,
        track_load=server.enable_server_load_tracking,
    )


def exit_process(exc: BaseException) -> None:
    """`on_dead` for a server: a dead loop cannot recover, so exit non-zero now and let the supervisor
    (Kubernetes) restart the pod, instead of lingering with /health 503 and every request refused.

    Waiters have already been sent their error; a moment lets the event loop relay it to open streams.
    """
    logger.critical("the engine loop died (%r): exiting with status 1", exc)
    time.sleep(0.5)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def _start_engine(factory: EngineFactory, on_step: Callable[[StatsSnapshot], None],
                  signals: StartSignals) -> tuple[ServingEngine, Any]:
    """The started engine and the server's tokenizer. With the core in its own process, the core loads the
    tokenizer and sends a copy, which this process unpickles while the core builds the engine: the tokenizer is
    loaded once, and this process imports neither transformers' model stack nor torch (about 3 s of CPU less a
    start). A SIGTERM or SIGINT recorded in `signals` stops the core that is starting (StartStopped)."""
    tokenizer_path = factory.config.model.tokenizer
    if not engine_in_own_process():
        tokenizer = load_tokenizer(tokenizer_path)
        # The engine thread's own copy, not a second load: one fast tokenizer used from two threads can fail
        # (the Rust tokenizer's "Already borrowed" while a call sets its truncation).
        engine_tokenizer = tokenizer_from_bytes(tokenizer_bytes(tokenizer), tokenizer_path)
        return AsyncEngine.build(partial(factory, engine_tokenizer), on_step, on_dead=exit_process), tokenizer
    client = EngineCoreClient(factory, on_step, on_dead=exit_process)
    client.launch()  # a signal meanwhile is only recorded: the spawn data reaches the core whole
    try:
        import_tokenizer_classes()
        signals.check()
        tokenizer = tokenizer_from_bytes(client.wait_for_tokenizer(signals.check), tokenizer_path)
        signals.check()
        client.wait_until_ready(signals.check)
    except BaseException:
        client.stop_launch()
        raise
    return client, tokenizer


def engine_in_own_process() -> bool:
    """vLLM's switch VLLM_ENABLE_V1_MULTIPROCESSING: 1 (the default, as in vLLM) runs the engine core in a
    process of its own; 0 keeps it on a thread of the server's process (the same routes, one process)."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip().lower() not in ("0", "false")
