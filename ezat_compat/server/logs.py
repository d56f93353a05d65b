"""Logs: one line per record, ours and gunicorn's alike, and one line per request; on stderr, or
in the files ``[server] error_log`` and ``access_log`` name.

- ``logging_config(settings, level)``: the ``logging.config.dictConfig`` dictionary that
  gunicorn applies (``logconfig_dict``) to its loggers and ours: JSON lines by default
  (``[logging] format = "text"`` for people), RFC 3339 UTC times everywhere, a traceback kept
  inside its record's one JSON line.
- ``gunicorn_logger_class``: gunicorn's ``logger_class``; its ``reopen_files`` (SIGUSR1, in the
  master and every worker: logrotate's ``postrotate``) reopens our files by path too
  (``reopen_log_files``).
- ``RequestRecord``: what the request log line says about one request. The app creates it
  when the request arrives, the pipeline fills it in (who, which model, where it went, what it
  cost) and ``finish`` hands it to the app's sink: when the response is done, or for a stream
  when the stream ends. It never holds prompt or completion text, nor a key (only the key's
  public id).
- ``access_line(fields, fmt)``: the line itself, one ``json.dumps`` of a flat dict; in the text
  format ``key=value`` pairs, a value with a space, a quote, ``=``, a backslash or a control
  character (C0, DEL, C1) written as a JSON string with every control character escaped, so a
  request line can't forge log lines nor send terminal escapes (the text formatter escapes
  them in messages too).
- ``Outages``: a database or Redis outage logged once per incident, with its cause.
- ``redact_query``: query strings keep their names, never their values (``?api_key=…``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ezat_compat import __version__, jsonfast
from ezat_compat.domain import LoggingSettings, Usage

PROBE_VIEWS = frozenset({"metrics", "healthz", "readyz"})  # the app's views that are not traffic: never counted

if TYPE_CHECKING:  # the gunicorn master imports this module before prometheus_client may be
    from ezat_compat.errors import GatewayError
    from ezat_compat.server.metrics import Metrics
    from ezat_compat.server.telemetry import RequestTrace

ACCESS_LOGGER = "ezat_compat.access"
REDACTED = "…"
MODEL_NAME_MAX = 200  # a client's model string, as sent, is cut to this in the log line
NO_MODEL = "-"  # the metrics' model label of routes without a model (/healthz, /metrics…)
UNKNOWN_MODEL = "unknown"  # … of a model route whose model was not (or not yet) resolved
# C0 (line ends and tabs included), DEL and C1: what could end a line early or drive a terminal.
CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROLS_BUT_LF = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
_DEL_C1 = re.compile(r"[\x7f-\x9f]")  # what json.dumps(ensure_ascii=False) leaves as it is
_QUOTED = re.compile(r'[\x00-\x20"=\\\x7f-\x9f]')  # a text value with any of these is a JSON string
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def escape_controls(text: str) -> str:
    """``text`` with each control character (C0, DEL, C1) written as its JSON escape."""
    return CONTROLS.sub(_escaped, text)


# ---------------------------------------------------------------- time


class _Clock:
    """RFC 3339 UTC with milliseconds (``2026-11-01T12:00:00.123Z``), the second's prefix cached."""

    __slots__ = ("prefix", "second")

    def __init__(self) -> None:
        self.second = -1
        self.prefix = ""

    def format(self, ts: float) -> str:
        second = int(ts)
        if second != self.second:
            self.prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self.second = second
        return f"{self.prefix}.{int((ts - second) * 1000):03d}Z"


_CLOCK = _Clock()


def rfc3339(ts: float) -> str:
    """``ts`` (seconds since the epoch) as RFC 3339 UTC with milliseconds."""
    return _CLOCK.format(ts)


