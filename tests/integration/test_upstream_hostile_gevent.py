"""A hostile upstream under gevent, as a worker runs: a response head sent a byte at a
time, endless ``100 Continue`` lines, and a stream so fast that its reader (and the writer
relaying it) never waits. Each runs
in a child process with gevent's patches (the test process has none), against a raw-socket
server on loopback in the same process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

PRELUDE = """
from gevent import monkey; monkey.patch_all()
import socket, time, gevent
from ezat_compat.domain import Deployment
from ezat_compat.errors import UpstreamTimeoutError
from ezat_compat.upstream.client import UpstreamClient

def serve(script):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    def accept():
        while True:
            conn, _ = listener.accept()
            conn.recv(65536)
            gevent.spawn(script, conn)
    gevent.spawn(accept)
    port = listener.getsockname()[1]
    return Deployment(name="d1", base_url=f"http://127.0.0.1:{port}", upstream_model="m", api_key="k")

def drip(conn):  # the head a byte a second (each read waits less than the read timeout)
    for byte in b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n" * 100:
        conn.sendall(bytes([byte])); gevent.sleep(0.05)

def continues(conn):  # 100 Continue for ever: http.client skips them in a loop
    while True:
        conn.sendall(b"HTTP/1.1 100 Continue\\r\\n\\r\\n"); gevent.sleep(0.05)

client = UpstreamClient(connect_timeout_s=2, stream_idle_timeout_s=30)
"""

CASES = {
    "json-drip": """
d = serve(drip); t = time.monotonic()
try: client.complete(d, "/v1/messages", b"{}", timeout_s=1); raise SystemExit("answered")
except UpstreamTimeoutError: pass
assert time.monotonic() - t < 1.5, time.monotonic() - t
""",
    "json-continue": """
d = serve(continues); t = time.monotonic()
try: client.complete(d, "/v1/messages", b"{}", timeout_s=1); raise SystemExit("answered")
except UpstreamTimeoutError: pass
assert time.monotonic() - t < 1.5, time.monotonic() - t
""",
    "stream-drip": """
d = serve(drip); t = time.monotonic()
stream = client.open_stream(d, "/v1/messages", b"{}", first_event_timeout_s=1)
try: stream.first(); raise SystemExit("answered")
except UpstreamTimeoutError: pass
assert time.monotonic() - t < 1.6, time.monotonic() - t
assert stream.poll() == []  # given up: nothing reads it any more (it has no reader of its own)
""",
    "fast-stream-yields": """
EVENT = (b'event: content_block_delta\\ndata: {"type":"content_block_delta","index":0,'
         b'"delta":{"type":"text_delta","text":"x"}}\\n\\n')
def fast(conn):
    conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\nconnection: close\\r\\n\\r\\n")
    conn.sendall(EVENT * 300_000); conn.close()
d = serve(fast)
lags = []
def ticker():
    while True:
        t = time.monotonic(); gevent.sleep(0.01); lags.append(time.monotonic() - t - 0.01)
gevent.spawn(ticker); gevent.sleep(0.05)
stream = client.open_stream(d, "/v1/messages", b"{}", first_event_timeout_s=5)
count = 0
started = time.monotonic()
for event in stream.events():
    count += 1
took = time.monotonic() - started
gevent.sleep(0.03)  # the tick pending during the read reports its lag
stream.close()
assert count == 300_000, count
assert took > 0.3, took  # long enough that a loop never yielding would show
assert max(lags) < max(0.15, took / 4), (max(lags), took)  # a loop never yielding: lags ~ took
""",
    "fast-relay-yields": """
import json
from ezat_compat.api.sse import relay
from tests.support.pipeline import DIALECTS, END, START, FakeStream, events, gateway, request

class Reads(FakeStream):  # the events as the reader hands them on: 200 a read, all there at once
    at = 0
    def poll(self, wait_s=None):
        out = self.script[self.at : self.at + 200]
        self.at += len(out)
        self.ended = not out
        return out
    def first(self):
        self.at = 1
        return self.script[0]
text = {"type": "text_delta", "text": "x"}
delta = ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": text})
block = ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}})
script = events(START, block, *[delta] * 120_000, *END)
gw, upstream, ledger = gateway({"a": script})
upstream.open_stream = lambda deployment, *_, **__: Reads(deployment, script)
lags = []
def ticker():
    while True:
        t = time.monotonic(); gevent.sleep(0.01); lags.append(time.monotonic() - t - 0.01)
