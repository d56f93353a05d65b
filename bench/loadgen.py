"""The benchmark's load generator: its own process, asyncio, HTTP/1.1 keep-alive on raw sockets.

    python bench/loadgen.py --url http://127.0.0.1:PORT/PATH --body-file BODY.json \
        [--header 'authorization: Bearer …'] --mode json|sse|idle \
        --concurrency N --duration S --max-requests N [--timeout S] [--expect TEXT]

``--concurrency`` connections each send the same POST again and again on one keep-alive
connection until ``--duration`` seconds have passed or ``--max-requests`` were sent (whichever
comes first; requests in flight then finish, each within ``--timeout``). Loopback only: the URL
must name 127.0.0.0/8, localhost or ::1.

Modes:

- ``json``: latency = request written -> whole response read.
- ``sse``: a stream. TTFB = request written -> first SSE event carrying ``data:``; latency =
  request written -> end of the body. ``--expect`` (``[DONE]``) must appear in the body.
- ``idle``: ``--concurrency`` streams opened at once, one request each, held open by an upstream
  that stalls. For each stream: the arrival time of every SSE event (pings are the events that
  start with ``:``); reported: gaps between consecutive events (the ping cadence) over the whole
  run and in the steady state (gaps that began once every stream was open), pings seen, and
  ``# all-open`` printed on its own line once every stream has its first event (the moment the
  caller measures the server's memory).

Output: progress lines starting with ``#``, then one line ``RESULT {json}`` (see ``Result``).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

READ_LIMIT = 1 << 20


def summary(values: list[float], scale: float = 1.0) -> dict[str, float | int]:
    """count, mean, p50, p90, p99, max, min of ``values`` × ``scale`` (nearest rank)."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, int(q * n + 0.999999) - 1))] * scale

    return {
        "count": n,
        "mean": sum(ordered) / n * scale,
        "min": ordered[0] * scale,
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": ordered[-1] * scale,
    }


@dataclass
class Target:
    host: str
    port: int
    request: bytes
    mode: str
    expect: bytes
    timeout_s: float


@dataclass
class Result:
    """What one run measured; ``as_json()`` is printed after ``RESULT ``."""

    mode: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    ttfbs: list[float] = field(default_factory=list)
    event_counts: list[int] = field(default_factory=list)  # sse, idle: SSE events (pings included) per stream
    ok: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    reconnects: int = 0
    elapsed_s: float = 0.0
    # idle mode
    opened: int = 0
    open_now: int = 0
    max_open: int = 0
    all_open_s: float | None = None
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (when the gap began, its length)
    stream_max_gaps: list[float] = field(default_factory=list)
    all_open_at: float | None = None
    pings: list[int] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text[:300])

    def as_json(self) -> dict[str, Any]:
        done = self.ok + self.errors
        out: dict[str, Any] = {
            "mode": self.mode,
            "concurrency": self.concurrency,
            "requests": done,
            "ok": self.ok,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "status_counts": {str(k): v for k, v in sorted(self.statuses.items())},
            "reconnects": self.reconnects,
            "elapsed_s": self.elapsed_s,
            "rps": self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0,
            "latency_ms": summary(self.latencies, 1000.0),
        }
        if self.mode in ("sse", "idle"):
            out["ttfb_ms"] = summary(self.ttfbs, 1000.0)
            out["events_per_stream"] = summary([float(n) for n in self.event_counts])
        if self.mode == "idle":
            steady = [g for began, g in self.gaps if self.all_open_at is not None and began >= self.all_open_at]
            out.update(
                {
                    "streams": self.concurrency,
                    "opened": self.opened,
                    "max_open": self.max_open,
                    "all_open_s": self.all_open_s,
                    "gap_s": summary([g for _, g in self.gaps]),
                    "steady_gap_s": summary(steady),
                    "stream_max_gap_s": summary(self.stream_max_gaps),
                    "pings": sum(self.pings),
                    "pings_min_per_stream": min(self.pings) if self.pings else 0,
                }
            )
        return out


class Closed(Exception):
    """The server closed a kept-alive connection before answering: reconnect and resend."""


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise Closed() from None
        raise
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_body(
    reader: asyncio.StreamReader, headers: dict[bytes, bytes], on_data: Callable[[bytes], None]
) -> bool:
    """Read the body, handing each piece to ``on_data``; returns whether the connection
    stays usable."""
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                break
            on_data((await reader.readexactly(size + 2))[:-2])
    elif b"content-length" in headers:
        length = int(headers[b"content-length"])
        on_data(await reader.readexactly(length) if length else b"")
    else:
        while chunk := await reader.read(65536):
            on_data(chunk)
        return False
    return headers.get(b"connection", b"").lower() != b"close"


class Events:
    """Splits an SSE body into events and timestamps them as they arrive."""

    __slots__ = ("buffer", "count", "expect", "first_data", "gaps", "last", "max_gap", "pings", "seen_expect")

    def __init__(self, expect: bytes, keep_gaps: bool) -> None:
        self.buffer = b""
        self.first_data: float | None = None
        self.last: float | None = None
        self.max_gap = 0.0
        self.pings = 0
        self.gaps: list[tuple[float, float]] | None = [] if keep_gaps else None
        self.expect = expect
        self.seen_expect = not expect
        self.count = 0

    def feed(self, data: bytes, now: float) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\n\n")
            if end < 0:
                return
            event, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            if not event.strip():
                continue
            self.count += 1
            if self.last is not None:
                gap = now - self.last
                self.max_gap = max(self.max_gap, gap)
                if self.gaps is not None:
                    self.gaps.append((self.last, gap))
            self.last = now
            if event.startswith(b":"):
                self.pings += 1
            elif self.first_data is None and b"data:" in event:
                self.first_data = now
            if not self.seen_expect and self.expect in event:
                self.seen_expect = True


