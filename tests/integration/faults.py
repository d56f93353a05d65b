"""Helpers of the fault tests: a TCP proxy to cut a database, stream clients, money invariants.

Loopback only: the proxy listens on 127.0.0.1 and forwards to a 127.0.0.1 target.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import requests
from sqlalchemy import Engine, create_engine, make_url, text


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; ``cut()`` closes the listener and every
    connection (new ones are refused), ``restore()`` listens on the same port again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in conns:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def pg_url(base: str, schema: str, port: int | None = None) -> str:
    """``base`` on ``schema`` (search_path), through 127.0.0.1:``port`` when given."""
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    return url.render_as_string(hide_password=False)


@contextmanager
def pg_schema(base: str) -> Iterator[str]:
    """A fresh schema on the PostgreSQL of ``base``, dropped at the end; yields its name."""
    schema = f"ezat_fault_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield schema
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


@dataclass
class Outcome:
    """What one client saw."""

    status: int = 0
    request_id: str = ""
    done: bool = False  # a stream that ended with data: [DONE] (or a complete JSON reply)
    error: str = ""
    body: bytes = b""


def chat(url: str, key: str, text_: str, *, stream: bool, max_tokens: int = 64, timeout_s: float = 60) -> Outcome:
    """One chat completion; never raises (a cut connection is an ``error``)."""
    out = Outcome()
    body: dict[str, Any] = {
        "model": "anthropic/claude-sonnet-5-5",
        "max_completion_tokens": max_tokens,
        "messages": [{"role": "user", "content": text_}],
        "stream": stream,
    }
    try:
        with requests.post(
            url + "/openai/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            stream=stream,
            timeout=timeout_s,
        ) as r:
            out.status = r.status_code
            out.request_id = r.headers.get("request-id", "")
            chunks = []
            for chunk in r.iter_content(chunk_size=None):
                chunks.append(chunk)
            out.body = b"".join(chunks)
            out.done = (b"data: [DONE]" in out.body) if stream else r.status_code == 200
    except requests.RequestException as exc:
        out.error = type(exc).__name__
    return out


@dataclass
class Money:
    balance: int
    reserved: int
    key_reserved: int
    reservations: int
    ledger_rows: int
    ledger_cost: int
    ledger_ids: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


def money(engine: Engine, org: str) -> Money:
    """The org's money as the database has it now."""
    with engine.connect() as conn:
        org_id, balance, reserved = conn.execute(
            text("SELECT id, balance_micros, reserved_micros FROM orgs WHERE name = :n"), {"n": org}
        ).one()
        key_reserved = conn.execute(
            text("SELECT COALESCE(SUM(reserved_micros), 0) FROM api_keys WHERE org_id = :o"), {"o": org_id}
        ).scalar_one()
        held = conn.execute(text("SELECT COUNT(*) FROM reservations WHERE org_id = :o"), {"o": org_id}).scalar_one()
        rows = conn.execute(
            text("SELECT request_id, cost_micros, status FROM ledger WHERE org_id = :o"), {"o": org_id}
        ).all()
    statuses: dict[int, int] = {}
    for row in rows:
        statuses[row[2]] = statuses.get(row[2], 0) + 1
    return Money(
        balance=int(balance),
        reserved=int(reserved),
        key_reserved=int(key_reserved),
        reservations=int(held),
        ledger_rows=len(rows),
        ledger_cost=sum(int(r[1]) for r in rows),
        ledger_ids=[r[0] for r in rows],
        statuses=statuses,
    )


def worker_holds(engine: Engine) -> dict[int, int]:
    """Open reservations per worker pid (the pid field of each reservation's worker tag)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT worker, COUNT(*) FROM reservations GROUP BY worker")).all()
    return {int(str(w).split(":")[3]): int(n) for w, n in rows if w}


def wait_for(predicate: Any, timeout_s: float, step_s: float = 0.1) -> float:
    """Poll ``predicate()`` until true; returns the seconds it took (raises on timeout)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(step_s)
    raise AssertionError(f"not true within {timeout_s} s")
