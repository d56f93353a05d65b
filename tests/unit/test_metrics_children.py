"""``Metrics.child``: the labelled child ``labels()`` gives, looked up once."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from ezat_compat.metrics import Metrics


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
