"""Gunicorn settings of the stack floor (``floor_app.py``): our gateway's worker settings.

The values come from the same config file the benchmark's gateway runs with (``EZAT_CONFIG``),
read the way ``ezat_compat/server/gunicorn_conf.py`` reads them: gevent workers, the same worker
connections, timeouts, HTTP keep-alive, log level and request-line limit; bind and workers from
``FLOOR_BIND`` / ``FLOOR_WORKERS``. None of the gateway's hooks (migrations, metrics folder).
"""

from __future__ import annotations

import os

from ezat_compat.config import load_config, resolve_config_path

_config = load_config(resolve_config_path(None))

wsgi_app = "floor_app:app"
bind = [os.environ.get("FLOOR_BIND") or _config.server.bind]
workers = int(os.environ.get("FLOOR_WORKERS") or _config.server.workers)
worker_class = "gevent"
worker_connections = _config.server.worker_connections
timeout = _config.server.timeout_s
graceful_timeout = _config.server.graceful_timeout_s
keepalive = _config.server.http_keepalive_s
loglevel = _config.server.log_level
accesslog = None
errorlog = "-"
proc_name = "ezat-bench-floor"
control_socket_disable = True
limit_request_line = 8190
