"""Client dialects: what differs between the APIs the gateway serves, and nothing else.

A dialect parses a client body into the upstream request (validation and translation),
turns an upstream message into its response, makes its stream translator and renders its
errors. The pipeline (``pipeline.py``) runs every dialect in the same order; a new dialect is
one module here plus one route.

    Dialect.parse(body, headers, resolve)   -> Parsed       (400 / 403 / 404 raise)
    Dialect.reply(parsed, data, ids)        -> Answer (bytes, usage, thinking to keep)
    Dialect.translator(parsed, ids)         -> EventTranslator
    Dialect.client_error(exc, parsed, ...)  -> GatewayError  (the one table, in failures.py)
    Dialect.status_of(err) / render_error   -> the status and envelope this dialect's clients get
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ezat_compat import jsonfast
from ezat_compat.domain import Model, Usage
from ezat_compat.errors import GatewayError, InvalidRequestError, UpstreamError, render_openai
from ezat_compat.jsonfast import encode_json
from ezat_compat.translate.request import ImageSlot
from ezat_compat.translate.thinking import ThinkingCollector
from ezat_compat.wire.loading import RequestValidationError
from ezat_compat.wire.paths import format_error

if TYPE_CHECKING:
    from ezat_compat.store.hotpath import Rider

MESSAGES_PATH = "/v1/messages"


class Headers(Protocol):
    """The request's headers, looked up case-insensitively (werkzeug's, or a dict in tests)."""

    def get(self, key: str, /) -> str | None: ...


Resolve = Callable[[Any], Model]  # the client's model name -> its model (404 / 403 raise)


def invalid_request(exc: RequestValidationError) -> InvalidRequestError:
    """A body its schema refused, as the 400 every dialect answers: ``path: message``, the
    path as ``param``."""
    return InvalidRequestError(format_error(exc.path, exc.message), param=exc.path or None)


def model_then_body(
    body: Any, resolve: Callable[[Any], Model], load: Callable[[Any], dict[str, Any]], max_name: int
) -> tuple[Model, dict[str, Any]]:
    """An OpenAI body's model resolved first (404 / 403 before the rest of the body is judged:
    Chat Completions reference, "Ignored and refused fields"), then the body loaded by its
    schema (a 400 naming the part); a model name the schema refuses is resolved after it."""
    name = body.get("model") if isinstance(body, dict) else None
    model = resolve(name) if isinstance(name, str) and 0 < len(name) <= max_name else None
    try:
        loaded = load(body)
    except RequestValidationError as exc:
        raise invalid_request(exc) from None
    return (model if model is not None else resolve(loaded["model"])), loaded


def openai_error_response(err: GatewayError) -> tuple[int, bytes, dict[str, str]]:
    """``err`` in OpenAI's envelope, as the response's status, body and headers (both OpenAI
    dialects' ``render_error``)."""
    status, body, headers = render_openai(err)
    return status, encode_json(body), headers


def event_data(data: str) -> Mapping[str, Any]:
    """An upstream stream event's ``data`` as a JSON object (``{}`` for any other JSON value);
    ``GatewayError`` when it isn't JSON. Anthropic Messages reference, "Streaming": every
    event's data is one JSON object."""
    try:
        parsed = jsonfast.loads(data)
    except ValueError:
        raise GatewayError("The upstream sent an event that is not JSON.") from None
    return parsed if isinstance(parsed, dict) else {}


NOT_JSON = "The upstream provider sent a reply that is not JSON."


def upstream_message(data: bytes) -> dict[str, Any]:
    """The upstream's JSON answer as an object; a reply that is not one is a 500 that says so."""
    try:
        message = json.loads(data)
    except ValueError:
        raise GatewayError(NOT_JSON) from None
    if not isinstance(message, dict):
        raise GatewayError(NOT_JSON)
    return message


@dataclass(slots=True)
class Parsed:
    """A client request as the pipeline runs it: the upstream body and what routing, admission
    and billing need. ``context`` is the dialect's own (its translation), for ``reply``,
    ``translator`` and ``client_error``."""

    model: Model
    model_name: str  # as the client sent it
    body: dict[str, Any]  # the upstream body, without "model" (and "stream" for streams)
    stream: bool
    max_tokens: int
    session: str | None = None  # routing affinity
    path: str = MESSAGES_PATH
    stream_flag: bool | None = False  # "stream" put in front of a non-streaming body (None: as sent)
    headers: Mapping[str, str] | None = None  # forwarded to the upstream
    image_slots: list[ImageSlot] = field(default_factory=list)
    billed: bool = True  # False: no reservation and no ledger row (count_tokens)
    thinking_ids: list[str] = field(default_factory=list)  # tool calls whose kept thinking to look up
    context: Any = None
    # A step that needs the organisation (the Responses dialect loads a stored conversation and
    # opens sealed reasoning): run as ``prepare(parsed, org_id)`` after parsing, before the kept
    # thinking is looked up. Given ``parsed`` rather than holding it: a step bound to it would make
    # a reference cycle, and every object of the request would wait for the cyclic collector.
    prepare: Callable[[Parsed, int], None] | None = None


# (client tool call ids, the thinking blocks that preceded those calls, as received)
KeptThinking = tuple[list[str], list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Answer:
    """A dialect's JSON response: the bytes, the usage to bill, the thinking to keep."""

    body: bytes
    usage: Usage | None
    kept: KeptThinking | None = None
    record: Rider | None = None  # written with the ledger row (a stored response)


@dataclass(frozen=True, slots=True)
class ReplyIds:
    """What a dialect's response names: the gateway's request id and the creation time."""

    request_id: str
    created: int


class StreamState(Protocol):
    """What every stream translator tells of its stream: the usage so far, whether the reply
    ended normally (``done``), and the upstream's ``error`` event (its error object) if one came."""

    @property
    def usage(self) -> Usage: ...

    @property
    def done(self) -> bool: ...

    @property
    def error(self) -> Mapping[str, Any] | None: ...


class EventTranslator(StreamState, Protocol):
    """A dialect's stream translator: upstream events in, the client's bytes out.

    ``feed`` gets every upstream event (type and raw data) and returns the bytes to send
    (possibly none). ``done``: the reply ended normally; ``error``: the upstream sent an
    ``error`` event (its error object). ``end()`` is what follows a success once the usage is
    recorded; ``fail(err)`` what tells the client of a failure after the start.
    """

    def feed(self, event: str, data: str) -> bytes: ...

    def produced_chars(self) -> int: ...

    def end(self) -> bytes: ...

    def kept(self) -> KeptThinking | None: ...

    def record(self) -> Rider | None:
        """The dialect's record of a finished reply, written with its ledger row (once the reply
        ended, before ``end``): a stored response; None for most."""

    def fail(self, err: GatewayError) -> bytes: ...


class UpstreamEvents(StreamState, Protocol):
    """What a pure stream translator of ``translate/`` offers (``StreamTranslator``,
    ``ResponseEvents``): its state and one step per upstream event."""

    def feed(self, event: str, data: Mapping[str, Any]) -> Sequence[Any]: ...


S = TypeVar("S", bound=UpstreamEvents)


class TranslatingStream(Generic[S]):
    """The part of a translating dialect's ``EventTranslator`` that doesn't depend on the
    dialect: the state comes from the pure translator ``source``; each upstream event is parsed
    once and, with thinking requested, also goes to the ``thinking`` collector (the blocks
    before tool calls are kept for the client's next round). Subclasses encode what
    ``translate`` returns and say how the stream ends."""

    __slots__ = ("source", "thinking")

    def __init__(self, source: S, thinking: ThinkingCollector | None) -> None:
        self.source = source
        self.thinking = thinking

    @property
    def usage(self) -> Usage:
        return self.source.usage

    @property
    def done(self) -> bool:
        return self.source.done

    @property
    def error(self) -> Mapping[str, Any] | None:
        return self.source.error

    def translate(self, event: str, data: str) -> Sequence[Any]:
        """One upstream event: what the pure translator makes of it."""
        parsed = event_data(data)
        if self.thinking is not None:
            self.thinking.feed(event, parsed)
        return self.source.feed(event, parsed)

    def kept(self) -> KeptThinking | None:
        return self.thinking.result() if self.thinking is not None else None

    def record(self) -> Rider | None:
        return None


class Dialect(Protocol):
    endpoint: str  # the ledger's and the metrics' name of the endpoint
    ping: bytes  # the keep-alive this dialect's streams send while nothing else is written

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed: ...

    def restore_thinking(self, parsed: Parsed, found: Mapping[str, list[dict[str, Any]]]) -> None: ...

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer: ...

    def translator(self, parsed: Parsed, ids: ReplyIds) -> EventTranslator: ...

    def client_error(
        self, exc: UpstreamError, parsed: Parsed | None, *, timeout_s: float, streaming: bool
    ) -> GatewayError: ...

    def status_of(self, err: GatewayError) -> int: ...

    def render_error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]: ...

    def body_path(self, parts: Sequence[str | int]) -> str: ...
