"""Gunicorn settings of the gateway (the repo's ``gunicorn.conf.py`` imports this).

gevent workers, one greenlet per request or stream. Bind, workers and timeouts come from the
config file's ``[server]`` table, overridden by ``EZAT_BIND`` / ``EZAT_WORKERS`` (what
``ezat-compat serve --bind/--workers`` sets). The master migrates the database once before
forking, and prepares the shared folder of the Prometheus multiprocess metrics.

The master executes this file on start and again on every SIGHUP (before ``on_reload``). On
start a bad configuration, bind address or database stops it with one line; on a reload a bad
file is refused in one line and the workers keep serving the configuration the master holds
(``ezat_compat.server.serving``). ``[server] pidfile`` and the process titles (``[server] name``)
are set here too.
Logs: gunicorn's loggers and ours through one ``logconfig_dict`` (``[logging]``: JSON lines,
RFC 3339 UTC times), to stderr or ``[server] access_log`` / ``error_log``, files the master
and every worker reopen on SIGUSR1 (logrotate's ``postrotate``: gunicorn's convention, through
``logger_class``); gunicorn's access log (``EZAT_ACCESS_LOG``, off by default: the gateway
writes its own line per request) never shows query values or credentials.
``[server] metrics_bind`` adds a listener that serves ``/metrics``, ``[admin] bind`` (or
``EZAT_ADMIN_BIND``) one that serves the admin API; both are checked at start like the main one. The multiprocess folder
(``metrics-*`` in the data folder) this master made is removed on every exit, also after a
SIGHUP (which reads this file again). The process's umask is 077: every file it writes is 0600.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any

from ezat_compat.server import serving
from ezat_compat.server.graceful import drain_then_stop, on_worker_term, shutting_down
from ezat_compat.server.logs import gunicorn_logger_class, log_file_problems, logging_config

_config = serving.master_config()
# Every file the gateway writes is its own: 0600 files in 0700 folders (the database and the
# journal hold balances and key hashes; the metrics' files, the logs and the pidfile follow).
# gunicorn's own ``umask`` setting applies to its sockets and worker temp files only.
os.umask(0o077)

wsgi_app = "ezat_compat.server.wsgi:app"
bind = [os.environ.get("EZAT_BIND") or _config.server.bind]
pidfile = _config.server.pidfile or None
# Titles need the setproctitle package (a dependency): "master [ezat-compat: /etc/ezat/ezat.toml]".
proc_name = serving.process_title(_config, bind[0])
workers = int(os.environ.get("EZAT_WORKERS") or _config.server.workers)
# gunicorn's gevent worker, its own 400/414/431 refusals in the JSON envelope (server/worker.py).
worker_class = "ezat_compat.server.worker.JSONErrorsGeventWorker"
worker_connections = _config.server.worker_connections
timeout = _config.server.timeout_s
graceful_timeout = _config.server.graceful_timeout_s
keepalive = _config.server.http_keepalive_s
# The proxies trusted with X-Forwarded-* (gunicorn: the scheme; the app: the client's address).
forwarded_allow_ips = _config.server.forwarded_allow_ips
loglevel = _config.server.log_level
accesslog = os.environ.get("EZAT_ACCESS_LOG") or None
errorlog = "-"
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
    from ezat_compat.datafiles import data_folder, private_dir

    folder = data_folder(_config)
    try:
        made = tempfile.mkdtemp(prefix="metrics-", dir=private_dir(folder))  # 0700, in the data folder
    except OSError as exc:  # check-config names it too
        raise SystemExit(f"ezat-compat: cannot start: data_dir: {folder}: {exc.strerror or exc}") from None
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = made
    os.environ[_OWNED_METRICS_DIR] = f"{os.getpid()}:{made}"
    return made


def _observability_settings() -> None:
    """Logging, the metrics listener, the drain marker and the folder's removal at exit."""
    import logging

    # After PROMETHEUS_MULTIPROC_DIR is set (prometheus_client reads it at import), and light:
    # nothing here may import what the workers' gevent patching must come first for.
    from ezat_compat.server.drain import DRAIN_FILE_ENV
    from ezat_compat.server.metrics import MASTER_PID_ENV, remove_at_exit

    global logconfig_dict, logger_class, bind
    logging.captureWarnings(True)  # warnings become records: one line each, like the rest
    problems = log_file_problems({"access_log": _config.server.access_log, "error_log": _config.server.error_log})
    if problems:  # else gunicorn's dictConfig fails with "Unable to configure handler 'requests'"
        raise SystemExit("ezat-compat: cannot start: " + "; ".join(problems))
    logconfig_dict = logging_config(
        _config.logging,
        _config.server.log_level,
        os.environ.get("EZAT_ACCESS_LOG"),
        request_log=_config.server.access_log,
        error_log=_config.server.error_log,
    )
    logger_class = gunicorn_logger_class()
    if _config.server.metrics_bind and _config.server.metrics_bind not in bind:
        bind = [*bind, _config.server.metrics_bind]
    try:
        admin = serving.admin_bind(_config, bind[0])  # the admin API's listener (app._register_admin)
    except serving.StartupError as exc:
        raise SystemExit(f"ezat-compat: cannot start: {exc}") from None
    if admin and admin not in bind:
        bind = [*bind, admin]
    # ezat_compat.server.readiness.start_draining() in this master creates it; every worker sees it.
    os.environ.setdefault(
        DRAIN_FILE_ENV, os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"draining-{os.getpid()}")
    )
    if _metrics_dir:
        remove_at_exit(_metrics_dir)
    os.environ[MASTER_PID_ENV] = str(os.getpid())  # the process tree's root for process_* (a re-exec: the new one)


