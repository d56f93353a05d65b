"""The simulator as ``python -m ezat_compat.sim`` runs it, with TCP_NODELAY on every connection.

    python bench/sim_nodelay.py --bind 127.0.0.1:0 [simulator flags]

Why: gevent's WSGI server writes a response's headers and its body with two ``sendall`` calls.
Without TCP_NODELAY, Nagle's algorithm holds the body back until the client ACKs the headers,
and a client on a kept-alive connection delays that ACK by 40 ms (Linux's delayed ACK). Every
non-streaming answer of the stock simulator on a reused connection therefore takes ~40 ms more
(the first one on a fresh connection does not) — an artefact that would hide the gateway's own
costs and would slow all three targets alike (our gateway and LiteLLM reuse their upstream
connections; so does the load generator). Real upstreams and gunicorn (which sets TCP_NODELAY
on its listener) don't have it. ``bench/run.py --stock-sim`` uses the unchanged simulator.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import socket  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

from gevent import pywsgi  # noqa: E402

from ezat_compat.sim.server import main  # noqa: E402


class NoDelayHandler(pywsgi.WSGIHandler):
    """gevent's handler, with Nagle's algorithm off on the accepted socket."""

    def __init__(self, sock: Any, address: Any, server: Any, rfile: Any = None) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().__init__(sock, address, server, rfile)


pywsgi.WSGIServer.handler_class = NoDelayHandler

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
