"""Gunicorn settings of the gateway (the repo's ``gunicorn.conf.py`` imports this).

gevent workers, one greenlet per request or stream. Bind, workers and timeouts come from the
config file's ``[server]`` table, overridden by ``EZAT_BIND`` / ``EZAT_WORKERS`` (what
``ezat-compat serve --bind/--workers`` sets). The master migrates the database once before
forking, and prepares the shared folder of the Prometheus multiprocess metrics.

Logs: gunicorn's loggers and ours through one ``logconfig_dict`` (``[logging]``: JSON lines,
RFC 3339 UTC times); gunicorn's access log (``EZAT_ACCESS_LOG``, off by default: the
gateway writes its own line per request) never shows query values or credentials.
``[server] metrics_bind`` adds a listener that serves ``/metrics``. The multiprocess folder
this master made is removed on every exit, also after a SIGHUP (which reads this file again).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any

from ezat_compat.config import ConfigError, load_config, resolve_config_path
from ezat_compat.logs import gunicorn_logger_class, logging_config

try:
    _config = load_config(resolve_config_path(None))
except ConfigError as exc:
    print(f"ezat-compat: {exc}", file=sys.stderr)
    sys.exit(1)

wsgi_app = "ezat_compat.wsgi:app"
bind = [os.environ.get("EZAT_BIND") or _config.server.bind]
workers = int(os.environ.get("EZAT_WORKERS") or _config.server.workers)
worker_class = "gevent"
worker_connections = _config.server.worker_connections
timeout = _config.server.timeout_s
graceful_timeout = _config.server.graceful_timeout_s
keepalive = _config.server.http_keepalive_s
loglevel = _config.server.log_level
accesslog = os.environ.get("EZAT_ACCESS_LOG") or None
errorlog = "-"
proc_name = "ezat-compat"
# gunicorn >= 25 opens a control socket at one fixed path per user; several gateways on one
# machine (tests, benchmarks, nodes of a demo) would fight over it.
control_socket_disable = True
# SSE must not be buffered; the body cap is the app's (max_body_mb), not gunicorn's.
limit_request_line = 8190

_OWNED_METRICS_DIR = "EZAT_OWNED_METRICS_DIR"  # "PID:PATH" of the folder this master made


def _metrics_folder() -> str:
    """The multiprocess folder this master made ("" when it was given from outside). On a
    SIGHUP gunicorn reads this file again in the same master: the folder is still its own."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        return given if os.environ.get(_OWNED_METRICS_DIR) == f"{os.getpid()}:{given}" else ""
    made = tempfile.mkdtemp(prefix="ezat-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = made
    os.environ[_OWNED_METRICS_DIR] = f"{os.getpid()}:{made}"
    return made


def _observability_settings() -> None:
    """Logging, the metrics listener, the drain marker and the folder's removal at exit."""
    import logging

    # After PROMETHEUS_MULTIPROC_DIR is set (prometheus_client reads it at import), and light:
    # nothing here may import what the workers' gevent patching must come first for.
    from ezat_compat.drain import DRAIN_FILE_ENV
    from ezat_compat.metrics import remove_at_exit

    global logconfig_dict, logger_class, bind
    logging.captureWarnings(True)  # warnings become records: one line each, like the rest
    logconfig_dict = logging_config(_config.logging, _config.server.log_level, os.environ.get("EZAT_ACCESS_LOG"))
    logger_class = gunicorn_logger_class()
    if _config.server.metrics_bind and _config.server.metrics_bind not in bind:
        bind = [*bind, _config.server.metrics_bind]
    # ezat_compat.readiness.start_draining() in this master creates it; every worker sees it.
    os.environ.setdefault(
        DRAIN_FILE_ENV, os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"draining-{os.getpid()}")
    )
    if _metrics_dir:
        remove_at_exit(_metrics_dir)


_metrics_dir = _metrics_folder()
logconfig_dict: dict[str, Any] = {}
logger_class: Any = "gunicorn.glogging.Logger"
_observability_settings()


def on_starting(server: Any) -> None:
    from datetime import UTC, datetime

    from ezat_compat.store.db import make_engine, migrate
    from ezat_compat.store.ledger import STALE_RESERVATION, Ledger

    engine = make_engine(_config.gateway.database_url)
    try:
        migrate(engine)
        Ledger(engine).sweep_stale(STALE_RESERVATION, datetime.now(UTC))
    finally:
        engine.dispose()


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    if _metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
