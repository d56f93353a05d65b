"""``api.common.still_connected``: the cheap peek that tells a client that left (billed 499)."""

from __future__ import annotations

import os
import socket

from ezat_compat.api.common import still_connected


def test_a_connected_client_with_nothing_sent_is_still_there() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert still_connected(ours) is True


def test_a_client_that_sent_more_bytes_is_still_there_and_the_bytes_stay_unread() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"GET / HTTP/1.1\r\n")
        assert still_connected(ours) is True
        assert ours.recv(64) == b"GET / HTTP/1.1\r\n"  # a peek: the next request's bytes are kept


def test_a_client_that_closed_its_side_has_left() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        theirs.close()
        assert still_connected(ours) is False


def test_a_socket_already_closed_counts_as_left() -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        ours.close()
        assert still_connected(ours) is False


def test_a_client_on_a_descriptor_past_1023_is_still_there() -> None:
    """A worker holding a thousand streams hands out descriptors past ``select``'s 1023: a JSON
    reply served on one of them is no client that left (it was billed 499 when the peek used
    ``select``, which refuses such a descriptor)."""
    ours, theirs = socket.socketpair()
    high = socket.socket(fileno=os.dup2(ours.fileno(), 1500))
    with ours, theirs, high:
        assert high.fileno() > 1023
        assert still_connected(high) is True
        theirs.close()
        assert still_connected(high) is False
