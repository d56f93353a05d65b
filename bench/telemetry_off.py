"""What telemetry costs the request's path, in process: the pipeline (``Gateway.handle`` over the
fakes of ``tests/support/pipeline.py``: no HTTP, no database, so the figures are the pipeline's own
CPU) for a JSON request and a streamed one, with ``[telemetry]`` off and on.

    .venv/bin/python bench/telemetry_off.py [--requests N] [--rounds R] [--baseline PATH]

- **off**: no ``Tracing`` (the default). The hooks on the path are ``is None`` tests; timed alone
  too (``hooks``: the tests one JSON request passes, and one per stream event), so the cost of
  telemetry off is read against the request's own time.
- **on**: spans recorded and exported to a collector on loopback (``tests/support/otlp.py``), in
  the background as in the gateway; and **on, unsampled** (``sample_ratio = 0``).

The rounds alternate (off, on, unsampled, off, …) so the machine's noise falls on each alike; each
figure is the median of its rounds, in microseconds of CPU per request of the thread that runs
the requests: the request path's own cost (with telemetry on, the batches are encoded and sent by
the exporter's thread, and the collector decodes them in threads of its own: neither is counted).
Prints one table and the
modules of opentelemetry imported while off (none).

``--baseline PATH``: another tree of the repository (the code before telemetry: its
``ezat_compat/`` and ``tests/support/``) timed against this one with telemetry off, each in a
process of its own, in paired rounds (this, before, before, this): CPU time of the process per
request, and this tree's over the baseline's, the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ezat_compat.api.sse import relay  # noqa: E402
from ezat_compat.domain import TelemetrySettings  # noqa: E402
from ezat_compat.pipeline import Gateway  # noqa: E402
from ezat_compat.server.logs import RequestRecord  # noqa: E402
from ezat_compat.server.telemetry import Tracing  # noqa: E402
from ezat_compat.session import StreamSession  # noqa: E402
from tests.support.pipeline import END, MESSAGE, OPENAI, START, TEXT, events, gateway, request  # noqa: E402

STREAM = events(START, *TEXT, *END)


def one(gw: Gateway, stream: bool) -> None:
    req = request("openai", stream=stream)
    req.record = RequestRecord(request_id="r1", method="POST", path="/openai/v1/chat/completions", started=1.0)
    out = gw.handle(OPENAI, req)
    if isinstance(out, StreamSession):
        for _chunk in relay(out):
            pass
    else:
        req.record.answered(200)


def per_request_us(gw: Gateway, stream: bool, requests: int) -> float:
    if stream:
        gw.upstream.script = {name: list(STREAM) for name in ("a", "b", "c")}  # type: ignore[attr-defined]
    started = time.thread_time()
    for _ in range(requests):
        if stream:
            for name in ("a", "b", "c"):
                gw.upstream.script[name] = list(STREAM)  # type: ignore[attr-defined]
        one(gw, stream)
    return (time.thread_time() - started) / requests * 1e6


def hooks_ns(loops: int = 200_000) -> tuple[float, float]:
    """The ``is None`` tests telemetry off adds: those of one JSON request (one attempt), and the
    one of each stream event; nanoseconds each."""
    record = RequestRecord()

    class Holder:
        tracing = None
        trace = None

    gw, session = Holder(), Holder()

    def request_hooks() -> None:
        if gw.tracing is not None:  # Gateway.handle
            pass
        if record.trace is not None:  # handle, after admission
            pass
        trace = record.trace  # an attempt
        attempt = trace if trace is not None else None
        _headers = attempt if attempt is not None else None
        if attempt is not None:
            pass
        if record.trace is not None:  # Run.go, the reply
            pass
        if record.trace is not None:  # RequestRecord.finish
            pass
        if record.trace is not None:  # RequestRecord.fields
            pass

    def event_hook() -> None:
        if session.trace is not None:
            pass

    def empty() -> None:
        pass

    def timed(fn: Callable[[], None]) -> float:
        started = time.process_time()
        for _ in range(loops):
            fn()
        return (time.process_time() - started) / loops * 1e9

    base = min(timed(empty) for _ in range(5))
    return (
        max(0.0, min(timed(request_hooks) for _ in range(5)) - base),
        max(0.0, min(timed(event_hook) for _ in range(5)) - base),
    )


# One tree's pipeline with telemetry off, timed on command ("json N" / "stream N" on stdin: one
# line of JSON back with the CPU and wall microseconds per request).
CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from ezat_compat.api.sse import relay
from ezat_compat.server.logs import RequestRecord
from ezat_compat.session import StreamSession
from tests.support.pipeline import END, MESSAGE, OPENAI, START, TEXT, events, gateway, request
STREAM = events(START, *TEXT, *END)
assert sys.modules["ezat_compat"].__file__.startswith(sys.argv[1])
gws = {"json": gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})[0], "stream": gateway({})[0]}
def one(kind):
    gw = gws[kind]
    if kind == "stream":
        gw.upstream.script = {name: list(STREAM) for name in ("a", "b", "c")}
    req = request("openai", stream=kind == "stream")
    req.record = RequestRecord(request_id="r1", method="POST", path="/openai/v1/chat/completions", started=1.0)
    out = gw.handle(OPENAI, req)
    if isinstance(out, StreamSession):
        for _chunk in relay(out):
            pass
    else:
        req.record.answered(200)
for line in sys.stdin:
    kind, count = line.split()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(int(count)):
        one(kind)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu_us": cpu / int(count) * 1e6, "wall_us": wall / int(count) * 1e6}), flush=True)
"""