class Connection:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = False

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.target.host, self.target.port, limit=READ_LIMIT)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.used = False

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def one_request(conn: Connection, result: Result, on_first_event: Callable[[], None] | None = None) -> None:
    """Send the request on ``conn`` (reconnecting once if a kept-alive connection was closed)
    and read the answer into ``result``."""
    target = conn.target
    for attempt in (0, 1):
        if conn.writer is None:
            await conn.open()
        assert conn.reader is not None and conn.writer is not None
        started = time.perf_counter()
        conn.writer.write(target.request)
        try:
            status, headers = await _read_head(conn.reader)
            break
        except Closed:
            was_used = conn.used
            conn.close()
            if attempt or not was_used:
                raise ConnectionError("the server closed the connection without answering") from None
            result.reconnects += 1
    conn.used = True
    result.statuses[status] += 1
    body = bytearray()
    events: Events | None = None
    if target.mode != "json" and status == 200:
        events = Events(target.expect, keep_gaps=target.mode == "idle")
        announced = False

        def on_data(data: bytes) -> None:
            nonlocal announced
            assert events is not None
            events.feed(data, time.perf_counter())
            if not announced and events.count and on_first_event is not None:
                announced = True
                on_first_event()
    else:

        def on_data(data: bytes) -> None:
            body.extend(data)

    keep = await _read_body(conn.reader, headers, on_data)
    finished = time.perf_counter()
    if not keep:
        conn.close()
    if status != 200:
        result.error(f"HTTP {status}: {bytes(body[:200])!r}")
        return
    if events is None:
        if target.expect and target.expect not in body:
            result.error(f"the answer lacks {target.expect!r}: {bytes(body[:200])!r}")
            return
    else:
        if not events.seen_expect:
            result.error(f"the stream ended without {target.expect!r}")
            return
        if events.first_data is None:
            result.error("the stream carried no data event")
            return
        result.ttfbs.append(events.first_data - started)
        result.event_counts.append(events.count)
        if target.mode == "idle":
            assert events.gaps is not None
            result.gaps.extend(events.gaps)
            result.stream_max_gaps.append(events.max_gap)
            result.pings.append(events.pings)
    result.ok += 1
    result.latencies.append(finished - started)


async def run_load(target: Target, concurrency: int, duration_s: float, max_requests: int) -> Result:
    """``json``/``sse``: ``concurrency`` keep-alive loops until the deadline or the count."""
    result = Result(mode=target.mode, concurrency=concurrency)
    issued = 0
    started = time.perf_counter()
    deadline = started + duration_s

    async def loop() -> None:
        nonlocal issued
        conn = Connection(target)
        try:
            while issued < max_requests and time.perf_counter() < deadline:
                issued += 1
                try:
                    await asyncio.wait_for(one_request(conn, result), target.timeout_s)
                except Exception as exc:  # any failure is one counted error, then a new connection
                    result.error(f"{type(exc).__name__}: {exc}")
                    conn.close()
        finally:
            conn.close()

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    result.elapsed_s = time.perf_counter() - started
    return result


async def run_idle(target: Target, streams: int) -> Result:
    """``idle``: ``streams`` streams at once, one request each."""
    result = Result(mode="idle", concurrency=streams)
    started = time.perf_counter()

    def opened() -> None:
        result.opened += 1
        result.open_now += 1
        result.max_open = max(result.max_open, result.open_now)
        if result.opened == streams:
            result.all_open_at = time.perf_counter()
            result.all_open_s = result.all_open_at - started
            print(f"# all-open {result.all_open_s:.3f}", flush=True)

    async def one() -> None:
        conn = Connection(target)
        got_first = False

        def first() -> None:
            nonlocal got_first
            got_first = True
            opened()

        try:
            await asyncio.wait_for(one_request(conn, result, first), target.timeout_s)
        except Exception as exc:
            result.error(f"{type(exc).__name__}: {exc}")
        finally:
            if got_first:
                result.open_now -= 1
            conn.close()

    await asyncio.gather(*(one() for _ in range(streams)))
    result.elapsed_s = time.perf_counter() - started
    return result


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_target(url: str, body: bytes, headers: list[str], mode: str, expect: str, timeout_s: float) -> Target:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "http" or not _loopback(host):
        raise SystemExit(f"loadgen: only http:// URLs on loopback are allowed, not {url!r}")
    port = parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "User-Agent: ezat-bench-loadgen",
        *headers,
    ]
    request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
    return Target(host=host, port=port, request=request, mode=mode, expect=expect.encode(), timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--header", action="append", default=[], help="an extra request header, 'name: value'")
    parser.add_argument("--mode", choices=("json", "sse", "idle"), default="json")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load (json, sse)")
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per request")
    parser.add_argument("--expect", default="", help="text the answer must contain")
    args = parser.parse_args(argv)
    if not 1 <= args.concurrency <= 5000:
        parser.error("--concurrency must be between 1 and 5000")
    if not 0 < args.duration <= 600:
        parser.error("--duration must be between 0 and 600 seconds")
    with open(args.body_file, "rb") as f:
        body = f.read()
    target = build_target(args.url, body, args.header, args.mode, args.expect, args.timeout)
    if args.mode == "idle":
        result = asyncio.run(run_idle(target, args.concurrency))
    else:
        result = asyncio.run(run_load(target, args.concurrency, args.duration, args.max_requests))
    print("RESULT " + json.dumps(result.as_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
