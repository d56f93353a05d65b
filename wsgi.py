"""``gunicorn -c gunicorn.conf.py wsgi:app`` from the repository root."""

from ezat_compat.server.wsgi import app

__all__ = ["app"]
