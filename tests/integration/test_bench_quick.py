"""The benchmark never rots: ``python bench/run.py --quick --skip-litellm`` runs end to end.

It starts the simulator, the gateway under gunicorn, the stack floor under gunicorn and the slow
image server, drives them with the load generator (the long-stream scenario included) and writes
its JSON. Machines are noisy, so nothing here judges a timing:
only that every section and metric is there, that no request failed and that the counts add up.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from typing import Any

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIOS = ("nonstream_c1", "nonstream_c32", "stream_c1", "stream_c32", "long_stream")
JSON_METRICS = ("rps", "p50_ms", "p99_ms", "cpu_ms_per_request")
STREAM_METRICS = ("ttfb_p50_ms", "ttfb_p99_ms", "done_p50_ms", "done_p99_ms")
GOALS = ("rps_vs_litellm", "added_p50", "added_ttfb", "cpu_per_request", "idle_streams", "images")
CONSTRAINTS = (
    "rps_vs_litellm",
    "rps_vs_litellm_responses",
    "cpu_vs_floor_nonstream_c32",
    "cpu_vs_floor_stream_c32",
    "long_stream_vs_litellm",
    "cpu_responses_c32_vs_chat",
    "cpu_responses_stream_c32_vs_chat",
)
RESPONSES_SCENARIOS = ("responses_c32", "responses_stream_c32")
LONG_DELTAS = 400


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--skip-litellm", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"bench/run.py --quick failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(out.read_text()), done.stdout


def test_meta_names_the_machine_and_mode(quick: tuple[dict[str, Any], str]) -> None:
    results, _ = quick
    meta = results["meta"]
    assert meta["mode"] == "quick"
    assert meta["workers"] == 1
    assert meta["machine"]["cores"] >= 1 and meta["machine"]["cpu_model"]
    assert meta["litellm"]["used"] is False and "skip-litellm" in meta["litellm"]["note"]
    assert positive(meta["run_s"])


@pytest.mark.parametrize("target", ["ours", "floor", "direct"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_has_its_metrics_and_no_errors(
    quick: tuple[dict[str, Any], str], target: str, scenario: str
) -> None:
    results, _ = quick
    m = results["targets"][target][scenario]
    assert m["errors"] == 0 and m["warmup_errors"] == 0, m["raw"]["error_samples"]
    assert m["requests"] == m["ok"] > 0
    assert m["raw"]["status_counts"] == {"200": m["requests"]}
    for metric in JSON_METRICS + (() if scenario.startswith("nonstream") else STREAM_METRICS):
        assert positive(m[metric]), (metric, m[metric])
    assert m["p99_ms"] >= m["p50_ms"]
    assert m["foreign_cpu_pct"] >= 0


@pytest.mark.parametrize("scenario", RESPONSES_SCENARIOS)
def test_the_responses_api_is_measured_on_the_gateway(quick: tuple[dict[str, Any], str], scenario: str) -> None:
    results, stdout = quick
    m = results["targets"]["ours"][scenario]
    assert m["errors"] == 0 and m["warmup_errors"] == 0, m["raw"]["error_samples"]
    assert m["requests"] == m["ok"] > 0 and m["raw"]["status_counts"] == {"200": m["requests"]}
    for metric in JSON_METRICS + (STREAM_METRICS if "stream" in scenario else ()):
        assert positive(m[metric]), (metric, m[metric])
    assert scenario not in results["targets"]["floor"] and scenario not in results["targets"]["direct"]
    assert "responses c=32" in stdout and "responses stream" in stdout


def test_the_long_stream_carries_400_text_deltas(quick: tuple[dict[str, Any], str]) -> None:
    results, _ = quick
    assert results["meta"]["long_stream"]["text_deltas"] == LONG_DELTAS
    for target in ("ours", "floor", "direct"):
        long, short = results["targets"][target]["long_stream"], results["targets"][target]["stream_c32"]
        # every stream of the run: one event per delta at least, plus the opening and closing ones
        assert long["raw"]["events_per_stream"]["min"] > LONG_DELTAS, target
        assert long["events_per_stream"] > 10 * short["events_per_stream"], target


def test_the_floor_relays_the_simulators_answers(quick: tuple[dict[str, Any], str]) -> None:
    results, _ = quick
    floor, direct = results["targets"]["floor"], results["targets"]["direct"]
    # the floor relays the upstream's bytes, so its streams carry exactly the simulator's events
    for scenario in ("stream_c1", "stream_c32", "long_stream"):
        relayed, sent = floor[scenario]["raw"]["events_per_stream"], direct[scenario]["raw"]["events_per_stream"]
        assert (relayed["min"], relayed["max"]) == (sent["min"], sent["max"]) == (sent["min"], sent["min"]), scenario
    assert "no auth" in results["meta"]["floor"]


def test_litellm_is_absent_when_skipped(quick: tuple[dict[str, Any], str]) -> None:
    results, _ = quick
    assert "litellm" not in results["targets"]
    row = results["comparisons"]["nonstream_c32"]["rps"]
    assert row["litellm"] is None and row["ours_over_litellm"] is None
    assert positive(row["ours_over_direct"])
    assert positive(row["ours_over_floor"])


def test_comparisons_divide_and_subtract(quick: tuple[dict[str, Any], str]) -> None:
    results, _ = quick
    for scenario in SCENARIOS:
        cpu = results["comparisons"][scenario]["cpu_ms_per_request"]
        assert cpu["ours"] == results["targets"]["ours"][scenario]["cpu_ms_per_request"]
        assert cpu["floor"] == results["targets"]["floor"][scenario]["cpu_ms_per_request"]
        assert cpu["ours_over_floor"] == pytest.approx(cpu["ours"] / cpu["floor"])
    row = results["comparisons"]["nonstream_c1"]["p50_ms"]
    assert row["ours_minus_direct"] == pytest.approx(row["ours"] - row["direct"])
    ttfb = results["comparisons"]["stream_c1"]["ttfb_p50_ms"]
    assert ttfb["ours_minus_direct"] == pytest.approx(ttfb["ours"] - ttfb["direct"])


def test_idle_streams_all_opened_and_pinged(quick: tuple[dict[str, Any], str]) -> None:
    results, _ = quick
    slow = results["slow_streams"]
    assert slow["streams"] == 100
    assert slow["opened"] == slow["ok"] == 100 and slow["errors"] == 0
    assert slow["keepalive_s"] == 1.0
    assert slow["pings_min_per_stream"] >= 1 and slow["pings"] >= 100
    for metric in ("rss_before_mb", "rss_open_mb", "max_gap_s", "steady_max_gap_s", "worker_cpu_ms_per_stream"):
        assert positive(slow[metric]), metric
    assert isinstance(slow["rss_per_stream_kb"], float)
    assert isinstance(slow["pings_on_time"], bool)


def test_twenty_image_urls_in_one_request(quick: tuple[dict[str, Any], str]) -> None:
    results, _ = quick
    img = results["images"]["ours"]
    assert img["urls"] == 20 and img["requests"] == img["ok"] == 1 and img["errors"] == 0
    assert img["image_server_requests"] == 20
    assert img["max_parallel_downloads"] >= 2
    assert positive(img["total_s_max"])


def test_goals_and_table(quick: tuple[dict[str, Any], str]) -> None:
    results, stdout = quick
    assert [g["id"] for g in results["goals"]] == list(GOALS)
    by_id = {g["id"]: g for g in results["goals"]}
    assert by_id["rps_vs_litellm"]["met"] is None  # LiteLLM skipped
    for goal in GOALS[1:]:
        assert isinstance(by_id[goal]["met"], bool), goal
        assert positive(by_id[goal]["measured"]), goal
    for text in (
        "non-stream c=1",
        "stream c=32",
        "long stream c=8",
        "events/stream",
        "ours/floor",
        "idle streams on ONE gateway worker",
        "image URLs",
        "performance targets, judged on this run",
        "ours/LiteLLM",
        "ours/direct",
        "ours−direct",
    ):
        assert text in stdout


def paired_ratio(results: dict[str, Any], name: str) -> float:
    """A paired measurement's figure, checked against its rounds: the two targets measured in
    alternation (base, other, other, base, then mirrored), the median of the rounds' CPU ratios."""
    pair = results["paired"][name]
    rounds = pair["rounds"]
    assert [r["order"] for r in rounds] == ["base other other base", "other base base other"]  # --quick: two
    for r in rounds:
        assert positive(r["base_cpu_ms"]) and positive(r["cpu_ms"]) and r["errors"] == 0
        assert r["ratio"] == pytest.approx(r["cpu_ms"] / r["base_cpu_ms"])
    ratio: float = pair["ratio"]
    assert ratio == pytest.approx(statistics.median(r["ratio"] for r in rounds))
    return ratio


