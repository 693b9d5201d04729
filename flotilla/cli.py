"""The one `flotilla` command. Subcommands import their component lazily, so the operator's image
(no torch) can run `flotilla operator` and the engine's can run `flotilla serve`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib import import_module

# subcommand -> (module, function, one-line help); the function takes argv and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "generate": ("flotilla.engine.generate_cli", "main", "offline generation from the command line"),
    "serve": ("flotilla.engine.server", "main", "OpenAI-compatible server"),
    "operator": ("flotilla.operator.main", "main", "run the Kubernetes operator"),
}


def _usage() -> str:
    lines = ["usage: flotilla <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    lines += ["  version    print the version"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `flotilla <command> ...` to the subcommand's own `main(argv)`. Output to a pipe closed early
    (`flotilla serve --help | head`) ends quietly, as with any Unix tool, not with a BrokenPipeError traceback."""
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # here, where a closed pipe can still be caught, rather than at exit
    except BrokenPipeError:
        # Python flushes stdout once more at exit: point it at /dev/null so that flush has nowhere to fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _dispatch(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("version", "--version"):
        from flotilla import __version__

        print(__version__)
        return 0
    if command not in SUBCOMMANDS:
        print(f"flotilla: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[command]
    func: Callable[[list[str]], int] = getattr(import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
