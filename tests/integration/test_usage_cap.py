"""An upstream that lies about its usage, or never stops, can't overdraw a balance.

A request is billed at most what it reserved from its own input and ``max_tokens``, whatever
the upstream reports: a JSON answer that claims a billion output tokens is billed at the cap, a
stream that goes on past what ``max_tokens`` can hold is cut there (``finish_reason: "length"``)
and billed at the cap; both are logged and counted in ``ezat_upstream_usage_excess_total``. One
ledger row each, no reservation held. One gevent worker, loopback only."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, text

from tests.integration.harness import Gateway, ModelSpec

pytestmark = pytest.mark.integration

MAX_TOKENS = 16
PRICE_OUT = Decimal(15) / 1_000_000  # the harness's model: $15 per million output tokens


def _message(output_tokens: int) -> dict[str, object]:
    return {
        "id": "msg_liar",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": "hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": output_tokens},
    }


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


class _Liar(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if not body.get("stream"):
            data = json.dumps(_message(1_000_000_000)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        start = _message(1)
        start["content"] = []
        start["stop_reason"] = None
        out = [_event("message_start", {"type": "message_start", "message": start})]
        out.append(
            _event(
                "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
            )
        )
        delta = _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a" * 100}},
        )
        try:
            self.wfile.write(b"".join(out))
            for _ in range(20_000):  # 2 MB of text for a reply of at most 16 tokens
                self.wfile.write(delta)
            self.wfile.write(_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
            self.wfile.write(
                _event(
                    "message_delta",
                    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 10**9}},
                )
            )
            self.wfile.write(_event("message_stop", {"type": "message_stop"}))
        except OSError:
            pass  # the gateway cut the stream and closed its side


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    root: Path = tmp_path_factory.mktemp("liar")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Liar)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    gateway = Gateway(root=root, models=[ModelSpec(deployments=[{"name": "liar", "base_url": url}])]).start()
    try:
        yield gateway, gateway.new_key("acme", balance="100")
    finally:
        gateway.stop()
        server.shutdown()
        server.server_close()


def _chat(gateway: Gateway, key: str, stream: bool) -> requests.Response:
    return requests.post(
        f"{gateway.url}/openai/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={
            "model": "claude-sonnet-5-5",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": MAX_TOKENS,
            "stream": stream,
        },
        timeout=30,
    )


def _held(gateway: Gateway) -> int:
    engine = create_engine(f"sqlite:///{(gateway.root / 'ezat.db').as_posix()}")
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COUNT(*) FROM reservations")).scalar() or 0)
    finally:
        engine.dispose()


def _excess(gateway: Gateway) -> float:
    for line in requests.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("ezat_upstream_usage_excess_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_upstream_reporting_more_than_max_tokens_is_billed_at_the_cap(
    rig: tuple[Gateway, str], stream: bool
) -> None:
    gateway, key = rig
    before_rows = len(gateway.usage())
    before_excess = _excess(gateway)
    resp = _chat(gateway, key, stream)
    assert resp.status_code == 200, resp.text[:300]
    if stream:
        chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
        text_out = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert len(text_out) < 10_000  # cut long before the upstream's 2 MB
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finish == ["length"]
        assert resp.text.rstrip().endswith("data: [DONE]")
    rows = gateway.usage()
    assert len(rows) == before_rows + 1
    row = rows[-1]
    assert row["output_tokens"] == MAX_TOKENS
    assert Decimal(row["cost_usd"]) <= Decimal("0.01")  # never the $15,000 the upstream claimed
    assert Decimal(row["cost_usd"]) >= MAX_TOKENS * PRICE_OUT
    assert _excess(gateway) == before_excess + 1
    assert _held(gateway) == 0
    assert "past request" in gateway.log_text()


def test_a_native_stream_past_max_tokens_ends_as_the_api_ends_one_at_its_limit(rig: tuple[Gateway, str]) -> None:
    gateway, key = rig
    before = len(gateway.usage())
    resp = requests.post(
        f"{gateway.url}/v1/messages",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json={
            "model": "claude-sonnet-5-5",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
        },
        timeout=30,
    )
    assert resp.status_code == 200
    events = [line[7:] for line in resp.text.splitlines() if line.startswith("event: ")]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert '"stop_reason": "max_tokens"' in resp.text
    assert len(resp.content) < 20_000
    rows = gateway.usage()
    assert len(rows) == before + 1 and rows[-1]["output_tokens"] == MAX_TOKENS
    assert _held(gateway) == 0


def test_a_responses_stream_past_max_output_tokens_is_incomplete(rig: tuple[Gateway, str]) -> None:
    gateway, key = rig
    before = len(gateway.usage())
    resp = requests.post(
        f"{gateway.url}/openai/v1/responses",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "claude-sonnet-5-5", "input": "hi", "max_output_tokens": MAX_TOKENS, "stream": True},
        timeout=30,
    )
    assert resp.status_code == 200
    last = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")][-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    rows = gateway.usage()
    assert len(rows) == before + 1 and rows[-1]["output_tokens"] == MAX_TOKENS
    assert _held(gateway) == 0
