"""One started stream: the upstream stream, its first event, the dialect's translator, and the
hooks that end it (settle, cooldowns, metrics) — what the pipeline hands the stream writer.

The writer (``api/sse.py``) reads the upstream's events with ``poll`` and calls exactly one
ending: ``feed`` until ``over`` (the reply ended, or the upstream sent an ``error`` event),
``ended`` (the upstream closed the body early), ``broke`` (the stream broke, or a bug while relaying);
``close`` always, last: a stream not over by then was left by the client and is billed for what
was produced, estimated (Chat Completions reference, "Streaming": usage is recorded before
``data: [DONE]``; a failure after the start ends with an error event and is not billed).
"""

from __future__ import annotations

import json
import logging
import math
from typing import TYPE_CHECKING, Protocol

from ezat_compat.dialects import EventTranslator, KeptThinking
from ezat_compat.domain import Usage
from ezat_compat.errors import GatewayError, UpstreamError, UpstreamStatusError
from ezat_compat.failures import STREAM_ENDED_EARLY
from ezat_compat.store.hotpath import Rider

if TYPE_CHECKING:
    from ezat_compat.server.telemetry import RequestTrace

log = logging.getLogger("ezat_compat")
# Messages API, "Streaming": the last event of a reply (its bill is recorded when it is fed).
LAST_EVENT = "message_stop"
CHARS_PER_TOKEN = 4
# A stream that produced more characters than its max_tokens could hold is cut there (an upstream
# that doesn't stop, or lies): no token of Claude's tokenizers is near this long, and the slack
# keeps a tiny max_tokens from cutting a reply that is within it.
MAX_CHARS_PER_TOKEN = 32
CHAR_CAP_SLACK = 1024
RELAY_FAILED = "The gateway failed while relaying the stream."
RELAY_STOPPED = "The gateway stopped while relaying the stream."


def estimated_usage(usage: Usage, produced_chars: int, max_tokens: int) -> Usage:
    """Usage of a stream the client closed early: output estimated from what was produced,
    never above the output limit (the reservation covers that much, no more)."""
    estimate = math.ceil(produced_chars / CHARS_PER_TOKEN)
    if max_tokens > 0:
        estimate = min(estimate, max_tokens)
    return Usage(
        input_tokens=usage.input_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        output_tokens=max(usage.output_tokens, estimate),
        reasoning_tokens=usage.reasoning_tokens,
    )


class Upstream(Protocol):
    """The open upstream stream (``upstream/client.UpstreamStream``)."""

    ended: bool  # the upstream ended the body

    def poll(self, wait_s: float | None = None) -> list[tuple[str, str]]: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


class StreamOwner(Protocol):
    """What the pipeline does when a stream ends (each called at most once, then ``closed``)."""

    def succeeded(self, usage: Usage, kept: KeptThinking | None, rider: Rider | None = None) -> None: ...

    def failed(self, failure: GatewayError) -> None: ...

    def left(self, usage: Usage) -> None: ...

    def closed(self) -> None: ...

    def failure(self, exc: UpstreamError) -> GatewayError: ...

    def connected(self) -> bool: ...  # is the client still there (a cheap peek, never blocks)?


