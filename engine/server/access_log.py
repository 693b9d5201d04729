"""uvicorn's access log as `vllm serve` keeps it: a line per HTTP request (`INFO:     127.0.0.1:5555 - "POST
/v1/chat/completions HTTP/1.1" 200 OK`) on stdout, on by default; --disable-uvicorn-access-log turns it off and
--disable-access-log-for-endpoints /health,/metrics drops the lines of those paths."""

from __future__ import annotations

import copy
import logging
from typing import Any
from urllib.parse import urlsplit

from uvicorn.config import LOGGING_CONFIG

ACCESS_LOGGER = "uvicorn.access"


def excluded_paths(text: str | None) -> frozenset[str]:
    """The paths of --disable-access-log-for-endpoints: comma-separated, each stripped, empty ones dropped."""
    return frozenset(part.strip() for part in (text or "").split(",") if part.strip())


class PathFilter(logging.Filter):
    """Drops uvicorn access records whose path is one of `paths`. As vLLM's filter, a path matches exactly and
    without its query string: `/health?probe=1` is `/health`, `/health/` and `/healthz` are not."""

    def __init__(self, paths: frozenset[str]) -> None:
        super().__init__()
        self.paths = paths

    def filter(self, record: logging.LogRecord) -> bool:
        """False for an access record of an excluded path; True for everything else."""
        # uvicorn's access record: args = (client address, method, path with query, HTTP version, status).
        args = record.args
        if record.name != ACCESS_LOGGER or not isinstance(args, tuple) or len(args) < 3:
            return True
        return not (isinstance(args[2], str) and urlsplit(args[2]).path in self.paths)


def uvicorn_log_config(disable_for_endpoints: str | None) -> dict[str, Any]:
    """uvicorn's own logging config (its handlers and formats, the access lines on stdout), plus a PathFilter on the
    access handler when --disable-access-log-for-endpoints names paths."""
    config = copy.deepcopy(LOGGING_CONFIG)
    paths = excluded_paths(disable_for_endpoints)
    if paths:
        config["filters"] = {"excluded_paths": {"()": PathFilter, "paths": paths}}
        config["handlers"]["access"]["filters"] = ["excluded_paths"]
    return config
