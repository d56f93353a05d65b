"""A collector on loopback for the telemetry tests: an HTTP server taking OTLP/HTTP protobuf
exports (``POST /v1/traces``), each decoded with opentelemetry-proto's
``ExportTraceServiceRequest`` into plain ``Span`` records a test can read."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

KINDS = {
    ProtoSpan.SPAN_KIND_SERVER: "server",
    ProtoSpan.SPAN_KIND_CLIENT: "client",
    ProtoSpan.SPAN_KIND_INTERNAL: "internal",
}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool
    resource: dict[str, Any]
    start_ns: int = 0
    end_ns: int = 0


@dataclass
class Collector:
    """``start()``, then ``url`` takes exports; ``spans`` holds every span received."""

    spans: list[Span] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.received(request, {k.lower(): v for k, v in self.headers.items()})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def received(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        self.headers.append(headers)
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Span(
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            error=span.status.code == span.status.STATUS_CODE_ERROR,
                            resource=resource,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )

    def wait_for(self, count: int, kind: str | None = None, timeout_s: float = 15.0) -> list[Span]:
        """At least ``count`` spans (of ``kind``) once they arrived; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [s for s in self.spans if kind is None or s.kind == kind]
            if len(found) >= count or time.monotonic() > deadline:
                assert len(found) >= count, f"{len(found)} {kind or ''} spans of {count} arrived: {self.spans}"
                return found
            time.sleep(0.05)

    def of_trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]
