"""Profile our gateway's hot path with py-spy under the benchmark's load.

    python bench/hotpath.py [--duration S] [--rate HZ] [--concurrency N] [--out DIR]

Starts the simulator (TCP_NODELAY, fast) and the gateway (gunicorn, ONE gevent worker, SQLite
ledger, a key with rpm/tpm), then for each load — non-streaming at concurrency 32 and
streaming at concurrency 32:

1. measures CPU per request of the worker without the profiler (the scale of the figures);
2. runs the same load again with ``py-spy record`` attached to the worker (idle samples
   dropped, so samples are CPU time) and turns the stacks into milliseconds per request:
   by package (where the CPU is spent), by function (self and inclusive), and by pipeline
   phase (auth, limits, reservation, validation, translation, upstream call, settlement…).

py-spy comes from PyPI into ``.bench-cache/tools/`` (a venv of its own, not a dependency of
the project). Writes ``DIR/profile-<load>.txt`` (the report), ``.collapsed`` (stacks for any
flame-graph tool) and ``profile.json``; default DIR is ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import venv
from collections import Counter
from pathlib import Path
from typing import Any

import procstats
from run import PROMPT, loadgen, openai_body, write_json
from servers import BENCH, REPO, Fleet

PY_SPY_VERSION = "0.4.3"
TOOLS = REPO / ".bench-cache" / "tools"
LOADS = (("nonstream_c32", "json", '"choices"'), ("stream_c32", "sse", "[DONE]"))
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")

# Where a CPU sample belongs: the innermost frame of its stack that matches a rule names the
# phase (so "settle" inside the stream generator counts as billing, not streaming). Rules are
# (qualified function name or "", file path prefix as py-spy prints it, phase).
PHASE_RULES: tuple[tuple[str, str, str], ...] = (
    ("", "prometheus_client/", "metrics: prometheus_client (multiprocess files)"),
    ("Gateway.authenticate", "ezat_compat/pipeline.py", "auth: key lookup (SQLAlchemy SELECT)"),
    ("RateLimits.admit", "ezat_compat/limits.py", "limits: rpm/tpm check + hit (SQLite counters)"),
    ("RateLimits.record_tokens", "ezat_compat/limits.py", "limits: record tokens (SQLite upsert)"),
    ("Ledger.reserve", "ezat_compat/store/ledger.py", "billing: reserve (write transaction)"),
    ("Ledger.settle", "ezat_compat/store/ledger.py", "billing: settle (ledger row, write transaction)"),
    ("LedgerEntry.__init__", "", "billing: LedgerEntry"),
    ("input_tokens_upper_bound", "ezat_compat/translate/estimate.py", "billing: input estimate"),
    ("read_json", "ezat_compat/api/common.py", "request: read body + json.loads"),
    ("load_chat_request", "ezat_compat/wire/openai.py", "validate: marshmallow schema"),
    ("openai_to_anthropic", "ezat_compat/translate/request.py", "translate: request"),
    ("encode_body", "ezat_compat/upstream/client.py", "translate: json.dumps of the upstream body"),
    ("UpstreamClient.complete", "ezat_compat/upstream/client.py", "upstream: HTTP call (requests)"),
    (
        "UpstreamClient.open_stream",
        "ezat_compat/upstream/client.py",
        "upstream: open stream (reader greenlet)",
    ),
    ("UpstreamStream.close", "ezat_compat/upstream/client.py", "upstream: close stream response"),
    ("UpstreamStream.poll", "ezat_compat/upstream/client.py", "upstream: wait for the reader's events (in the writer)"),
    ("anthropic_to_openai", "ezat_compat/translate/response.py", "translate: response"),
    ("json_response", "ezat_compat/api/common.py", "response: json.dumps + Flask Response"),
    ("StreamTranslator.feed", "ezat_compat/translate/stream.py", "stream: translate events"),
    ("encode_chunk", "ezat_compat/translate/stream.py", "stream: encode chunks (json.dumps)"),
    ("sse_data", "ezat_compat/jsonfast.py", "stream: encode chunks (orjson)"),
    ("event_data", "ezat_compat/dialects/__init__.py", "stream: parse events (orjson)"),
    ("relay", "ezat_compat/api/sse.py", "stream: writer (rest)"),
    ("new_request_id", "ezat_compat/api/common.py", "request id"),
    ("Response.write", "gunicorn/http/wsgi.py", "gunicorn: write the response (socket send)"),
)
FALLBACK_RULES: tuple[tuple[str, str], ...] = (
    ("ezat_compat/", "gateway: other (blueprint, pipeline glue)"),
    ("flask/", "Flask/werkzeug: routing, request/response objects"),
    ("werkzeug/", "Flask/werkzeug: routing, request/response objects"),
    ("gunicorn/", "gunicorn: parse the request, WSGI environ, keep-alive"),
    ("gevent/", "gevent: hub, greenlet switches"),
)


def ensure_py_spy() -> Path:
    """``.bench-cache/tools/bin/py-spy``, installed from PyPI on first use."""
    exe = TOOLS / "bin" / "py-spy"
    if not exe.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(TOOLS)
        subprocess.run(
            [
                str(TOOLS / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"py-spy=={PY_SPY_VERSION}",
            ],
            check=True,
            timeout=600,
        )
    return exe


def parse_frame(frame: str) -> tuple[str, str]:
    """``"func (path/file.py:12)"`` -> (func, path)."""
    match = FRAME.match(frame)
    if not match:
        return frame, ""
    return match["func"], match["file"]


def package_of(path: str) -> str:
    """Who owns a source path as py-spy prints it: ``ezat_compat.store``, ``sqlalchemy``, ``json``."""
    parts = path.split("/")
    if parts[0] == "ezat_compat" and len(parts) > 1:
        return "ezat_compat." + parts[1].removesuffix(".py")
    return parts[0].removesuffix(".py") or "?"


# A thread of gevent's thread pool (made by a first DNS lookup) waiting for work in a lock's
# acquire: py-spy counts it as active although it uses no CPU; such samples are dropped.
IDLE_WAITS = ("acquire_with_timeout (gevent/_threading.py",)


def read_collapsed(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            split = frames.split(";")
            if not split[-1].startswith(IDLE_WAITS):
                stacks.append((split, int(count)))
    return stacks


def analyse(stacks: list[tuple[list[str], int]], cpu_ms_per_request: float) -> dict[str, Any]:
    """Self and inclusive cost per function, self cost per package, cost per pipeline phase;
    each as its share of the samples times the CPU per request, in ms per request."""
    self_fn: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    self_pkg: Counter[str] = Counter()
    phase: Counter[str] = Counter()
    total = 0
    for frames, count in stacks:
        total += count
        parsed = [parse_frame(f) for f in frames]
        func, path = parsed[-1]
        self_fn[f"{func} ({path})"] += count
        self_pkg[package_of(path)] += count
        seen = set()
        for func_i, path_i in parsed:
            key = f"{func_i} ({path_i})"
            if key not in seen:
                seen.add(key)
                incl_fn[key] += count
        phase[_phase(parsed)] += count

    def ms(counter: Counter[str], n: int) -> list[tuple[str, float, float]]:
        return [(k, cpu_ms_per_request * v / total, 100 * v / total) for k, v in counter.most_common(n)]

    if not total:
        return {"samples": 0, "by_package": [], "self": [], "inclusive": [], "phases": []}
    return {
        "samples": total,
        "by_package": ms(self_pkg, 25),
        "self": ms(self_fn, 30),
        "inclusive": ms(incl_fn, 40),
        "phases": ms(phase, 40),
    }


def _phase(parsed: list[tuple[str, str]]) -> str:
    for func, path in reversed(parsed):  # innermost first: the most specific phase wins
        for name, prefix, label in PHASE_RULES:
            if (not name or func == name) and path.startswith(prefix):
                return label
    for _, path in reversed(parsed):
        for prefix, label in FALLBACK_RULES:
            if path.startswith(prefix):
                return label
    return "other"


def render(load: str, info: dict[str, Any], result: dict[str, Any]) -> str:
    lines = [
        f"py-spy profile of ONE gateway worker under {load} ({info['requests_profiled']} requests profiled, "
        f"{result['samples']} CPU samples at {info['rate']} Hz)",
        f"CPU per request without the profiler: {info['cpu_ms_per_request']:.3f} ms "
        f"({info['rps']:.0f} req/s); the figures below are that CPU split by where the samples fell.",
        "",
    ]
    sections = (
        ("by pipeline phase (each sample counted once, in the innermost phase it is in)", "phases"),
        ("by package (self time: where the CPU is actually spent)", "by_package"),
        ("top functions, self time", "self"),
        ("top functions, inclusive time", "inclusive"),
    )
    for title, key in sections:
        lines.append(f"{title}:")
        lines.append(f"  {'ms/req':>7} {'share':>6}  what")
        for name, ms, pct in result[key]:
            lines.append(f"  {ms:7.3f} {pct:5.1f}%  {name}")
        lines.append("")
    return "\n".join(lines)


def profile_load(
    fleet: Fleet, gateway: Any, py_spy: Path, load: str, mode: str, expect: str, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    (worker,) = gateway.worker_pids()
    body = write_json(fleet.workdir / f"{load}.json", openai_body(f"{PROMPT} [[sim:words=12]]", stream=mode == "sse"))
    common = [
        "--url",
        gateway.url + "/openai/v1/chat/completions",
        "--body-file",
        str(body),
        "--mode",
        mode,
        "--concurrency",
        str(args.concurrency),
        "--expect",
        expect,
        "--header",
        f"authorization: Bearer {gateway.key}",
    ]
    loadgen([*common, "--duration", "2"], timeout_s=120)  # warm-up
    cpu0 = procstats.cpu_seconds(worker)
    plain = loadgen([*common, "--duration", str(args.duration)], timeout_s=args.duration + 120)
    cpu_ms = (procstats.cpu_seconds(worker) - cpu0) * 1000 / max(plain["requests"], 1)
    collapsed = out / f"profile-{load}.collapsed"
    spy = subprocess.Popen(
        [
            str(py_spy),
            "record",
            "--pid",
            str(worker),
            "--rate",
            str(args.rate),
            "--duration",
            str(int(args.duration)),
            "--format",
            "raw",
            "--output",
            str(collapsed),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    fleet.track("py-spy", spy)
    time.sleep(0.5)  # attached
    profiled = loadgen([*common, "--duration", str(args.duration)], timeout_s=args.duration + 120)
    _, err = spy.communicate(timeout=args.duration + 60)
    if spy.returncode != 0 or not collapsed.exists():
        raise RuntimeError(f"py-spy failed: {err.strip()[-1500:]}")
    stacks = read_collapsed(collapsed)
    samples = sum(c for _, c in stacks)
    samples_per_request = samples / max(profiled["requests"], 1)
    info = {
        "cpu_ms_per_request": cpu_ms,
        "rps": plain["rps"],
        "requests_profiled": profiled["requests"],
        "rate": args.rate,
        "errors": plain["errors"] + profiled["errors"],
        "profiled_rps": profiled["rps"],
        "samples_per_request": samples_per_request,
    }
    result = analyse(stacks, cpu_ms)
    text = render(load, info, result)
    (out / f"profile-{load}.txt").write_text(text + "\n")
    print(text)
    return {"info": info, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="py-spy profile of the gateway's hot path under load")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of load per measurement (default 15)")
    parser.add_argument("--concurrency", type=int, default=32, help="clients at once (default 32)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="folder for the reports")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    py_spy = ensure_py_spy()
    workdir = Path(tempfile.mkdtemp(prefix="ezat-profile-"))
    report: dict[str, Any] = {"machine": procstats.machine()}
    with Fleet(workdir) as fleet:
        _, sim_url = fleet.start_sim()
        gateway = fleet.start_gateway("gateway", sim_url, workers=1, keepalive_s=1.0)
        for load, mode, expect in LOADS:
            if args.concurrency != 32:
                load = load.replace("_c32", f"_c{args.concurrency}")
            report[load] = profile_load(fleet, gateway, py_spy, load, mode, expect, args, args.out)
    (args.out / "profile.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"reports: {args.out}/profile-*.txt, stacks: {args.out}/profile-*.collapsed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
