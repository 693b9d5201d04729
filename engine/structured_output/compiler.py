"""Compiling a request's constraint into an xgrammar grammar, once per distinct constraint.

Compiling a JSON schema builds the token-level automaton over the whole vocabulary (milliseconds to
seconds; a large legal schema can take minutes, see compile_queue.py); requests that repeat a schema —
the usual case for a JSON pipeline — reuse the compiled grammar from an LRU cache and pay nothing.

Two halves: `prepare` parses the constraint into an xgrammar `Grammar` (fast: it finds every invalid
schema, regex or EBNF grammar, so the caller can refuse the request at once), and `compile_prepared`
builds the token-level automaton (the slow part, run off the step loop by compile_queue.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections import OrderedDict
from typing import Any

import xgrammar as xgr

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.structured_output.params import StructuredOutputsParams
from flotilla.engine.structured_output.structural_tag import format_text
from flotilla.engine.structured_output.unenforced import find_unenforced

# Distinct compiled grammars kept; most hold a per-state token cache of a few hundred KB at most.
CACHE_SIZE = 512
# ... and their bytes (xgrammar's own estimate), as vLLM bounds its cache (VLLM_XGRAMMAR_CACHE_MB, default 512):
# the count alone let one client fill the engine's memory, since a grammar's size grows with its constraint (a
# `choice` of 20,000 strings, a 160 KB body, compiles in 0.5 s to 25 MB: 512 of them held 12.6 GB).
CACHE_MB_DEFAULT = 512


def cache_bytes_from_env() -> int:
    """The compiled-grammar cache's bound in bytes: VLLM_XGRAMMAR_CACHE_MB (vLLM's variable) MiB, else 512 MiB."""
    return int(os.environ.get("VLLM_XGRAMMAR_CACHE_MB", CACHE_MB_DEFAULT)) * 1024 * 1024

CacheKey = tuple[str, str, bool]
_SOURCE_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")
_COMMENT = re.compile(r"(#|//).*$")


class GrammarCompiler:
    """Compiles StructuredOutputsParams for one tokenizer and vocabulary width; thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 disable_any_whitespace: bool = False, cache_bytes: int | None = None) -> None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._setup(info, vocab_size, disable_any_whitespace, cache_bytes)

    @classmethod
    def from_tokenizer_info(cls, info: xgr.TokenizerInfo, vocab_size: int,
                            disable_any_whitespace: bool = False) -> GrammarCompiler:
        """A compiler over xgrammar's view of a vocabulary already read (a compile process's: compile_process.py)."""
        compiler = cls.__new__(cls)
        compiler._setup(info, vocab_size, disable_any_whitespace, None)
        return compiler

    def _setup(self, info: xgr.TokenizerInfo, vocab_size: int, disable_any_whitespace: bool,
               cache_bytes: int | None) -> None:
        self.tokenizer_info = info
        self.vocab_size = vocab_size
        # The server-wide --structured-outputs-config default; a request may still ask for compact JSON.
        self.disable_any_whitespace = disable_any_whitespace
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[CacheKey, xgr.CompiledGrammar] = OrderedDict()
        self.cache_bytes = cache_bytes_from_env() if cache_bytes is None else cache_bytes
        self.cached_bytes = 0  # the cached grammars' memory_size_bytes, together
        self._lock = threading.Lock()
        self.num_compiled = 0  # compilations done (cache misses), for tests and benchmarks

    @functools.cached_property
    def tokenizer_info_json(self) -> str:
        """xgrammar's view of the vocabulary, serialized (for a compile process: 1.6 MB for 49k tokens, 40 ms)."""
        return self.tokenizer_info.serialize_json()

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The compiled grammar for `params`, compiled here and now if it is not cached; an invalid schema,
        regex or grammar is an InvalidParamError."""
        cached = self.lookup(params.cache_key())
        if cached is not None:
            return cached
        return self.compile_prepared(params.cache_key(), self.prepare(params))

    def lookup(self, key: CacheKey) -> xgr.CompiledGrammar | None:
        """The cached grammar for a constraint's `cache_key()`, or None."""
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
            return compiled

    def prepare(self, params: StructuredOutputsParams) -> xgr.Grammar:
        """The constraint parsed into a grammar, not yet compiled against the vocabulary (milliseconds):
        InvalidParamError names what is wrong with an invalid one."""
        try:
            return self._grammar(params)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidParamError(f"invalid {params.kind} constraint for structured output: {_reason(exc)}",
                                    "structured_outputs") from None

    def compile_prepared(self, key: CacheKey, grammar: xgr.Grammar) -> xgr.CompiledGrammar:
        """Compile a prepared grammar against the vocabulary (the slow part; xgrammar releases the GIL
        meanwhile) and cache it under `key`."""
        compiled = self.build(key[0], grammar)
        self.store(key, compiled)
        return compiled

    def build(self, kind: str, grammar: xgr.Grammar) -> xgr.CompiledGrammar:
        """A prepared grammar (of constraint `kind`) compiled against the vocabulary, not cached; one that
        xgrammar refuses or that matches no text is an InvalidParamError."""
        try:
            compiled = self._compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidParamError(f"invalid {kind} constraint for structured output: {_reason(exc)}",
                                    "structured_outputs") from None
        if not _allows_a_first_token(compiled, self.vocab_size):
            # Masked sampling would have nothing to draw from: the request's fault, not the engine's.
            raise InvalidParamError(f"the {kind} constraint for structured output matches no text (it allows "
                                    "no first token)", "structured_outputs")
        return compiled

    def store(self, key: CacheKey, compiled: xgr.CompiledGrammar) -> None:
        """Cache a grammar compiled for `key` (by `build`, here or in a compile process)."""
        with self._lock:
            self.num_compiled += 1
            if key not in self._cache:  # (two threads may compile one key at once)
                self._cache[key] = compiled
                self.cached_bytes += compiled.memory_size_bytes
            # the least recently used first; the newest stays even alone past the bound (its requests hold it anyway)
            while len(self._cache) > 1 and (len(self._cache) > CACHE_SIZE or self.cached_bytes > self.cache_bytes):
                _, dropped = self._cache.popitem(last=False)
                self.cached_bytes -= dropped.memory_size_bytes

    def _grammar(self, p: StructuredOutputsParams) -> xgr.Grammar:
        kind = p.kind
        if kind in ("json", "json_object"):
            # json_object is any object (not any JSON value), as vLLM compiles it.
            schema = '{"type": "object"}' if kind == "json_object" else p.json_schema
            # A dict schema's text is its cache key's (keys sorted but for `properties`: the same schema), made
            # already: a second json.dumps would hold the GIL, and so the step loop, as long (~0.2 s at 7.5 MB).
            text = schema if isinstance(schema, str) else p.cache_key()[1]
            if p._checked:  # by the front end, on its dict (the schema came as text: not parsed again here)
                problem = p._unenforced
            else:
                unenforced = find_unenforced(json.loads(text) if isinstance(schema, str) else schema)
                problem = unenforced.message() if unenforced is not None else None
            if problem is not None:  # a grammar without it would let outputs break the schema
                raise ValueError(problem)
            compact = p.disable_any_whitespace or self.disable_any_whitespace
            return xgr.Grammar.from_json_schema(
                text, any_whitespace=not compact, separators=(",", ":") if compact else None)
        if kind == "regex":
            assert p.regex is not None
            return xgr.Grammar.from_regex(p.regex)
        if kind == "choice":
            assert p.choice is not None
            return xgr.Grammar.from_ebnf(choice_grammar(p.choice))
        if kind == "structural_tag":
            assert p.structural_tag is not None
            return xgr.Grammar.from_structural_tag(format_text(p.structural_tag))
        assert p.grammar is not None
        return xgr.Grammar.from_lark(p.grammar) if is_lark(p.grammar) else xgr.Grammar.from_ebnf(p.grammar)


