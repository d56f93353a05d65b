"""What the benchmark reads from /proc: CPU time of a process tree, a process's RSS, the machine.

CPU time is ``utime + stime`` (fields 14 and 15 of ``/proc/PID/stat``, in clock ticks) summed
over a process and all its live descendants, so a gunicorn master and its workers, or LiteLLM's
launcher and its uvicorn server, count as one server. Linux only.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rfind(")") + 2 :].split()


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/PID/task/*/children)."""
    found: list[int] = []
    tasks = Path(f"/proc/{pid}/task")
    try:
        for task in tasks.iterdir():
            try:
                found.extend(int(x) for x in (task / "children").read_text().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
    except (FileNotFoundError, ProcessLookupError):
        return []
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant, parents first."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        out.append(current)
        todo.extend(children(current))
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (0 if it is gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # After the name: state is field 3, so utime (14) and stime (15) are at indexes 11 and 12.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants."""
    return sum(cpu_seconds(p) for p in tree(pid))


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (VmRSS), in bytes; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot, all cores (from /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def wait_quiet(limit_pct: float, timeout_s: float, window_s: float = 1.0) -> float:
    """Wait until the machine's busy CPU over ``window_s`` is at most ``limit_pct`` percent of
    all cores (our servers being idle, that is other people's load), at most ``timeout_s``;
    returns the seconds waited."""
    started = time.monotonic()
    cores = os.cpu_count() or 1
    while True:
        busy = machine_busy_seconds()
        time.sleep(window_s)
        share = 100 * (machine_busy_seconds() - busy) / (window_s * cores)
        waited = time.monotonic() - started
        if share <= limit_pct or waited >= timeout_s:
            return waited - window_s if share <= limit_pct else waited


def children_cpu_seconds() -> float:
    """CPU seconds of this process's waited-for children (the finished load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine() -> dict[str, object]:
    """CPU model, cores, memory, kernel, Python and the load average when the run started."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
                break
    except OSError:
        pass
    return {
        "cpu_model": model or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": list(os.getloadavg()),
    }
