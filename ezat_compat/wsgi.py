"""The WSGI entry point for gunicorn: the app of the config named by ``EZAT_CONFIG``."""

from ezat_compat.app import app_from_environment

app = app_from_environment()
