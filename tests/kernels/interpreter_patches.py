"""Triton's interpreter patches `triton.language` once per launch, in the launch, and then again on every call of a
nested `@triton.jit` function inside it (`InterpretedFunction.__call__` -> `_patch_lang`), each time scanning the
language modules with `inspect.getmembers`. Inside a launch the modules are already patched, so the nested scans
change nothing: the builtins they would wrap are the launch's wrappers already (no longer builtins), and the rest
is set again to the same behaviour. They are a third of an interpreted decode launch's CPU time (cProfile of one
fp8 "h2" decode launch: 1.79 of 5.25 s in 249 `_patch_lang` calls for 8 programs).

`skip_nested_lang_patches()` makes a nested call skip the scan when the launch already patched every language
module the nested function sees; a nested function that sees another (e.g. `triton.language.core` by name) is
patched as before. The kernels run the same Python either way."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

_launches: list[frozenset[int] | None] = []  # per running launch: ids of the language modules its patch covers


class _NoPatch:
    """A nested call's patch scope when nothing was patched (the interpreter drops nested scopes unrestored)."""

    def restore(self) -> None:
        """Nothing to undo."""


_seen: dict[tuple[Callable[..., Any], int], frozenset[int]] = {}  # (function, size of its globals) -> module ids


def _language_ids(fn: Callable[..., Any], languages: tuple[Any, ...]) -> frozenset[int]:
    """The ids of the `triton.language` modules in `fn`'s globals (what `_patch_lang` patches); kept per function
    while its module's globals keep their size (the scan is a tenth of a launch's CPU time when redone per call)."""
    key = (fn, len(fn.__globals__))
    if key not in _seen:
        _seen[key] = frozenset(id(v) for v in fn.__globals__.values()
                               if inspect.ismodule(v) and any(v is lang for lang in languages))  # fmt: skip
    return _seen[key]


def skip_nested_lang_patches() -> bool:
    """Install the skip on Triton's interpreter; False (and nothing changed) where its internals are not the ones
    this was written against (Triton 3.x: `interpreter._patch_lang`, `GridExecutor`, `InterpretedFunction`)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "_skips_nested", False):
        return bool(original)
    if not (hasattr(interpreter, "GridExecutor") and hasattr(interpreter, "InterpretedFunction")):
        return False
    languages = (tl, tl.core)
    launch = interpreter.GridExecutor.__call__

    def run_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        _launches.append(None)  # the launch's own `_patch_lang` call fills it
        try:
            return launch(self, *args, **kwargs)
        finally:
            _launches.pop()

    def patch_lang(fn: Callable[..., Any]) -> Any:
        seen = _language_ids(fn, languages)
        covered = _launches[-1] if _launches else None
        if covered is not None and seen <= covered:
            return _NoPatch()
        scope = original(fn)
        if _launches:
            _launches[-1] = seen | (covered or frozenset())
        return scope

    patch_lang._skips_nested = True  # type: ignore[attr-defined]
    interpreter.GridExecutor.__call__ = run_launch
    interpreter._patch_lang = patch_lang
    return True
