"""Images for tests, and a real threaded HTTP server on loopback that serves them (with redirects,
statuses, slow and broken bodies): shared by the image downloader's tests and the gateway's."""

from __future__ import annotations

import base64
import http.server
import io
import random
import ssl
import struct
import threading
import zlib
from urllib.parse import parse_qs, urlsplit

from tests.conftest import free_port

MB = 1024 * 1024

# ---------------------------------------------------------------- tiny valid images, made here


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # 1x1, 8-bit greyscale
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b"")
    )


def _jpeg() -> bytes:
    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    one_code = bytes([1] + [0] * 15) + b"\x00"  # one Huffman code of length 1, for symbol 0
    return (
        b"\xff\xd8"
        + segment(0xDB, b"\x00" + bytes([1] * 64))  # quantisation table 0
        + segment(0xC0, struct.pack(">BHHB", 8, 1, 1, 1) + b"\x01\x11\x00")  # 1x1, one component
        + segment(0xC4, b"\x00" + one_code)  # DC table 0: size 0
        + segment(0xC4, b"\x10" + one_code)  # AC table 0: end of block
        + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
        + b"\x3f"  # DC size 0, EOB, padded with ones
        + b"\xff\xd9"
    )


def _gif(version: bytes = b"89a") -> bytes:
    header = b"GIF" + version + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    return header + b"," + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00" + b";"


WEBP = base64.b64decode("UklGRhoAAABXRUJQVlA4TA0AAAAvAAAAEAcQERGIiP4HAA==")  # 1x1 lossless
IMAGES: dict[str, tuple[bytes, str]] = {
    "png": (_png(), "image/png"),
    "jpeg": (_jpeg(), "image/jpeg"),
    "gif": (_gif(), "image/gif"),
    "gif87": (_gif(b"87a"), "image/gif"),
    "webp": (WEBP, "image/webp"),
}
PNG = IMAGES["png"][0]
HTML = b"<!doctype html><html><body>not an image</body></html>"
_NOISE: dict[tuple[int, int], bytes] = {}
_NOISE_LOCK = threading.Lock()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


PDF_FILE = b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"
PNG_RANDOM_IDAT = (
    b"\x89PNG\r\n\x1a\n"
    + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
    + _png_chunk(b"IDAT", random.Random(28).randbytes(3000))
    + _png_chunk(b"IEND", b"")
)