gevent.spawn(ticker); gevent.sleep(0.05)
# max_tokens room for 120,000 characters: a stream past what its max_tokens can hold is cut
body = {"model": "m", "max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}]}
session = gw.handle(DIALECTS["openai"], request("openai", stream=True, body=body))
started = time.monotonic()
out = b"".join(relay(session))
took = time.monotonic() - started
gevent.sleep(0.03)  # the tick pending during the relay reports its lag
assert out.count(b'"content":"x"') == 120_000
assert took > 0.2, took  # long enough that a writer never yielding would show
assert max(lags) < max(0.1, took / 4), (max(lags), took)  # a writer never yielding: lags ~ took
""",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_upstream_under_gevent(case: str) -> None:
    script = textwrap.dedent(PRELUDE) + textwrap.dedent(CASES[case])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


# Another greenlet's timer every 10 ms; ``lags`` holds how late each tick was (a stream's pings would be).
TICKER = """lags = []
def ticker():
    while True:
        t = time.monotonic(); gevent.sleep(0.01); lags.append(time.monotonic() - t - 0.01)
gevent.spawn(ticker); gevent.sleep(0.05)
"""


def _ticked(script: str, timeout_s: float) -> None:
    """Run ``script`` (its ``{TICKER}`` the ticker greenlet) in a process of its own; its
    assertions must hold."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script).replace("{TICKER}", TICKER)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


IMAGE_OFF_LOOP = """
from gevent import monkey; monkey.patch_all()
import io, time, gevent
from PIL import Image
from ezat_compat.translate.request import ImageSlot
from ezat_compat.upstream.image_fitting import Image as Held, check_all
from ezat_compat.upstream.imagefit import b64_length, probe

buffer = io.BytesIO()
Image.new("RGB", (6500, 6500), (10, 200, 30)).save(buffer, "PNG")  # ~42 megapixels, a small file
raw = buffer.getvalue()
images = [Held(raw=raw, probe=probe(raw), b64=b64_length(len(raw)), fresh=False)]
slots = [ImageSlot(path="messages[0].content[0].image_url.url", block={}, raw=raw)]
{TICKER}started = time.monotonic()
check_all(slots, images)  # decodes every pixel once
took = time.monotonic() - started
gevent.sleep(0.03)
assert images[0].decoded
assert took > 0.15, took  # long enough that a decode on the loop's own thread would show
assert max(lags) < max(0.1, took / 4), (max(lags), took)  # a writer never yielding: lags ~ took
"""


def test_an_image_decode_runs_off_the_event_loop() -> None:
    """A big image's decode (``check_all``) runs on one of the hub's real threads: another
    greenlet's timers keep their time meanwhile (a stream's pings would)."""
    _ticked(IMAGE_OFF_LOOP, timeout_s=60)


BIG_BODY_SHARES_THE_LOOP = """
from gevent import monkey; monkey.patch_all()
import json, time, gevent
from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.cooperative import tools
from ezat_compat.translate.request import openai_to_anthropic
from ezat_compat.translate.body_json import decode_body
from ezat_compat.wire.openai import load_chat_request

deployment = {"name": "d", "base_url": "http://h", "upstream_model": "x"}
spec = {"id": "anthropic/m", "aliases": ["m"], "price": {"input": 3, "output": 15}, "deployments": [deployment]}
model = Catalog(parse_config({"models": [spec]}).models).resolve("m")
turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(100_000)]
raw = json.dumps({"model": "m", "messages": [*turns, {"role": "user", "content": "end"}]}).encode()
{TICKER}started = time.monotonic()
request = load_chat_request(decode_body(raw, pause=tools().pause))
openai_to_anthropic(request, model, pause=tools().pause)
took = time.monotonic() - started
gevent.sleep(0.03)
assert took > 0.8, took  # seconds of work: without its pauses, one stall as long
# The longest stall is a share of the work, whatever the machine's load (CI: 0.54 s of 6 s):
# the one-piece steps (the JSON decode, a full collection of the grown heap) are ~1/10 of it.
assert max(lags) < took / 4, (max(lags), took)
"""


def test_a_body_of_100000_messages_shares_the_event_loop() -> None:
    """Parsing, validating and translating 100,000 tiny messages (~2 s of CPU) pause every few
    hundred messages: another greenlet's timers (a stream's pings) wait for a small share of the
    whole (~0.15 s of 1.5 s on an idle 2-core machine), never for all of it."""
    _ticked(BIG_BODY_SHARES_THE_LOOP, timeout_s=120)
