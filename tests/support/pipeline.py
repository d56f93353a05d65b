"""The pipeline with fakes around it (no HTTP, no database), for the tests that drive it: a
``gateway`` over a scripted upstream, a ledger, limits, accounts and a thinking stash held in
memory; the dialects; Anthropic events and answers to script the upstream with."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.cooldowns import LocalCooldowns, Policy
from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.dialects.openai_chat import OpenAIChat
from ezat_compat.dialects.openai_responses import OpenAIResponses, ResponsesServices
from ezat_compat.domain import Config, ResponsesSettings
from ezat_compat.limits import TokenHold
from ezat_compat.pipeline import ClientRequest, Gateway
from ezat_compat.sealing import Sealer
from ezat_compat.server.metrics import Metrics
from ezat_compat.store.accounts import AuthContext
from ezat_compat.upstream.providers import make_provider

AUTH = AuthContext(
    key_id=1,
    key_public_id="key_1",
    org_id=1,
    org_name="acme",
    model_patterns=(),
    spend_limit_micros=None,
    rpm=None,
    tpm=None,
)
CONFIG = parse_config(
    {
        "gateway": {"keepalive_s": 60},
        "models": [
            {
                "id": "anthropic/m",
                "aliases": ["m"],
                "price": {"input": 3, "output": 15},
                "deployments": [
                    {"name": "a", "base_url": "http://a", "upstream_model": "ma"},
                    {"name": "b", "base_url": "http://b", "upstream_model": "mb"},
                    {"name": "c", "base_url": "http://c", "upstream_model": "mc", "priority": 1},
                ],
            }
        ],
    },
    environ={"ANTHROPIC_API_KEY": "sk-up"},
)
MODEL = CONFIG.models[0]


class FakeUpstream:
    """Answers per deployment from a script: a bytes body, a list of events, or an exception."""

    def __init__(self, script: Mapping[str, Any]) -> None:
        self.script = dict(script)
        self.calls: list[tuple[str, bytes]] = []

    def shape(
        self,
        deployment: Any,
        body: bytes,
        *,
        source: Any = None,
        stream: bool | None = False,
        headers: Any = None,
        path: str = "/v1/messages",
    ) -> tuple[bytes, Any]:
        return make_provider(deployment).shape(body, source, stream, headers, path)

    def complete(
        self, deployment: Any, path: str, body: bytes, *, timeout_s: float, headers: Any = None, trace: Any = None
    ) -> tuple[bytes, dict[str, str]]:
        self.calls.append((deployment.name, body))
        answer = self.script[deployment.name]
        if isinstance(answer, Exception):
            raise answer
        return answer, {}

    def open_stream(
        self,
        deployment: Any,
        path: str,
        body: bytes,
        *,
        headers: Any = None,
        first_event_timeout_s: Any = None,
        trace: Any = None,
    ) -> FakeStream:
        self.calls.append((deployment.name, body))
        answer = self.script[deployment.name]
        if isinstance(answer, Exception):
            raise answer
        return FakeStream(deployment, answer)


# In a script: the upstream goes silent here until the stream is closed (a client can leave
# mid-stream: the writer writes what came before it together, then waits).
GATE: Any = ("gate", "")


class FakeStream:
    """The upstream stream's ``poll`` over a script: each poll gives the events up to the next
    exception or ``GATE``; an exception is raised by the poll after; at a ``GATE`` polls are
    silent until the stream is closed or interrupted, then the body ends."""

    def __init__(self, deployment: Any, events: list[Any], headers: dict[str, str] | None = None) -> None:
        self.deployment = deployment
        self.headers = headers or {}  # the response head's fields
        self.script = list(events)
        self.closed = False
        self.ended = False
        self._released = threading.Event()
        self.exhausted = threading.Event()  # the script was read to its end

    def poll(self, wait_s: float | None = None) -> list[tuple[str, str]]:
        script = self.script
        out: list[tuple[str, str]] = []
        while script and not isinstance(script[0], BaseException) and script[0] is not GATE:
            out.append(script.pop(0))
        if out:
            return out
        if not script:
            self.ended = True
            self.exhausted.set()
            return []
        if isinstance(script[0], BaseException):
            self.exhausted.set()
            raise script.pop(0)
        if self._released.wait(10 if wait_s is None else max(wait_s, 0)):  # a GATE
            script.clear()
        return []

    def first(self) -> tuple[str, str] | None:
        events = self.poll()
        if not events:
            return None
        self.script[:0] = events[1:]
        return events[0]

    def interrupt(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.closed = True
        self._released.set()


class FakeLedger:
    """Holds reservations like the real ledger: ``settle`` writes the row and releases the hold."""

    def __init__(self) -> None:
        self.reserved: dict[str, int] = {}
        self.made: dict[str, int] = {}  # every reservation made, as made
        self.rows: list[tuple[str, Any]] = []
        self.riders: list[Any] = []  # what rode with each settlement (None: nothing)

    def check_funds(self, ctx: AuthContext, amount: int) -> None:
        pass

    def reserve(self, ctx: AuthContext, request_id: str, amount: int, **_request: str) -> None:
        self.reserved[request_id] = amount
        self.made[request_id] = amount

    def maintain(self) -> None:
        pass

    def settle_durably(self, request_id: str, entry: Any, rider: Any = None) -> bool:
        self.riders.append(rider)
        return self.settle(request_id, entry)

    def settle(self, request_id: str, entry: Any) -> bool:
        if any(rid == request_id for rid, _ in self.rows):
            return False
        self.reserved.pop(request_id, None)
        self.rows.append((request_id, entry))
        return True


class FakeLimits:
    def __init__(self) -> None:
        self.tokens = 0

    def admit(self, ctx: AuthContext, tokens: int = 0, *, counted: bool = False) -> TokenHold | None:
        return TokenHold("k", tokens) if tokens else None

    def count_request(self, ctx: AuthContext) -> None:
        pass

    def settle_tokens(self, hold: TokenHold | None, used: int) -> None:
        self.tokens += used


class FakeAccounts:
    def authenticate(self, secret: str, now: Any) -> AuthContext:
        return AUTH


class FakeImages:
    def fetch_all(self, urls: list[str]) -> list[Any]:
        raise AssertionError("no image URLs in these requests")


class FakeStash:
    """The thinking stash in a dict: (org, client tool id) -> blocks."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, str], list[dict[str, Any]]] = {}

    def put(self, org_id: int, tool_ids: Any, blocks: list[dict[str, Any]], now: float) -> None:
        for tool_id in tool_ids:
            self.kept[(org_id, tool_id)] = blocks

    def get(self, org_id: int, tool_ids: Any, now: float) -> dict[str, list[dict[str, Any]]]:
        return {i: self.kept[(org_id, i)] for i in tool_ids if (org_id, i) in self.kept}


