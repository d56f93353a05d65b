"""The pure pieces of logs, readiness and metrics: formatting, redaction, outages, caching."""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import re
import sqlite3
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ezat_compat import __version__
from ezat_compat.app import metrics_listener
from ezat_compat.domain import LoggingSettings, Usage
from ezat_compat.server.logs import (
    JsonFormatter,
    LineFormatter,
    Outages,
    RequestLog,
    RequestRecord,
    TextFormatter,
    _write_directly,
    access_line,
    describe,
    logging_config,
    redact_atoms,
    redact_query,
    rfc3339,
)
from ezat_compat.server.metrics import Metrics, status_class
from ezat_compat.server.readiness import Readiness


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (0.0, "1970-01-01T00:00:00.000Z"),
        (1_798_761_600.5, "2027-01-01T00:00:00.500Z"),
        (1_798_761_601.0999, "2027-01-01T00:00:01.099Z"),
    ],
    ids=["epoch", "half-second", "next-second-truncated"],
)
def test_rfc3339(ts: float, text: str) -> None:
    assert rfc3339(ts) == text


@pytest.mark.parametrize(
    ("uri", "redacted"),
    [
        ("/v1/messages", "/v1/messages"),
        ("/x?api_key=ezat_sk_abc", "/x?api_key=…"),
        ("/x?api_key=ezat_sk_abc&limit=3", "/x?api_key=…&limit=…"),
        ("/x?flag&key=1", "/x?flag=…&key=…"),
        ("/x?", "/x?"),
    ],
    ids=["no-query", "one-key", "two-params", "bare-name", "empty-query"],
)
def test_redact_query_keeps_names_never_values(uri: str, redacted: str) -> None:
    assert redact_query(uri) == redacted


def test_redact_atoms_cleans_the_request_line_query_and_credentials() -> None:
    atoms = {
        "r": "GET /openai/v1/models?api_key=ezat_sk_secret HTTP/1.1",
        "q": "api_key=ezat_sk_secret",
        "f": "https://a.example/?token=t0k",
        "{authorization}i": "Bearer ezat_sk_secret",
        "{x-api-key}i": "ezat_sk_secret",
        "t": "[01/Jan/2027:00:00:00 +0000]",
    }
    out = redact_atoms(dict(atoms))
    assert "ezat_sk_secret" not in json.dumps(out) and "t0k" not in json.dumps(out)
    assert out["r"] == "GET /openai/v1/models?api_key=… HTTP/1.1"
    assert out["q"] == "api_key=…"
    assert out["t"].endswith("Z")


