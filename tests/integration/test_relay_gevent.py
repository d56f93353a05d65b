"""The stream read in place under gevent, as a worker runs it: one greenlet per stream (the
request's own), ``poll`` returning by its bound while the upstream is silent with another
greenlet's timers on time, ``interrupt`` from another greenlet waking it, and a head that
drips given up at the deadline with nothing left reading. Each case runs in a child process
with gevent's patches (the test process has none), against a raw-socket upstream in the same
process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

PRELUDE = """
from gevent import monkey; monkey.patch_all()
import gc, socket, time, gevent
from ezat_compat.domain import Deployment
from ezat_compat.errors import UpstreamTimeoutError
from ezat_compat.upstream.client import UpstreamClient

HEAD = b"HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\ntransfer-encoding: chunked\\r\\n\\r\\n"
START = b'event: message_start\\ndata: {"type":"message_start"}\\n\\n'
STOP = b'event: message_stop\\ndata: {"type":"message_stop"}\\n\\n'

def chunk(data):
    return b"%x\\r\\n%s\\r\\n" % (len(data), data)

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

def alive():  # the greenlets spawned (the hub's, the resolver's threads' and the main one aside)
    return sum(1 for g in gc.get_objects() if isinstance(g, gevent.Greenlet) and not g.dead)

go = gevent.event.Event()
def silent_after_start(conn):
    conn.sendall(HEAD + chunk(START))
    go.wait(10)
    conn.sendall(chunk(STOP) + b"0\\r\\n\\r\\n")

lags = []
def ticker():
    while True:
        t = time.monotonic(); gevent.sleep(0.01); lags.append(time.monotonic() - t - 0.01)

client = UpstreamClient(connect_timeout_s=2, stream_idle_timeout_s=30)
"""

CASES = {
    "one-greenlet-a-stream": """
d = serve(silent_after_start)
gevent.sleep(0.05)
before = alive()
stream = client.open_stream(d, "/v1/messages", b"{}", first_event_timeout_s=5)
assert stream.first()[0] == "message_start"
assert stream.poll(0.1) == []
during = alive()
assert during == before + 1, (before, during)  # the upstream's own greenlet for the connection: no reader
go.set()
assert [e for e, _ in stream.events()] == ["message_stop"]
stream.close()
""",
    "silent-upstream-poll-returns-by-its-bound": """
d = serve(silent_after_start)
gevent.spawn(ticker); gevent.sleep(0.05)
stream = client.open_stream(d, "/v1/messages", b"{}", first_event_timeout_s=5)
assert stream.first()[0] == "message_start"
for _ in range(2):
    t = time.monotonic()
    assert stream.poll(0.2) == []
    took = time.monotonic() - t
    assert 0.15 < took < 0.6, took
assert max(lags) < 0.1, max(lags)  # the other greenlets ran meanwhile
go.set()
assert [e for e, _ in stream.events()] == ["message_stop"] and stream.ended
stream.close()
""",
    "interrupt-from-another-greenlet": """
d = serve(silent_after_start)
stream = client.open_stream(d, "/v1/messages", b"{}", first_event_timeout_s=5)
assert stream.first()[0] == "message_start"
gevent.spawn_later(0.2, stream.interrupt)
t = time.monotonic()
assert stream.poll(5) == []
assert time.monotonic() - t < 0.6, time.monotonic() - t
go.set()
stream.close()
""",
    "a-dripping-head-leaves-nothing-reading": """
def drip(conn):  # the head a byte every 50 ms (each read waits less than the read timeout)
    for byte in b"HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\n" * 100:
        conn.sendall(bytes([byte])); gevent.sleep(0.05)
d = serve(drip)
gevent.sleep(0.05)
before = alive()
t = time.monotonic()
stream = client.open_stream(d, "/v1/messages", b"{}", first_event_timeout_s=0.5)
try: stream.first(); raise SystemExit("answered")
except UpstreamTimeoutError: pass
assert time.monotonic() - t < 1.1, time.monotonic() - t
stream.close()
gevent.sleep(0.2)  # the upstream's greenlet sees the connection dropped
assert alive() <= before, (before, alive())
""",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_stream_read_in_place_under_gevent(case: str) -> None:
    script = textwrap.dedent(PRELUDE) + textwrap.dedent(CASES[case])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