# ---------------------------------------------------------------- formatters


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, pid, message, and ``exc`` (the whole
    traceback, one string) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    """``TIME [PID] [LEVEL] LOGGER: MESSAGE`` with the same RFC 3339 times as the JSON lines."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return rfc3339(record.created)

    def __init__(self) -> None:
        super().__init__("%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line, its control characters escaped (a message can quote a client)."""
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        """The traceback on its lines, other control characters escaped."""
        return _CONTROLS_BUT_LF.sub(_escaped, super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _CONTROLS_BUT_LF.sub(_escaped, stack_info)


class LineFormatter(logging.Formatter):
    """For the request log: the message is the finished line."""

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage()


def log_file_problems(files: dict[str, str]) -> list[str]:
    """Why each log file of ``files`` (setting name -> path; "-": stderr) can't be appended to,
    one phrase each (``"access_log: the folder /var/log/ezat does not exist"``). The folder is
    judged by making (and removing) a file in it, which shows a read-only mount; the log file
    itself is not created."""
    from ezat_compat.datafiles import writable_problem

    problems = []
    for name, path in files.items():
        if not path or path == "-":
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            problems.append(f"{name}: the folder {folder} does not exist")
            continue
        if not os.path.exists(path):
            problem = writable_problem(folder)
            if problem is not None:
                problems.append(f"{name}: {problem}")
        elif os.path.isdir(path) or not os.access(path, os.W_OK):
            problems.append(f"{name}: {path} is not a writable file")
    return problems


def _handler(path: str, formatter: str) -> dict[str, Any]:
    """A ``dictConfig`` handler writing to ``path`` ("-": stderr), appending."""
    if path and path != "-":
        return {"class": "logging.FileHandler", "formatter": formatter, "filename": path, "encoding": "utf-8"}
    return {"class": "logging.StreamHandler", "formatter": formatter, "stream": "ext://sys.stderr"}


def logging_config(
    settings: LoggingSettings,
    level: str,
    access_file: str | None = None,
    *,
    request_log: str = "-",
    error_log: str = "-",
) -> dict[str, Any]:
    """The ``dictConfig`` of the process: gunicorn's error logger and ours in ``settings.format``
    on ``error_log`` (``[server] error_log``; "-": stderr); the request log
    (``ezat_compat.access``) on ``request_log`` (``[server] access_log``), on or off by
    ``settings.access_log`` whatever the level; ``level`` for ours (``ezat_compat``) and
    gunicorn's. Other libraries (Alembic's migration notes, SQLAlchemy, urllib3…) log through
    the root logger, which passes their warnings and errors only, unless the level is
    ``debug``. gunicorn's access log written to a file (``access_file``, not ``-``) keeps its
    own line format. The files are reopened on SIGUSR1 (``gunicorn_logger_class``)."""
    formatter = "json" if settings.format == "json" else "text"
    level_name = (settings.level or level or "info").upper()
    libraries = level_name if level_name == "DEBUG" else max(level_name, "WARNING", key=logging.getLevelName)
    access_handler = _handler(access_file or "-", formatter)
    if access_file and access_file != "-":
        access_handler["formatter"] = "line"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {"()": JsonFormatter},
            "text": {"()": TextFormatter},
            "line": {"()": LineFormatter},
        },
        "handlers": {
            "stderr": _handler(error_log, formatter),  # named for its default
            "requests": _handler(request_log, "line"),
            "gunicorn_access": access_handler,
        },
        "root": {"level": libraries, "handlers": ["stderr"]},
        "loggers": {
            "ezat_compat": {"level": level_name},  # propagates to the root's handler
            "ezat_compat.audit": {"level": "INFO"},  # every admin change's line, whatever log_level says
            "gunicorn.error": {"level": level_name, "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": ["gunicorn_access"], "propagate": False},
            ACCESS_LOGGER: {
                "level": "INFO" if settings.access_log else "CRITICAL",
                "handlers": ["requests"],
                "propagate": False,
            },
        },
    }


def log_audit_trail(settings: LoggingSettings, error_log: str) -> logging.Handler:
    """For the admin commands run on the shell: each change's audit line (logger
    ``ezat_compat.audit``) written where the serving gateway writes it (``[server] error_log``,
    "-": stderr) in ``[logging] format``, so a change made with the CLI leaves the same line as
    one made through the admin API. The handler, for whoever closes it."""
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if error_log and error_log != "-":
        with contextlib.suppress(OSError):  # a file this user can't write: the line goes to stderr
            handler = logging.FileHandler(error_log, encoding="utf-8")
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    logger = logging.getLogger("ezat_compat.audit")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    return handler


# ---------------------------------------------------------------- the request log


def _noop(_record: RequestRecord) -> None:
    return None


