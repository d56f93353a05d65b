"""The console's charts: server-side SVG, pure functions of their data (no Flask, no I/O, no clock).

A chart is a ``Chart``: labels along the x axis (time buckets, oldest first) and one or more
``Series`` of values, one per label (stacked in a bar chart, one line each in a line chart).
``render_svg`` draws it as an inline ``<svg role="img">`` whose ``<title>`` names it and whose
``<desc>`` sums it up; ``table_of`` gives the same numbers as the rows of the table that follows
every chart (class ``chart-data``: what a screen reader reads). The SVG carries presentation
attributes and classes only (``fill=``, ``class=``), never ``style=``: the console's
Content-Security-Policy allows no inline styles; static/console.css sizes and colours the rest.

``stack_top`` folds many series into the largest few and an "Other" one; ``nice_scale`` picks the
y axis' top and step (1, 2, 2.5 or 5 times a power of ten); ``format_value`` writes a value as
money (integer micro-USD) or as a count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import floor, log10

from markupsafe import Markup, escape

USD = "usd"  # values are integer micro-USD
COUNT = "count"  # values are counts (requests, tokens)
UNITS = (USD, COUNT)
BAR, LINE = "bar", "line"
OTHER = "Other"
PALETTE_SIZE = 8  # series colours: classes s0..s7 (static/console.css), fill= as a fallback
PALETTE = ("#4f46e5", "#0ea5e9", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#ec4899", "#64748b")

# The drawing's own coordinates (the viewBox); CSS scales it to the page's width.
WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 14, 40
MAX_X_LABELS = 8


@dataclass(frozen=True, slots=True)
class Series:
    """One series: its name (an organisation, a model…) and a value per label of its chart."""

    name: str
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Chart:
    """A chart's data. ``id``: the element id of the ``<svg>`` (its title's id is derived from
    it); ``title``: what it shows ("Spend per day by organisation"); ``labels``: the x axis, one per
    bucket; ``series``: stacked (``BAR``) or drawn as lines (``LINE``); ``unit``: ``USD`` or
    ``COUNT``."""

    id: str
    title: str
    labels: tuple[str, ...]
    series: tuple[Series, ...]
    unit: str = COUNT
    kind: str = BAR

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if self.kind not in (BAR, LINE):
            raise ValueError(f"kind must be {BAR!r} or {LINE!r}, got {self.kind!r}")
        for series in self.series:
            if len(series.values) != len(self.labels):
                raise ValueError(
                    f"series {series.name!r} has {len(series.values)} values for {len(self.labels)} labels"
                )

    @property
    def totals(self) -> tuple[int, ...]:
        """Each label's sum over the series."""
        return tuple(sum(column) for column in zip(*(s.values for s in self.series), strict=True)) or tuple(
            0 for _ in self.labels
        )

    @property
    def empty(self) -> bool:
        return not any(any(s.values) for s in self.series)


# ---------------------------------------------------------------- numbers


def format_usd(micros: int) -> str:
    """Money for people: ``$1,234.56``; below a dollar four decimals (``$0.0123``), so that a
    day of small requests doesn't read as nothing; ``$0`` for zero."""
    if micros == 0:
        return "$0"
    sign = "-" if micros < 0 else ""
    dollars = abs(micros) / 1_000_000
    if dollars < 1:
        return f"{sign}${dollars:.4f}"
    return f"{sign}${dollars:,.2f}"


def format_count(value: int) -> str:
    """``1234567`` -> ``1,234,567``."""
    return f"{value:,}"


def format_short(value: float, unit: str) -> str:
    """An axis label: ``$1.2k``, ``3.5M``, ``$0.05``."""
    prefix = "$" if unit == USD else ""
    amount = value / 1_000_000 if unit == USD else value
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(amount) >= limit:
            return f"{prefix}{amount / limit:.3g}{suffix}"
    if unit == USD and 0 < abs(amount) < 1:
        return f"{prefix}{amount:.2g}"
    return f"{prefix}{amount:.3g}" if amount != int(amount) else f"{prefix}{int(amount)}"