class StreamSession:
    """A started stream. ``head`` is the translation of the first event (already read)."""

    __slots__ = (
        "_char_cap",
        "_closed",
        "_max_tokens",
        "_open_block",
        "_owner",
        "_trace",
        "_translator",
        "_upstream",
        "cut_by",
        "head",
        "keepalive_s",
        "over",
        "ping",
    )

    def __init__(
        self,
        *,
        upstream: Upstream,
        first: tuple[str, str],
        translator: EventTranslator,
        owner: StreamOwner,
        ping: bytes,
        keepalive_s: float,
        max_tokens: int,
        trace: RequestTrace | None = None,
    ) -> None:
        self._upstream = upstream
        self._trace = trace  # the request's spans (telemetry on): told of each event
        self._translator = translator
        self._owner = owner
        self._max_tokens = max_tokens
        self._char_cap = max_tokens * MAX_CHARS_PER_TOKEN + CHAR_CAP_SLACK if max_tokens > 0 else -1
        self._open_block: str | None = None  # the data of the content block started and not stopped
        self._closed = False
        self.ping = ping
        self.keepalive_s = keepalive_s
        self.over = False
        self.cut_by: GatewayError | None = None
        self.head = b""
        self.head = self.feed(*first)

    def poll(self, wait_s: float) -> list[tuple[str, str]]:
        """The upstream's next events, waiting at most ``wait_s``: none when it was silent
        that long or ended its body (``upstream_ended``); raises what the upstream raises."""
        return self._upstream.poll(wait_s)

    @property
    def upstream_ended(self) -> bool:
        return self._upstream.ended

    def feed(self, event: str, data: str) -> bytes:
        """The client's bytes for one upstream event; after the last one, the stream's ending."""
        translator = self._translator
        if self._trace is not None:
            self._trace.event(event, data)
        out = translator.feed(event, data)
        if translator.done:
            return out + self._succeed()
        if translator.error is not None:
            return out + self._fail(self._owner.failure(UpstreamStatusError.from_event(translator.error)))
        if event == "content_block_start":
            self._open_block = data
        elif event == "content_block_stop":
            self._open_block = None
        if 0 <= self._char_cap < translator.produced_chars():
            return out + self._overran()
        return out

    def _overran(self) -> bytes:
        """The upstream went on past what ``max_tokens`` allows: the reply is ended here as the
        API ends one at its limit (the open block stopped, ``stop_reason: "max_tokens"``), and
        billed at the cap (the pipeline counts the excess as an upstream fault)."""
        log.warning("an upstream stream went past its max_tokens (%d): cut there", self._max_tokens)
        out = []
        if self._open_block is not None:
            try:
                index = json.loads(self._open_block).get("index", 0)
            except (ValueError, AttributeError):
                index = 0
            out.append(
                self._translator.feed("content_block_stop", json.dumps({"type": "content_block_stop", "index": index}))
            )
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
            "usage": {"output_tokens": self._max_tokens + 1},  # past the cap: billed at it, counted as excess
        }
        out.append(self._translator.feed("message_delta", json.dumps(delta)))
        out.append(self.feed(LAST_EVENT, json.dumps({"type": LAST_EVENT})))
        return b"".join(out)

    def relay(self, event: str, data: str) -> bytes:
        """``feed``, where a failure to translate (a bug) ends the stream as broken."""
        try:
            return self.feed(event, data)
        except Exception as exc:
            return self.broke(exc)

    @staticmethod
    def bills(event: tuple[str, str]) -> bool:
        """Whether feeding ``event`` ends the reply and bills it."""
        return event[0] == LAST_EVENT

    def client_gone(self) -> bool:
        """The client closed its side (a peek, no write): before billing an ending that comes
        with bytes not yet written, so that a client that left is billed as having left."""
        return not self._owner.connected()

    def ended(self) -> bytes:
        """The upstream ended the body before the reply was complete."""
        return self._fail(GatewayError(STREAM_ENDED_EARLY))

    def broke(self, exc: BaseException) -> bytes:
        """The upstream stream broke, or relaying it failed (a bug: logged)."""
        if isinstance(exc, UpstreamError):
            return self._fail(self._owner.failure(exc))
        log.error("relaying a stream failed", exc_info=exc)
        return self._fail(GatewayError(RELAY_FAILED))

    def cut(self, failure: GatewayError) -> bytes:
        """The gateway ends the stream (shutting down): the failure's bytes, not billed."""
        return self._fail(failure)

    def abort(self, exc: BaseException) -> None:
        """The writer itself was stopped (the worker killed its greenlet, an exit): a gateway
        failure, not the client's close; nothing more can be written."""
        if not self.over:
            log.warning("a stream was stopped by the gateway: %s", type(exc).__name__)
            self._fail(GatewayError(RELAY_STOPPED))

    def _succeed(self) -> bytes:
        self.over = True
        self._upstream.close()
        translator = self._translator
        self._owner.succeeded(translator.usage, translator.kept(), translator.record())
        return translator.end()

    def _fail(self, failure: GatewayError) -> bytes:
        self.over = True
        self._upstream.close()
        self._owner.failed(failure)
        return self._translator.fail(failure)

    def request_cut(self, failure: GatewayError) -> None:
        """Ask the writer to end the stream with ``failure`` (from another greenlet): the
        upstream is interrupted, so a writer waiting on it wakes and sees the cut."""
        self.cut_by = failure
        self._upstream.interrupt()

    def close(self) -> None:
        """Always, last (idempotent): a stream that isn't over was left by the client."""
        if self._closed:
            return
        self._closed = True
        self._upstream.close()
        try:
            if not self.over:
                self.over = True
                translator = self._translator
                self._owner.left(estimated_usage(translator.usage, translator.produced_chars(), self._max_tokens))
        finally:
            self._owner.closed()