@dataclass(slots=True, eq=False)
class RequestRecord:
    """What the request log line and the request metrics say about one request.

    Filled in as the request goes: the app sets the HTTP facts, the pipeline who called
    (``org``, ``key``), the model as sent and its canonical id, and at settlement the status,
    deployment, attempts, usage and cost. ``finish`` calls ``sink`` once."""

    request_id: str = ""
    method: str = ""
    path: str = ""
    client: str = ""
    started: float = 0.0  # time.monotonic() when the request arrived
    view: str = ""  # the app's name of the route (``healthz``, ``openai.list_models``, ``unmatched``)
    route: str = ""  # a dialect's endpoint (``chat.completions``, ``messages``…): set by the pipeline
    org: str | None = None
    key: str | None = None
    user: str | None = None  # the person of a person's key ("user_…")
    model: str | None = None  # as sent
    canonical_model: str | None = None
    deployment: str = ""
    attempts: int = 0
    status: int = 0  # the outcome: for a stream, what it was settled as (200, 499, 502…)
    error: str | None = None
    stream: bool = False
    first_byte: float = 0.0  # time.monotonic() when the first bytes were ready
    usage: Usage | None = None
    cost_micros: int | None = None
    counted: bool = True  # traffic, in the request metrics (False: a scrape or a probe)
    done: bool = False
    sink: Callable[[RequestRecord], None] = _noop
    trace: RequestTrace | None = None  # its spans, when telemetry is on (the line names the trace)

    def settled(self, status: int, deployment: str, attempts: int) -> None:
        self.status = status
        self.deployment = deployment
        self.attempts = attempts

    def billed(self, usage: Usage, cost_micros: int) -> None:
        self.usage = usage
        self.cost_micros = cost_micros

    def streaming(self, at: float) -> None:
        """The stream's first bytes are ready: the line is written when the stream ends."""
        self.stream = True
        self.first_byte = at

    def finish(self) -> None:
        if not self.done:
            self.done = True
            if self.trace is not None:
                self._end_trace(self.trace)
            self.sink(self)

    def _end_trace(self, trace: RequestTrace) -> None:
        try:
            trace.end(self)
        except Exception:  # telemetry never fails a request
            logging.getLogger("ezat_compat").exception("telemetry: the spans of request %s", self.request_id)

    def answered(self, status: int) -> None:
        """The response (``status``, unless settlement said otherwise) is about to be sent:
        the line is written now, except for a started stream's (written when it ends)."""
        if not self.stream:
            self.status = self.status or status
            self.finish()

    def note_error(self, error: GatewayError) -> None:
        """``error`` is what the client gets: its name goes in the line (the first one named)."""
        if self.error is None:
            self.error = type(error).__name__

    def unanswered(self) -> None:
        """Nothing answered the request (a bug past the error handlers, a killed greenlet): a
        500 line, unless its line is written already or a started stream will write it."""
        if not self.stream and not self.done:
            self.status = self.status or 500
            self.finish()

    def fields(self, now: float, wall: float) -> dict[str, Any]:
        """The flat dict of the log line (``now``: monotonic, ``wall``: epoch seconds)."""
        usage = self.usage
        latency = now - self.started
        ttfb = self.first_byte - self.started if self.first_byte else latency
        model = self.model
        if model is not None and len(model) > MODEL_NAME_MAX:
            model = model[:MODEL_NAME_MAX]
        out: dict[str, Any] = {
            "time": rfc3339(wall),
            "level": "info",
            "logger": "access",
            "version": __version__,  # which release answered (a rolling upgrade runs two)
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "endpoint": self.route or self.view,
            "client": self.client,
            "org": self.org,
            "key_id": self.key,
            "model": model,
            "canonical_model": self.canonical_model,
            "deployment": self.deployment or None,
            "attempts": self.attempts,
            "status": self.status,
            "error": self.error,
            "stream": self.stream,
            "latency_ms": round(latency * 1000, 3),
            "ttfb_ms": round(ttfb * 1000, 3),
            "input_tokens": usage.input_tokens if usage else None,
            "cache_write_tokens": usage.cache_write_tokens if usage else None,
            "cache_read_tokens": usage.cache_read_tokens if usage else None,
            "output_tokens": usage.output_tokens if usage else None,
            "reasoning_tokens": usage.reasoning_tokens if usage else None,
            "cost_usd": _usd(self.cost_micros),
        }
        if self.user is not None:
            out["user_id"] = self.user
        if self.trace is not None:
            out["trace_id"] = self.trace.trace_id
        return out


def _usd(micros: int | None) -> str | None:
    if micros is None:
        return None
    whole, fraction = divmod(micros, 1_000_000)
    return f"{whole}.{fraction:06d}"


def access_line(fields: Mapping[str, Any], fmt: str = "json") -> str:
    """The request's one line: JSON, or ``key=value`` pairs for ``format = "text"``."""
    if fmt == "json":  # its floats are finite milliseconds to 3 decimals: written by orjson as by json
        try:
            return jsonfast.dumps_compact(fields, finite=True).decode()
        except UnicodeEncodeError:  # a lone surrogate in a field: json writes it as it is
            return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    parts = [_text_value(str(fields.get("time", "")))]
    for name, value in fields.items():
        if name in ("time", "level", "logger") or value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        parts.append(f"{_text_value(name)}={_text_value(text)}")
    return " ".join(parts)


