"""The OpenAI-compatible HTTP server (`flotilla serve`, or `python -m flotilla.engine.server`)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Entry point of `flotilla serve`."""
    from flotilla.engine.server.cli import main as run

    return run(argv)
