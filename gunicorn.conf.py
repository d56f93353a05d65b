"""Run the gateway directly with gunicorn: ``gunicorn -c gunicorn.conf.py wsgi:app``
(``ezat-compat serve`` does the same). The settings live in ezat_compat/server/gunicorn_conf.py."""

from ezat_compat.server.gunicorn_conf import *  # noqa: F403