def _text_value(text: str) -> str:
    """A value of the text line: as it is, or a JSON string with every control character
    escaped when it is empty or holds a space, a quote, ``=``, a backslash or a control."""
    if text and not _QUOTED.search(text):
        return text
    return _DEL_C1.sub(_escaped, json.dumps(text, ensure_ascii=False))


# ---------------------------------------------------------------- outages


class Outages:
    """Logs each outage of a dependency (``database``, ``redis``) once: its start with the
    cause, then its end. ``failed`` is cheap to call on every failing request."""

    def __init__(self, logger: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._clock = clock
        self._since: dict[str, float] = {}

    @property
    def open(self) -> bool:
        return bool(self._since)

    def down(self, what: str) -> bool:
        return what in self._since

    def failed(self, what: str, exc: BaseException) -> None:
        if what in self._since:
            return
        self._since[what] = self._clock()
        self._log.error("%s unreachable: %s", what, describe(exc))

    def recovered(self, what: str) -> None:
        since = self._since.pop(what, None)
        if since is not None:
            self._log.warning("%s reachable again after %.1f s", what, self._clock() - since)


CHAIN_MAX = 10  # exceptions followed down a chain (a cycle or a runaway chain ends there)


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line of the innermost exception in ``exc``'s chain (its causes,
    else the exceptions it was raised while handling) that has a message: the cause an operator
    can act on, e.g. psycopg's "connection refused". The wrappers around it are passed, and so is
    an exception without a message beneath it: SQLAlchemy's pool raises ``InvalidatePoolError()``
    when its pre-ping fails and reconnects while handling it, so the connection's error carries
    that empty one as its context. Without any message: the innermost exception's type."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < CHAIN_MAX and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    for link in reversed(chain):
        message = _message(link)
        if message:
            return f"{type(link).__name__}: {message}"
    return type(chain[-1]).__name__


def _message(exc: BaseException) -> str:
    """The exception's text on one line; "" when it has none (SQLAlchemy's errors without arguments
    read ``()``)."""
    message = " ".join(str(exc).split())
    return "" if message == "()" and not exc.args else message


# ---------------------------------------------------------------- gunicorn's access log

_SECRET_HEADERS = ("{authorization}i", "{x-api-key}i", "{cookie}i", "{proxy-authorization}i")


def redact_query(uri: str) -> str:
    """``/path?api_key=sk&x=1`` -> ``/path?api_key=…&x=…``: names kept, values never."""
    path, sep, query = uri.partition("?")
    if not sep:
        return uri
    names = [part.partition("=")[0] for part in query.split("&") if part]
    return path + "?" + "&".join(f"{name}={REDACTED}" for name in names)


def redact_atoms(atoms: dict[str, Any]) -> dict[str, Any]:
    """gunicorn's access-log atoms without query values or credentials, times in RFC 3339."""
    request_line = atoms.get("r")
    if isinstance(request_line, str):
        method, _, rest = request_line.partition(" ")
        uri, _, protocol = rest.rpartition(" ") if rest.count(" ") else (rest, "", "")
        atoms["r"] = f"{method} {redact_query(uri)} {protocol}".rstrip()
    if isinstance(atoms.get("f"), str):
        atoms["f"] = redact_query(atoms["f"])
    if atoms.get("q"):
        atoms["q"] = redact_query("?" + str(atoms["q"]))[1:]
    for name in _SECRET_HEADERS:
        if name in atoms:
            atoms[name] = REDACTED
    atoms["t"] = rfc3339(time.time())
    return atoms


def reopen_log_files(loggers: list[logging.Logger]) -> int:
    """Reopen, by its path, every file handler of ``loggers`` (each once): after logrotate moved
    the file, the lines go to the new one. Each handler's stream is swapped under its lock
    (``setStream``), so no line is written to a closed file; returns how many were reopened."""
    seen: set[int] = set()
    for logger in loggers:
        for handler in logger.handlers:
            if not isinstance(handler, logging.FileHandler) or id(handler) in seen:
                continue
            seen.add(id(handler))
            fresh = open(handler.baseFilename, handler.mode, encoding=handler.encoding, errors=handler.errors)  # noqa: SIM115
            if not isinstance(fresh, io.TextIOWrapper):  # a text mode: FileHandler's own
                fresh.close()
                continue
            old = handler.setStream(fresh)  # flushes the old stream, under the handler's lock
            if old is not None:
                old.close()
    return len(seen)


