"""The console's pure parts, by tables: the SVG charts (console/charts.py), the shaping of rollup
rows into charts and the parsing of the usage filters (console/queries.py), and the pages' client
snippets and base URL (console/pages.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from ezat_compat.console import charts, pages, queries
from ezat_compat.console.charts import BAR, COUNT, LINE, OTHER, USD, Chart, Series
from ezat_compat.domain import Deployment, Model, Price
from ezat_compat.store.rollup import Total

T0 = datetime(2026, 12, 7, tzinfo=UTC)


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        pytest.param(0, "$0", id="zero"),
        pytest.param(12_300, "$0.0123", id="below-a-dollar-four-decimals"),
        pytest.param(999_999, "$1.0000", id="rounds-within-four-decimals"),
        pytest.param(1_000_000, "$1.00", id="a-dollar"),
        pytest.param(1_234_567_890, "$1,234.57", id="thousands"),
        pytest.param(-2_500_000, "-$2.50", id="negative"),
    ],
)
def test_money_is_written_for_people(micros: int, text: str) -> None:
    assert charts.format_usd(micros) == text


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        pytest.param(0, COUNT, "0", id="zero"),
        pytest.param(15, COUNT, "15", id="count"),
        pytest.param(2_500, COUNT, "2.5k", id="thousands"),
        pytest.param(3_000_000, COUNT, "3M", id="millions"),
        pytest.param(250_000, USD, "$0.25", id="cents"),
        pytest.param(12_000_000, USD, "$12", id="dollars"),
        pytest.param(1_500_000_000, USD, "$1.5k", id="thousand-dollars"),
    ],
)
def test_axis_labels_are_short(value: int, unit: str, text: str) -> None:
    assert charts.format_short(value, unit) == text


@pytest.mark.parametrize(
    ("largest", "top", "step"),
    [
        pytest.param(0, 1.0, 0.25, id="nothing"),
        pytest.param(1, 1.0, 0.25, id="one"),
        pytest.param(7, 8.0, 2.0, id="seven"),
        pytest.param(15, 15.0, 5.0, id="fifteen-exactly"),
        pytest.param(99, 100.0, 25.0, id="just-under-a-hundred"),
        pytest.param(101, 150.0, 50.0, id="just-over-a-hundred"),
        pytest.param(3_140_000, 4_000_000.0, 1_000_000.0, id="money"),
    ],
)
def test_the_y_axis_is_nice(largest: float, top: float, step: float) -> None:
    assert charts.nice_scale(largest) == (top, step)
    assert top >= largest


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        pytest.param(0, [], id="none"),
        pytest.param(3, [0, 1, 2], id="few-all"),
        pytest.param(8, list(range(8)), id="eight-all"),
        pytest.param(24, [0, 3, 6, 9, 12, 15, 18, 21, 23], id="hours-every-third-and-the-last"),
        pytest.param(30, [0, 4, 8, 12, 16, 20, 24, 29], id="days-last-replaces-a-close-one"),
    ],
)
def test_x_labels_are_thinned(count: int, shown: list[int]) -> None:
    assert charts.thinned([str(i) for i in range(count)]) == shown


# ---------------------------------------------------------------- shaping


def test_the_largest_series_are_kept_and_the_rest_is_other() -> None:
    named = {"a": [1, 1], "b": [5, 0], "c": [0, 3], "d": [2, 2], "e": [0, 0]}
    series = charts.stack_top(named, keep=2)
    assert series == (Series("b", (5, 0)), Series("d", (2, 2)), Series(OTHER, (1, 4)))
    assert charts.stack_top({"x": [1], "y": [1]}, keep=2) == (Series("x", (1,)), Series("y", (1,)))


def test_a_chart_refuses_series_of_another_length() -> None:
    with pytest.raises(ValueError, match="2 values for 3 labels"):
        Chart("c", "t", ("a", "b", "c"), (Series("s", (1, 2)),))
    with pytest.raises(ValueError, match="unit"):
        Chart("c", "t", (), (), unit="euro")


def test_the_data_table_has_a_row_per_label_and_a_total_per_row() -> None:
    chart = Chart("c", "Spend", ("01 Dec", "02 Dec"), (Series("a", (1_000_000, 0)), Series("b", (500, 2))), USD)
    header, rows = charts.table_of(chart)
    assert header == ("When", "a", "b", "Total")
    assert rows == [("01 Dec", "$1.00", "$0.0005", "$1.00"), ("02 Dec", "$0", "$0.0000", "$0.0000")]
    single = Chart("c", "Requests", ("x",), (Series("all", (1234,)),))
    assert charts.table_of(single) == (("When", "all"), [("x", "1,234")])


# ---------------------------------------------------------------- drawing


def _chart(kind: str = BAR, series: tuple[Series, ...] | None = None) -> Chart:
    labels = tuple(f"{h:02d}:00" for h in range(6))
    return Chart(
        "requests-chart",
        "Requests <per> hour & model",
        labels,
        series or (Series("m<1>", (1, 2, 0, 4, 0, 6)), Series("m2", (0, 1, 1, 1, 0, 0))),
        COUNT,
        kind,
    )


@pytest.mark.parametrize("kind", [BAR, LINE])
def test_the_svg_is_an_accessible_image_without_inline_styles(kind: str) -> None:
    svg = str(charts.render_svg(_chart(kind)))
    assert svg.startswith('<svg id="requests-chart" class="chart chart-' + kind + '" role="img"')
    assert '<title id="requests-chart-title">Requests &lt;per&gt; hour &amp; model</title>' in svg
    assert 'aria-labelledby="requests-chart-title requests-chart-desc"' in svg
    assert "<desc" in svg and "16 in all" in svg and "the most, 6, at 05:00" in svg
    assert "style=" not in svg and "<script" not in svg
    assert "m&lt;1&gt;" in svg and "m<1>" not in svg
    assert svg.endswith("</svg>")


def test_bars_are_stacked_per_label() -> None:
    svg = str(charts.render_svg(_chart(BAR)))
    bars = re.findall(r'<rect class="s(\d)" x="([\d.]+)" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"', svg)
    # 4 non-zero values in m<1>, 3 in m2 (the legend's two squares have no height attribute of this form)
    assert len([b for b in bars if float(b[3]) > 0]) >= 7
    assert {b[0] for b in bars} == {"0", "1"}


def test_an_empty_chart_says_so() -> None:
    chart = _chart(series=(Series("m", (0,) * 6),))
    svg = str(charts.render_svg(chart))
    assert "No usage in this range" in svg and "<rect" not in svg
    assert charts.summary(chart).endswith("nothing in this range.")


def test_a_line_chart_draws_a_polyline_per_series() -> None:
    svg = str(charts.render_svg(_chart(LINE)))
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 12


# ---------------------------------------------------------------- rollup rows into charts


def _total(hour: int, org: int, model: str, requests: int, cost: int) -> Total:
    return Total(T0 + timedelta(hours=hour), org, None, model, requests, 10, 0, 0, 5, cost)


def test_rollup_rows_become_a_chart_by_dimension() -> None:
    buckets = queries.bucket_labels(T0, T0 + timedelta(hours=3), "1h")
    assert [label for _at, label in buckets] == ["00:00", "01:00", "02:00"]
    rows = [_total(0, 1, "m1", 2, 100), _total(0, 2, "m1", 1, 50), _total(2, 1, "", 4, 0), _total(9, 1, "m1", 7, 7)]
    chart = queries.chart_of(
        rows, buckets, chart_id="c", title="t", metric="requests", dimension="org", name_of={1: "team-a", 2: "team-b"}
    )
    assert chart.series == (Series("team-a", (2, 0, 4)), Series("team-b", (1, 0, 0)))
    by_model = queries.chart_of(rows, buckets, chart_id="c", title="t", metric="spend", dimension="model")
    assert by_model.unit == USD and by_model.series == (Series("m1", (150, 0, 0)), Series(queries.NO_MODEL, (0, 0, 0)))
    nothing = queries.chart_of([], buckets, chart_id="c", title="t", metric="tokens", dimension="model")
    assert nothing.empty and len(nothing.series) == 1


def test_sums_by_rank_by_spend_then_requests() -> None:
    rows = [_total(0, 1, "a", 1, 100), _total(1, 1, "b", 5, 100), _total(1, 2, "a", 1, 300)]
    assert [(n, s.cost_micros, s.requests) for n, s in queries.sums_by(rows, None, "model")] == [
        ("a", 400, 2),
        ("b", 100, 5),
    ]


def test_day_labels_span_several_days() -> None:
    days = queries.bucket_labels(T0, T0 + timedelta(days=2), "1d")
    assert [label for _at, label in days] == ["07 Dec", "08 Dec"]
    hours = queries.bucket_labels(T0, T0 + timedelta(days=2), "1h")
    assert hours[25][1] == "08 Dec 01:00"


# ---------------------------------------------------------------- the usage filter


@pytest.mark.parametrize(
    ("given_from", "given_to", "start", "end"),
    [
        pytest.param("", "", "2026-12-01", "2026-12-08", id="default-last-seven-days"),
        pytest.param("2026-12-05", "2026-12-05", "2026-12-05", "2026-12-06", id="one-day"),
        pytest.param("", "2026-11-30", "2026-11-24", "2026-12-01", id="seven-days-up-to-to"),
    ],
)
def test_the_range_is_whole_utc_days_both_ends_included(given_from: str, given_to: str, start: str, end: str) -> None:
    now = T0 + timedelta(hours=15)
    assert queries.parse_range(given_from, given_to, now) == (
        datetime.fromisoformat(start).replace(tzinfo=UTC),
        datetime.fromisoformat(end).replace(tzinfo=UTC),
    )


@pytest.mark.parametrize(
    ("given_from", "given_to", "message"),
    [
        pytest.param("yesterday", "", "from: 'yesterday' is not a date", id="not-a-date"),
        pytest.param("2026-12-05", "2026-12-01", "on or before", id="reversed"),
        pytest.param("2020-01-01", "2026-12-01", "at most 400 days", id="too-long"),
    ],
)
def test_a_bad_range_is_refused(given_from: str, given_to: str, message: str) -> None:
    with pytest.raises(queries.FilterError, match=message):
        queries.parse_range(given_from, given_to, T0)


@pytest.mark.parametrize(
    ("text", "status"),
    [("", None), ("ok", "ok"), ("ERROR", "error"), ("429", "429"), (" 503 ", "503")],
)
def test_status_filters(text: str, status: str | None) -> None:
    assert queries.parse_status(text) == status


@pytest.mark.parametrize("text", ["teapot", "42", "999", "4299"])
def test_bad_status_filters_are_refused(text: str) -> None:
    with pytest.raises(queries.FilterError, match="status"):
        queries.parse_status(text)


def test_the_chart_is_by_hour_up_to_two_days() -> None:
    assert queries.UsageFilter(T0, T0 + timedelta(days=2)).width == "1h"
    assert queries.UsageFilter(T0, T0 + timedelta(days=3)).width == "1d"


@pytest.mark.parametrize(
    ("text", "cursor"),
    [
        ("1765000000000000.42", (1765000000000000, 42)),
        ("", None),
        ("abc.1", None),
        ("1.", None),
        ("-1.2", None),
        ("1" * 25 + ".1", None),
    ],
)
def test_page_cursors(text: str, cursor: tuple[int, int] | None) -> None:
    assert queries.parse_cursor(text) == cursor


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ("team-a", "team-a"),
        ("=HYPERLINK(1)", "'=HYPERLINK(1)"),
        ("+1", "'+1"),
        ("-cmd", "'-cmd"),
        ("@sum", "'@sum"),
        (12, "12"),
        (None, ""),
    ],
)
def test_csv_cells_are_never_formulas(value: object, cell: str) -> None:
    assert queries.csv_cell(value) == cell


# ---------------------------------------------------------------- the audit trail, metrics


@pytest.mark.parametrize(
    ("before", "after", "found"),
    [
        pytest.param(None, {"a": 1}, ["created"], id="created"),
        pytest.param({"a": 1}, None, ["deleted"], id="deleted"),
        pytest.param({"a": 1, "b": [1]}, {"a": 2, "b": [1]}, ["a: 1 → 2"], id="one-field"),
        pytest.param({"m": []}, {"m": ["x"], "n": None}, ['m: [] → ["x"]'], id="lists-and-absent-none"),
        pytest.param({"s": "x"}, {"s": None}, ["s: x → none"], id="to-none"),
    ],
)
def test_audit_changes_are_told_field_by_field(before: object, after: object, found: list[str]) -> None:
    assert queries.changes(before, after) == found


@pytest.mark.parametrize(
    ("q", "value"),
    [(0.25, 0.3), (0.5, 0.5), (0.95, 0.95), (1.0, 1.0)],
)
def test_latency_quantiles_from_histogram_buckets(q: float, value: float) -> None:
    buckets = [(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (float("inf"), 20.0)]
    assert queries.quantile(buckets, q) == pytest.approx(value)
    assert queries.quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_signals_count_inference_answers_and_failovers_only() -> None:
    samples = [
        ("ezat_requests_total", {"route": "chat", "model": "m", "deployment": "d1", "status": "200"}, 8.0),
        ("ezat_requests_total", {"route": "chat", "model": "m", "deployment": "d1", "status": "502"}, 2.0),
        ("ezat_requests_total", {"route": "chat", "model": "m", "deployment": "-", "status": "401"}, 1.0),
        (
            "ezat_requests_total",
            {"route": "console_pages.overview", "model": "-", "deployment": "-", "status": "200"},
            50.0,
        ),
        ("ezat_failovers_total", {"model": "m", "deployment": "d1", "reason": "529"}, 3.0),
        ("gen_ai_server_request_duration_seconds_bucket", {"route": "chat", "le": "0.5"}, 5.0),
        ("gen_ai_server_request_duration_seconds_bucket", {"route": "chat", "le": "+Inf"}, 11.0),
        ("gen_ai_server_request_duration_seconds_bucket", {"route": "console_pages.usage", "le": "0.5"}, 99.0),
    ]
    found = queries.signals_of(samples)
    assert (found.answers, found.client_errors, found.server_errors, found.failovers) == (11, 1, 2, 3)
    assert found.failovers_by == (("m", "d1", "529", 3),)
    assert found.by_deployment == {("m", "d1"): (10, 2)}
    assert found.p50_s == pytest.approx(0.5)


def test_deployment_states() -> None:
    model = Model(
        "m",
        (),
        Price(Decimal(3), Decimal(15), Decimal(3), Decimal(0)),
        (
            Deployment("d1", "https://user:pw@api.example.com/v1", "u"),
            Deployment("d2", "https://other.example.com", "u", api_key_env="NOT_SET_HERE"),
            Deployment("d3", "https://third.example.com", "u", api_key_env="SET_HERE"),
        ),
    )
    signals = queries.Signals(failovers_by=(("m", "d1", "529", 2),), by_deployment={("m", "d1"): (7, 1)})
    states = queries.deployment_states([model], ["m/d1"], {"m/d1": 12.34}, signals, environ={"SET_HERE": "x"})
    assert [(s.name, s.state, s.wait_s, s.host, s.answers, s.failovers) for s in states] == [
        ("d1", "cooling", 12.3, "api.example.com", 7, 2),
        ("d2", "no key", 0.0, "other.example.com", 0, 0),
        ("d3", "healthy", 0.0, "third.example.com", 0, 0),
    ]


# ---------------------------------------------------------------- the snippets


@pytest.mark.parametrize(
    ("public_url", "bind", "host", "base"),
    [
        pytest.param("https://llm.example.com/", "127.0.0.1:8080", "x", "https://llm.example.com", id="public-url"),
        pytest.param("", "127.0.0.1:8080", "admin:8081", "http://127.0.0.1:8080", id="bind"),
        pytest.param("", "0.0.0.0:8080", "gw.internal:8081", "http://gw.internal:8080", id="wildcard-host-of-request"),
        pytest.param("", "unix:/run/ezat.sock", "x", "http://127.0.0.1:8080", id="unix-socket"),
    ],
)
def test_the_snippets_base_url(public_url: str, bind: str, host: str, base: str) -> None:
    assert pages.public_base_url(public_url, bind, host) == base


@pytest.mark.parametrize(
    ("patterns", "configured", "model"),
    [
        pytest.param((), ("a/x", "a/y"), "a/x", id="any-model-first-configured"),
        pytest.param(("a/y*",), ("a/x", "a/y"), "a/y", id="first-allowed"),
        pytest.param(("b/z",), ("a/x",), "b/z", id="a-plain-pattern"),
        pytest.param(("b/*",), ("a/x",), "a/x", id="a-glob-matching-nothing"),
        pytest.param((), (), pages.EXAMPLE_MODEL, id="no-configuration"),
    ],
)
def test_the_snippets_model(patterns: tuple[str, ...], configured: tuple[str, ...], model: str) -> None:
    assert pages.snippet_model(patterns, configured) == model


def test_the_snippets_carry_the_secret_and_base_url() -> None:
    snippets = pages.client_snippets("http://gw:8080", "ezat_sk_abc", "a/x")
    assert [s[0] for s in snippets] == ["snippet-curl", "snippet-openai", "snippet-anthropic"]
    for _id, _title, text in snippets:
        assert "ezat_sk_abc" in text and "http://gw:8080" in text and "a/x" in text
    assert 'base_url="http://gw:8080/openai/v1"' in snippets[1][2]


@pytest.mark.parametrize(
    ("text", "found"),
    [("", None), ("80, 100", [80, 100]), ("50 90", [50, 90])],
)
def test_thresholds_from_a_form(text: str, found: list[int] | None) -> None:
    assert pages.parse_thresholds(text) == found


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="whole percentages"):
        pages.parse_thresholds("80%, lots")