class Tree:
    """A process running ``CHILD`` on one tree."""

    def __init__(self, tree: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tree)], cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def time(self, kind: str, count: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{kind} {count}\n")
        self.proc.stdin.flush()
        return float(json.loads(self.proc.stdout.readline())["cpu_us"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def against_baseline(baseline: Path, requests: int, rounds: int) -> None:
    """Paired rounds of this tree and ``baseline``, telemetry off: CPU µs per request and the ratio."""
    this, before = Tree(REPO), Tree(baseline.resolve())
    try:
        for tree in (this, before):  # warm
            tree.time("json", 50)
            tree.time("stream", 50)
        print(f"\n{'telemetry off':<14} {'this µs':>9} {'before µs':>10} {'this/before (median, min-max)':>32}")
        for kind in ("json", "stream"):
            ratios, mine, theirs = [], [], []
            for number in range(rounds):
                first, second = (this, before) if number % 2 == 0 else (before, this)
                a1, b1, b2, a2 = (
                    first.time(kind, requests),
                    second.time(kind, requests),
                    second.time(kind, requests),
                    first.time(kind, requests),
                )
                ours, base = ((a1 + a2), (b1 + b2)) if first is this else ((b1 + b2), (a1 + a2))
                ratios.append(ours / base)
                mine.append(ours / 2)
                theirs.append(base / 2)
            print(
                f"{kind:<14} {statistics.median(mine):>9.1f} {statistics.median(theirs):>10.1f} "
                f"{statistics.median(ratios):>15.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            )
    finally:
        this.close()
        before.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="requests per round and kind")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--baseline", type=Path, help="a tree of the code before telemetry, timed against this one")
    args = parser.parse_args()
    if args.baseline:
        against_baseline(args.baseline, args.requests, args.rounds)
        return

    from tests.support.otlp import Collector  # the collector decodes with opentelemetry-proto: after "off"

    off_json, _, _ = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    off_stream, _, _ = gateway({})
    per_request_us(off_json, False, 20)  # warm: the first requests build what later ones reuse
    per_request_us(off_stream, True, 20)
    imported_off = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter")))

    collector = Collector().start()
    endpoint = collector.url + "/v1/traces"
    on = {name: gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})[0] for name in ("json", "stream")}
    unsampled = {name: gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})[0] for name in ("json", "stream")}
    tracings = []
    for group, ratio in ((on, 1.0), (unsampled, 0.0)):
        for gw in group.values():
            gw.tracing = Tracing(TelemetrySettings(endpoint=endpoint, sample_ratio=ratio))
            tracings.append(gw.tracing)
    for group in (on, unsampled):
        per_request_us(group["json"], False, 20)
        per_request_us(group["stream"], True, 20)

    figures: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for label, gw, stream in (
            ("off json", off_json, False),
            ("on json", on["json"], False),
            ("on unsampled json", unsampled["json"], False),
            ("off stream", off_stream, True),
            ("on stream", on["stream"], True),
            ("on unsampled stream", unsampled["stream"], True),
        ):
            figures.setdefault(label, []).append(per_request_us(gw, stream, args.requests))
    for tracing in tracings:
        tracing.shutdown()
    collector.stop()
    request_ns, event_ns = hooks_ns()

    print(f"{'what':<22} {'CPU µs/request (median)':>24} {'spread (min-max)':>20}")
    for label, values in figures.items():
        print(f"{label:<22} {statistics.median(values):>24.1f} {min(values):>9.1f}-{max(values):<10.1f}")
    json_us = statistics.median(figures["off json"])
    stream_us = statistics.median(figures["off stream"])
    print(f"\nhooks while off: {request_ns:.0f} ns per JSON request ({request_ns / 1000 / json_us * 100:.3f} %),")
    print(
        f"{event_ns:.0f} ns per stream event (x{len(STREAM)} events: "
        f"{(request_ns + event_ns * len(STREAM)) / 1000 / stream_us * 100:.3f} % of a stream)"
    )
    print(f"spans received by the collector: {len(collector.spans)}")
    print(f"opentelemetry's tracing modules imported while off: {imported_off or 'none'}")


if __name__ == "__main__":
    main()
