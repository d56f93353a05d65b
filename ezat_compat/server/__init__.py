"""The server plumbing around the gateway: gunicorn settings and hooks, serving, the graceful
drain, readiness, logs, metrics, forwarded addresses, the process id and the WSGI entry point."""
