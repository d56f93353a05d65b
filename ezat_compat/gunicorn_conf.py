"""Gunicorn settings of the gateway (the repo's ``gunicorn.conf.py`` imports this).

gevent workers, one greenlet per request or stream. Bind, workers and timeouts come from the
config file's ``[server]`` table, overridden by ``EZAT_BIND`` / ``EZAT_WORKERS`` (what
``ezat-compat serve --bind/--workers`` sets). The master migrates the database once before
forking, and prepares the shared folder of the Prometheus multiprocess metrics.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any

from ezat_compat.config import ConfigError, load_config, resolve_config_path
from ezat_compat.graceful import drain_file, drain_then_stop, on_worker_term, shutting_down

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

drain_file()  # made in the master, inherited by the workers (graceful.py)

if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _metrics_dir = tempfile.mkdtemp(prefix="ezat-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir
else:
    _metrics_dir = ""


def on_starting(server: Any) -> None:
    from datetime import UTC, datetime

    drain_then_stop(server, _config.server.drain_s)
    from ezat_compat.store.db import make_engine, migrate
    from ezat_compat.store.hotpath import make_hot_path
    from ezat_compat.store.ledger import STALE_RESERVATION, Ledger

    engine = make_engine(_config.gateway.database_url)
    hot_path = make_hot_path(engine)
    try:
        migrate(engine)
        Ledger(engine, hot_path).sweep_stale(STALE_RESERVATION, datetime.now(UTC))
    finally:
        hot_path.close()
        engine.dispose()


def post_worker_init(worker: Any) -> None:
    import logging

    gateway = worker.wsgi.extensions["ezat"]
    on_worker_term(worker, lambda: gateway.cut_streams(shutting_down()), float(_config.server.graceful_timeout_s))
    logging.basicConfig(
        level=getattr(logging, _config.server.log_level.upper(), logging.INFO),
        format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    shutil.rmtree(os.path.dirname(drain_file()), ignore_errors=True)
    if _metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
