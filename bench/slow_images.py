"""A slow image server for the benchmark: every image takes ``--delay`` seconds to answer.

    python bench/slow_images.py --bind 127.0.0.1:0 --delay 1

prints ``slow-images listening on http://HOST:PORT`` and serves until SIGTERM/SIGINT:

- ``GET /slow/<anything>.png``: waits ``--delay`` seconds, then a small valid PNG (the same
  bytes every time; the gateway judges the type by the bytes);
- ``GET /stats``: ``{"requests": N, "max_concurrent": M}`` — M shows whether a client fetched
  the images side by side;
- ``DELETE /stats``: zero both counters.

One thread per connection, so any number of downloads wait side by side. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import signal
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def tiny_png(width: int = 8, height: int = 8) -> bytes:
    """A valid RGB PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\x20\x60\xa0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


PNG = tiny_png()


class _State:
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.requests = 0
        self.active = 0
        self.max_concurrent = 0


class _Handler(BaseHTTPRequestHandler):
    server: Any
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        state: _State = self.server.state
        path = self.path.split("?", 1)[0]
        if path == "/stats":
            with state.lock:
                body = json.dumps({"requests": state.requests, "max_concurrent": state.max_concurrent}).encode()
            self._send(200, "application/json", body)
            return
        if not (path.startswith("/slow/") and path.endswith(".png")):
            self._send(404, "text/plain", b"not found")
            return
        with state.lock:
            state.requests += 1
            state.active += 1
            state.max_concurrent = max(state.max_concurrent, state.active)
        try:
            time.sleep(state.delay_s)
            self._send(200, "image/png", PNG)
        finally:
            with state.lock:
                state.active -= 1

    def do_DELETE(self) -> None:
        state: _State = self.server.state
        with state.lock:
            state.requests = state.max_concurrent = 0
        self._send(200, "application/json", b"{}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default (5) would drop a burst of 20 connects into SYN retries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a slow image server on loopback")
    parser.add_argument("--bind", default="127.0.0.1:0")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds before each image is sent")
    args = parser.parse_args(argv)
    host, _, port = args.bind.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("--bind must be a loopback address")
    server = _Server((host, int(port)), _Handler)
    server.state = _State(args.delay)  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"slow-images listening on http://{host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
