"""The benchmark's one table, its ratios and its targets, from the results dict of run.py."""

from __future__ import annotations

from typing import Any

JSON_METRICS = (
    ("rps", "req/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("cpu_ms_per_request", "CPU ms/req"),
    ("errors", "errors"),
    ("foreign_cpu_pct", "others' CPU %"),
)
SSE_METRICS = (
    ("ttfb_p50_ms", "TTFB p50 ms"),
    ("ttfb_p99_ms", "TTFB p99 ms"),
    ("done_p50_ms", "[DONE] p50 ms"),
    ("done_p99_ms", "[DONE] p99 ms"),
    ("rps", "req/s"),
    ("cpu_ms_per_request", "CPU ms/req"),
    ("errors", "errors"),
    ("foreign_cpu_pct", "others' CPU %"),
)
LONG_METRICS = (*SSE_METRICS[:-2], ("events_per_stream", "events/stream"), *SSE_METRICS[-2:])
SCENARIO_TITLES = {
    "nonstream_c1": "non-stream c=1",
    "nonstream_c32": "non-stream c=32",
    "stream_c1": "stream c=1",
    "stream_c32": "stream c=32",
    "long_stream": "long stream c=8",
    "responses_c32": "responses c=32",
    "responses_stream_c32": "responses stream",
}
SSE_SCENARIOS = ("stream_c1", "stream_c32", "responses_stream_c32")
# Each Responses scenario and the chat completions scenario its CPU is held to.
RESPONSES_VS_CHAT = (("responses_c32", "nonstream_c32"), ("responses_stream_c32", "stream_c32"))
TARGET_NAMES = ("ours", "litellm", "floor", "direct")
NO_RATIO = ("errors", "foreign_cpu_pct", "events_per_stream")
RPS_VS_LITELLM = 6.0  # ours ≥ 6× LiteLLM's requests/s per worker (non-stream c=32)
CPU_VS_FLOOR = 1.15  # ours ≤ 1.15× the stack floor's CPU per request
RESPONSES_VS_CHAT_CPU = 1.15  # a Responses request ≤ 1.15× the CPU of the same chat completions request
LONG_STREAM_VS_LITELLM = 15.0  # LiteLLM's CPU per long stream ≥ 15× ours


def _metrics(scenario: str) -> tuple[tuple[str, str], ...]:
    if scenario == "long_stream":
        return LONG_METRICS
    return SSE_METRICS if scenario in SSE_SCENARIOS else JSON_METRICS


def ratio_of(a: float | None, b: float | None) -> float | None:
    """``a / b``; None when either is missing or ``b`` is 0 (run.py's paired rounds use it too)."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def comparisons(results: dict[str, Any]) -> dict[str, Any]:
    """Per scenario and metric: each target's value, ours/LiteLLM, ours/floor, ours/direct,
    ours − direct (ms)."""
    targets = results["targets"]
    out: dict[str, Any] = {}
    for scenario in SCENARIO_TITLES:
        rows: dict[str, Any] = {}
        for metric, _ in _metrics(scenario):
            values = {t: targets.get(t, {}).get(scenario, {}).get(metric) for t in TARGET_NAMES}
            row: dict[str, Any] = dict(values)
            if metric not in NO_RATIO:
                row["ours_over_litellm"] = ratio_of(values["ours"], values["litellm"])
                row["ours_over_floor"] = ratio_of(values["ours"], values["floor"])
                row["ours_over_direct"] = ratio_of(values["ours"], values["direct"])
            if metric.endswith("_ms") and values["ours"] is not None and values["direct"] is not None:
                row["ours_minus_direct"] = values["ours"] - values["direct"]
            rows[metric] = row
        out[scenario] = rows
    return out


def _goal(
    goal_id: str, text: str, target: str, measured: float | None, unit: str, met: bool | None, by: str
) -> dict[str, Any]:
    return {"id": goal_id, "goal": text, "target": target, "measured": measured, "unit": unit, "met": met, "by": by}


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The six performance targets, each judged on this run's figures (``met`` None: not measured)."""
    cmp = results["comparisons"]
    workers = results["meta"]["workers"]
    out = []

    rps = cmp["nonstream_c32"]["rps"]
    ratio = rps.get("ours_over_litellm")
    out.append(
        _goal(
            "rps_vs_litellm",
            f"requests/s per worker vs LiteLLM (non-stream c=32, {workers} worker(s) each)",
            "≥ 6×",
            ratio,
            "×",
            None if ratio is None else ratio >= 6,
            "" if ratio is None else _by(ratio, 6, "×", higher_is_better=True),
        )
    )

    for goal_id, scenario, metric, what in (
        ("added_p50", "nonstream_c1", "p50_ms", "added p50 latency, non-stream c=1"),
        ("added_ttfb", "stream_c1", "ttfb_p50_ms", "added time to first byte p50, stream c=1"),
    ):
        row = cmp[scenario][metric]
        ours, floor, direct = row.get("ours"), row.get("floor"), row.get("direct")
        added = None if None in (ours, floor, direct) else ratio_of(ours - direct, max(floor - direct, 1e-3))
        detail = "" if added is None else f"ours +{ours - direct:.2f} ms, floor +{floor - direct:.2f} ms over direct; "
        out.append(
            _goal(
                goal_id,
                f"{what} (ours − direct) vs the stack floor's (floor − direct)",
                "≤ 1.3×",
                added,
                "×",
                None if added is None else added <= 1.3,
                "" if added is None else detail + _by(added, 1.3, "×"),
            )
        )

    cpu = cmp["nonstream_c32"]["cpu_ms_per_request"].get("ours")
    out.append(
        _goal(
            "cpu_per_request",
            "CPU per request, non-stream c=32 (gunicorn tree: auth, limits, translation, ledger)",
            "≤ 1.6 ms",
            cpu,
            "ms",
            None if cpu is None else cpu <= 1.6,
            "" if cpu is None else _by(cpu, 1.6, " ms"),
        )
    )

    slow = results.get("slow_streams") or {}
    kb = slow.get("rss_per_stream_kb")
    complete = slow.get("opened") == slow.get("streams") and slow.get("errors") == 0
    met = None if kb is None else bool(kb < 64 and slow.get("pings_on_time") and complete)
    detail = ""
    if kb is not None:
        detail = (
            _by(kb, 64, " KB") + f"; max gap between pings {slow.get('steady_max_gap_s') or 0:.2f} s once all "
            f"were open, {slow.get('max_gap_s') or 0:.2f} s over the whole run (keepalive_s "
            f"{slow.get('keepalive_s')}); {slow.get('opened')}/{slow.get('streams')} open"
        )
    out.append(
        _goal(
            "idle_streams",
            f"{slow.get('streams', 1000)} idle streams on one worker: RSS per stream, pings on time",
            "< 64 KB, gap ≤ 1.5 × keepalive_s",
            kb,
            "KB",
            met,
            detail,
        )
    )

    img = (results.get("images") or {}).get("ours") or {}
    total = img.get("total_s_max")
    out.append(
        _goal(
            "images",
            "20 image URLs of 1 s each, one request (slowest of the repetitions)",
            "< 2 s",
            total,
            "s",
            None if total is None else bool(total < 2 and img.get("errors") == 0),
            "" if total is None else _by(total, 2.0, " s"),
        )
    )
    return out


def _verdict(ok: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[ok]


def constraints(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The performance constraints every change must keep, each judged on this run's figures:
    requests/s per worker ≥ 6× LiteLLM's (non-stream c=32, chat completions and Responses); CPU
    per request ≤ 1.15× the stack floor's (non-stream and stream, c=32); a long stream's CPU ≥ 15×
    less than LiteLLM's; a Responses request's CPU ≤ 1.15× the same chat completions request's.
    The two CPU ratios are judged on the paired measurements when the run made them
    (``_paired_or_single``). ``met`` is None when a figure was not measured (LiteLLM skipped)."""
    cmp = results["comparisons"]
    workers = results["meta"]["workers"]
    out = []

    for goal_id, scenario in (("rps_vs_litellm", "nonstream_c32"), ("rps_vs_litellm_responses", "responses_c32")):
        ratio = cmp.get(scenario, {}).get("rps", {}).get("ours_over_litellm")
        out.append(
            _goal(
                goal_id,
                f"requests/s per worker vs LiteLLM ({SCENARIO_TITLES[scenario]}, {workers} worker(s) each)",
                f"≥ {RPS_VS_LITELLM:g}×",
                ratio,
                "×",
                None if ratio is None else ratio >= RPS_VS_LITELLM,
                "" if ratio is None else _by(ratio, RPS_VS_LITELLM, "×", higher_is_better=True),
            )
        )
    paired = results.get("paired") or {}
    for scenario in ("nonstream_c32", "stream_c32"):
        row = cmp[scenario]["cpu_ms_per_request"]
        single = row.get("ours_over_floor")
        ratio, how = _paired_or_single(paired.get(f"{scenario}_vs_floor"), single)
        out.append(
            _goal(
                f"cpu_vs_floor_{scenario}",
                f"CPU per request vs the stack floor ({SCENARIO_TITLES[scenario]}: "
                f"ours {_fmt(row.get('ours'))} ms, floor {_fmt(row.get('floor'))} ms; {how})",
                f"≤ {CPU_VS_FLOOR:g}×",
                ratio,
                "×",
                None if ratio is None else ratio <= CPU_VS_FLOOR,
                "" if ratio is None else _by(ratio, CPU_VS_FLOOR, "×"),
            )
        )
    row = cmp["long_stream"]["cpu_ms_per_request"]
    less = ratio_of(row.get("litellm"), row.get("ours"))
    out.append(
        _goal(
            "long_stream_vs_litellm",
            f"CPU per long stream ({results['meta'].get('long_stream', {}).get('text_deltas', 400)} text deltas), "
            f"LiteLLM / ours (ours {_fmt(row.get('ours'))} ms, LiteLLM {_fmt(row.get('litellm'))} ms)",
            f"≥ {LONG_STREAM_VS_LITELLM:g}× less",
            less,
            "×",
            None if less is None else less >= LONG_STREAM_VS_LITELLM,
            "" if less is None else _by(less, LONG_STREAM_VS_LITELLM, "×", higher_is_better=True),
        )
    )
    for scenario, chat in RESPONSES_VS_CHAT:
        ours = cmp.get(scenario, {}).get("cpu_ms_per_request", {}).get("ours")
        base = cmp[chat]["cpu_ms_per_request"].get("ours")
        ratio, how = _paired_or_single(paired.get(f"{scenario}_vs_chat"), ratio_of(ours, base))
        out.append(
            _goal(
                f"cpu_{scenario}_vs_chat",
                f"CPU per request, Responses vs chat completions ({SCENARIO_TITLES[scenario]}: "
                f"{_fmt(ours)} ms, {SCENARIO_TITLES[chat]}: {_fmt(base)} ms; {how})",
                f"≤ {RESPONSES_VS_CHAT_CPU:g}×",
                ratio,
                "×",
                None if ratio is None else ratio <= RESPONSES_VS_CHAT_CPU,
                "" if ratio is None else _by(ratio, RESPONSES_VS_CHAT_CPU, "×"),
            )
        )
    return out


def _paired_or_single(pair: dict[str, Any] | None, single: float | None) -> tuple[float | None, str]:
    """The ratio a CPU constraint is judged on: the paired measurement's median (``run.paired``:
    the two targets in alternation), else the ratio of the two single runs; and how it was had."""
    if pair and pair.get("ratio") is not None:
        rounds = [r["ratio"] for r in pair["rounds"] if r.get("ratio") is not None]
        spread = f", rounds {min(rounds):.2f}–{max(rounds):.2f}×" if rounds else ""
        return pair["ratio"], (
            f"judged on the median of {len(pair['rounds'])} paired rounds{spread}; "
            f"the single runs above: {_fmt_ratio(single)}"
        )
    return single, "the single runs above"


def _by(value: float, limit: float, unit: str, higher_is_better: bool = False) -> str:
    gap = value - limit
    if higher_is_better:
        return f"met with {gap:+.2f}{unit} to spare" if gap >= 0 else f"missed by {-gap:.2f}{unit}"
    if gap <= 0:
        return f"met with {-gap:.2f}{unit} to spare"
    return f"missed by {gap:.2f}{unit} ({value / limit:.2f}× the target)"


def _fmt(value: Any, metric: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if metric == "rps":
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    return f"{value:.2f}" if abs(value) < 100 else f"{value:,.0f}"


def table(results: dict[str, Any]) -> str:
    meta = results["meta"]
    machine = meta["machine"]
    lt = meta.get("litellm") or {}
    plan = meta["plan"]
    lines = [
        f"ezat_compat benchmark, {meta['mode']} mode, {meta['workers']} worker(s) per gateway, {meta['started_at']}",
        f"machine: {machine['cpu_model']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}, load average at start "
        f"{', '.join(f'{x:.2f}' for x in machine['loadavg_at_start'])}",
        "LiteLLM: " + (f"proxy {lt.get('version')}, {lt.get('auth')}" if lt.get("used") else str(lt.get("note"))),
        f"each figure: {plan['duration_s']:g} s of load after {plan['warmup_s']:g} s of warm-up; loopback; "
        f"run took {meta.get('run_s', 0):.0f} s",
        "",
    ]
    header = (
        f"{'':17}{'':15}{'ours':>10}{'LiteLLM':>10}{'floor':>10}{'direct':>10}{'ours/LiteLLM':>14}"
        f"{'ours/floor':>12}{'ours/direct':>13}{'ours−direct':>13}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for scenario, title in SCENARIO_TITLES.items():
        rows = results["comparisons"][scenario]
        for i, (metric, label) in enumerate(_metrics(scenario)):
            row = rows[metric]
            ratio_l = row.get("ours_over_litellm")
            ratio_f = row.get("ours_over_floor")
            ratio_d = row.get("ours_over_direct")
            lines.append(
                f"{title if i == 0 else '':17}{label:15}{_fmt(row['ours'], metric):>10}"
                f"{_fmt(row['litellm'], metric):>10}{_fmt(row['floor'], metric):>10}{_fmt(row['direct'], metric):>10}"
                f"{_fmt_ratio(ratio_l) if metric not in NO_RATIO else '':>14}"
                f"{_fmt_ratio(ratio_f) if metric not in NO_RATIO else '':>12}"
                f"{_fmt_ratio(ratio_d) if metric not in NO_RATIO else '':>13}"
                f"{_fmt(row.get('ours_minus_direct')) if 'ours_minus_direct' in row else '':>13}"
            )
        lines.append("")
    slow = results.get("slow_streams")
    if slow:
        lines += [
            f"{slow['streams']:,} idle streams on ONE gateway worker (simulator stalls {slow['stall_s']:g} s, "
            f"keepalive_s = {slow['keepalive_s']:g}):",
            f"  open at once {slow['max_open']:,}/{slow['streams']:,} (all open after "
            f"{_fmt(slow['all_open_s'])} s), completed {slow['ok']:,}, errors {slow['errors']}",
            f"  worker RSS {slow['rss_before_mb']:.1f} MB -> {slow['rss_open_mb']:.1f} MB with all open: "
            f"{slow['rss_per_stream_kb']:.1f} KB per stream (peak {slow['rss_peak_per_stream_kb']:.1f} KB; the "
            f"simulator holding the same streams: {slow['sim_rss_per_stream_kb']:.1f} KB); worker CPU "
            f"{slow['worker_cpu_ms_per_stream']:.2f} ms per stream",
            f"  pings {slow['pings']:,} (at least {slow['pings_min_per_stream']} per stream); gap between events "
            f"once all were open: max {_fmt(slow['steady_max_gap_s'])} s, p99 {_fmt(slow['steady_p99_gap_s'])} s "
            f"(whole run, opening included: max {_fmt(slow['max_gap_s'])} s, p99 {_fmt(slow['p99_gap_s'])} s) "
            f"-> pings on time: {_fmt(slow['pings_on_time'])}",
            "",
        ]
    imgs = results.get("images") or {}
    if imgs:
        parts = []
        for name, img in imgs.items():
            parts.append(
                f"{name} {_fmt(img['total_s_p50'])} s (min {_fmt(img['total_s_min'])}, max "
                f"{_fmt(img['total_s_max'])}, {img['ok']}/{img['requests']} ok, "
                f"{img['max_parallel_downloads']} downloads at once)"
            )
            if img["errors"]:
                parts[-1] += f" [error: {img['raw']['error_samples'][0][:160]}]"
        urls = imgs[next(iter(imgs))]["urls"]
        lines += [f"{urls} image URLs that take 1 s each, in one request: " + "; ".join(parts), ""]
    lines.append("performance targets, judged on this run:")
    for goal in results.get("goals", []):
        verdict = {True: "MET", False: "MISSED", None: "n/a"}[goal["met"]]
        lines.append(
            f"  {verdict:7}{goal['goal']}: target {goal['target']}, measured "
            f"{_fmt(goal['measured'])}{'' if goal['unit'] in ('×',) else ' '}{goal['unit']}"
            f"{' — ' + goal['by'] if goal['by'] else ''}"
        )
    lines += ["", "constraints (ours vs LiteLLM, the stack floor and our chat endpoint), judged on this run:"]
    for goal in results.get("constraints", []):
        lines.append(
            f"  {_verdict(goal['met']):6}{goal['goal']}: target {goal['target']}, measured "
            f"{_fmt_ratio(goal['measured'])}{' — ' + goal['by'] if goal['by'] else ''}"
        )
    return "\n".join(lines)


def _fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"
