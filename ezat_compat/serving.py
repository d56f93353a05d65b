"""``ezat-compat serve``: gunicorn with gevent workers and the gateway's gunicorn settings."""

from __future__ import annotations

import os
import sys

from ezat_compat.domain import Config


def gunicorn_argv(config: Config) -> list[str]:
    conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gunicorn_conf.py")
    return [sys.executable, "-m", "gunicorn", "-c", conf, "ezat_compat.wsgi:app"]


def serving_environment(config: Config, *, bind: str | None = None, workers: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["EZAT_CONFIG"] = os.path.abspath(config.path)
    if bind:
        env["EZAT_BIND"] = bind
    if workers:
        env["EZAT_WORKERS"] = str(workers)
    return env


def serve(config: Config, *, bind: str | None = None, workers: int | None = None) -> int:
    """Replace this process with the gunicorn master (signals then reach gunicorn directly).
    The master migrates the database before it forks the workers."""
    argv = gunicorn_argv(config)
    os.execve(sys.executable, argv, serving_environment(config, bind=bind, workers=workers))
    return 0  # pragma: no cover - execve does not return
