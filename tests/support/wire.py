"""One HTTP/1.1 message read off a raw socket by the tests' scripted servers."""

from __future__ import annotations

import socket

__all__ = ["read_message"]


def read_message(sock: socket.socket, buffer: bytes = b"") -> tuple[bytes, bytes, bytes] | None:
    """(head, body, rest): the next message on ``sock`` after ``buffer`` (what an earlier read
    took past the last message), its body as long as its ``content-length`` (none: empty); None
    when the peer closes before a whole head."""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            return None
        buffer += data
    head, _, buffer = buffer.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(buffer) < length:
        data = sock.recv(65536)
        if not data:
            break
        buffer += data
    return head, buffer[:length], buffer[length:]
