"""The admin API's usage and cost reports over 10 million ledger rows, on SQLite and PostgreSQL.

    python bench/reports.py [--rows 10000000] [--backends sqlite,postgresql]
                            [--postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
                            [--repeat 5] [--keep]

For each backend: a new database (SQLite: a file in a temporary folder; PostgreSQL: a scratch
schema ``ezat_bench_reports_<hex>`` in the given database, dropped at the end unless ``--keep``)
migrated to this release's schema; 10 organisations (workspaces) with 10 keys each; then
``--rows`` ledger rows spread evenly over the 31 days before today (UTC), written by the database
itself in chunks of a million (SQLite: a recursive CTE; PostgreSQL: ``generate_series``): each key
uses 3 of 6 models, token counts and costs vary row by row, one row in 97 is a failed request at
no cost. Then:

1. the rollup is built from nothing (``Rollup.catch_up``: what the fold job does after an upgrade),
   timed; on PostgreSQL then ``VACUUM (ANALYZE)`` of the ledger and the rollup (what autovacuum does
   within minutes of a bulk load: the figures are the steady state's);
2. each report below is answered as a request would be (``admin.reports.report``: the fold of what
   is new, the SQL, the ids' lookup, the rows' shapes, then the JSON body) once, then ``--repeat``
   times more; the first time, the median and the slowest of the others are printed, against the
   0.5 s target;
3. a background fold of one batch of new rows (``FOLD_BATCH``: what the fold loop takes at a time) is timed;
4. the 31-day totals of the reports are checked against the ledger's own sums (exact).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, make_url, text
from werkzeug.datastructures import MultiDict

from ezat_compat.admin.reports import COST, USAGE, encoded, report
from ezat_compat.store.db import make_engine, migrate
from ezat_compat.store.rollup import FOLD_BATCH, Rollup
from ezat_compat.store.store import Store, open_store
from ezat_compat.store.tables import to_epoch_micros

ORGS, KEYS_PER_ORG = 10, 10
MODELS = ("claude-opus-5", "claude-sonnet-5-5", "claude-haiku-5", "claude-sonnet-4-5", "claude-opus-4-8", "claude-x")
CHUNK = 1_000_000
ROLLUPS = ("usage_1m", "usage_1h", "usage_1d")
TARGET_S = 0.5
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _row_sql(first: str, source: str, keys: int, start_us: int, span_us: int, rows: int) -> str:
    """``INSERT … SELECT`` of ledger rows numbered ``i`` from ``source`` (a row source with a
    column ``i``), each a pure function of ``i``; ``first``: what comes before (a CTE)."""
    key = f"((i * 7919) % {keys})"  # 0..keys-1, spread over the range
    model = f"(({key} + (i % 3) * 2) % {len(MODELS)})"  # each key uses 3 of the models
    model_name = "CASE " + " ".join(f"WHEN {model} = {n} THEN '{m}'" for n, m in enumerate(MODELS)) + " END"
    failed = "(i % 97 = 0)"
    ok = f"(CASE WHEN {failed} THEN 0 ELSE 1 END)"
    inp, write = (
        f"({ok} * (100 + (i * 37) % 4000))",
        f"({ok} * ((i * 13) % 2000) * (CASE WHEN i % 5 = 0 THEN 1 ELSE 0 END))",
    )
    read = f"({ok} * ((i * 17) % 3000) * (CASE WHEN i % 3 = 0 THEN 1 ELSE 0 END))"
    out = f"({ok} * (50 + (i * 29) % 1500))"
    cost = f"({inp} * 3 + {write} * 4 + {read} / 3 + {out} * 15)"
    created = f"({start_us} + (i - 1) * {span_us // rows} + (i * 104729) % {span_us // rows})"
    return (
        f"{first} INSERT INTO ledger (request_id, created_at, org_id, key_id, endpoint, model, canonical_model, "
        "deployment, input_tokens, cache_write_tokens, cache_read_tokens, output_tokens, reasoning_tokens, "
        "cost_micros, status, estimated) "
        f"SELECT 'bench_' || CAST(i AS TEXT), {created}, ({key} / {KEYS_PER_ORG}) + 1, {key} + 1, 'messages', "
        f"{model_name}, CASE WHEN {failed} THEN '' ELSE {model_name} END, 'sim', {inp}, {write}, {read}, {out}, 0, "
        f"{cost}, CASE WHEN {failed} THEN 500 ELSE 200 END, {'false' if 'generate_series' in source else '0'} "
        f"FROM {source}"
    )


def fill(engine: Engine, rows: int, start: datetime, span: timedelta) -> float:
    """The organisations, keys and ``rows`` ledger rows; returns the seconds the rows took."""
    pg = engine.dialect.name == "postgresql"
    with engine.begin() as conn:
        created = to_epoch_micros(start)
        for org in range(1, ORGS + 1):
            conn.execute(
                text(
                    "INSERT INTO orgs (id, name, balance_micros, reserved_micros, suspended, created_at, public_id, "
                    "models) VALUES (:id, :name, 0, 0, :no, :at, :public, '')"
                ),
                {"id": org, "name": f"team-{org}", "no": False, "at": created, "public": f"wrkspc_01bench{org:017d}"},
            )
        for key in range(1, ORGS * KEYS_PER_ORG + 1):
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, public_id, org_id, name, prefix, key_hash, models, spent_micros, "
                    "reserved_micros, created_at) VALUES (:id, :public, :org, '', 'ezat_sk_x', :hash, '', 0, 0, :at)"
                ),
                {
                    "id": key,
                    "public": f"key_{key:012x}",
                    "org": (key - 1) // KEYS_PER_ORG + 1,
                    "hash": f"{key:064x}",
                    "at": created,
                },
            )
    started = time.perf_counter()
    start_us, span_us = to_epoch_micros(start), int(span.total_seconds() * 1_000_000)
    for lo in range(1, rows + 1, CHUNK):
        hi = min(rows, lo + CHUNK - 1)
        if pg:
            statement = _row_sql(
                "",
                f"generate_series(CAST({lo} AS BIGINT), CAST({hi} AS BIGINT)) AS s(i)",
                ORGS * KEYS_PER_ORG,
                start_us,
                span_us,
                rows,
            )
        else:
            cte = f"WITH RECURSIVE s(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM s WHERE i < {hi})"
            statement = _row_sql(cte, "s", ORGS * KEYS_PER_ORG, start_us, span_us, rows)
        with engine.begin() as conn:
            conn.execute(text(statement))
        print(f"  {hi:>11,} ledger rows ({time.perf_counter() - started:.0f} s)", flush=True)
    if pg:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    return time.perf_counter() - started


def _encoded(body: dict[str, Any]) -> bytes:
    """The body as the view sends it."""
    return encoded(body)


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, float, float, Any]:
    """Seconds of the first call (cold: the database's and the process's caches not yet warm for
    this report), then the median and the slowest of ``repeat`` more, and the last answer."""
    started = time.perf_counter()
    answer = call()
    first = time.perf_counter() - started
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        answer = call()
        seconds.append(time.perf_counter() - started)
    return first, statistics.median(seconds), max(seconds), answer


def reports(start: datetime, end: datetime, keys_by_id: list[str]) -> list[tuple[str, str, bool, dict[str, Any]]]:
    """(name, kind, legacy, query) of each report measured."""

    def z(moment: datetime) -> str:
        return moment.isoformat().replace("+00:00", "Z")

    month = {"starting_at": z(start), "ending_at": z(end)}
    week = {"starting_at": z(end - timedelta(days=7)), "ending_at": z(end)}
    day = {"starting_at": z(end - timedelta(days=1)), "ending_at": z(end)}
    by_model, by_key = {"group_by[]": ["model"]}, {"group_by[]": ["api_key_id"]}
    legacy_days = {**month, "bucket_width": "1d", "limit": "31"}
    hours = {**month, "time_bucket_width": "1h"}
    return [
        ("usage_report 1d × 31, by model", USAGE, True, {**legacy_days, **by_model}),
        ("cost_report 1d × 31, by model", COST, True, {**legacy_days, **by_model}),
        ("usage_report 1h × 168 (7 days), by model", USAGE, True,
         {**week, "bucket_width": "1h", "limit": "168", **by_model}),
        ("cost_report 1h × 24 (a default page), by api key", COST, True, {**day, "bucket_width": "1h", **by_key}),
        ("cost_report 1h × 168 (the largest page), by api key", COST, True,
         {**week, "bucket_width": "1h", "limit": "168", **by_key}),
        ("cost_report 1m × 256, by workspace", COST, True,
         {**day, "bucket_width": "1m", "limit": "256", "group_by[]": ["workspace_id"]}),
        ("usage 1d × 31, by model", USAGE, False, {**month, "time_bucket_width": "1d", **by_model, "limit": "1000"}),
        ("cost 1d × 31, by model", COST, False, {**month, "time_bucket_width": "1d", **by_model, "limit": "1000"}),
        ("usage 1h × 744 (31 days), by api key", USAGE, False, {**hours, **by_key}),
        ("cost 1h × 744, by workspace and model", COST, False, {**hours, "group_by[]": ["workspace_id", "model"]}),
        ("cost 1h × 744, by api key, order_by time", COST, False,
         {**hours, **by_key, "order_by": "time", "limit": "1000"}),
        ("usage 31 days in one row per api key", USAGE, False, {**month, **by_key, "limit": "1000"}),
        ("cost 31 days, by workspace, one key", COST, False,
         {**month, "group_by[]": ["workspace_id"], "api_key_ids[]": [keys_by_id[7]]}),
        ("usage 1m × 1440 (24 h), by model", USAGE, False, {**day, "time_bucket_width": "1m", **by_model}),
    ]  # fmt: skip


def check_exact(store: Store, engine: Engine, start: datetime, end: datetime) -> str:
    """The 31-day legacy reports' sums against the ledger's."""
    args = {"starting_at": start.isoformat(), "ending_at": end.isoformat(), "bucket_width": "1d", "limit": "31"}
    usage = report(store, MultiDict(args), kind=USAGE, legacy=True)
    cost = report(store, MultiDict(args), kind=COST, legacy=True)
    got = [0, 0, 0, 0, 0]
    for bucket in usage["data"]:
        for r in bucket["results"]:
            writes = r["cache_creation"]["ephemeral_5m_input_tokens"]
            values = (
                r["requests"],
                r["uncached_input_tokens"],
                writes,
                r["cache_read_input_tokens"],
                r["output_tokens"],
            )
            got = [a + b for a, b in zip(got, values, strict=True)]
    cents = sum((Decimal(r["amount"]) for b in cost["data"] for r in b["results"]), Decimal(0))
    with engine.connect() as conn:
        want = conn.execute(
            text(
                "SELECT COUNT(*), SUM(input_tokens), SUM(cache_write_tokens), SUM(cache_read_tokens), "
                "SUM(output_tokens), SUM(cost_micros) FROM ledger WHERE created_at >= :a AND created_at < :b"
            ),
            {"a": to_epoch_micros(start), "b": to_epoch_micros(end)},
        ).one()
    exact = got == [int(v) for v in want[:5]] and cents == Decimal(int(want[5])) / 10_000
    return f"{'exact' if exact else 'MISMATCH'}: {got[0]:,} requests, {sum(got[1:]):,} tokens, ${cents / 100:,.2f}"


def run_backend(name: str, url: str, rows: int, repeat: int) -> list[str]:
    """Fill, build, measure one backend; the Markdown table's lines."""
    engine = make_engine(url)
    migrate(engine)
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start = end - timedelta(days=31)
    print(f"{name}: filling {rows:,} ledger rows", flush=True)
    fill_s = fill(engine, rows, start, end - start)
    store = open_store(url)
    assert store.rollup is not None
    try:
        started = time.perf_counter()
        assert store.rollup.catch_up(max_rows=rows * 2)
        build_s = time.perf_counter() - started
        if engine.dialect.name == "postgresql":
            # What autovacuum does within minutes of a bulk load (else it runs during the figures).
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM (ANALYZE) ledger, usage_1m, usage_1h, usage_1d"))
        with engine.connect() as conn:
            sizes = {t: conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar() for t in ROLLUPS}
        print(f"{name}: rows in {fill_s:.0f} s; rollup built in {build_s:.0f} s {sizes}", flush=True)
        lines = [
            f"### {name}: {rows:,} ledger rows (written in {fill_s:.0f} s), rollup built in {build_s:.0f} s",
            "",
            f"Rollup rows: {sizes['usage_1m']:,} minutes, {sizes['usage_1h']:,} hours, {sizes['usage_1d']:,} days.",
            "",
            f"| report | rows/results | first | median of {repeat} more | slowest | under 0.5 s |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        keys = [f"apikey_{k:012x}" for k in range(1, ORGS * KEYS_PER_ORG + 1)]
        for title, kind, legacy, args in reports(start, end, keys):
            query = MultiDict(args)
            answer = lambda: _encoded(report(store, query, kind=kind, legacy=legacy))  # noqa: B023, E731
            first, median, slowest, body = timed(answer, repeat)
            data = json.loads(body)["data"]
            size = sum(len(b["results"]) for b in data) if legacy else len(data)
            verdict = "yes" if max(first, slowest) < TARGET_S else "**no**"
            times = " | ".join(f"{seconds * 1000:.0f} ms" for seconds in (first, median, slowest))
            lines.append(f"| {title} | {size:,} | {times} | {verdict} |")
            print(lines[-1], flush=True)
        lines += ["", fold_batch(store.rollup, engine, rows), "", check_exact(store, engine, start, end)]
        print("\n".join(lines[-3:]), flush=True)
        return lines
    finally:
        store.close()
        engine.dispose()


def fold_batch(rollup: Rollup, engine: Engine, rows: int) -> str:
    """One background fold of ``FOLD_BATCH`` new rows (copies of existing ones, new ids)."""
    columns = (
        "created_at, org_id, key_id, endpoint, model, canonical_model, deployment, input_tokens, cache_write_tokens, "
        "cache_read_tokens, output_tokens, reasoning_tokens, cost_micros, status, estimated"
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO ledger (request_id, {columns}) SELECT 'again_' || request_id, {columns} FROM ledger "
                f"WHERE id <= {FOLD_BATCH}"
            )
        )
    started = time.perf_counter()
    report_ = rollup.fold()
    seconds = time.perf_counter() - started
    return f"One background fold of {report_.folded:,} new rows: {seconds * 1000:.0f} ms (its transaction)."


def _schema_url(base: str, schema: str) -> str:
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the SQLite file / the PostgreSQL schema")
    args = parser.parse_args(argv)
    out: list[str] = []
    for backend in args.backends.split(","):
        if backend == "sqlite":
            folder = Path(tempfile.mkdtemp(prefix="ezat-bench-reports-"))
            out += run_backend("SQLite", f"sqlite:///{folder / 'ezat.db'}", args.rows, args.repeat)
            if not args.keep:
                for path in folder.iterdir():
                    path.unlink()
                folder.rmdir()
            else:
                print(f"kept {folder}")
        elif backend == "postgresql":
            schema = f"ezat_bench_reports_{uuid.uuid4().hex[:8]}"
            admin = create_engine(args.postgres_url)
            with admin.begin() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            try:
                out += run_backend("PostgreSQL", _schema_url(args.postgres_url, schema), args.rows, args.repeat)
            finally:
                if not args.keep:
                    with admin.begin() as conn:
                        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
                else:
                    print(f"kept schema {schema}")
                admin.dispose()
        else:
            parser.error(f"unknown backend {backend!r}")
        out.append("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
