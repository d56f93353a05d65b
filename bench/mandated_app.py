"""The stack floor plus the least per-request work the product card requires: a yardstick.

    gunicorn -c bench/floor_gunicorn.py --pythonpath bench mandated_app:app

The floor (``floor_app.py``) relays bytes. Every request of the gateway must also do, on the
card's libraries, at least what this app does — and nothing of the gateway's own code runs here:

- **authenticate** the key: one indexed ``SELECT`` on a SQLite file in WAL mode (``sqlite3``);
- **validate** the body with a marshmallow schema (model, messages, max_tokens, stream);
- **reserve** before the upstream call, so a killed worker can't lose what it spent: one write
  transaction (the org's hold, the reservation row);
- call the upstream as the floor does (one ``requests.Session`` per worker, pooled adapter);
- **read the stream as events** with sseclient-py and write each one again from its parsed
  JSON (the least a translation does), or parse and re-encode the JSON answer;
- **bill** once it ends: one write transaction (the reservation taken, the ledger row, the
  org's balance);
- **count** it in prometheus_client's multiprocess mode (a counter and a latency histogram,
  the documented way under gunicorn; ``PROMETHEUS_MULTIPROC_DIR`` set by the caller);
- **log** one access line (JSON) to a file.

No rate limits, no translation tables, no failover, no group commit, no reader greenlet, no
cooldowns, no request ids in the answer. ``bench/mandated.py`` runs it beside the floor and the
gateway and prints the ratios. Environment: the floor's (``FLOOR_UPSTREAM``, ``FLOOR_BODIES``,
``FLOOR_API_KEY``) and ``MANDATED_DIR`` (its SQLite file and access log; created).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sseclient
from flask import Flask, Response, request
from floor_app import Upstream, floor_environment
from marshmallow import INCLUDE, Schema, fields, validate
from prometheus_client import Counter, Histogram

KEY = "ezat_sk_mandated"
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS orgs (id INTEGER PRIMARY KEY, balance_micros INTEGER NOT NULL,
    reserved_micros INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (id INTEGER PRIMARY KEY, org_id INTEGER NOT NULL REFERENCES orgs(id),
    key_hash TEXT NOT NULL UNIQUE, revoked_at INTEGER);
CREATE TABLE IF NOT EXISTS reservations (request_id TEXT PRIMARY KEY, org_id INTEGER NOT NULL,
    amount_micros INTEGER NOT NULL, created_at INTEGER NOT NULL, worker TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (id INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL, org_id INTEGER NOT NULL, model TEXT NOT NULL, input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL, status INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS ledger_org_created ON ledger (org_id, created_at);
"""

REQUESTS = Counter("mandated_requests", "Requests answered", ["route", "status"])
DURATION = Histogram("mandated_request_duration_seconds", "Request duration", ["route"])


class Message(Schema):
    class Meta:
        unknown = INCLUDE

    role = fields.String(required=True, validate=validate.OneOf(["system", "user", "assistant", "tool"]))
    content = fields.Raw(required=True)


class ChatBody(Schema):
    class Meta:
        unknown = INCLUDE

    model = fields.String(required=True)
    messages = fields.List(fields.Nested(Message), required=True, validate=validate.Length(min=1))
    max_tokens = fields.Integer(load_default=None, validate=validate.Range(min=1))
    stream = fields.Boolean(load_default=False)


