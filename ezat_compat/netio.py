"""``sendall`` in one ``send`` call when the socket buffer takes it all.

gevent's ``sendall`` asks the kernel for the socket's buffer size (``getsockopt``) and reads
the clock before every send, also when one ``send`` takes the whole message, which is what
happens to nearly every response and upstream request. ``send_all`` sends once and leaves
only what that left over to ``sendall``: the same bytes, in the same order.
"""

from __future__ import annotations

from typing import Any


def send_all(sock: Any, data: bytes) -> None:
    """``sock.sendall(data)``: one ``send``, then ``sendall`` for what it didn't take."""
    sent = sock.send(data)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])
