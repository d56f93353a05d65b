"""The WSGI entry point for gunicorn: the app of the configuration the master holds (the last
one that validated, ``serving.served_config``), else of the file named by ``EZAT_CONFIG``."""

from __future__ import annotations

from flask import Flask

from ezat_compat.app import app_from_environment, create_app
from ezat_compat.server.serving import served_config


def worker_app() -> Flask:
    """The WSGI app of a gunicorn worker: built from the configuration its master holds (the
    last one that validated), else, outside ezat-compat's gunicorn settings, from the file."""
    config = served_config()
    return create_app(config) if config is not None else app_from_environment()


app = worker_app()