def noise_png(size: int, width: int = 1024) -> bytes:
    """A real PNG of seeded RGB noise (Pillow, stored uncompressed: noise wouldn't compress) of
    exactly ``size`` bytes: as many rows as fit, then a private ancillary chunk as padding."""
    key = (size, width)
    with _NOISE_LOCK:
        if key not in _NOISE:
            from PIL import Image  # only the tests that serve noise need it

            height = max(1, size // (width * 3 + 1) - 1)
            while True:
                rows = random.Random(size).randbytes(width * height * 3)
                out = io.BytesIO()
                Image.frombytes("RGB", (width, height), rows).save(out, "PNG", compress_level=0)
                png = out.getvalue()
                if len(png) + 12 <= size or height == 1:
                    break
                height -= max(1, (len(png) + 12 - size) // (width * 3) + 1)
            end = len(png) - 12  # before IEND
            pad = _png_chunk(b"ezPd", bytes(max(0, size - len(png) - 12)))
            _NOISE[key] = png[:end] + pad + png[end:]
        return _NOISE[key]


# ---------------------------------------------------------------- the server


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        self.query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.server.app.record(self.path, self.headers.get("Host", ""))
        segments = parts.path.strip("/").split("/")
        route = getattr(self, f"route_{segments[0].replace('-', '_')}", None)
        try:
            if route is None:
                self.reply(404, "text/plain", b"no such route")
            else:
                route(*segments[1:])
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.server.app.broken(self.query.get("tag", ""))
            self.close_connection = True

    def reply(self, status: int, content_type: str, body: bytes, *, length: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for start in range(0, len(body), 64 * 1024):
            self.wfile.write(body[start : start + 64 * 1024])

    def wait(self, seconds: float) -> None:
        self.server.app.stopping.wait(seconds)

    def route_image(self, kind: str) -> None:
        body, media_type = IMAGES[kind]
        self.reply(200, media_type, body)

    def route_random_idat(self) -> None:
        """A PNG whose header reads and whose IDAT is random bytes (CRCs right): it doesn't decode."""
        self.reply(200, "image/png", PNG_RANDOM_IDAT)

    def route_pdf(self) -> None:
        self.reply(200, "application/pdf", PDF_FILE)

    def route_png_as_text(self) -> None:
        self.reply(200, "text/plain", PNG)

    def route_html_as_png(self) -> None:
        self.reply(200, "image/png", HTML)

    def route_status(self, status: str) -> None:
        self.reply(int(status), "text/plain", b"status")

    def route_bytes(self, size: str, framing: str = "length") -> None:
        body = PNG[:8] + bytes(int(size) - 8)  # a PNG signature, then zeros
        self.reply(200, "image/png", body, length=framing == "length")

    def route_noise(self, size: str, framing: str = "length") -> None:
        """A decodable PNG of exactly ``size`` bytes (noise, so it is as large as it claims)."""
        self.reply(200, "image/png", noise_png(int(size)), length=framing == "length")

    def route_slow(self, seconds: str) -> None:
        self.wait(float(seconds))
        self.reply(200, "image/png", PNG)

    def route_slow_status(self, seconds: str, status: str) -> None:
        self.wait(float(seconds))
        self.reply(int(status), "text/plain", b"status")

    def route_silent(self) -> None:
        self.wait(30)

    def route_drip(self, interval: str) -> None:
        """Headers at once, then the body one byte per ``interval`` (Content-Length says 100)."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", "100")
        self.end_headers()
        body = PNG[:8] + bytes(92)
        for i in range(100):
            self.wfile.write(body[i : i + 1])
            self.wait(float(interval))

    def route_drip_forever(self, interval: str) -> None:
        """A body with no length that never ends, one byte per ``interval``."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        self.wfile.write(PNG[:8])
        while not self.server.app.stopping.is_set():
            self.wfile.write(b"\x00")
            self.wait(float(interval))

    def route_drip_headers(self, interval: str) -> None:
        """The status line, then a header that never ends, one byte per ``interval``."""
        self.wfile.write(b"HTTP/1.0 200 OK\r\nX-Drip: ")
        while not self.server.app.stopping.is_set():
            self.wfile.write(b"a")
            self.wait(float(interval))

    def route_redirect(self, hops: str) -> None:
        """A chain of ``hops`` redirects ending in a PNG; odd hops send a relative Location."""
        n = int(hops)
        if n == 0:
            self.reply(200, "image/png", PNG)
            return
        query = urlsplit(self.path).query
        location = f"/redirect/{n - 1}?{query}"
        if n % 2 == 0:
            location = f"http://127.0.0.1:{self.server.server_port}{location}"
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def route_slow_redirect(self, hops: str, seconds: str) -> None:
        self.wait(float(seconds))
        if int(hops) == 0:
            self.reply(200, "image/png", PNG)
            return
        self.send_response(307)
        self.send_header("Location", f"/slow-redirect/{int(hops) - 1}/{seconds}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def route_redirect_to(self) -> None:
        self.send_response(301)
        self.send_header("Location", self.query["url"])
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    app: ImageServer


class ImageServer:
    """A threaded HTTP server on a free 127.0.0.1 port that records every request it sees."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.port = free_port()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []
        self._broken: dict[str, threading.Event] = {}
        self.httpd = _Server(("127.0.0.1", self.port), _Handler)
        self.httpd.app = self
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        scheme = "https" if isinstance(self.httpd.socket, ssl.SSLSocket) else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def record(self, path: str, host: str) -> None:
        with self._lock:
            self.requests.append((path, host))

    def seen(self, needle: str) -> list[tuple[str, str]]:
        with self._lock:
            return [(path, host) for path, host in self.requests if needle in path]

    def broken_event(self, tag: str) -> threading.Event:
        with self._lock:
            return self._broken.setdefault(tag, threading.Event())

    def broken(self, tag: str) -> None:
        self.broken_event(tag).set()

    def close(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)