def gunicorn_logger_class() -> type:
    """gunicorn's logger with ``redact_atoms`` applied to every access line (``logger_class``),
    and ``reopen_files`` (SIGUSR1, in the master and, signalled by it, in every worker) reopening
    our files too: the root logger's (the error log) and the request log's."""
    base: Any = importlib.import_module("gunicorn.glogging").Logger

    class GatewayGunicornLogger(base):
        def reopen_files(self) -> None:
            # Ours first, by their path; gunicorn's then reopens its own (and any other
            # named logger's) file handlers: reopening one twice only opens it again.
            reopen_log_files([logging.getLogger(), logging.getLogger(ACCESS_LOGGER)])
            super().reopen_files()

        def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
            # gunicorn counts our ``logconfig_dict`` as "access log on" and would build every
            # request's atoms for a line nobody asked for: only an ``accesslog`` turns it on.
            if self.cfg.accesslog:
                super().access(resp, req, environ, request_time)

        def atoms(self, resp: Any, req: Any, environ: Any, request_time: Any) -> dict[str, Any]:
            return redact_atoms(super().atoms(resp, req, environ, request_time))

        def now(self) -> str:
            return rfc3339(time.time())

    return GatewayGunicornLogger


_PLAIN_HANDLERS = (logging.StreamHandler, logging.FileHandler)


def _write_directly(logger: logging.Logger, line: str) -> bool:
    """Write the finished ``line`` to ``logger``'s handlers as their ``emit`` would, without a
    ``LogRecord`` (its creation, the caller lookup and the dispatch cost more than the write):
    only when nothing could tell the difference — the logger doesn't propagate and has no
    filter, and each handler is a plain stream or file handler, open, with the line formatter
    and no filter, passing INFO. False (nothing written) otherwise: the caller logs the line
    the usual way then. A failed write is reported as ``emit`` reports it (``handleError``)."""
    handlers = logger.handlers
    if logger.propagate or logger.filters or not handlers:
        return False
    for handler in handlers:
        if (
            type(handler) not in _PLAIN_HANDLERS
            or type(handler.formatter) is not LineFormatter
            or handler.filters
            or handler.level > logging.INFO
            or getattr(handler, "stream", None) is None
        ):
            return False
    for handler in handlers:
        stream_handler: logging.StreamHandler[Any] = handler  # type: ignore[assignment]
        with stream_handler.lock or contextlib.nullcontext():
            try:
                stream_handler.stream.write(line + stream_handler.terminator)
                stream_handler.flush()
            except Exception:  # what emit does: the handler reports it (logging.raiseExceptions)
                stream_handler.handleError(logger.makeRecord(logger.name, logging.INFO, __file__, 0, line, (), None))
    return True


class RequestLog:
    """The sink of every ``RequestRecord``: counts the answer in the metrics (a billed one's
    tokens and cost too; scrapes and probes are not traffic: never counted, not in flight) and
    writes the request's line on ``ezat_compat.access`` (when ``[logging] access_log`` is on)."""

    def __init__(
        self, metrics: Metrics, fmt: str = "json", outages: Outages | None = None, logger: logging.Logger | None = None
    ) -> None:
        self.metrics = metrics
        self.fmt = fmt
        self.outages = outages
        self.log = logger or logging.getLogger(ACCESS_LOGGER)

    def start(self, request_id: str, method: str, path: str, client: str, view: str) -> RequestRecord:
        counted = view not in PROBE_VIEWS
        if counted:
            self.metrics.in_flight.inc()
        return RequestRecord(
            counted=counted,
            request_id=request_id,
            method=method,
            path=path,
            client=client,
            view=view,
            started=time.monotonic(),
            sink=self.finish,
        )

    def finish(self, record: RequestRecord) -> None:
        now = time.monotonic()
        if record.counted:
            metrics = self.metrics
            metrics.in_flight.dec()
            route = record.route or record.view
            model = record.canonical_model or (UNKNOWN_MODEL if record.route else NO_MODEL)
            metrics.answered(route, model, record.deployment, record.status, now - record.started)
            if record.stream:
                metrics.streamed(route, record.status, record.first_byte - record.started, now - record.first_byte)
            usage = record.usage
            if usage is not None:
                metrics.billed(model, record.deployment or "-", usage, record.cost_micros or 0)
        if self.log.isEnabledFor(logging.INFO):
            line = access_line(record.fields(now, time.time()), self.fmt)
            if not _write_directly(self.log, line):
                self.log.info(line)
        outages = self.outages
        if outages is not None and outages.open and record.org is not None and record.status < 500:
            outages.recovered("database")  # it authenticated the key: the database answers again
