"""The stream writers of both dialects: upstream events in, the client's bytes out.

``openai_stream`` translates Anthropic's events into ``chat.completion.chunk`` lines;
``anthropic_stream`` passes them through. Both send a keep-alive while nothing is written
(``: ping`` / ``event: ping``), record usage before the end (``data: [DONE]`` for OpenAI
clients), end a failure after the start with an error event (not billed), and in ``finally``
close the upstream and bill an early-closed stream for what was produced. Spec:
chat-completions.md "Streaming"; issue 4.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from ezat_compat.api.sse import PING, pump
from ezat_compat.domain import Usage
from ezat_compat.errors import (
    GatewayError,
    InvalidRequestError,
    OverloadedError,
    RateLimitError,
    UpstreamTimeoutError,
    openai_error_event,
)
from ezat_compat.pipeline import (
    STATUS_OK,
    Call,
    Gateway,
    estimated_usage,
    health_key,
    parse_event,
    upstream_to_gateway_error,
)
from ezat_compat.store.ledger import CLIENT_CLOSED
from ezat_compat.translate.response import merge_usage, usage_from_anthropic
from ezat_compat.translate.stream import DONE, StreamTranslator, encode_chunk, encode_error
from ezat_compat.upstream.client import UpstreamStream, UpstreamStreamError

ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'
OPENAI_PING = b": ping\n\n"
STREAM_BROKE = (
    b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
    b'"message":"The upstream stream broke off before the reply was complete."}}\n\n'
)
STREAM_ENDED_EARLY = (
    b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
    b'"message":"The upstream stream ended before the reply was complete."}}\n\n'
)


def stream_error_to_gateway_error(error: Mapping[str, Any]) -> GatewayError:
    """An Anthropic ``error`` event mid-stream -> the error sent as ``data: {"error": …}``."""
    kind = error.get("type")
    message = str(error.get("message") or "The upstream stream failed.")
    if kind == "overloaded_error":
        return OverloadedError(message, retry_after=1)
    if kind == "rate_limit_error":
        return RateLimitError(message, retry_after=1)
    if kind == "invalid_request_error":
        return InvalidRequestError(message)
    if kind == "timeout_error":
        return UpstreamTimeoutError(message)
    return GatewayError(message)


def openai_stream(
    gw: Gateway,
    call: Call,
    stream: UpstreamStream,
    events: Iterator[tuple[str, str]],
    first: tuple[str, str],
    translator: StreamTranslator,
    include_usage: bool,
) -> Iterator[bytes]:
    """chat.completion.chunk events, ``: ping`` while the upstream is silent, usage recorded
    before ``[DONE]``; an error after the start is sent as ``data: {"error": …}``."""
    gw.metrics.streams_open.inc()
    deployment = stream.deployment
    started = time.monotonic()
    items = _chain_first(first, pump(events, gw.keepalive_s))
    keepalive_s = gw.keepalive_s
    try:
        failure: GatewayError | None = None
        last_write = time.monotonic()
        try:
            for item in items:
                if item is PING:  # the upstream is silent
                    yield OPENAI_PING
                    last_write = time.monotonic()
                    continue
                event, data = item
                chunks = translator.feed(event, parse_event(data))
                if translator.error is not None:
                    failure = stream_error_to_gateway_error(translator.error)
                    break
                if chunks:
                    yield b"".join(encode_chunk(chunk) for chunk in chunks)
                    last_write = time.monotonic()
                elif time.monotonic() - last_write >= keepalive_s:  # the model is thinking
                    yield OPENAI_PING
                    last_write = time.monotonic()
                if translator.done:
                    break
            else:
                failure = GatewayError("The upstream stream ended before the reply was complete.")
        except UpstreamStreamError as exc:
            failure = upstream_to_gateway_error(exc)
        stream.close()
        if failure is not None:
            gw.stream_failed(call, deployment, failure)
            yield encode_error(openai_error_event(failure))
            yield DONE
            return
        gw.cooldowns.success(health_key(call.model, deployment))
        gw.metrics.upstream_latency.labels(deployment.name, "true").observe(time.monotonic() - started)
        gw.settle(call, translator.usage, STATUS_OK)
        if include_usage:
            yield encode_chunk(translator.usage_chunk())
        yield DONE
    finally:
        items.close()
        stream.close()
        gw.metrics.streams_open.dec()
        if not call.settled:  # the client went away: bill what was produced, estimated
            gw.settle(
                call,
                estimated_usage(
                    translator.usage, translator.produced_chars + translator.thinking_chars, call.max_tokens
                ),
                CLIENT_CLOSED,
                estimated=True,
            )


def anthropic_stream(
    gw: Gateway, call: Call, stream: UpstreamStream, events: Iterator[tuple[str, str]], first: tuple[str, str]
) -> Iterator[bytes]:
    """Anthropic's events passed through one by one (``event: ping`` while silent);
    usage read on the way for billing."""
    gw.metrics.streams_open.inc()
    deployment = stream.deployment
    meter = AnthropicStreamMeter()
    started = time.monotonic()
    items = _chain_first(first, pump(events, gw.keepalive_s))
    try:
        failed = False
        try:
            for item in items:
                if item is PING:
                    yield ANTHROPIC_PING
                    continue
                event, data = item
                meter.feed(event, data)
                yield b"event: " + event.encode() + b"\ndata: " + data.encode() + b"\n\n"
                if meter.error or meter.done:
                    break
            failed = not meter.done
            if failed and not meter.error:  # ended cleanly, but before message_stop
                yield STREAM_ENDED_EARLY
        except UpstreamStreamError:
            failed = True
            yield STREAM_BROKE
        stream.close()
        if failed:
            gw.stream_failed(call, deployment, GatewayError("stream failed"))
            return
        gw.cooldowns.success(health_key(call.model, deployment))
        gw.metrics.upstream_latency.labels(deployment.name, "true").observe(time.monotonic() - started)
        gw.settle(call, meter.usage, STATUS_OK)
    finally:
        items.close()
        stream.close()
        gw.metrics.streams_open.dec()
        if not call.settled:
            gw.settle(
                call, estimated_usage(meter.usage, meter.produced_chars, call.max_tokens), CLIENT_CLOSED, estimated=True
            )


def _chain_first(first: tuple[str, str], rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


class AnthropicStreamMeter:
    """Reads a native stream on the way through: usage, produced characters, end, error."""

    __slots__ = ("done", "error", "produced_chars", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        self.produced_chars = 0
        self.done = False
        self.error = False

    def feed(self, event: str, data: str) -> None:
        if event == "content_block_delta":
            delta = parse_event(data).get("delta") or {}
            for key in ("text", "partial_json", "thinking"):
                value = delta.get(key)
                if isinstance(value, str):
                    self.produced_chars += len(value)
        elif event == "message_start":
            message = parse_event(data).get("message") or {}
            self.usage = usage_from_anthropic(message.get("usage"))
        elif event == "message_delta":
            self.usage = merge_usage(self.usage, parse_event(data).get("usage"))
        elif event == "message_stop":
            self.done = True
        elif event == "error":
            self.error = True
