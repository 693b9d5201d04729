"""The engine core: requests in, one scheduled step at a time, outputs out.

Front ends (the offline `LLM` class, the HTTP server) add requests and call `step()`; the engine
tokenizes, validates, schedules, runs the model and detokenizes. It never imports a front end.
"""

from __future__ import annotations

import itertools
from typing import Any

from flotilla.engine.block_manager import BlockManager
from flotilla.engine.config import EngineConfig
from flotilla.engine.detokenizer import IncrementalDetokenizer
from flotilla.engine.model_runner import ModelRunner
from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import Scheduler, SchedulerOutput
from flotilla.engine.stats import EngineStats
from flotilla.engine.tokenizer import eos_token_ids, load_tokenizer


class LLMEngine:
    """Holds the scheduler, the block manager and the model runner, and drives them step by step."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model.tokenizer)
        self.eos_token_ids = eos_token_ids(config.model.model, self.tokenizer, config.model.hf_config)
        self.runner = ModelRunner(config)
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.cache.block_size, config.cache.enable_prefix_caching
        )
        self.scheduler = Scheduler(config.scheduler, self.block_manager)
        self.stats = EngineStats()
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> LLMEngine:
        """Build from `vllm serve`-style keyword arguments."""
        return cls(EngineConfig.from_kwargs(model, **kwargs))

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        prompt_text: str | None = None,
    ) -> Request:
        """Tokenize (if text), validate and queue a request.

        `prompt_text` is the text behind pre-tokenized prompts (e.g. a rendered chat template),
        reported back in the output.
        """
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = prompt_text, list(prompt)
        self._validate_prompt(token_ids)
        request = Request(
            request_id=request_id if request_id is not None else str(next(self._ids)),
            prompt_token_ids=token_ids,
            sampling_params=params,
            eos_token_ids=self.eos_token_ids,
            prompt=text,
        )
        self.scheduler.add(request)
        self._detokenizers[request.request_id] = IncrementalDetokenizer(
            self.tokenizer, token_ids, params.skip_special_tokens
        )
        return request

    def _validate_prompt(self, token_ids: list[int]) -> None:
        max_len = self.config.model.max_model_len
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= max_len:
            raise ValueError(
                f"the prompt is {len(token_ids)} tokens long; this model's maximum context length is "
                f"{max_len} tokens (prompt plus at least one generated token)"
            )
        vocab = self.config.model.hf_config["vocab_size"]
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id(s) {bad[:5]} are outside the vocabulary (size {vocab})")

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests at any time; their blocks return to the pool at once."""
        for request in self.scheduler.abort(request_ids):
            self._detokenizers.pop(request.request_id, None)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Schedule, run and post-process one step; returns outputs of requests that got a token."""
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        sampled = self.runner.execute(plan)
        touched = self.scheduler.update(plan, sampled)
        self._record(plan, len(sampled))
        return [self._output(request) for request in touched]

    def _output(self, request: Request) -> RequestOutput:
        detok = self._detokenizers[request.request_id]
        detok.add(request.output_token_ids[-1:])
        finished = request.status.finished
        if finished:
            detok.flush()
            del self._detokenizers[request.request_id]
        completion = CompletionOutput(
            index=0,
            text=detok.text,
            token_ids=list(request.output_token_ids),
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
        )
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            finished=finished,
        )

    def _record(self, plan: SchedulerOutput, num_sampled: int) -> None:
        s = self.stats
        s.num_steps += 1
        s.step_tokens.append(plan.num_batched_tokens)
        s.prompt_tokens += sum(
            max(0, min(x.request.num_prompt_tokens, x.num_computed_tokens + x.num_new_tokens) - x.num_computed_tokens)
            for x in plan.scheduled
        )
        s.generation_tokens += num_sampled
        s.num_running = len(self.scheduler.running)
        s.num_waiting = len(self.scheduler.waiting)
        s.kv_cache_usage = self.block_manager.usage
        s.num_preemptions = self.scheduler.num_preemptions
        s.prefix_cache_queries = self.block_manager.prefix_cache_queries
        s.prefix_cache_hits = self.block_manager.prefix_cache_hits
