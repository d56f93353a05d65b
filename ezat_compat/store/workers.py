"""Who holds a reservation: a tag naming one process of one boot of one host.

A tag is ``host:boot:parent:pid:start`` — the host name (sanitised), the kernel's boot id, the
parent's pid (a gunicorn worker's master), the pid and the process's start time in clock ticks
(``/proc/<pid>/stat`` field 22). A pid reused later, or on another host, or after a reboot, is a
different tag; a tag is *dead* when its host and boot are ours and no process with that pid and
start time runs now. ``parse_tag`` and ``tag_prefix`` are pure; ``current_tag`` and
``is_dead`` read ``/proc``.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")
TAG_MAX = 160


@dataclass(frozen=True, slots=True)
class Tag:
    host: str
    boot: str
    parent: int
    pid: int
    start: int

    def __str__(self) -> str:
        return f"{self.host}:{self.boot}:{self.parent}:{self.pid}:{self.start}"


def sanitise_host(name: str) -> str:
    """A host name safe in a tag and a file name (no ``:``, ``~`` or ``/``), at most 64 characters."""
    return _UNSAFE.sub("-", name)[:64] or "host"


def parse_tag(text: str) -> Tag | None:
    """The ``Tag`` written as ``text``, or None when it isn't one."""
    parts = text.split(":")
    if len(parts) != 5 or not parts[0] or not parts[1]:
        return None
    try:
        parent, pid, start = int(parts[2]), int(parts[3]), int(parts[4])
    except ValueError:
        return None
    return Tag(parts[0], parts[1], parent, pid, start)


def tag_prefix(host: str, boot: str, parent: int, pid: int | None = None) -> str:
    """What every tag of ``parent``'s children (and, with ``pid``, of that one child) starts with."""
    prefix = f"{host}:{boot}:{parent}:"
    return prefix if pid is None else f"{prefix}{pid}:"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:32] or "boot"
    except OSError:
        return "boot"


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its end.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


HOST = sanitise_host(socket.gethostname())
BOOT = _boot_id()


def current_tag() -> Tag:
    """This process's tag (computed again in a forked child: the pid changes)."""
    pid = os.getpid()
    return Tag(HOST, BOOT, os.getppid(), pid, start_ticks(pid) or 0)


def is_dead(tag: Tag) -> bool:
    """True when ``tag`` is a process of this host that doesn't run any more (an earlier boot of
    this host counts as dead); a tag of another host is never called dead here."""
    if tag.host != HOST:
        return False
    if tag.boot != BOOT:
        return True
    return start_ticks(tag.pid) != tag.start


_current = ""


def _forked() -> None:
    global _current
    _current = ""


os.register_at_fork(after_in_child=_forked)


def worker_tag() -> str:
    """``str(current_tag())``, computed once per process (again in a forked child)."""
    global _current
    if not _current:
        _current = str(current_tag())
    return _current


def live_tag(parent: int, pid: int) -> str:
    """The tag process ``pid`` (child of ``parent``) has if it runs now, else ``""``."""
    start = start_ticks(pid)
    return "" if start is None else str(Tag(HOST, BOOT, parent, pid, start))