_metrics_dir = _metrics_folder()
logconfig_dict: dict[str, Any] = {}
logger_class: Any = "gunicorn.glogging.Logger"
_observability_settings()


def _start_checks(server: Any) -> None:
    """Before the master listens: the bind address is free and the database migrated (else one
    line and exit 1, the pidfile removed), and a warning per deployment without its key."""
    try:
        if not (os.environ.get("LISTEN_FDS") or os.environ.get("GUNICORN_FD")):  # sockets handed over: bound
            for address in server.cfg.bind:
                serving.check_bind(address)
        serving.prepare_database(_config)
        serving.check_sealing_key(_config)
        from ezat_compat.server.telemetry import missing_extra

        telemetry_problem = missing_extra(_config.telemetry)  # else every worker fails its first request
        if telemetry_problem:
            raise serving.StartupError(telemetry_problem)
    except serving.StartupError as exc:
        print(f"ezat-compat: {exc}", file=sys.stderr, flush=True)
        if getattr(server, "pidfile", None) is not None:
            server.pidfile.unlink()
        raise SystemExit(1) from None
    for line in serving.deployment_warnings(_config):
        server.log.warning(line)


def _guard_reload(server: Any) -> None:
    """SIGHUP: refuse a bad file (one line); workers then start from the held configuration."""
    if serving.reload_config(server.log.error, server.log.warning):
        server.log.info("configuration reloaded from %s", os.path.abspath(serving.resolve_config_path(None)))


def on_starting(server: Any) -> None:
    _start_checks(server)
    _release_dead_worker(None)  # on start: the journal, then the holds of dead workers of dead masters


def when_ready(server: Any) -> None:
    drain_then_stop(_config.server.drain_s)  # after gunicorn set its signal handlers


def on_reload(server: Any) -> None:
    _guard_reload(server)


def post_worker_init(worker: Any) -> None:
    gateway = worker.wsgi.extensions["ezat"]
    gateway.ledger.start_replayer()  # the journal is applied when the database answers, traffic or not
    store = worker.wsgi.extensions.get("ezat_store")
    if store is not None and store.rollup is not None:
        store.rollup.start()  # the reports' rollup folds new ledger rows in the background (store/rollup.py)
    if store is not None and store.spend is not None:
        from ezat_compat.alerts import start_alerts
        from ezat_compat.upstream.egress import trusting_session

        # spend limits' thresholds: webhooks and gauges, every few seconds (ezat_compat/alerts.py),
        # sent through the environment's proxies with [gateway] ca_file trusted besides its CAs
        ca_files = (_config.gateway.ca_file,) if _config.gateway.ca_file else ()
        start_alerts(store.spend, _config.alerts, gateway.metrics.publish_spend_limits, trusting_session(ca_files).post)
    on_worker_term(worker, lambda: gateway.cut_streams(shutting_down()), float(_config.server.graceful_timeout_s))
    serving.tune_collector()  # last: the app and its hooks are what it sets aside


def worker_exit(server: Any, worker: Any) -> None:
    """In the worker, once it has stopped serving: its store's handles are closed and the spans
    not yet exported are sent (``[telemetry]``)."""
    extensions = getattr(worker.wsgi, "extensions", {}) if worker.wsgi is not None else {}
    store = extensions.get("ezat_store")
    if store is not None:
        store.close()
    tracing = getattr(extensions.get("ezat"), "tracing", None)
    if tracing is not None:
        tracing.shutdown()


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
    _release_dead_worker(worker.pid)


def _recover(ledger: Any, worker_pid: int | None) -> None:
    """The master's part of "nothing stuck": apply the usage journal (settlements the dead
    worker couldn't write, store/journal.py), then settle the reservations that worker
    (``worker_pid``; None on start: those of dead workers of dead masters on this host) still holds as gateway
    failures (store/ledger.py ``release_worker``). Releasing waits for a complete replay, so
    a journaled settlement always wins; what is left is done by the workers' ``maintain``."""
    import logging
    import os

    from ezat_compat.store.ledger import legacy_journal_dirs
    from ezat_compat.store.workers import BOOT, HOST, live_tag, tag_prefix

    try:
        if worker_pid is None:  # on start: what an earlier release journaled elsewhere joins the journal
            for folder in legacy_journal_dirs(_config.gateway.database_url):
                ledger.journal.adopt(folder)
        if ledger.replay().failed:
            return
        if worker_pid is None:
            ledger.release_orphaned()
        else:
            prefix = tag_prefix(HOST, BOOT, os.getpid(), worker_pid)
            ledger.release_worker(prefix, keep=live_tag(os.getpid(), worker_pid))
    except Exception as exc:
        logging.getLogger("ezat_compat").warning("could not release dead workers' reservations yet: %s", exc)


def _release_dead_worker(pid: int | None) -> None:
    """Release the reservations of worker ``pid`` that just exited, whatever killed it (None: on
    start, those of dead workers of dead masters)."""
    from ezat_compat.store.store import open_store

    store = open_store(_config.gateway.database_url, config=_config, pool_size=1)
    try:
        _recover(store.ledger, pid)
    finally:
        store.close()


def on_exit(server: Any) -> None:
    if _metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
