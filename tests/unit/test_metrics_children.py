"""``Metrics.child``: the labelled child ``labels()`` gives, looked up once; and the
multiprocess mode, prometheus_client's own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from prometheus_client import CollectorRegistry

from ezat_compat.server.metrics import Metrics


def test_a_child_is_the_one_labels_gives_and_counts_there() -> None:
    metrics = Metrics(CollectorRegistry())
    child = metrics.child(metrics.requests, "chat.completions", "anthropic/m", "a", "200")
    assert child is metrics.requests.labels("chat.completions", "anthropic/m", "a", "200")
    assert metrics.child(metrics.requests, "chat.completions", "anthropic/m", "a", "200") is child
    metrics.answered("chat.completions", "anthropic/m", "a", 200, 0.01)
    metrics.answered("chat.completions", "anthropic/m", "a", 200, 0.01)
    sample = metrics.registry.get_sample_value(
        "ezat_requests_total", {"route": "chat.completions", "model": "anthropic/m", "deployment": "a", "status": "200"}
    )
    assert sample == 2.0
    other = metrics.child(metrics.requests, "chat.completions", "anthropic/m", "a", "429")
    assert other is not child and other is metrics.requests.labels("chat.completions", "anthropic/m", "a", "429")


def test_multiprocess_mode_is_the_packages_own_and_sums_the_workers() -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client is imported (what gunicorn's
    config does in the master): each process's samples go to the shared folder, ``render``
    sums them, a dead worker's live gauges drop out, and nothing of the package is replaced."""
    script = textwrap.dedent(
        """
        import os, sys, tempfile
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
        import prometheus_client.values as values
        from prometheus_client import multiprocess
        before = (values.ValueClass, values.Lock)
        from ezat_compat.server.metrics import Metrics
        metrics = Metrics()
        assert metrics.multiprocess and (values.ValueClass, values.Lock) == before
        metrics.answered("chat.completions", "anthropic/m", "a", 200, 0.01)
        metrics.in_flight.inc()
        pid = os.fork()
        if pid == 0:  # a second worker
            metrics.answered("chat.completions", "anthropic/m", "a", 200, 0.01)
            metrics.in_flight.inc()
            os._exit(0)
        os.waitpid(pid, 0)
        text = metrics.render()[0].decode()
        line = 'ezat_requests_total{deployment="a",model="anthropic/m",route="chat.completions",status="200"} 2.0'
        assert line in text, text
        assert "ezat_requests_in_flight 2.0" in text, text
        multiprocess.mark_process_dead(pid)
        assert "ezat_requests_in_flight 1.0" in metrics.render()[0].decode()
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