def test_a_traceback_stays_inside_one_json_line() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("ezat_compat", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "failed x" and parsed["level"] == "error"
    assert "Traceback" in parsed["exc"] and "ValueError: boom" in parsed["exc"]


def test_the_request_line_is_flat_and_has_no_text() -> None:
    record = RequestRecord(request_id="r1", method="POST", path="/v1/messages", started=10.0, view="anthropic.x")
    record.route = "messages"
    record.org, record.key, record.model, record.canonical_model = "acme", "key_1", "Claude", "anthropic/c"
    record.settled(200, "dep", 2)
    record.billed(Usage(input_tokens=3, output_tokens=5), 1_234)
    record.streaming(10.5)
    fields = record.fields(now=12.0, wall=0.0)
    assert all(not isinstance(v, dict | list) for v in fields.values())
    assert fields["latency_ms"] == 2000.0 and fields["ttfb_ms"] == 500.0
    assert (fields["cost_usd"], fields["attempts"], fields["endpoint"]) == ("0.001234", 2, "messages")
    parsed = json.loads(access_line(fields))
    assert parsed["deployment"] == "dep" and parsed["stream"] is True
    assert parsed["version"] == __version__  # the release that answered (two run during a rolling upgrade)
    text = access_line(fields, "text")
    assert text.startswith("1970-01-01T00:00:00.000Z ") and " status=200 " in text and " stream=true " in text


CONTROL_PATHS = [
    ("cr-forging-a-line", "/v1/x\r2027-01-01T00:00:00.000Z status=200 org=victim", "\\r2027"),
    ("lf-forging-a-line", "/v1/x\nforged", "\\nforged"),
    ("esc-clearing-the-terminal", "/v1/\x1b[2J\x1b]0;pwned\x07", "\\u001b[2J\\u001b]0;pwned\\u0007"),
    ("nul-and-tab", "/v1/\x00\t", "\\u0000\\t"),
    ("del", "/v1/\x7f", "\\u007f"),
    ("c1-nel-and-csi", "/v1/\x85\x9b31m", "\\u0085\\u009b31m"),
    ("only-controls-no-space", "\x1b", "\\u001b"),
]


@pytest.mark.parametrize(("path", "written"), [r[1:] for r in CONTROL_PATHS], ids=[r[0] for r in CONTROL_PATHS])
def test_the_text_line_escapes_control_characters_in_every_field(path: str, written: str) -> None:
    fields = RequestRecord(request_id="r1", method="GET\x1b", path=path, view="v").fields(now=0.0, wall=0.0)
    line = access_line({**fields, "model": path, "error": "x\x9b"}, "text")
    assert not any(c < " " or "\x7f" <= c <= "\x9f" for c in line)
    assert 'method="GET\\u001b"' in line and 'error="x\\u009b"' in line
    for name in ("path", "model"):
        quoted = re.search(f' {name}=("(?:[^"\\\\]|\\\\.)*")', line)
        assert quoted is not None and written in quoted.group(1)
        assert json.loads(quoted.group(1)) == path  # a quoted value is a JSON string: the value as sent


def test_plain_text_values_stay_unquoted_and_backslashes_are_quoted() -> None:
    line = access_line({"time": "T", "path": "/v1/messages", "client": "a\\b", "empty": ""}, "text")
    assert line == 'T path=/v1/messages client="a\\\\b" empty=""'


def test_the_text_formatter_escapes_control_characters_but_keeps_the_traceback_lines() -> None:
    try:
        raise ValueError("boom\x1b[2J\nsecond line")
    except ValueError:
        record = logging.LogRecord(
            "ezat_compat", logging.ERROR, __file__, 1, "unknown route %s", ("/x\r\x1b[1m\x85",), sys.exc_info()
        )
    text = TextFormatter().format(record)
    first, *rest = text.split("\n")
    assert first.endswith("ezat_compat: unknown route /x\\r\\u001b[1m\\u0085")
    assert rest[0] == "Traceback (most recent call last):"
    assert "ValueError: boom\\u001b[2J" in text and "\x1b" not in text and "\r" not in text


def test_a_long_model_name_is_cut_in_the_line() -> None:
    record = RequestRecord(model="m" * 5000)
    assert len(record.fields(0.0, 0.0)["model"]) == 200


def test_finish_calls_the_sink_once() -> None:
    seen: list[RequestRecord] = []
    record = RequestRecord(sink=seen.append)
    record.finish()
    record.finish()
    assert seen == [record]


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def error(self, msg: str, *args: Any) -> None:
        self.lines.append("E " + msg % args)

    def warning(self, msg: str, *args: Any) -> None:
        self.lines.append("W " + msg % args)


def test_an_outage_is_logged_once_with_its_cause_then_its_end() -> None:
    log = _Log()
    now = [100.0]
    outages = Outages(log, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        try:
            raise ConnectionRefusedError("Connection refused")
        except OSError as cause:
            raise RuntimeError("wrapped") from cause
    except RuntimeError as exc:
        for _ in range(50):
            outages.failed("redis", exc)
    now[0] = 112.0
    outages.recovered("redis")
    outages.recovered("redis")
    assert log.lines == [
        "E redis unreachable: ConnectionRefusedError: Connection refused",
        "W redis reachable again after 12.0 s",
    ]


def test_readiness_caches_its_checks_and_reports_each() -> None:
    calls = {"db": 0}
    now = [0.0]
    down: list[bool] = [False]

    def probe_db() -> None:
        calls["db"] += 1
        if down[0]:
            raise OSError("no route")

    ready = Readiness(
        "sqlite:///x.db", "redis://r", Outages(logging.getLogger("t")), clock=lambda: now[0], probe_database=probe_db
    )
    ready._probe_redis = lambda: None
    assert ready.status() == (200, {"status": "ready", "database": "ok", "redis": "ok", "draining": False})
    down[0] = True
    assert ready.status()[0] == 200 and calls["db"] == 1  # cached for a second
    now[0] = 1.5
    status, body = ready.status()
    assert (status, body["database"], body["status"]) == (503, "unreachable: OSError: no route", "not ready")


def test_readiness_without_redis_says_so() -> None:
    ready = Readiness("sqlite:///x.db", "", Outages(logging.getLogger("t")), probe_database=lambda: None)
    assert ready.status()[1]["redis"] == "not configured"


class _Sock:
    def __init__(self, name: Any) -> None:
        self.name = name

    def getsockname(self) -> Any:
        return self.name


@pytest.mark.parametrize(
    ("bind", "local", "matches"),
    [
        ("127.0.0.1:9100", ("127.0.0.1", 9100), True),
        ("127.0.0.1:9100", ("127.0.0.1", 8080), False),
        ("0.0.0.0:9100", ("10.0.0.5", 9100), True),
        ("unix:/run/ezat-metrics.sock", "/run/ezat-metrics.sock", True),
        ("unix:/run/ezat-metrics.sock", ("127.0.0.1", 9100), False),
        ("127.0.0.1:9100", "/run/ezat.sock", False),
    ],
    ids=["same-port", "main-port", "wildcard", "unix", "unix-vs-tcp", "tcp-vs-unix"],
)
def test_metrics_listener_asks_the_socket(bind: str, local: Any, matches: bool) -> None:
    assert metrics_listener(bind)({"gunicorn.socket": _Sock(local), "HTTP_HOST": bind}) is matches
    assert metrics_listener(bind)({"HTTP_HOST": bind}) is False  # no socket: never by the Host header


@pytest.mark.parametrize(
    ("status", "cls"), [(200, "2xx"), (401, "4xx"), (499, "4xx"), (529, "5xx"), (0, "other")], ids=str
)
def test_status_class(status: int, cls: str) -> None:
    assert status_class(status) == cls


def test_logging_config_keeps_the_request_log_apart_from_the_level() -> None:
    config = logging_config(LoggingSettings(format="text", level="", access_log=False), "warning")
    assert config["root"]["level"] == config["loggers"]["ezat_compat"]["level"] == "WARNING"
    assert config["handlers"]["stderr"]["formatter"] == "text"
    assert config["loggers"]["ezat_compat.access"]["level"] == "CRITICAL"
    on = logging_config(LoggingSettings(level="debug"), "warning")
    assert on["root"]["level"] == "DEBUG" and on["loggers"]["ezat_compat.access"]["level"] == "INFO"


MINIMAL = {
    "models": [
        {
            "id": "m",
            "aliases": [],
            "price": {"input": 1, "output": 1},
            "deployments": [{"name": "d", "base_url": "http://127.0.0.1:1", "upstream_model": "u"}],
        }
    ]
}


def test_logging_and_metrics_bind_are_defaulted_and_validated() -> None:
    from ezat_compat.config import ConfigError, parse_config

    config = parse_config(MINIMAL, environ={})
    assert config.logging == LoggingSettings(format="json", level="", access_log=True)
    assert config.server.metrics_bind == ""
    custom = parse_config({**MINIMAL, "logging": {"format": "text", "access_log": False}}, environ={})
    assert (custom.logging.format, custom.logging.access_log) == ("text", False)
    for bad, where in (
        ({"logging": {"format": "xml"}}, "logging.format"),
        ({"logging": {"colour": True}}, "logging.colour"),
        ({"server": {"bind": "127.0.0.1:8080", "metrics_bind": "127.0.0.1:8080"}}, "server.metrics_bind"),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            parse_config({**MINIMAL, **bad}, environ={})


@pytest.mark.parametrize(("accesslog", "lines"), [(None, 0), ("-", 1)])
def test_gunicorn_access_line_only_with_an_access_log(accesslog: str | None, lines: int) -> None:
    """Our ``logconfig_dict`` alone doesn't switch gunicorn's access log on (nor build its atoms)."""
    from types import SimpleNamespace

    from gunicorn.config import Config

    from ezat_compat.server.logs import gunicorn_logger_class

    cfg = Config()
    cfg.set("accesslog", accesslog)
    cfg.set("logconfig_dict", logging_config(LoggingSettings(), "info"))
    logger = gunicorn_logger_class()(cfg)
    seen: list[str] = []
    logger.access_log = SimpleNamespace(info=lambda fmt, atoms: seen.append(fmt % atoms))
    req = SimpleNamespace(
        headers=[], method="GET", uri="/healthz?api_key=secret", path="/healthz", query="api_key=secret", version=(1, 1)
    )
    resp = SimpleNamespace(status="200 OK", headers=[], sent=2, response_length=2)
    environ = {
        "REMOTE_ADDR": "127.0.0.1",
        "REQUEST_METHOD": "GET",
        "RAW_URI": "/healthz?api_key=secret",
        "SERVER_PROTOCOL": "HTTP/1.1",
    }
    logger.access(resp, req, environ, timedelta(seconds=0.01))
    assert len(seen) == lines
    assert all("secret" not in line for line in seen)


def _request_logger(name: str, stream: io.StringIO, *, handler_filter: bool = False) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LineFormatter())
    if handler_filter:
        handler.addFilter(lambda record: "secret" not in record.getMessage())
    logger.addHandler(handler)
    return logger


def test_the_request_line_is_written_as_logging_would_write_it() -> None:
    direct, through = io.StringIO(), io.StringIO()
    probe = io.StringIO()
    assert _write_directly(_request_logger("t.probe", probe), "probe") and probe.getvalue() == "probe\n"
    log = RequestLog(Metrics(CollectorRegistry()), logger=_request_logger("t.direct", direct))
    record = log.start("req_1", "POST", "/v1/messages", "127.0.0.1", "messages")
    record.finish()
    (line,) = direct.getvalue().splitlines()
    _request_logger("t.through", through).info(line)  # what logging itself writes for that line
    assert direct.getvalue() == through.getvalue() and json.loads(line)["request_id"] == "req_1"


def test_a_handler_with_a_filter_gets_the_line_through_logging() -> None:
    stream = io.StringIO()
    logger = _request_logger("t.filtered", stream, handler_filter=True)
    assert not _write_directly(logger, "a secret line")
    log = RequestLog(Metrics(CollectorRegistry()), logger=logger)
    log.start("secret", "POST", "/v1/messages", "127.0.0.1", "messages").finish()
    assert stream.getvalue() == ""  # the filter saw the line: nothing went around it


def _pool_outage() -> BaseException:
    """The chain SQLAlchemy raises when PostgreSQL went away under a pooled connection: the pre-ping fails
    (``InvalidatePoolError()``, no message), the pool reconnects while handling it, psycopg refuses, and
    SQLAlchemy wraps psycopg's error (``raise … from``)."""
    import psycopg
    import sqlalchemy.exc

    refused = (
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?"
    )
    try:
        try:
            raise sqlalchemy.exc.InvalidatePoolError()
        except sqlalchemy.exc.DisconnectionError:
            try:
                raise psycopg.OperationalError(refused)
            except psycopg.OperationalError as dbapi:
                raise sqlalchemy.exc.OperationalError(None, None, dbapi) from dbapi
    except sqlalchemy.exc.OperationalError as exc:
        return exc
    raise AssertionError("unreachable")


def _chain(*links: BaseException, context: bool = False) -> BaseException:
    """``links[0]`` raised from ``links[1]`` raised from …; by ``__context__`` when ``context``."""
    for outer, inner in itertools.pairwise(links):
        if context:
            outer.__context__ = inner
        else:
            outer.__cause__ = inner
    return links[0]


def _cycle() -> BaseException:
    a, b = RuntimeError(""), ValueError("")
    a.__cause__, b.__cause__ = b, a
    return a


def _suppressed() -> BaseException:
    shown = RuntimeError("no database configured")
    shown.__context__ = KeyError("EZAT_DATABASE_URL")
    shown.__suppress_context__ = True  # raise … from None
    return shown


@pytest.mark.parametrize(
    "exc, described",
    [
        (
            _pool_outage,  # made when the test runs: importing psycopg is no work for collection
            'OperationalError: connection failed: connection to server at "127.0.0.1", port 5432 failed: '
            "Connection refused Is the server running on that host and accepting TCP/IP connections?",
        ),
        (
            _chain(RuntimeError(""), OSError(111, "Connection refused"), RuntimeError()),
            "ConnectionRefusedError: [Errno 111] Connection refused",
        ),
        (_chain(RuntimeError("outer"), TimeoutError(), context=True), "RuntimeError: outer"),
        (_chain(RuntimeError(), TimeoutError()), "TimeoutError"),
        (_chain(ConnectionError("redis down"), ConnectionRefusedError("refused")), "ConnectionRefusedError: refused"),
        (_cycle(), "ValueError"),
        (_suppressed(), "RuntimeError: no database configured"),
    ],
    ids=[
        "sqlalchemy-pool-outage",
        "empty-wrappers-both-sides",
        "only-the-outer-has-a-message",
        "no-message-at-all",
        "innermost-with-a-message",
        "cycle",
        "from-none",
    ],
)
def test_an_outage_is_described_by_its_innermost_cause_with_a_message(
    exc: BaseException | Callable[[], BaseException], described: str
) -> None:
    if not isinstance(exc, BaseException):
        exc = exc()
    assert describe(exc) == described
    log = _Log()
    Outages(log).failed("database", exc)  # type: ignore[arg-type]
    assert log.lines == [f"E database unreachable: {described}"]


class _RecordingHotPath:
    """The worker's hot path: records the reads it runs."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def read(self, sql: str, params: Any) -> Any:
        self.reads.append(sql)
        return (1,)


def _handles_on(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


def test_readiness_probes_a_sqlite_file_through_the_workers_own_connection(tmp_path: Path) -> None:
    """A handle of the probe's own on the file would be a second owner of the process's POSIX
    locks (closing it drops them all): the probe reads through the hot path, opens nothing."""
    db = tmp_path / "ezat.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
    conn.execute("INSERT INTO alembic_version VALUES ('x')")
    conn.commit()
    conn.close()
    hot = _RecordingHotPath()
    ready = Readiness(f"sqlite:///{db}", "", Outages(logging.getLogger("t")), hot=hot)  # type: ignore[arg-type]
    try:
        assert ready.status()[0] == 200
        assert hot.reads == ["SELECT 1 FROM alembic_version LIMIT 1"]
        assert _handles_on(db) == 0
    finally:
        ready.close()


def test_readiness_is_503_until_the_usage_journal_is_replayed() -> None:
    waiting = [2]
    now = [0.0]
    ready = Readiness(
        "sqlite:///x.db",
        "",
        Outages(logging.getLogger("t")),
        clock=lambda: now[0],
        probe_database=lambda: None,
        backlog=lambda: waiting[0],
    )
    status, body = ready.status()
    assert (status, body["database"], body["journal"]) == (
        503,
        "ok",
        "replaying: 2 file(s) of settlements wait for the database",
    )
    waiting[0], now[0] = 0, 1.5
    assert ready.status() == (
        200,
        {"status": "ready", "database": "ok", "redis": "not configured", "journal": "ok", "draining": False},
    )