def format_value(value: int, unit: str) -> str:
    """A value in full, as the chart's table writes it."""
    return format_usd(value) if unit == USD else format_count(value)


def nice_scale(largest: float, ticks: int = 4) -> tuple[float, float]:
    """The y axis' top and step for values up to ``largest``: about ``ticks`` steps of 1, 2, 2.5 or
    5 times a power of ten, the top at least ``largest`` (``(1, 0.25)`` for nothing to show)."""
    if largest <= 0:
        return 1.0, 0.25
    raw = largest / ticks
    power = 10 ** floor(log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        step = factor * power
        if step >= raw:
            break
    top = step * -(-largest // step)
    return float(top), float(step)


# ---------------------------------------------------------------- shaping data


def stack_top(named: Mapping[str, Sequence[int]], keep: int = 5) -> tuple[Series, ...]:
    """The ``keep`` series with the largest sums (largest first, ties by name), the rest summed
    into one "Other" series (absent when nothing was folded in). Series of equal length."""
    ranked = sorted(named.items(), key=lambda item: (-sum(item[1]), item[0]))
    kept = [Series(name, tuple(values)) for name, values in ranked[:keep]]
    rest = ranked[keep:]
    if rest:
        length = len(rest[0][1])
        summed = tuple(sum(values[i] for _, values in rest) for i in range(length))
        kept.append(Series(OTHER, summed))
    return tuple(kept)


def table_of(chart: Chart) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The chart's numbers as a table: the header (the x axis' name, each series, "Total" when
    there are several) and one row per label, values written in full."""
    several = len(chart.series) > 1
    header = ("When", *(s.name for s in chart.series), *(("Total",) if several else ()))
    rows = []
    for index, label in enumerate(chart.labels):
        values = [s.values[index] for s in chart.series]
        cells = [format_value(v, chart.unit) for v in values]
        if several:
            cells.append(format_value(sum(values), chart.unit))
        rows.append((label, *cells))
    return header, rows


def summary(chart: Chart) -> str:
    """One sentence for the chart's ``<desc>``: the total and the busiest label."""
    totals = chart.totals
    if chart.empty:
        return f"{chart.title}: nothing in this range."
    total = sum(totals)
    peak = max(range(len(totals)), key=lambda i: totals[i])
    return (
        f"{chart.title}: {format_value(total, chart.unit)} in all; the most, "
        f"{format_value(totals[peak], chart.unit)}, at {chart.labels[peak]}."
    )


def thinned(labels: Sequence[str], most: int = MAX_X_LABELS) -> list[int]:
    """The indexes of the x labels to write: every n-th so that at most ``most`` show, the last
    one always."""
    if not labels:
        return []
    every = max(1, -(-len(labels) // most))
    shown = list(range(0, len(labels), every))
    if shown[-1] != len(labels) - 1:
        if len(labels) - 1 - shown[-1] < every / 2 and len(shown) > 1:
            shown[-1] = len(labels) - 1
        else:
            shown.append(len(labels) - 1)
    return shown


# ---------------------------------------------------------------- drawing


def _n(value: float) -> str:
    """A coordinate, short: two decimals at most."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _colour(index: int) -> str:
    return PALETTE[index % PALETTE_SIZE]


def _axes(chart: Chart, top: float, step: float) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = ['<g class="chart-grid">']
    steps = round(top / step)
    for i in range(steps + 1):
        value = step * i
        y = TOP + plot_h - plot_h * value / top
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{_n(y)}" y2="{_n(y)}" stroke="#e2e8f0"/>')
        label = escape(format_short(value, chart.unit))
        parts.append(f'<text class="chart-tick" x="{LEFT - 8}" y="{_n(y + 4)}" text-anchor="end">{label}</text>')
    parts.append("</g>")
    count = len(chart.labels)
    slot = plot_w / max(count, 1)
    parts.append('<g class="chart-x">')
    for index in thinned(chart.labels):
        x = LEFT + slot * (index + 0.5)
        label = escape(chart.labels[index])
        parts.append(
            f'<text class="chart-tick" x="{_n(x)}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle">{label}</text>'
        )
    parts.append("</g>")
    return parts


def _bars(chart: Chart, top: float) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(chart.labels), 1)
    bar = max(1.0, slot * 0.7)
    parts = []
    for index, label in enumerate(chart.labels):
        base = 0
        x = LEFT + slot * index + (slot - bar) / 2
        for number, series in enumerate(chart.series):
            value = series.values[index]
            if value <= 0:
                continue
            y0 = TOP + plot_h - plot_h * base / top
            y1 = TOP + plot_h - plot_h * (base + value) / top
            tip = escape(f"{label} · {series.name}: {format_value(value, chart.unit)}")
            parts.append(
                f'<rect class="s{number % PALETTE_SIZE}" x="{_n(x)}" y="{_n(y1)}" width="{_n(bar)}" '
                f'height="{_n(max(y0 - y1, 0.5))}" fill="{_colour(number)}"><title>{tip}</title></rect>'
            )
            base += value
    return parts


def _lines(chart: Chart, top: float) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(chart.labels), 1)
    parts = []
    for number, series in enumerate(chart.series):
        points = [
            (LEFT + slot * (i + 0.5), TOP + plot_h - plot_h * value / top) for i, value in enumerate(series.values)
        ]
        path = " ".join(f"{_n(x)},{_n(y)}" for x, y in points)
        colour = _colour(number)
        parts.append(
            f'<polyline class="line s{number % PALETTE_SIZE}" points="{path}" fill="none" stroke="{colour}" '
            'stroke-width="2.5" stroke-linejoin="round" stroke-linecap="round"/>'
        )
        if len(points) <= 48:
            for (x, y), label, value in zip(points, chart.labels, series.values, strict=True):
                tip = escape(f"{label} · {series.name}: {format_value(value, chart.unit)}")
                parts.append(
                    f'<circle class="s{number % PALETTE_SIZE}" cx="{_n(x)}" cy="{_n(y)}" r="3" fill="{colour}">'
                    f"<title>{tip}</title></circle>"
                )
    return parts


def _legend(chart: Chart) -> list[str]:
    if len(chart.series) < 2:
        return []
    parts = ['<g class="chart-legend">']
    x: float = LEFT
    y = HEIGHT - 8
    for number, series in enumerate(chart.series):
        name = series.name if len(series.name) <= 24 else series.name[:23] + "…"
        parts.append(
            f'<rect class="s{number % PALETTE_SIZE}" x="{_n(x)}" y="{y - 9}" width="10" height="10" rx="2" '
            f'fill="{_colour(number)}"/>'
        )
        parts.append(f'<text class="chart-legend-label" x="{_n(x + 14)}" y="{y}">{escape(name)}</text>')
        x += 22 + 6.5 * len(name)
        if x > WIDTH - 80:
            break
    parts.append("</g>")
    return parts


def render_svg(chart: Chart) -> Markup:
    """The chart as an inline ``<svg role="img">`` (its ``<title>`` first, then a ``<desc>``
    summing it up): grid and y ticks, x labels (thinned), stacked bars or lines, a legend when there
    are several series. Every text is escaped."""
    largest = (
        max(chart.totals, default=0)
        if chart.kind == BAR
        else max((max(s.values, default=0) for s in chart.series), default=0)
    )
    top, step = nice_scale(largest)
    title_id = f"{chart.id}-title"
    desc_id = f"{chart.id}-desc"
    parts = [
        f'<svg id="{escape(chart.id)}" class="chart chart-{chart.kind}" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'preserveAspectRatio="xMidYMid meet" aria-labelledby="{escape(title_id)} {escape(desc_id)}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{escape(title_id)}">{escape(chart.title)}</title>',
        f'<desc id="{escape(desc_id)}">{escape(summary(chart))}</desc>',
        *_axes(chart, top, step),
    ]
    if chart.empty:
        parts.append(
            f'<text class="chart-empty" x="{(WIDTH + LEFT) // 2}" y="{HEIGHT // 2}" text-anchor="middle">'
            "No usage in this range</text>"
        )
    else:
        parts.extend(_bars(chart, top) if chart.kind == BAR else _lines(chart, top))
    parts.extend(_legend(chart))
    parts.append("</svg>")
    return Markup("".join(parts))
