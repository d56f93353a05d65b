"""How far above the stack floor the product card's least per-request work already is.

    python bench/mandated.py [--rounds N] [--seconds S]

Starts the simulator, our gateway, the stack floor (``floor_app.py``) and the floor plus the
card's mandated per-request work (``mandated_app.py``: key lookup, marshmallow validation, a
reservation and a ledger transaction on SQLite, sseclient-py events written again from their
JSON, prometheus_client's multiprocess counter and histogram, one access line; none of the
gateway's code), each under gunicorn with the gateway's worker settings and one worker. Then:

- CPU per request of the mandated app and of the gateway over the floor's, non-streaming and
  streaming at c=32, each measured in pairs with the floor as ``bench/run.py`` measures its
  ratios (rounds of base, other, other, base; the median of the rounds), and of the gateway over
  the mandated app itself in the same way (the card's target: ≤ 1.0×);
- latency at c=1 (non-streaming p50 and stream TTFB p50), of each over the bare simulator,
  as ratios of the floor's, as ``bench/run.py``'s latency targets are judged.

The issue's targets (≤ 1.15× the floor's CPU, ≤ 1.3× its added latency) are printed beside
each figure: where the mandated app alone is over a target, no gateway built on that stack can
meet it while it does that work.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import litellm_env
import procstats
from run import (
    PROMPT,
    QUICK,
    Endpoint,
    anthropic_body,
    measure,
    openai_body,
    paired,
    write_json,
)
from servers import BENCH, Fleet, Gateway, Proc

CPU_TARGET = 1.15
LATENCY_TARGET = 1.3


def start_mandated(fleet: Fleet, gateway: Gateway, sim_url: str, bodies: Path) -> tuple[Proc, str]:
    folder = fleet.workdir / "mandated"
    metrics = folder / "metrics"
    metrics.mkdir(parents=True, exist_ok=True)
    env = {"MANDATED_DIR": str(folder), "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    return fleet.start_floor(gateway, sim_url, bodies, app="mandated_app:app", env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="paired rounds per CPU ratio (default 4)")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per run of a round (default 1)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "mandated.json")
    args = parser.parse_args(argv)
    plan = replace(QUICK, paired_rounds=args.rounds, paired_s=args.seconds, duration_s=max(args.seconds, 1.5))
    results: dict[str, Any] = {"machine": procstats.machine(), "paired": {}, "against_mandated": {}, "c1": {}}
    with tempfile.TemporaryDirectory(prefix="ezat-mandated-") as tmp, Fleet(Path(tmp)) as fleet:
        sim, sim_url = fleet.start_sim()
        gw = fleet.start_gateway("gateway", sim_url, workers=1, keepalive_s=1.0)
        text = f"{PROMPT} [[sim:words=12]]"
        wd = fleet.workdir
        oa_json = write_json(wd / "openai.json", openai_body(text))
        oa_sse = write_json(wd / "openai-stream.json", openai_body(text, stream=True))
        an_json = write_json(wd / "anthropic.json", anthropic_body(text))
        an_sse = write_json(wd / "anthropic-stream.json", anthropic_body(text, stream=True))
        table = write_json(
            wd / "bodies.json", [[oa_json.read_text(), an_json.read_text()], [oa_sse.read_text(), an_sse.read_text()]]
        )
        floor, floor_url = fleet.start_floor(gw, sim_url, table)
        mandated, mandated_url = start_mandated(fleet, gw, sim_url, table)
        route = "/openai/v1/chat/completions"
        targets = {
            "ours": Endpoint(
                "ours",
                gw.url + route,
                [f"authorization: Bearer {gw.key}"],
                oa_json,
                oa_sse,
                oa_sse,
                '"choices"',
                "[DONE]",
                gw.proc.pid,
            ),
            "floor": Endpoint(
                "floor", floor_url + route, [], oa_json, oa_sse, oa_sse, '"content"', "message_stop", floor.pid
            ),
            "mandated": Endpoint(
                "mandated",
                mandated_url + route,
                ["authorization: Bearer ezat_sk_mandated"],
                oa_json,
                oa_sse,
                oa_sse,
                '"content"',
                "message_stop",
                mandated.pid,
            ),
            "direct": Endpoint(
                "direct",
                sim_url + "/v1/messages",
                [f"x-api-key: {litellm_env.UPSTREAM_KEY}", "anthropic-version: 2023-06-01"],
                an_json,
                an_sse,
                an_sse,
                '"content"',
                "message_stop",
                sim.pid,
            ),
        }
        for mode, kind in (("json", "json"), ("sse", "sse")):
            for name in ("mandated", "ours"):
                print(f"mandated: paired {name}/floor {mode}", file=sys.stderr, flush=True)
                pair = paired(targets["floor"], targets[name], mode, kind, plan, sim.pid)
                results["paired"][f"{name}_{mode}"] = pair
            # the card's own target: ours against the mandated app itself, in the same rounds
            print(f"mandated: paired ours/mandated {mode}", file=sys.stderr, flush=True)
            pair = paired(targets["mandated"], targets["ours"], mode, kind, plan, sim.pid)
            results["against_mandated"][mode] = pair
        for mode, kind in (("json", "json"), ("sse", "sse")):
            for name in ("direct", "floor", "mandated", "ours"):
                print(f"mandated: c=1 {name} {mode}", file=sys.stderr, flush=True)
                m = measure(targets[name], mode, 1, kind, plan, sim.pid)
                results["c1"][f"{name}_{mode}"] = m
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(report(results))
    return 0


def report(results: dict[str, Any]) -> str:
    lines = ["CPU per request over the floor's, c=32 (median of paired rounds; target ≤ 1.15×):"]
    for key, pair in results["paired"].items():
        ratios = [r["ratio"] for r in pair["rounds"] if r["ratio"] is not None]
        lines.append(
            f"  {key:14} {pair['ratio']:.3f}×  ({pair['cpu_ms']:.3f} ms against {pair['base_cpu_ms']:.3f}; "
            f"rounds {min(ratios):.2f}–{max(ratios):.2f}×; errors {pair['errors']})"
        )
    lines.append("CPU per request of ours over the mandated app's, c=32 (paired rounds; the card's target ≤ 1.0×):")
    for mode, pair in results.get("against_mandated", {}).items():
        ratios = [r["ratio"] for r in pair["rounds"] if r["ratio"] is not None]
        lines.append(
            f"  ours/mandated {mode:4} {pair['ratio']:.3f}×  "
            f"({pair['cpu_ms']:.3f} ms against {pair['base_cpu_ms']:.3f}; "
            f"rounds {min(ratios):.2f}–{max(ratios):.2f}×; errors {pair['errors']})"
        )
    lines.append("latency added over the bare simulator at c=1, as a ratio of the floor's (target ≤ 1.3×):")
    c1 = results["c1"]
    for mode, figure in (("json", "p50_ms"), ("sse", "ttfb_p50_ms")):
        direct, floor = c1[f"direct_{mode}"][figure], c1[f"floor_{mode}"][figure]
        for name in ("mandated", "ours"):
            mine = c1[f"{name}_{mode}"][figure]
            added, base = mine - direct, floor - direct
            lines.append(
                f"  {name:8} {mode:4} {figure:11} {added / base:.2f}×  (+{added:.2f} ms against +{base:.2f}; "
                f"CPU {c1[f'{name}_{mode}']['cpu_ms_per_request']:.3f} ms/req against "
                f"{c1[f'floor_{mode}']['cpu_ms_per_request']:.3f})"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
