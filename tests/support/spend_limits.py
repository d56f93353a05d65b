"""For the spend limits' gateway tests: a gateway whose config file has more tables than the
harness writes (``[admin]``, ``[alerts]``…), and a webhook receiver on loopback."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.integration.harness import Gateway


@dataclass
class TabledGateway(Gateway):
    """``Gateway`` with ``tables`` (TOML text: ``[admin]``, ``[alerts]``…) after its models."""

    tables: str = ""

    def write_config(self) -> None:
        super().write_config()
        with self.config_path.open("a") as out:
            out.write("\n" + self.tables)


class HookReceiver:
    """An HTTP server on loopback that keeps every POST (its headers and body) and answers 200."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    receiver.received.append((dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/spend"

    def start(self) -> HookReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def bodies(self) -> list[tuple[dict[str, str], bytes]]:
        with self._lock:
            return list(self.received)