def gateway(script: Mapping[str, Any], config: Config = CONFIG) -> tuple[Gateway, FakeUpstream, FakeLedger]:
    """The pipeline for ``config`` over fakes, each deployment answering from ``script`` (by its
    name: a body, a list of events, or an exception); with its upstream and its ledger."""
    upstream, ledger = FakeUpstream(script), FakeLedger()
    gw = Gateway(
        config,
        catalog=Catalog(config.models),
        accounts=FakeAccounts(),  # type: ignore[arg-type]
        ledger=ledger,  # type: ignore[arg-type]
        limits=FakeLimits(),  # type: ignore[arg-type]
        cooldowns=LocalCooldowns(Policy.make(failures=1, cooldown_s=30, max_cooldown_s=300)),
        upstream=upstream,  # type: ignore[arg-type]
        images=FakeImages(),  # type: ignore[arg-type]
        metrics=Metrics(),
        thinking=FakeStash(),
        rand=lambda: 0.0,
    )
    return gw, upstream, ledger


MESSAGE = json.dumps(
    {
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 4},
    }
).encode()


def events(*items: tuple[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """Anthropic stream events as the upstream stream gives them: (name, JSON data)."""
    return [(name, json.dumps(data)) for name, data in items]


START = ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}})
TEXT = [
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello there, friend"}},
    ),
]
END = [
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
    ("message_stop", {"type": "message_stop"}),
]


OPENAI = OpenAIChat()
ANTHROPIC = AnthropicMessages()
DIALECTS = {"openai": OPENAI, "anthropic": ANTHROPIC}


def request(dialect: str, *, stream: bool, body: dict[str, Any] | None = None, rid: str = "r1") -> ClientRequest:
    """A client request of ``body`` (by default one user message to the model ``m``), streamed or not."""
    payload = body or {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        payload = {**payload, "stream": True}
    raw = json.dumps(payload).encode()
    return ClientRequest(request_id=rid, api_key="k", headers={}, read_body=lambda: raw)


THINKING = {"type": "thinking", "thinking": "Let me look it up.", "signature": "c2lnbmVk"}
TOOL_REPLY = json.dumps(
    {
        "content": [THINKING, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 4},
    }
).encode()


def _start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _delta(index: int, **delta: str) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _stop(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


TOOL_STREAM = events(
    START,
    _start(0, {"type": "thinking", "thinking": ""}),
    _delta(0, type="thinking_delta", thinking="Let me look it up."),
    _delta(0, type="signature_delta", signature="c2lnbmVk"),
    _stop(0),
    _start(1, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
    _delta(1, type="input_json_delta", partial_json='{"q":"x"}'),
    _stop(1),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
    ("message_stop", {"type": "message_stop"}),
)


# ---------------------------------------------------------------- the Responses dialect

SEALER = Sealer(bytes(range(32)))
RESPONSES = OpenAIResponses(ResponsesServices(ResponsesSettings(store=False), None, SEALER, lambda: 1000.0))
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


def responses_request(body: dict[str, Any], rid: str = "r1") -> ClientRequest:
    """A Responses request for the model ``m`` with ``body``'s fields."""
    raw = json.dumps({"model": "m", **body}).encode()
    return ClientRequest(request_id=rid, api_key="k", headers={}, read_body=lambda: raw)
