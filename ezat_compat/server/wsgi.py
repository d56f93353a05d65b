"""The WSGI entry point for gunicorn: the app of the configuration the master holds (the last
one that validated, see ``serving.worker_app``), else of the file named by ``EZAT_CONFIG``."""

from ezat_compat.server.serving import worker_app

app = worker_app()