class Store:
    """One sqlite3 connection per process (opened after the fork), as a worker keeps one."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "mandated.db"
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        conn = self.conn
        conn.executescript(SCHEMA_SQL)
        conn.execute("INSERT OR IGNORE INTO orgs (id, balance_micros, reserved_micros) VALUES (1, 10000000000000, 0)")
        conn.execute(
            "INSERT OR IGNORE INTO api_keys (id, org_id, key_hash) VALUES (1, 1, ?)",
            (hashlib.sha256(KEY.encode()).hexdigest(),),
        )

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def authenticate(self, secret: str) -> int | None:
        row = self.conn.execute(
            "SELECT org_id FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL",
            (hashlib.sha256(secret.encode()).hexdigest(),),
        ).fetchone()
        return None if row is None else int(row[0])

    def reserve(self, org: int, request_id: str, amount: int) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE orgs SET reserved_micros = reserved_micros + ? WHERE id = ?", (amount, org))
        conn.execute(
            "INSERT INTO reservations (request_id, org_id, amount_micros, created_at, worker) VALUES (?, ?, ?, ?, ?)",
            (request_id, org, amount, time.time_ns() // 1000, str(os.getpid())),
        )
        conn.execute("COMMIT")

    def settle(self, org: int, request_id: str, usage: dict[str, Any], status: int) -> None:
        conn = self.conn
        inp, out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
        cost = inp * 3 + out * 15
        conn.execute("BEGIN IMMEDIATE")
        held = conn.execute(
            "DELETE FROM reservations WHERE request_id = ? RETURNING amount_micros", (request_id,)
        ).fetchone()
        conn.execute(
            "INSERT INTO ledger (request_id, created_at, org_id, model, input_tokens, output_tokens, cost_micros, "
            "status) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (request_id, time.time_ns() // 1000, org, "claude-sonnet-5-5", inp, out, cost, status),
        )
        conn.execute(
            "UPDATE orgs SET balance_micros = balance_micros - ?, reserved_micros = reserved_micros - ? WHERE id = ?",
            (cost, held[0] if held else 0, org),
        )
        conn.execute("COMMIT")


class AccessLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None
        self._pid = 0

    def write(self, fields_: dict[str, Any]) -> None:
        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = self.path.open("a", encoding="utf-8"), os.getpid()
        self._file.write(json.dumps(fields_, separators=(",", ":")) + "\n")
        self._file.flush()


def create_app(upstream: Upstream, bodies: dict[bytes, bytes], folder: Path) -> Flask:
    app = Flask("mandated")
    store = Store(folder)
    access = AccessLog(folder / "access.log")
    schema = ChatBody()

    def finish(org: int, request_id: str, usage: dict[str, Any], status: int, started: float) -> None:
        store.settle(org, request_id, usage, status)
        took = time.monotonic() - started
        REQUESTS.labels("chat", str(status)).inc()
        DURATION.labels("chat").observe(took)
        access.write({"request_id": request_id, "route": "chat", "status": status, "duration_ms": took * 1000})

    @app.post("/openai/v1/chat/completions")
    def chat_completions() -> Response:
        started = time.monotonic()
        secret = request.headers.get("authorization", "").removeprefix("Bearer ")
        org = store.authenticate(secret)
        if org is None:
            return Response(b'{"error":"bad key"}', status=401, content_type="application/json")
        raw = request.get_data()
        body = schema.load(json.loads(raw))
        upstream_body = bodies.get(raw)
        if upstream_body is None:
            return Response(b'{"error":"unknown body"}', status=400, content_type="application/json")
        request_id = uuid.uuid4().hex
        store.reserve(org, request_id, 100_000)
        stream = body["stream"] is True
        response = upstream.post(upstream_body, stream=stream)
        if not stream:
            answer = json.loads(response.content)
            finish(org, request_id, answer.get("usage") or {}, response.status_code, started)
            return Response(json.dumps(answer).encode(), status=response.status_code, content_type="application/json")

        def events() -> Iterator[bytes]:
            usage: dict[str, Any] = {}
            try:
                for event in sseclient.SSEClient(response.iter_content(chunk_size=None)).events():
                    data = json.loads(event.data)
                    if event.event == "message_start":
                        usage.update(data["message"].get("usage") or {})
                    elif event.event == "message_delta":
                        usage.update(data.get("usage") or {})
                    yield f"event: {event.event}\ndata: {json.dumps(data)}\n\n".encode()
            finally:
                response.close()
                finish(org, request_id, usage, 200, started)

        return Response(events(), status=200, content_type="text/event-stream", headers={"cache-control": "no-cache"})

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b'{"status":"ok"}', content_type="application/json")

    return app


def _from_environment() -> Flask:
    folder = Path(os.environ.get("MANDATED_DIR", "."))
    folder.mkdir(parents=True, exist_ok=True)
    upstream, bodies = floor_environment()
    return create_app(upstream, bodies, folder)


app = _from_environment()
