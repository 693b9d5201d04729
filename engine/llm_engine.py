"""The engine core: requests in, one scheduled step at a time, outputs out.

Front ends (the offline `LLM` class, the HTTP server) add requests and call `step()`; the engine
tokenizes, validates, schedules, runs the model, detokenizes and applies stop strings. It never
imports a front end.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from flotilla.engine.bad_words import BadWordIds, bad_word_token_ids
from flotilla.engine.batch_queue import build_batch_queue
from flotilla.engine.block_manager import BlockManager
from flotilla.engine.config import EngineConfig
from flotilla.engine.detokenizer import IncrementalDetokenizer
from flotilla.engine.errors import EngineBusyError, InvalidParamError, RequestFailedError
from flotilla.engine.executor import MultiprocExecutor, build_executor
from flotilla.engine.generation_defaults import default_sampling_fields
from flotilla.engine.lora.manager import LoRAManager
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.model_runner import LaunchedStep, ModelRunner, StepOutput
from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.pooling.classify import classify_prompts, token_classify_prompts
from flotilla.engine.pooling.embed import EmbeddingOutput, embed_prompts
from flotilla.engine.pooling.output import ClassificationOutput
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.prompt_rules import check_prompt_ids, check_prompt_length
from flotilla.engine.prompt_truncation import truncate_prompt
from flotilla.engine.request import Request, RequestStatus
from flotilla.engine.sampling_metadata import SamplingRow
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import Scheduler, SchedulerOutput
from flotilla.engine.sleep_args import check_sleep_level, check_sleep_mode, wake_tags
from flotilla.engine.spec_decode.speculator import Speculator, build_speculator
from flotilla.engine.start_failure import forget_frames
from flotilla.engine.stats import EngineStats, FinishedGroup, FinishedRequest, StatsSnapshot
from flotilla.engine.step_trace import StepTrace
from flotilla.engine.structured_output.compile_queue import PendingGrammar  # stdlib only: no xgrammar import
from flotilla.engine.structured_output.waiting_room import GrammarWaitingRoom, attach_grammar
from flotilla.engine.tokenizer import eos_token_ids, load_tokenizer

if TYPE_CHECKING:  # xgrammar is imported on the first constrained request only
    import xgrammar as xgr

    from flotilla.engine.structured_output.compile_queue import GrammarCompiles
    from flotilla.engine.structured_output.compiler import GrammarCompiler
    from flotilla.engine.structured_output.matcher import RequestGrammar

logger = logging.getLogger(__name__)

# How long a step with nothing to run waits for a grammar compile to finish before it returns (and the
# front end looks for new commands): short, so that adds and aborts are not held up by it.
COMPILE_POLL_S = 0.05


class LLMEngine:
    """Holds the scheduler, the block manager and the model runner, and drives them step by step."""

    def __init__(self, config: EngineConfig, tokenizer: Any = None) -> None:
        """Build the engine of `config`; `tokenizer` is its tokenizer already loaded (the engine-core process loads
        it first, to send the API process a copy), None to load it here."""
        try:
            self._start(config, tokenizer)
        except BaseException as exc:
            self._abandon()
            forget_frames(exc)  # the caller keeps the exception: it must not keep the half-built runner with it
            raise

    def _start(self, config: EngineConfig, tokenizer: Any) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model.tokenizer) if tokenizer is None else tokenizer
        # A .gguf model is a file: generation_config.json, if any, is beside the tokenizer.
        gen_dir = config.model.tokenizer if config.model.quantization == "gguf" else config.model.model
        # --generation-config DIR gives the eos ids too (vLLM reads the whole generation config from DIR); `vllm`
        # drops only the sampling defaults
        gen_source = gen_dir if config.model.generation_config in ("auto", "vllm") else config.model.generation_config
        self.eos_token_ids = eos_token_ids(gen_source, self.tokenizer, config.model.hf_config)
        # generation_config.json's sampling fields, for requests that leave them out (--generation-config)
        self.default_sampling = default_sampling_fields(config.model.generation_config, gen_dir,
                                                        config.model.override_generation_config)
        self.runner = build_executor(config)  # this process's model runner, or tp x pp workers
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.cache.block_size, config.cache.enable_prefix_caching,
            config.cache.prefix_caching_hash_algo,
        )
        max_loras = config.lora.max_loras if config.lora.enable_lora else None
        self.scheduler = Scheduler(config.scheduler, self.block_manager, max_loras)
        self.speculator: Speculator | None = build_speculator(config, self.runner)
        self.batches = build_batch_queue(config, self.scheduler, self.runner)  # pipeline parallelism's steps
        self.stats = EngineStats()
        self._groups: dict[str, list[Request]] = {}  # request id -> its completions, by index
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}  # per completion (child request id)
        self._ids = itertools.count()
        # The step launched but not yet collected (asynchronous scheduling).
        self._in_flight: tuple[SchedulerOutput, LaunchedStep] | None = None
        # Requests whose own post-processing failed; aborted, waiting for the front end to collect.
        self._failures: list[RequestFailedError] = []
        # The final outputs (finish_reason "abort") of requests a sleep in mode "abort" ended, for the front end.
        self._aborted: list[RequestOutput] = []
        # Requests waiting for their grammar to compile (by request id), not yet in the scheduler: they hold
        # no KV blocks and are scheduled once it is ready (vLLM's WAITING_FOR_FSM).
        self._compiling = GrammarWaitingRoom(self.tokenizer, self.vocab_size, sorted(self.eos_token_ids),
                                             config.structured_outputs)
        self.step_trace = StepTrace.from_env()  # FLOTILLA_STEP_TRACE: one JSON line per step
        self._paused = False  # asleep (sleep mode): steps run nothing until wake_up
        self._sleep_level: int | None = None  # the level asleep at (vllm:engine_sleep_state); None: awake
        # A sleep waiting for the running requests to finish ("wait") or the step in flight ("keep"): (level, mode).
        self._pending_sleep: tuple[int, str] | None = None
        if config.model.enable_sleep_mode:
            logger.info("sleep mode enabled (--enable-sleep-mode)")

    def _abandon(self) -> None:
        """Free what a failed start built: its workers, KV pool and graphs, its weights (this half-built engine
        is never returned, so nothing may reach them through it), and give the device its cached memory back."""
        try:
            if (runner := self.__dict__.get("runner")) is not None:
                runner.shutdown() if isinstance(runner, MultiprocExecutor) else runner.release()
            if (compiling := self.__dict__.get("_compiling")) is not None:
                compiling.shutdown()
        except Exception:  # the start's own error is the one to raise
            logger.exception("freeing the engine of a failed start failed")
        self.__dict__.clear()
        gc.collect()  # a model's reference cycles, so that the cache below holds nothing of it
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> LLMEngine:
        """Build from `vllm serve`-style keyword arguments."""
        return cls(EngineConfig.from_kwargs(model, **kwargs))

    # --- requests in --------------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        prompt_text: str | None = None,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> Request:
        """Tokenize (if text), validate and queue a request; returns its first completion.

        `prompt_text` is the text behind pre-tokenized prompts (e.g. a rendered chat template),
        reported back in the output. `priority` orders the waiting queue under the priority policy
        (lower first); `cache_salt` keeps its prefix-cache blocks apart from other salts'.
        """
        if self.config.model.runner == "pooling":
            raise InvalidParamError("this model is served by the pooling runner (--runner pooling): it computes "
                                    "embeddings or class scores and does not generate text", "model")
        params = params.with_whole_vocabulary(self.vocab_size)
        text, token_ids = self._prompt_tokens(prompt, prompt_text, params)
        bad_words = self._check_options(params, lora_request, priority)
        request_id = request_id if request_id is not None else str(next(self._ids))
        completion_ids = [request_id, *(f"{request_id}#{i}" for i in range(1, params.n))]
        self._check_unique(completion_ids)
        now = time.monotonic()
        sampler_tensors: dict = {}  # made at the first draw, for every completion alike
        stop_token_set = frozenset(params.stop_token_ids)
        group = [
            Request(
                request_id=completion_ids[i],
                prompt_token_ids=token_ids,
                sampling_params=params,
                eos_token_ids=self.eos_token_ids,
                eos_token_id=self.tokenizer.eos_token_id,
                prompt=text,
                arrival_time=now,
                parent_id=request_id,
                index=i,
                lora_request=lora_request,
                priority=priority,
                cache_salt=cache_salt,
                bad_words_token_ids=bad_words,
                sampler_tensors=sampler_tensors,
                stop_token_set=stop_token_set,
            )
            for i in range(params.n)
        ]
        group[0].fork_children = group[1:]
        try:
            self._check_prompt_ids(group[0])
            self._admit(request_id, group, token_ids)
        except BaseException:
            self.block_manager.free(group[0])  # holds no blocks yet: drops the prompt's block hashes
            raise
        return group[0]

    def _prompt_tokens(self, prompt: str | list[int], prompt_text: str | None,
                       params: SamplingParams) -> tuple[str | None, list[int]]:
        """(text, token ids) of a new request's prompt: tokenized if text, truncated as `params` ask, checked
        against the context length (`prompt_rules.check_prompt_length`; its ids: `_check_prompt_ids`)."""
        text: str | None
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = prompt_text, list(prompt)
        token_ids = truncate_prompt(token_ids, params.truncate_prompt_tokens, self.config.model.max_model_len)
        check_prompt_length(token_ids, self.config.model.max_model_len)
        return text, token_ids

    def _check_options(self, params: SamplingParams, lora_request: LoRARequest | None,
                       priority: int) -> BadWordIds:
        """Check a new request's token ids, bad words, adapter and priority against this engine (the first
        problem raised); returns its bad words as token ids."""
        params.check_vocab(self.vocab_size)
        params.check_logprobs(self.config.model.logprobs_cap)
        bad_words = bad_word_token_ids(params.bad_words, self.tokenizer, self.vocab_size) if params.bad_words else ()
        if lora_request is not None:
            self.add_lora(lora_request)  # read (and checked) now, so a bad adapter fails this request alone
        if priority != 0 and self.config.scheduler.scheduling_policy != "priority":
            raise InvalidParamError("priority scheduling is not enabled: start the server with "
                                    "--scheduling-policy priority to use `priority`", "priority")
        return bad_words

    def _admit(self, request_id: str, group: list[Request], token_ids: list[int]) -> None:
        """Make a new request's completions known to the engine and queue them: in the scheduler, or in the
        grammar waiting room while their grammar compiles."""
        params = group[0].sampling_params
        grammar = self._submit_grammar(params, request_id) if params.structured_outputs is not None else None
        for child in group:
            self._detokenizers[child.request_id] = IncrementalDetokenizer(
                self.tokenizer, token_ids, params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
        # Queued last: a request is either fully known to the engine or not at all.
        self._groups[request_id] = group
        if isinstance(grammar, PendingGrammar):
            self._compiling.add(request_id, group, grammar)
        else:  # free, or its grammar was cached
            attach_grammar(group, grammar, self._compiling.thinking)
            self.scheduler.add(group[0])

    def _check_unique(self, completion_ids: list[str]) -> None:
        """ValueError if a new request's completion id is live: checked against every live completion's (the
        detokenizers hold them all, forked or not; the scheduler's, once forked). `a#1` is the second
        completion of a request `a`."""
        for completion_id in completion_ids:
            if completion_id in self._detokenizers or completion_id in self.scheduler.requests:
                raise ValueError(f"duplicate request id {completion_id!r}")

    def _submit_grammar(self, params: SamplingParams, request_id: str) -> xgr.CompiledGrammar | PendingGrammar:
        """A constrained request's grammar: compiled already (cached), or the compile it will wait for. An
        invalid constraint is refused here (a small one: the parse takes milliseconds) or fails its compile (a
        large one, parsed off the step loop: `compile_queue.SYNC_PARSE_CHARS`)."""
        assert params.structured_outputs is not None, "called for constrained requests only"
        if not isinstance(self.runner, ModelRunner):  # workers would need the grammars' bitmasks
            raise InvalidParamError("structured output is not supported with tensor or pipeline parallelism "
                                    "yet", "structured_outputs")
        if self.speculator is not None:  # drafts would need a bitmask per drafted position
            raise InvalidParamError("structured output is not supported with speculative decoding yet",
                                    "structured_outputs")
        return self.grammar_compiles.submit(params.structured_outputs, request_id)

    def _admit_compiled(self) -> None:
        """Queue the requests whose grammar has compiled; fail those whose compile failed or took too long."""
        ready, failed = self._compiling.take_done(time.monotonic())
        for request_id, exc in failed:
            self._fail(request_id, exc)
        for group in ready:
            self.scheduler.add(group[0], by_arrival=True)

    def _wait_for_grammars(self) -> None:
        """Nothing can run but grammars are compiling: wait a moment for one, rather than spin the loop."""
        if self._compiling and not self.scheduler.has_unfinished() and self._in_flight is None and not self.batches:
            self._compiling.wait(COMPILE_POLL_S)
            self._admit_compiled()

    def embed(self, prompts: list[list[int]], params: PoolingParams,
              cache_salt: str | None = None) -> list[EmbeddingOutput]:
        """Embeddings of tokenized prompts on the pooling runner (prefill only, blocks freed at once); `cache_salt`
        keeps their prefix-cache blocks apart from other salts', as on `add_request`."""
        return embed_prompts(self, prompts, params, cache_salt)

    def classify(self, prompts: list[list[int]], use_activation: bool = True,
                 cache_salt: str | None = None) -> list[ClassificationOutput]:
        """A classifier's (--convert classify) class scores of tokenized prompts, as `embed` runs (prefill only,
        blocks freed at once); `use_activation=False` gives the head's raw logits."""
        return classify_prompts(self, prompts, use_activation, cache_salt)

    def token_classify(self, prompts: list[list[int]], use_activation: bool = True,
                       cache_salt: str | None = None) -> list[list[list[float]]]:
        """A classifier's class scores at every token of tokenized prompts (vLLM's token_classify task), as `classify`
        runs, every token computed (no prefix-cache block taken)."""
        return token_classify_prompts(self, prompts, use_activation, cache_salt)

    def add_lora(self, lora: LoRARequest) -> None:
        """Load an adapter into the CPU cache, checked against the model (LoRAAdapterError if it cannot
        be served; InvalidParamError when LoRA is off)."""
        manager = self._lora_manager()
        if manager is None:
            raise InvalidParamError("LoRA adapters are not enabled on this server (--enable-lora)", "model")
        manager.add(lora)

    def remove_lora(self, lora_int_id: int) -> None:
        """Drop an adapter's cached copies; running requests that use it reload it from its directory."""
        manager = self._lora_manager()
        if manager is not None:
            manager.remove(lora_int_id)

    # --- sleep mode (--enable-sleep-mode; engine/sleep_mode.py) -------------------------------------

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """vLLM's `sleep`: stop scheduling and give the device memory back. Level 0 only pauses; level 1 moves the
        weights to host memory and frees the KV cache (the prefix cache forgets its blocks); level 2 frees the
        weights too (`reload_weights`, or the caller's own update, refills them after `wake_up`). `mode` is what
        happens to the requests in flight (vLLM's): "abort" ends each, its final output (`take_aborted_outputs`) holding
        what it generated with finish_reason "abort"; "wait" lets
        the running ones finish first, starting no new one, and sleeps once they have (`sleep_pending` until
        then; the engine must keep stepping); "keep" holds them, preempted at level 1 or 2 (their KV is freed),
        and they go on after `wake_up`, recomputed. Requests added while asleep wait until `wake_up`."""
        runner = self._sleep_runner()
        check_sleep_level(level)
        check_sleep_mode(mode)
        self._pending_sleep = None
        if mode == "abort":
            if self._in_flight is not None:  # asynchronous scheduling: let the launched step finish with the device
                runner.collect(self._in_flight[1])
                self._in_flight = None
            self._aborted += [self._end_aborted(request_id) for request_id in list(self._groups)]
        self._pending_sleep = (level, mode)
        self.scheduler.hold_new = True  # a wait drains the running requests only: no new one starts
        self._sleep_if_settled()

    def sleep_pending(self) -> bool:
        """True from a "wait" or "keep" sleep until it has happened (the running requests finished, or the step in
        flight collected): the caller keeps stepping, and a server's /sleep answers once it is False."""
        return self._pending_sleep is not None

    def _sleep_if_settled(self) -> None:
        """Fall asleep as the pending sleep asked, once nothing it waits for is left: a step in flight (every
        mode) and, for "wait", a running or preempted request (none, when a level-0 pause already holds them)."""
        if self._pending_sleep is None or self._in_flight is not None:
            return
        level, mode = self._pending_sleep
        # Paused already (level 0), nothing steps the running requests: a "wait" could never drain, so it holds
        # them as "keep" does.
        if mode == "wait" and not self._paused and self.scheduler.has_started():
            return
        self._pending_sleep = None
        if level >= 1:  # a request still running ("keep", or held by a pause) loses its KV: recomputed on waking
            self.scheduler.preempt_all()
        self._paused = True
        # a lighter sleep on top of a deeper one frees nothing back: the memory stays as the deeper one left it
        self._sleep_level = max(level, self._sleep_level or 0)
        if level >= 1:
            self.block_manager.reset_prefix_cache()
            self._sleep_runner().sleep(level)
        logger.info("engine asleep (level %d, mode %s)", level, mode)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM's `wake_up`: take back the memory `tags` name ("weights", "kv_cache"; None: all). Scheduling resumes
        once nothing is asleep. A sleep still pending (mode "wait" or "keep") is called off."""
        runner = self._sleep_runner()
        runner.wake_up(wake_tags(tags))
        self._pending_sleep = None
        self._paused = bool(runner.asleep)
        if not self._paused:
            self._sleep_level = None
            self.scheduler.hold_new = False
            logger.info("engine awake")

    def is_sleeping(self) -> bool:
        """True from `sleep` (a pending one too, as vLLM's paused scheduler) until `wake_up` has brought everything
        back."""
        return self._paused or self._pending_sleep is not None

    def reload_weights(self) -> None:
        """Fill the weights again from the model's checkpoint (vLLM's collective_rpc("reload_weights"), after a
        level-2 sleep and a wake-up of the weights)."""
        self._sleep_runner().reload_weights()

    def _sleep_runner(self) -> ModelRunner:
        if not self.config.model.enable_sleep_mode:
            raise InvalidParamError("sleep mode is not enabled: start the engine with --enable-sleep-mode "
                                    "(enable_sleep_mode=True)")
        assert isinstance(self.runner, ModelRunner), "the config allows sleep mode at one rank only"
        return self.runner

    def _lora_manager(self) -> LoRAManager | None:
        # LoRA runs in this process only (the config refuses it with tensor or pipeline parallelism).
        return self.runner.lora if isinstance(self.runner, ModelRunner) else None

    @property
    def vocab_size(self) -> int:
        """Width of the model's logits: every token id a request names must lie below it."""
        return self.config.model.hf_config["vocab_size"]

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """Structured output's compiler and its cache of compiled grammars (built on first use: reading
        the vocabulary into xgrammar takes a moment that unconstrained serving should not pay)."""
        return self._compiling.compiler

    @property
    def grammar_compiles(self) -> GrammarCompiles:
        """The compile threads in front of `grammar_compiler` (started on first use)."""
        return self._compiling.compiles

    def warm_up_grammars(self) -> None:
        """Start structured output's compiler and compile processes in the background now (the server's engine,
        once started), not on the first constrained request (GrammarWaitingRoom.warm_up), unless
        --structured-outputs-config's `warm_up` is false."""
        if self.config.structured_outputs.warm_up:
            self._compiling.warm_up()

    @property
    def max_pending_compiles(self) -> int | None:
        """Distinct grammar compiles queued or running at most (past it, a new one is EngineBusyError, a 503);
        None: no cap (the offline LLM). Set it before the first constrained request."""
        return self._compiling.max_pending

    @max_pending_compiles.setter
    def max_pending_compiles(self, value: int | None) -> None:
        self._compiling.max_pending = value

    def _check_prompt_ids(self, request: Request) -> None:
        """Every prompt id the model may be fed lies in the vocabulary (`prompt_rules.check_prompt_ids`).

        Ids inside the prompt's blocks that the prefix cache holds are not checked again where equal block keys
        imply equal tokens (`BlockManager.keys_imply_equal_tokens`: sha256 keys, not `builtin`): they were checked
        when the request that computed those blocks came in, and a hit's cached tokens are never fed to the model.
        Over a 2,000-token cached prefix the two C loops of the check held its first token back by ~0.04 ms (CPU).
        The block hashes computed here serve the scheduler's prefix look-up."""
        ids = request.prompt_token_ids
        blocks = self.block_manager
        known = blocks.cached_prompt_tokens(request) if blocks.keys_imply_equal_tokens else 0
        check_prompt_ids(ids[known:] if known else ids, self.vocab_size)

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests (all their completions) at any time; their blocks return to the pool at once."""
        for request_id in request_ids:
            group = self._groups.pop(request_id, [])
            self._release(request_id, group)
            for child in group:
                self._detokenizers.pop(child.request_id, None)

    def _release(self, request_id: str, group: list[Request]) -> None:
        """Take a request's completions out of the scheduler (and the grammar waiting room), return their blocks,
        and mark those not finished yet aborted."""
        self._compiling.discard(request_id)  # not in the scheduler yet: no blocks to return
        self.scheduler.abort(child.request_id for child in group)
        for child in group:
            self.block_manager.free(child)  # one that never ran holds its prompt's block hashes (`add_request`)
            child.status = RequestStatus.FINISHED_ABORTED if not child.status.finished else child.status

    def _end_aborted(self, request_id: str) -> RequestOutput:
        """End a request as vLLM's abort-mode pause does: every completion not finished yet finishes "abort", its
        blocks return to the pool, and its final output holds what it generated."""
        group = self._groups[request_id]
        ending = [child for child in group if not child.status.finished]
        self._release(request_id, group)  # one in the grammar waiting room too (never scheduled)
        for child in ending:
            detok = self._detokenizers[child.request_id]
            params = child.sampling_params
            if params.output_kind == "final_only" and not params.stop:  # not decoded before its end (`_process_token`)
                detok.add(child.output_token_ids)
            detok.flush()
            if child.index == 0:  # counted as vLLM counts the abort outputs its pause sends: finished_reason "abort"
                self._record_finished(child, time.monotonic())
        logger.info("request %s aborted: the engine was put to sleep (mode abort)", request_id)
        return self._output(request_id, group, finished=True)

    def take_aborted_outputs(self) -> list[RequestOutput]:
        """The final outputs (finish_reason "abort") of the requests a sleep ended since the last call."""
        aborted, self._aborted = self._aborted, []
        return aborted

    def take_failures(self) -> list[RequestFailedError]:
        """Requests that failed (and were aborted) since the last call; the others went on."""
        failures, self._failures = self._failures, []
        return failures

    def _fail(self, request_id: str, exc: Exception) -> None:
        """One request's error ends that request alone: abort it (its blocks return) and report it.

        An InvalidParamError or EngineBusyError is a refusal whose cause showed only later (its grammar: too slow
        to compile, before any output; or a dead end, maybe mid-stream): front ends answer it as they would have
        at `add_request` (`errors.client_error`), or with an error event once a stream has begun. Anything else
        is a failure, logged with its traceback."""
        if isinstance(exc, (InvalidParamError, EngineBusyError)):
            logger.warning("request %s refused: %s", request_id, exc)
        else:
            logger.exception("request %s failed; aborting it", request_id)
        self.abort([request_id])
        self._failures.append(RequestFailedError(request_id, exc))

    def stats_snapshot(self) -> StatsSnapshot:
        """A frozen copy of the gauges and counters, with the samples since the previous call (which it
        drains): the only view of the engine's state that front ends read. Call it on the engine thread."""
        s = self.stats
        return StatsSnapshot(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting) + len(self._compiling),
            kv_cache_usage=self.block_manager.usage,
            num_gpu_blocks=self.block_manager.num_blocks,
            prompt_tokens=s.prompt_tokens,
            generation_tokens=s.generation_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=self.block_manager.prefix_cache_queries,
            prefix_cache_hits=self.block_manager.prefix_cache_hits,
            spec_decode=self.speculator.counts if self.speculator is not None else None,
            events=s.drain_events(),
            running_lora_adapters=_lora_names(self.scheduler.running),
            waiting_lora_adapters=_lora_names(itertools.chain(self.scheduler.waiting,
                                                               self._compiling.first_requests())),
            sleep_level=self._sleep_level,
        )

    def check_health(self) -> None:
        """Raise if the model can no longer run steps (a tensor/pipeline-parallel worker has died)."""
        if isinstance(self.runner, MultiprocExecutor):
            self.runner.check_health()

    def shutdown(self) -> None:
        """Stop the worker processes, if any, or free this process's KV pool and CUDA graphs (the engine cannot
        step afterwards)."""
        if isinstance(self.runner, MultiprocExecutor):
            self.runner.shutdown()
        else:
            self.runner.release()
        self._compiling.shutdown()

    def can_step(self) -> bool:
        """True when `step` has work to do now: unfinished requests and the engine awake."""
        return not self._paused and self.has_unfinished_requests()

    def has_unfinished_requests(self) -> bool:
        """True while any request waits (for its grammar too) or runs, or a step's outputs are still to come."""
        return (self.scheduler.has_unfinished() or bool(self._compiling) or self._in_flight is not None
                or bool(self.batches))

    # --- one step -----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run and post-process one step; returns outputs of requests that got a token.

        With asynchronous scheduling a call plans and launches the next step before it waits for
        the one in flight, so the host's work overlaps the GPU's; the outputs it returns are those
        of the step launched by the call before.
        """
        if self._paused:  # asleep: the model's memory may be gone; requests wait for wake_up
            return []
        if self._pending_sleep is not None:
            return self._step_towards_sleep()
        return self._step()

    def _step(self) -> list[RequestOutput]:
        if self._compiling:
            self._admit_compiled()
            self._wait_for_grammars()
        if self.config.scheduler.async_scheduling:
            return self._step_overlapped()
        if self.batches is not None:  # pipeline parallelism: up to pp steps in flight
            done = self.batches.step()
            return [] if done is None else self._finish_step(*done)
        plan = self._schedule()
        if plan.is_empty:
            return []
        if isinstance(self.runner, ModelRunner):
            return self._finish_step(plan, self.runner.execute(plan, self._bitmask))
        return self._finish_step(plan, self.runner.execute(plan))

    def _step_towards_sleep(self) -> list[RequestOutput]:
        """A step while a sleep is pending: "keep" only collects the step in flight (launching none), "wait" steps
        the running requests on; then the sleep happens if nothing it waits for is left."""
        assert self._pending_sleep is not None, "called with a sleep pending only"
        if self._pending_sleep[1] == "keep":
            in_flight, self._in_flight = self._in_flight, None
            outputs = [] if in_flight is None else self._finish_step(in_flight[0], self.runner.collect(in_flight[1]))
        else:  # the scheduler starts no new request meanwhile (hold_new)
            outputs = self._step()
        self._sleep_if_settled()
        return outputs

    def _step_overlapped(self) -> list[RequestOutput]:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None and self._needs_known_outputs(in_flight[0]):
            return self._step_after_known_outputs(*in_flight)
        plan = self._schedule()
        launched = None if plan.is_empty else self.runner.launch(plan)
        if launched is not None:
            self._in_flight = (plan, launched)
        outputs = [] if in_flight is None else self._finish_step(in_flight[0], self.runner.collect(in_flight[1]))
        if launched is not None:
            # After the step in flight's tokens have advanced the grammars: the new step's bitmask
            # needs them, and the host builds it while the device runs the new step's forward pass.
            self._draw_constrained(launched)
        return outputs

    def _step_after_known_outputs(self, done: SchedulerOutput, launched: LaunchedStep) -> list[RequestOutput]:
        """The next step can be planned only once the step in flight's tokens are in (drafts, penalties):
        take them in, plan and launch the next step, and only then detokenize, check stop strings and
        build the outputs, while the device runs the new step. (A stop string found then finishes its
        request; the step just launched for it is discarded, as with any step in flight.)"""
        result = self.runner.collect(launched)
        touched = self._take_tokens(done, result)
        plan = self._schedule()
        new = None if plan.is_empty else self.runner.launch(plan)
        if new is not None:
            self._in_flight = (plan, new)
        outputs = self._post_process(done, result, touched)
        if new is not None:  # a draw waiting for its grammars' bitmask: they take the tokens above in _post_process
            self._draw_constrained(new)
        return outputs

    def _draw_constrained(self, launched: LaunchedStep) -> None:
        """Draw a launched step whose rows wait for their grammars' bitmask (structured output)."""
        if launched.hidden is not None and isinstance(self.runner, ModelRunner):
            self.runner.draw(launched, self._bitmask(launched.rows))

    def _bitmask(self, rows: list[SamplingRow]) -> torch.Tensor | None:
        """The step's grammar bitmask, one row per sampling row (None: nothing constrained)."""
        from flotilla.engine.structured_output.bitmask import step_bitmask

        return step_bitmask([r.request.grammar for r in rows], self.vocab_size)

    def _needs_known_outputs(self, in_flight: SchedulerOutput) -> bool:
        """Penalties (and bad words of several tokens) read a request's output on the host, so the next
        step of a running request that has them cannot be planned before the step in flight has delivered
        its token. Drafts
        likewise: proposals read the known tokens, and a step with drafts in flight has an unknown
        number of accepted tokens to roll back to."""
        if any(r.reads_known_outputs for r in self.scheduler.running):
            return True
        spec = self.speculator
        if spec is None:
            return False
        return spec.lookahead(len(self.scheduler.running)) > 0 or any(s.spec_token_ids for s in in_flight.scheduled)

    def _schedule(self) -> SchedulerOutput:
        """The scheduler's next plan, with drafts in the slots it reserved for them."""
        spec = self.speculator
        if spec is None:
            plan = self.scheduler.schedule()
        else:
            plan = self.scheduler.schedule(spec.lookahead(len(self.scheduler.running)))
            spec.propose(plan)
        if self._lora_manager() is not None:
            self._read_adapters(plan)
        return plan

    def _read_adapters(self, plan: SchedulerOutput) -> None:
        """Have the step's adapters in the CPU cache before it runs: one unloaded (or evicted) while its requests
        ran is read again from its directory, and if that fails, its requests fail and leave the step alone
        (raised inside the step, the error would end the engine loop and every other request with it)."""
        manager = self._lora_manager()
        assert manager is not None, "called with LoRA on only"
        loras = {s.request.lora_request.lora_int_id: s.request.lora_request for s in plan.scheduled
                 if s.request.lora_request is not None}
        failed = set()
        for lora_id, lora in loras.items():
            try:
                manager.add(lora)
            except Exception as exc:  # e.g. its directory is gone: those requests' problem
                failed.add(lora_id)
                # By id: requests of one adapter may hold distinct equal objects (each unpickled in the core process).
                planned = [s for s in plan.scheduled
                           if s.request.lora_request is not None and s.request.lora_request.lora_int_id == lora_id]
                for s in planned:  # the blocks this step was to fill were indexed as planned: never filled
                    self.block_manager.uncache(s.request, s.num_computed_tokens)
                for parent_id in dict.fromkeys(s.request.parent_id for s in planned):
                    self._fail(parent_id, exc)
        if failed:
            plan.scheduled = [s for s in plan.scheduled
                              if s.request.lora_request is None or s.request.lora_request.lora_int_id not in failed]

    def _finish_step(self, plan: SchedulerOutput, result: StepOutput) -> list[RequestOutput]:
        """Post-process a step that has run: tokens in, stop checks, detokenization, outputs."""
        return self._post_process(plan, result, self._take_tokens(plan, result))

    def _take_tokens(self, plan: SchedulerOutput, result: StepOutput) -> list[Request]:
        """What planning the next step needs of a step that has run: its tokens appended (token stops,
        lengths, the roll-back of rejected drafts). Returns the requests that got a token."""
        self._attach_prompt_logprobs(result)
        if self.speculator is not None and result.verified:
            self.speculator.record(plan, result.verified)
        return self.scheduler.update(plan, result.tokens, result.verified)

    def _post_process(self, plan: SchedulerOutput, result: StepOutput, touched: list[Request]) -> list[RequestOutput]:
        """The rest of a step's post-processing: logprobs, detokenization, stop strings, outputs, stats."""
        now = time.monotonic()
        for child in touched:
            if child.parent_id not in self._groups:  # its request failed on an earlier completion
                continue
            try:
                self._process_token(child, result)
            except Exception as exc:  # a grammar's dead end (refused) or e.g. an undecodable id: this request's problem
                self._fail(child.parent_id, exc)
                continue
            self._record_timing(child, now)
        # The tokens requests received: not a token drawn for one that had finished (or was aborted) while the step
        # ran, which asynchronous scheduling discards, as vLLM drops it before its counters see it.
        verified = result.verified
        self._record(plan, sum(len(verified[c.request_id]) if c.request_id in verified else 1 for c in touched))
        # An output is due every step (streaming: cumulative or delta), or once every completion has finished; a
        # final-only request can have finished only if a completion that got a token this step did.
        due = (c.parent_id for c in touched if c.status.finished or c.sampling_params.output_kind != "final_only")
        outputs = []
        for parent_id in dict.fromkeys(due):
            group = self._groups.get(parent_id)
            if group is None:
                continue
            finished = all(c.status.finished for c in group)
            if finished or group[0].sampling_params.output_kind != "final_only":
                try:
                    outputs.append(self._output(parent_id, group, finished))
                except Exception as exc:
                    self._fail(parent_id, exc)
        return outputs

    def _attach_prompt_logprobs(self, result: StepOutput) -> None:
        for request_id, (first, entries) in result.prompt_logprobs.items():
            request = self.scheduler.requests.get(request_id)
            if request is None:  # aborted while its step was in flight (asynchronous scheduling)
                continue
            if not request.prompt_logprobs:  # the first prompt token has no predecessor: stays None
                request.prompt_logprobs.extend([None] * request.num_prompt_tokens)
            # By position, so recomputing a preempted prompt overwrites rather than appends.
            request.prompt_logprobs[first : first + len(entries)] = entries

    def _process_token(self, child: Request, result: StepOutput) -> None:
        """Logprobs, detokenization and stop strings for a completion's new token(s): one, or the
        tokens verification kept, each handled as if it had come in a step of its own."""
        verified = result.verified.get(child.request_id) if result.verified else None
        num_new = len(verified) if verified is not None else 1
        if verified is not None:  # cut at a stop token by the scheduler; its logprobs are cut here
            entries = result.verified_logprobs.get(child.request_id, [])[:num_new]
        else:
            entry = result.logprobs.get(child.request_id) if result.logprobs else None
            entries = [entry] if entry is not None else []
        num_output = child.num_output_tokens
        first = num_output - num_new
        for i, entry in enumerate(entries):
            child.logprobs.append(entry)
            child.cumulative_logprob += entry[child.output_token_ids[first + i]][0]
        if child.grammar is not None:
            self._advance_grammar(child, child.grammar)
        detok = self._detokenizers[child.request_id]
        params = child.sampling_params
        # Stopped already, it was by its last token (EOS or a stop id; stop strings are found below): as vLLM,
        # that token is in token_ids but not in the text, unless include_stop_str_in_output.
        unrendered = child.status == RequestStatus.FINISHED_STOPPED and not params.include_stop_str_in_output
        if params.output_kind == "final_only" and not params.stop:
            if child.status.finished:  # nothing reads the text before the end: decode it once
                detok.add(child.output_token_ids[:-1] if unrendered else child.output_token_ids)
                detok.flush()
            return
        if num_new == 1 and not params.stop:  # a stream's one token a step and no stop string: `_detokenize_each`'s
            if not unrendered:  # one turn, without its loop (the step does this for every running request)
                detok.add(child.output_token_ids[-1:])
            if child.status.finished:
                detok.flush()
            return
        self._detokenize_each(child, detok, first, unrendered)

    def _detokenize_each(self, child: Request, detok: IncrementalDetokenizer, first: int, unrendered: bool) -> None:
        """Detokenize a completion's tokens from `first` on one at a time, each as if it had come in a step of its
        own, looking for its stop strings after each."""
        params = child.sampling_params
        num_output = child.num_output_tokens
        for i in range(first, num_output):
            searched_from = detok.num_chars
            last = i == num_output - 1
            if not (last and unrendered):
                detok.add(child.output_token_ids[i : i + 1])
            if last and child.status.finished:
                detok.flush()
            stop = self._find_stop_string(child, detok, searched_from, i + 1) if params.stop else None
            if stop is not None:
                if not last:  # the tokens after the one that completed the stop string were never output
                    del child.output_token_ids[i + 1 :]
                    del child.logprobs[i + 1 :]
                    if child.logprobs:
                        pairs = zip(child.logprobs, child.output_token_ids, strict=True)
                        child.cumulative_logprob = sum(e[t][0] for e, t in pairs)
                self._stop_on_string(child, detok, *stop)
                return

    @staticmethod
    def _advance_grammar(child: Request, grammar: RequestGrammar) -> None:
        """Advance a constrained completion's grammar over its new tokens; a token that does not fit is the
        request's error (InvalidParamError) when the grammar, or the grammar and the request's own token masks,
        left no token to draw, and the engine's (RuntimeError) otherwise."""
        if grammar.accept(child.output_token_ids):
            return
        if grammar.dead_end:  # the grammar allowed no token at all: the request's fault, not the engine's
            raise InvalidParamError(
                f"the structured output constraint reaches a dead end after {grammar.num_accepted} tokens "
                "of output: it allows no next token (no text completes it from there)", "structured_outputs")
        params = child.sampling_params
        masks = [f for f in ("allowed_token_ids", "bad_words") if getattr(params, f)]
        short = grammar.num_accepted < params.min_tokens  # stop tokens were banned for min_tokens
        if short and not masks:  # the grammar allowed only stop tokens: its text was complete
            raise InvalidParamError(
                f"min_tokens {params.min_tokens} bans the stop tokens that the structured output constraint allows "
                f"alone after {grammar.num_accepted} tokens of output (its text is complete there)", "min_tokens")
        masks += ["min_tokens"] if short else []
        if masks:  # with the grammar's bitmask they forbade every token: the sampler had nothing to draw
            raise InvalidParamError(
                f"{' and '.join(masks)} leave no token that the structured output constraint allows after "
                f"{grammar.num_accepted} tokens of output", masks[0])
        raise RuntimeError("a drawn token does not fit the request's grammar")

    def _find_stop_string(
        self, child: Request, detok: IncrementalDetokenizer, searched_from: int, num_output: int
    ) -> tuple[str, int] | None:
        """The earliest stop string in the new text (a stop may straddle the old text's end)."""
        stops = child.sampling_params.stop
        # As EOS and stop ids (banned while fewer than min_tokens are out), and as vLLM: the first token that
        # may stop the request is number min_tokens + 1.
        if not stops or num_output <= child.sampling_params.min_tokens:
            return None
        # The tail that the searches span (the new text and a stop string's length before it), not the whole text.
        base = max(0, searched_from - max(map(len, stops)) + 1)
        tail = detok.text_between(base, detok.num_chars)
        best: tuple[str, int] | None = None
        for stop in stops:
            # Only an occurrence that ends in the new text (vLLM's window, per stop string): a long stop string
            # does not widen the short ones' searches.
            index = tail.find(stop, max(0, searched_from - len(stop) + 1) - base)
            # The earliest; of stops found at one index, the first listed (vLLM's rule), not the smallest string.
            if index >= 0 and (best is None or index + base < best[1]):
                best = stop, index + base
        return best

    def _stop_on_string(self, child: Request, detok: IncrementalDetokenizer, stop: str, index: int) -> None:
        keep = index + len(stop) if child.sampling_params.include_stop_str_in_output else index
        detok.cut(keep)
        child.stop_reason = stop
        if child.status.finished:  # the same token also hit a length limit: the stop string wins
            child.status = RequestStatus.FINISHED_STOPPED
        else:
            self.scheduler.finish(child, RequestStatus.FINISHED_STOPPED)

    def _output(self, parent_id: str, group: list[Request], finished: bool) -> RequestOutput:
        completions = [self._completion(child) for child in group]
        if finished:
            params = group[0].sampling_params
            longest = max(child.num_output_tokens for child in group)
            self.stats.finished_groups.append(FinishedGroup(params.n, params.max_tokens, longest))
            del self._groups[parent_id]
            for child in group:
                self._detokenizers.pop(child.request_id, None)
        first = group[0]
        prompt_logprobs = None
        if first.sampling_params.prompt_logprobs is not None:  # a 1-token prompt has no entry but its None (vLLM)
            prompt_logprobs = first.prompt_logprobs or [None] * first.num_prompt_tokens
        return RequestOutput(
            request_id=parent_id,
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=max(first.num_cached_tokens, 0),
            outputs=completions,
            finished=finished,
        )

    def _completion(self, child: Request) -> CompletionOutput:
        detok = self._detokenizers[child.request_id]
        params = child.sampling_params
        end = detok.num_chars
        if params.stop and not params.include_stop_str_in_output and not child.status.finished:
            # Hold back what could be the start of a stop string, so a stream never shows it (a kept stop
            # string is shown anyway: nothing held back, as vLLM).
            end = max(0, end - max(map(len, params.stop)) + 1)
        if params.output_kind != "delta":
            return self._snapshot(child, detok, end)
        # What the previous output did not hold (vLLM's DELTA outputs): O(new tokens), whatever the output's length.
        sent = child.sent
        text = ""
        if end > sent.chars:  # text already out stays out (a cut stop string never reaches it)
            text = detok.text_between(sent.chars, end)
            sent.chars = end
        tokens = child.output_token_ids
        token_ids = tokens[sent.tokens :]
        sent.tokens = len(tokens)
        logprobs = None
        if params.logprobs is not None:
            logprobs = child.logprobs[sent.logprobs :]
            sent.logprobs = len(child.logprobs)
        return CompletionOutput(child.index, text, token_ids, child.finish_reason, child.stop_reason,
                                child.cumulative_logprob if logprobs is not None else None, logprobs)

    @staticmethod
    def _snapshot(child: Request, detok: IncrementalDetokenizer, end: int) -> CompletionOutput:
        """A completion's whole output so far, its text up to `end` (cumulative and final outputs)."""
        wants_logprobs = child.sampling_params.logprobs is not None
        return CompletionOutput(
            index=child.index,
            text=detok.text[:end],
            # A copy: the output is a snapshot, read (on the server, on another thread) while the
            # request keeps growing. It makes a cumulative stream O(output length) per request per step,
            # which is why the server streams deltas.
            token_ids=list(child.output_token_ids),
            finish_reason=child.finish_reason,
            stop_reason=child.stop_reason,
            cumulative_logprob=child.cumulative_logprob if wants_logprobs else None,
            logprobs=list(child.logprobs) if wants_logprobs else None,
        )

    def _record_timing(self, child: Request, now: float) -> None:
        """Latency samples, from each request's first completion (as vLLM reports per request)."""
        if child.index != 0:
            return
        if child.first_token_time is None or child.last_token_time is None:
            child.first_token_time = now
            self.stats.ttft.append(now - child.arrival_time)
            if self.step_trace is not None:  # the engine's part of the time to first token
                self.step_trace.note(first=1, ttft_ms=round((now - child.arrival_time) * 1e3, 1))
            # vLLM counts a request's whole prompt once it is prefilled, cached tokens included, so the
            # counter agrees with `usage.prompt_tokens` and vllm:request_prompt_tokens.
            self.stats.prompt_tokens += child.num_prompt_tokens
        else:
            self.stats.inter_token.append(now - child.last_token_time)
        child.last_token_time = now
        if child.status.finished:
            self._record_finished(child, now)

    def _record_finished(self, child: Request, now: float) -> None:
        """A finished first completion's sample (vllm:request_success_total by its reason, the per-request
        histograms). One that a sleep aborted may have no token yet: its time so far is queue, or prefill once
        scheduled; its decode time ends at its last token (vLLM's intervals end at token times, e2e at the end)."""
        scheduled = child.first_scheduled_time or now
        first = child.first_token_time or now
        last = child.last_token_time or first
        self.stats.finished.append(
            FinishedRequest(
                finish_reason=child.finish_reason or "abort",
                prompt_tokens=child.num_prompt_tokens,
                generation_tokens=child.num_output_tokens,
                e2e_seconds=now - child.arrival_time,
                queue_seconds=scheduled - child.arrival_time,
                prefill_seconds=first - scheduled,
                decode_seconds=last - first,
            )
        )

    def _record(self, plan: SchedulerOutput, num_sampled: int) -> None:
        num_tokens = sum(x.num_new_tokens for x in plan.scheduled)
        s = self.stats
        s.num_steps += 1
        s.step_tokens.append(num_tokens)
        s.generation_tokens += num_sampled
        s.num_preemptions = self.scheduler.num_preemptions
        s.prefix_cache_queries = self.block_manager.prefix_cache_queries
        s.prefix_cache_hits = self.block_manager.prefix_cache_hits
        if self.step_trace is not None:
            self._trace(plan, num_tokens)

    def _trace(self, plan: SchedulerOutput, num_tokens: int) -> None:
        """The step's line in the step trace: what it held and what it cost."""
        assert self.step_trace is not None, "called only with a trace"
        prefill = [s for s in plan.scheduled if s.num_computed_tokens < len(s.request.prompt_token_ids)]
        timing = self.runner.last_step
        self.step_trace.record(
            tokens=num_tokens, decode=len(plan.scheduled) - len(prefill), prefill=len(prefill),
            prefill_tokens=sum(s.num_new_tokens for s in prefill), running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting), preempted=len(plan.preempted), graph=timing.graph_tokens,
            host_ms=round(timing.host_s * 1e3, 2), sync_ms=round(timing.sync_s * 1e3, 2),
            step_ms=round(timing.total_s * 1e3, 2),
        )


def _lora_names(requests: Iterable[Request]) -> tuple[str, ...]:
    """The distinct adapter names among `requests`, in order of first appearance."""
    return tuple(dict.fromkeys(r.lora_request.lora_name for r in requests if r.lora_request is not None))
