"""``procid.pid()`` is ``os.getpid()`` without the system call: right in this process and in
a forked child (the metrics' multiprocess files and the per-process connections key on it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from ezat_compat import procid


def test_pid_is_this_process_id() -> None:
    assert procid.pid() == os.getpid()


def test_a_forked_child_sees_its_own_id() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(write, f"{procid.pid()} {os.getpid()}".encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(child, 0)
    seen, real = os.read(read, 64).decode().split()
    os.close(read)
    assert status == 0 and int(seen) == int(real) == child != os.getpid()


def test_multiprocess_metrics_write_the_files_of_the_process_that_counts(tmp_path: object) -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from ezat_compat.server.metrics import Metrics
        metrics = Metrics()
        metrics.requests.labels("chat", "m", "d", "200").inc()
        child = os.fork()
        if child == 0:
            metrics.requests.labels("chat", "m", "d", "200").inc()
            os._exit(0)
        os.waitpid(child, 0)
        print(os.getpid(), child)
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    parent, child = done.stdout.split()
    counters = sorted(name for name in os.listdir(str(tmp_path)) if name.startswith("counter_"))
    assert counters == sorted([f"counter_{parent}.db", f"counter_{child}.db"])
