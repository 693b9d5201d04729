"""uvicorn's h11 protocol with a deadline on each request head, against slow-loris clients.

uvicorn closes a connection that idles *between* requests (`timeout_keep_alive`), but one that has
sent part of a request line or headers, or nothing yet, is kept forever: every byte resets nothing,
because no timer runs. Here a timer runs whenever the server waits for a request head, from the
moment the connection opens or the previous response ends, and closes the connection if the head is
not complete within `--header-read-timeout`. A request whose head is complete is no longer timed
here (its body is bounded by `request_limits`, its response may stream for as long as it needs).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)


class HeadDeadlineProtocol(H11Protocol):
    """H11Protocol that closes connections whose request head does not arrive in `header_timeout` seconds."""

    header_timeout: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's own
        """Start timing the first request head."""
        super().connection_made(transport)
        self._track_head()

    def data_received(self, data: bytes) -> None:
        """Stop timing once a whole head has arrived."""
        super().data_received(data)
        self._track_head()

    def on_response_complete(self) -> None:
        """Start timing the next head (or the rest of a body the route never read)."""
        super().on_response_complete()
        self._track_head()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the timer with the connection."""
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _waiting_for_client(self) -> bool:
        # IDLE: no head yet. Our response done while theirs is not: a body we will not read.
        return self.conn.their_state is h11.IDLE or (
            self.conn.our_state in (h11.DONE, h11.MUST_CLOSE) and self.conn.their_state is h11.SEND_BODY
        )

    def _track_head(self) -> None:
        if self.transport.is_closing():
            self._cancel_head_timer()
        elif self._waiting_for_client():
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)
        else:
            self._cancel_head_timer()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing() and self._waiting_for_client():
            logger.debug("closing %s: no complete request head within %.1f s", self.client, self.header_timeout)
            self.transport.close()


def head_deadline_protocol(header_timeout: float) -> type[HeadDeadlineProtocol]:
    """The protocol class to give uvicorn.Config(http=...), with this deadline."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"header_timeout": header_timeout})