def test_constraints_are_judged_on_this_run(quick: tuple[dict[str, Any], str]) -> None:
    results, stdout = quick
    assert [c["id"] for c in results["constraints"]] == list(CONSTRAINTS)
    by_id = {c["id"]: c for c in results["constraints"]}
    for no_litellm in ("rps_vs_litellm", "rps_vs_litellm_responses", "long_stream_vs_litellm"):
        assert by_id[no_litellm]["met"] is None, no_litellm
    for scenario in ("nonstream_c32", "stream_c32"):
        c = by_id[f"cpu_vs_floor_{scenario}"]
        ratio = paired_ratio(results, f"{scenario}_vs_floor")
        assert c["measured"] == ratio and c["met"] is (ratio <= 1.15)
        assert ("PASS" if c["met"] else "FAIL") + "  CPU per request vs the stack floor" in stdout
    for scenario in ("responses_c32", "responses_stream_c32"):
        c = by_id[f"cpu_{scenario}_vs_chat"]
        ratio = paired_ratio(results, f"{scenario}_vs_chat")
        assert c["measured"] == ratio and c["met"] is (ratio <= 1.15)
    assert "CPU per request, Responses vs chat completions" in stdout
    assert stdout.count("judged on the median of 2 paired rounds") == 4
    tail = stdout[stdout.index("constraints (ours vs LiteLLM, the stack floor and our chat endpoint)") :]
    assert tail.count("n/a") >= 3 and "target ≤ 1.15×" in tail and "target ≥ 6×" in tail
