"""The console's overview and usage pages over a million ledger rows, on SQLite and PostgreSQL.

    python bench/console.py [--rows 1000000] [--backends sqlite,postgresql]
                            [--postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
                            [--repeat 10] [--keep]

For each backend: a new database (SQLite: a file in a temporary folder; PostgreSQL: a scratch
schema ``ezat_bench_console_<hex>``, dropped at the end unless ``--keep``) migrated to this
release's schema, filled as bench/reports.py fills it (10 organisations of 10 keys, 6 models,
one row in 97 a failed request) with ``--rows`` ledger rows over the 31 days up to now, so that
today has its share; the rollup built (what the fold job does), and on PostgreSQL ``VACUUM
(ANALYZE)``. Then the app itself (``create_app``, the console registered as the gateway serves
it) answers each page through Flask's test client, signed in as a gateway admin (and as an
organisation's admin): the whole request, from the session check to the rendered HTML. Each page
is asked once (cold), then ``--repeat`` times; the first time, the median and the slowest of the
others are printed, against the 300 ms target.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flask.testing import FlaskClient
from reports import MODELS, ORGS, POSTGRES_URL, _schema_url, fill, timed
from sqlalchemy import create_engine, text

from ezat_compat.app import create_app
from ezat_compat.config import parse_config
from ezat_compat.console.security import COOKIE_NAME
from ezat_compat.store.db import make_engine, migrate
from ezat_compat.store.store import open_store

TARGET_S = 0.3
DAYS = 31


def _config(url: str, folder: Path) -> Any:
    data = {
        "gateway": {"database_url": url, "data_dir": str(folder)},
        "admin": {"bind": "", "on_main_listener": True},
        "console": {"secure_cookies": False},
        "models": [
            {
                "id": model,
                "aliases": [],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "sim", "base_url": "http://127.0.0.1:9", "upstream_model": "m"}],
            }
            for model in MODELS
        ],
    }
    return parse_config(data, path=str(folder / "ezat.toml"), environ={})


def _signed_in(client: FlaskClient, store: Any, role: str, org_ids: tuple[int, ...] = ()) -> None:
    cookie, _public_id = store.console.open_session(
        subject=f"bench-{role}", name="Bench", email="bench@example.com", role=role, org_ids=org_ids
    )
    client.set_cookie(COOKIE_NAME, cookie, path="/")


def _page(client: FlaskClient, path: str) -> Callable[[], bytes]:
    def get() -> bytes:
        answer = client.get(path)
        if answer.status_code != 200:
            raise SystemExit(f"{path}: {answer.status_code} {answer.get_data(as_text=True)[:400]}")
        return answer.get_data()

    return get


def pages(admin: FlaskClient, org_admin: FlaskClient, now: datetime) -> list[tuple[str, FlaskClient, str]]:
    """(name, client, path) of each page measured."""
    month_ago = (now - timedelta(days=DAYS - 1)).date().isoformat()
    today = now.date().isoformat()
    return [
        ("overview (gateway admin: every organisation)", admin, "/console/"),
        ("overview (an organisation's admin)", org_admin, "/console/"),
        ("usage, default (7 days, every organisation)", admin, "/console/usage"),
        ("usage, 31 days", admin, f"/console/usage?from={month_ago}&to={today}"),
        ("usage, today by the hour", admin, f"/console/usage?from={today}&to={today}"),
        ("usage, one organisation, 31 days", admin, f"/console/usage?org=team-3&from={month_ago}&to={today}"),
        ("usage, one key, 31 days", admin, f"/console/usage?key=key_{42:012x}&from={month_ago}&to={today}"),
        ("usage, one model", admin, f"/console/usage?model={MODELS[1]}"),
        ("usage, failed requests only (1 in 97)", admin, "/console/usage?status=error"),
        ("usage, failed requests of one key, 31 days", admin,
         f"/console/usage?key=key_{42:012x}&status=error&from={month_ago}&to={today}"),
        ("usage (an organisation's admin)", org_admin, "/console/usage"),
    ]  # fmt: skip


def run_backend(name: str, url: str, rows: int, repeat: int) -> list[str]:
    """Fill, build, measure one backend; the Markdown table's lines."""
    folder = Path(tempfile.mkdtemp(prefix="ezat-bench-console-data-"))
    engine = make_engine(url)
    migrate(engine)
    now = datetime.now(UTC)
    print(f"{name}: filling {rows:,} ledger rows", flush=True)
    fill_s = fill(engine, rows, now - timedelta(days=DAYS), timedelta(days=DAYS))
    config = _config(url, folder)
    store = open_store(url, config=config)
    assert store.rollup is not None
    try:
        started = time.perf_counter()
        assert store.rollup.catch_up(max_rows=rows * 2)
        build_s = time.perf_counter() - started
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM (ANALYZE) ledger, usage_1m, usage_1h, usage_1d"))
        app = create_app(config, store=store)
        admin, org_admin = app.test_client(), app.test_client()
        _signed_in(admin, store, "admin")
        _signed_in(org_admin, store, "org_admin", (3,))
        print(f"{name}: rows in {fill_s:.0f} s; rollup built in {build_s:.0f} s", flush=True)
        lines = [
            f"### {name}: {rows:,} ledger rows over {DAYS} days (written in {fill_s:.0f} s), rollup built in "
            f"{build_s:.0f} s",
            "",
            f"| page | first | median of {repeat} more | slowest | under 0.3 s |",
            "| --- | --- | --- | --- | --- |",
        ]
        for title, client, path in pages(admin, org_admin, now):
            first, median, slowest, _body = timed(_page(client, path), repeat)
            verdict = "yes" if max(first, slowest) < TARGET_S else "**no**"
            times = " | ".join(f"{seconds * 1000:.0f} ms" for seconds in (first, median, slowest))
            lines.append(f"| {title} | {times} | {verdict} |")
            print(lines[-1], flush=True)
        second = _second_page(admin)
        lines.append(second)
        print(second, flush=True)
        return lines
    finally:
        store.close()
        engine.dispose()
        for path in sorted(folder.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        folder.rmdir()


def _second_page(client: FlaskClient) -> str:
    """A later page of the default usage rows (the keyset's cursor from the first page's link)."""
    page = client.get("/console/usage").get_data(as_text=True)
    marker = page.find("after=")
    if marker < 0:
        return "| usage, the next page | — | — | — | — |"
    cursor = page[marker + len("after=") :].split("&", 1)[0].split('"', 1)[0]
    first, median, slowest, _ = timed(_page(client, f"/console/usage?after={cursor}"), 10)
    verdict = "yes" if max(first, slowest) < TARGET_S else "**no**"
    times = " | ".join(f"{seconds * 1000:.0f} ms" for seconds in (first, median, slowest))
    return f"| usage, the next page (keyset) | {times} | {verdict} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the SQLite file / the PostgreSQL schema")
    args = parser.parse_args(argv)
    assert ORGS >= 3, "the organisation admin's pages read team-3"
    out: list[str] = []
    for backend in args.backends.split(","):
        if backend == "sqlite":
            folder = Path(tempfile.mkdtemp(prefix="ezat-bench-console-"))
            out += run_backend("SQLite", f"sqlite:///{folder / 'ezat.db'}", args.rows, args.repeat)
            if not args.keep:
                for path in folder.iterdir():
                    path.unlink()
                folder.rmdir()
            else:
                print(f"kept {folder}")
        elif backend == "postgresql":
            schema = f"ezat_bench_console_{uuid.uuid4().hex[:8]}"
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