def is_lark(grammar: str) -> bool:
    """Whether a `grammar` constraint is written in Lark (`start: "a" b`), not EBNF (`root ::= "a" b`): as vLLM
    tells them apart, a non-empty grammar none of whose lines defines a rule with `::=` outside a `#` or `//`
    comment. xgrammar parses Lark itself (its `start` rule is the root; `%import common.*` terminals included)."""
    lines = (_COMMENT.sub("", line) for line in grammar.splitlines())
    return bool(grammar.strip()) and not any("::=" in line for line in lines)


def _reason(exc: Exception) -> str:
    """Why xgrammar refused a constraint: its message, or what is known to make it refuse without one."""
    # xgrammar 0.2.9's JSON reader raises RuntimeError('') on an integer past a double's range (1e309) anywhere in a
    # schema, `default` and `enum` included; the 400 said nothing after its opening.
    # Its C++ checks prefix the time and their source line ("[07:06:06] /project/cpp/json_schema_converter.cc:1727: "):
    # the client gets the reason without them.
    return _SOURCE_PREFIX.sub("", str(exc)).strip() or (
        "xgrammar refused it without a reason (it does so for an integer past a double's range, about 1.8e308, "
        "anywhere in a JSON schema)")


def _allows_a_first_token(compiled: xgr.CompiledGrammar, vocab_size: int) -> bool:
    """Whether a fresh matcher of `compiled` allows any token (a grammar such as `root ::= root`, or a regex
    such as an empty character class, has no sentence: it allows none)."""
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask, 0)
    return bool((bitmask != 0).any())


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the given strings (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
