"""The stream relay's two figures: the added stream TTFB at c=1 against the card's least
work, and the memory of idle streams on one worker.

    python bench/relay.py [--rounds N] [--seconds S] [--streams N] [--skip-idle] [--skip-ttfb] [--json] [--unlimited]
                          [--references] [--baseline PATH [--cpu-rounds N]]

Starts the simulator, our gateway (one worker, ``keepalive_s = 1``), and the floor plus the
card's least per-request work (``mandated_app.py``, as ``bench/mandated.py`` starts it). Then:

- **TTFB at c=1**, streaming: ``--rounds`` rounds, each a run of ``--seconds`` of the direct
  simulator, the least work and ours, in that order then mirrored on the next round, so a drift
  of the shared machine falls on all alike. A round's figure is (ours − direct) / (least work −
  direct) on the p50 TTFB of its runs; the result is the median of the rounds (target ≤ 1.1×).
  ``--json``: then the same rounds for a JSON answer (its p50 latency at c=1, the same target).
  ``--unlimited``: ours with a second key of the same gateway, without rpm and tpm, in the same
  rounds: like for like with the least work, which has no rate limits (the bench's key has them).
  ``--baseline PATH``: another checkout's gateway (the code before a change) runs in the same
  rounds as "before"; with ``--cpu-rounds``, CPU per stream (and per long stream) at c=32,
  ours over before, in paired rounds as ``bench/run.py`` pairs.
- **Idle streams**: ``--streams`` streams held open at once on the one worker by a stalling
  simulator, measured as ``bench/run.py`` measures them (RSS per stream, the largest gap between
  pings once all were open; target under 48 KB each, pings on time). ``--references``: the
  floor's and the least work's RSS per stream holding the same streams.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import litellm_env
import procstats
import servers
from mandated import start_mandated
from run import (
    FULL,
    LOADGEN,
    LONG_MAX_TOKENS,
    LONG_WORDS,
    PROMPT,
    QUICK,
    Endpoint,
    _timed,
    anthropic_body,
    loadgen,
    openai_body,
    paired,
    slow_streams,
    write_json,
)
from servers import BENCH, Fleet, Gateway

TTFB_TARGET = 1.1
RSS_TARGET_KB = 48.0


def _c1_args(ep: Endpoint, mode: str) -> list[str]:
    body, expect = (ep.body_sse, ep.expect_sse) if mode == "sse" else (ep.body_json, ep.expect_json)
    args = ["--url", ep.url, "--body-file", str(body), "--mode", mode, "--concurrency", "1", "--expect", expect]
    for header in ep.headers:
        args += ["--header", header]
    return args


def _ttfb(ep: Endpoint, seconds: float, sim_pid: int, mode: str = "sse") -> dict[str, Any]:
    """One c=1 run: a stream's time to first byte (``mode`` "sse"), or a JSON answer's latency
    ("json", under the same names)."""
    run = _timed(ep, _c1_args(ep, mode), mode, replace(QUICK, duration_s=seconds), sim_pid)
    if mode == "json":
        run["ttfb_p50_ms"], run["ttfb_p99_ms"] = run["p50_ms"], run["p99_ms"]
    return run


def ttfb_rounds(
    targets: dict[str, Endpoint], rounds: int, seconds: float, sim_pid: int, mode: str = "sse"
) -> dict[str, Any]:
    """Rounds of c=1 streams (or JSON answers: ``mode`` "json") of direct, mandated and ours
    (and the baseline tree's, "before") in mirrored order (module docstring)."""
    names = tuple(name for name in ("direct", "mandated", "before", "unlimited", "ours") if name in targets)
    for name in names:  # warm each once (connections, caches, the JIT-less interpreter's first paths)
        loadgen([*_c1_args(targets[name], mode), "--duration", "0.5"], timeout_s=60)
    out = []
    for i in range(rounds):
        order = names if i % 2 == 0 else tuple(reversed(names))
        runs = {name: _ttfb(targets[name], seconds, sim_pid, mode) for name in order}
        p50 = {name: runs[name]["ttfb_p50_ms"] for name in names}
        added_ours, added_mandated = p50["ours"] - p50["direct"], p50["mandated"] - p50["direct"]
        out.append(
            {
                "mode": mode,
                "ttfb_p50_ms": p50,
                "ttfb_p99_ms": {name: runs[name]["ttfb_p99_ms"] for name in names},
                "cpu_ms_per_request": {name: runs[name]["cpu_ms_per_request"] for name in names},
                "errors": sum(runs[name]["errors"] for name in names),
                "foreign_cpu_pct": max(runs[name]["foreign_cpu_pct"] for name in names),
                "added_ours_ms": added_ours,
                "added_mandated_ms": added_mandated,
                "ratio": added_ours / added_mandated if added_mandated > 0 else None,
            }
        )
        for other in ("before", "unlimited"):
            if other in p50:
                added = p50[other] - p50["direct"]
                out[-1][f"added_{other}_ms"] = added
                out[-1][f"{other}_ratio"] = added / added_mandated if added_mandated > 0 else None
        print(f"relay: round {i + 1}/{rounds}: {out[-1]['ratio']}", file=sys.stderr, flush=True)
    ratios = [r["ratio"] for r in out if r["ratio"] is not None]
    result = {
        "rounds": out,
        "ratio": statistics.median(ratios) if ratios else None,
        "added_ours_ms": statistics.median(r["added_ours_ms"] for r in out),
        "added_mandated_ms": statistics.median(r["added_mandated_ms"] for r in out),
        "errors": sum(r["errors"] for r in out),
    }
    for other in ("before", "unlimited"):
        theirs = [r[f"{other}_ratio"] for r in out if r.get(f"{other}_ratio") is not None]
        if theirs:
            result[f"{other}_ratio"] = statistics.median(theirs)
            result[f"added_{other}_ms"] = statistics.median(r[f"added_{other}_ms"] for r in out)
    return result


def start_baseline(fleet: Fleet, sim_url: str, tree: Path) -> Gateway:
    """A gateway run from ``tree`` (another checkout of the repository: the code to compare
    with), as ``Fleet.start_gateway`` starts ours."""
    here = servers.REPO
    servers.REPO = tree
    try:
        return fleet.start_gateway("baseline", sim_url, workers=1, keepalive_s=1.0)
    finally:
        servers.REPO = here


def reference_idle(fleet: Fleet, gw: Gateway, sim_url: str, app: str, streams: int, stall_s: float) -> dict[str, Any]:
    """RSS per idle stream of the floor (``app`` "floor") or the card's least work ("mandated")
    holding ``streams`` streams of a stalling simulator on one worker: what any gateway on this
    stack pays for an idle stream (neither sends keep-alives; the same measure as ``slow_streams``)."""
    wd = fleet.workdir / f"idle-{app}"
    wd.mkdir(exist_ok=True)
    texts = {
        "warm": f"{PROMPT} [[sim:words=12,stall=1.5]]",
        "idle": f"{PROMPT} [[sim:words=12,stall={stall_s:g}]]",
    }
    bodies = {k: write_json(wd / f"{k}.json", openai_body(t, stream=True)) for k, t in texts.items()}
    upstream = {k: write_json(wd / f"{k}-up.json", anthropic_body(t, stream=True)) for k, t in texts.items()}
    table = write_json(wd / "bodies.json", [[bodies[k].read_text(), upstream[k].read_text()] for k in texts])
    if app == "mandated":
        proc, url = start_mandated(fleet, gw, sim_url, table)
        headers = ["authorization: Bearer ezat_sk_mandated"]
    else:
        proc, url = fleet.start_floor(gw, sim_url, table)
        headers = []
    (worker,) = procstats.children(proc.pid)
    route = url + "/openai/v1/chat/completions"

    def run(body: Path, n: int, on_open: Any = None) -> dict[str, Any]:
        cmd = [sys.executable, str(LOADGEN), "--url", route, "--body-file", str(body), "--mode", "idle"]
        cmd += ["--concurrency", str(n), "--timeout", str(stall_s + 120), "--expect", "message_stop"]
        for header in headers:
            cmd += ["--header", header]
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        result: dict[str, Any] = {}
        assert popen.stdout is not None
        for line in popen.stdout:
            if line.startswith("# all-open") and on_open is not None:
                on_open()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        popen.wait()
        return result

    run(bodies["warm"], 10)
    time.sleep(0.5)
    before = procstats.rss_bytes(worker)
    at_open: list[int] = []

    def opened() -> None:
        readings = []
        for _ in range(5):
            readings.append(procstats.rss_bytes(worker))
            time.sleep(0.05)
        at_open.append(max(readings))

    raw = run(bodies["idle"], streams, opened)
    fleet.stop(proc)
    return {
        "app": app,
        "streams": streams,
        "opened": raw.get("opened"),
        "errors": raw.get("errors"),
        "rss_per_stream_kb": (at_open[0] - before) / streams / 1024 if at_open else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="TTFB rounds (default 10)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per run of a round (default 2)")
    parser.add_argument("--streams", type=int, default=1000, help="idle streams on the one worker (default 1000)")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--skip-ttfb", action="store_true")
    parser.add_argument(
        "--unlimited",
        action="store_true",
        help="also ours with a key without rpm and tpm, in the same rounds (the least work has no rate limits)",
    )
    parser.add_argument(
        "--json", action="store_true", help="also the JSON answer's added latency at c=1, in rounds of its own"
    )
    parser.add_argument(
        "--references", action="store_true", help="also the floor's and the least work's idle streams, for reference"
    )
    parser.add_argument(
        "--baseline", type=Path, help="another checkout of the repository, measured as 'before' in the same rounds"
    )
    parser.add_argument(
        "--cpu-rounds", type=int, default=0, help="with --baseline: CPU per stream, ours over before, paired rounds"
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "relay.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine": procstats.machine()}
    with tempfile.TemporaryDirectory(prefix="ezat-relay-") as tmp, Fleet(Path(tmp)) as fleet:
        sim, sim_url = fleet.start_sim()
        gw = fleet.start_gateway("gateway", sim_url, workers=1, keepalive_s=1.0)
        wd = fleet.workdir
        text = f"{PROMPT} [[sim:words=12]]"
        oa_json = write_json(wd / "openai.json", openai_body(text))
        oa_sse = write_json(wd / "openai-stream.json", openai_body(text, stream=True))
        long_text = f"{PROMPT} [[sim:words={LONG_WORDS}]]"
        oa_long = write_json(wd / "openai-long.json", openai_body(long_text, stream=True, max_tokens=LONG_MAX_TOKENS))
        an_json = write_json(wd / "anthropic.json", anthropic_body(text))
        an_sse = write_json(wd / "anthropic-stream.json", anthropic_body(text, stream=True))
        table = write_json(
            wd / "bodies.json", [[oa_json.read_text(), an_json.read_text()], [oa_sse.read_text(), an_sse.read_text()]]
        )
        route = "/openai/v1/chat/completions"
        if not args.skip_ttfb:
            mandated, mandated_url = start_mandated(fleet, gw, sim_url, table)
            auth = ["authorization: Bearer ezat_sk_mandated"]
            direct_headers = [f"x-api-key: {litellm_env.UPSTREAM_KEY}", "anthropic-version: 2023-06-01"]
            targets = {
                "ours": Endpoint(
                    "ours", gw.url + route, [f"authorization: Bearer {gw.key}"], oa_json, oa_sse, oa_long,
                    '"choices"', "[DONE]", gw.proc.pid,
                ),
                "mandated": Endpoint(
                    "mandated", mandated_url + route, auth, oa_json, oa_sse, oa_sse, '"content"', "message_stop",
                    mandated.pid,
                ),
                "direct": Endpoint(
                    "direct", sim_url + "/v1/messages", direct_headers, an_json, an_sse, an_sse, '"content"',
                    "message_stop", sim.pid,
                ),
            }  # fmt: skip
            if args.unlimited:
                targets["unlimited"] = replace(
                    targets["ours"], name="unlimited", headers=[f"authorization: Bearer {gw.unlimited_key()}"]
                )
            if args.baseline:
                base = start_baseline(fleet, sim_url, args.baseline.resolve())
                targets["before"] = replace(
                    targets["ours"], name="before", url=base.url + route, headers=[f"authorization: Bearer {base.key}"],
                    pid=base.proc.pid,
                )  # fmt: skip
            results["ttfb"] = ttfb_rounds(targets, args.rounds, args.seconds, sim.pid)
            if args.json:
                results["json"] = ttfb_rounds(targets, args.rounds, args.seconds, sim.pid, "json")
            fleet.stop(mandated)
            if args.baseline and args.cpu_rounds:
                plan = replace(QUICK, paired_rounds=args.cpu_rounds, paired_s=args.seconds)
                results["cpu"] = {
                    kind: paired(targets["before"], targets["ours"], "sse", kind, plan, sim.pid)
                    for kind in ("sse", "long")
                }
        if not args.skip_idle:
            plan = replace(FULL, slow_streams=args.streams)
            print(f"relay: {args.streams} idle streams on one worker", file=sys.stderr, flush=True)
            results["idle"] = slow_streams(gw, sim.pid, plan, fleet)
        if args.references:
            results["idle_references"] = [
                reference_idle(fleet, gw, sim_url, app, args.streams, FULL.stall_s) for app in ("floor", "mandated")
            ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(report(results))
    return 0


def report(results: dict[str, Any]) -> str:
    lines: list[str] = []
    for key, what in (("ttfb", "stream TTFB"), ("json", "JSON answer's latency (p50)")):
        ttfb = results.get(key)
        if not ttfb:
            continue
        ratios = [r["ratio"] for r in ttfb["rounds"] if r["ratio"] is not None]
        lines.append(
            f"added {what} at c=1, ours / the card's least work: {ttfb['ratio']:.2f}× (target ≤ {TTFB_TARGET}×; "
            f"+{ttfb['added_ours_ms']:.2f} ms against +{ttfb['added_mandated_ms']:.2f}, medians; "
            f"rounds {min(ratios):.2f}–{max(ratios):.2f}×; errors {ttfb['errors']})"
        )
        if "before_ratio" in ttfb:
            lines.append(
                f"  the baseline tree's ('before'): {ttfb['before_ratio']:.2f}× (+{ttfb['added_before_ms']:.2f} ms)"
            )
        if "unlimited_ratio" in ttfb:
            lines.append(
                f"  ours with a key without rpm and tpm (as the least work, which has no rate limits): "
                f"{ttfb['unlimited_ratio']:.2f}× (+{ttfb['added_unlimited_ms']:.2f} ms)"
            )
        for r in ttfb["rounds"]:
            p50 = r["ttfb_p50_ms"]
            before = f"  before {p50['before']:.2f}" if "before" in p50 else ""
            before += f"  unlimited {p50['unlimited']:.2f}" if "unlimited" in p50 else ""
            lines.append(
                f"  direct {p50['direct']:.2f}  mandated {p50['mandated']:.2f}{before}  ours {p50['ours']:.2f} ms  "
                f"-> {r['ratio']:.2f}×  (others' CPU {r['foreign_cpu_pct']:.0f} %)"
            )
    for kind, pair in (results.get("cpu") or {}).items():
        ratios = [r["ratio"] for r in pair["rounds"] if r["ratio"] is not None]
        lines.append(
            f"CPU per {'long stream' if kind == 'long' else 'stream'} at c=32, ours / before: {pair['ratio']:.2f}× "
            f"({pair['cpu_ms']:.3f} ms against {pair['base_cpu_ms']:.3f}; rounds {min(ratios):.2f}–{max(ratios):.2f}×)"
        )
    idle = results.get("idle")
    if idle:
        lines.append(
            f"{idle['streams']} idle streams on one worker: {idle['rss_per_stream_kb']:.1f} KB each "
            f"(peak {idle['rss_peak_per_stream_kb']:.1f}; target < {RSS_TARGET_KB:g}), opened {idle['opened']}, "
            f"errors {idle['errors']}, largest gap between pings once all were open {idle['steady_max_gap_s']} s "
            f"(whole run {idle['max_gap_s']} s) -> pings on time: {idle['pings_on_time']}"
        )
    for ref in results.get("idle_references") or []:
        lines.append(
            f"  for reference, the {ref['app']} app holding the same {ref['streams']} streams: "
            f"{ref['rss_per_stream_kb']:.1f} KB each (opened {ref['opened']}, errors {ref['errors']})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
