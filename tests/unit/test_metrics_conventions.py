"""Tokens, cost, probes and the process tree in the metrics; the log files reopened by path."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ezat_compat.domain import LoggingSettings, Usage
from ezat_compat.server.logs import RequestLog, logging_config, reopen_log_files
from ezat_compat.server.metrics import Metrics, ProcessTreeCollector
from tests.conftest import IN_CI

REPO = Path(__file__).resolve().parents[2]


def _quiet(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(io.StringIO()))
    return logger


def test_billed_counts_non_zero_types_and_exact_micro_dollars() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.billed("anthropic/m", "a", Usage(input_tokens=12, output_tokens=7, cache_read_tokens=100), 1_234_567)
    metrics.billed("anthropic/m", "a", Usage(input_tokens=3, output_tokens=2), 9)
    metrics.billed("anthropic/m", "b", Usage(), 0)  # a failed request's zeros: nothing, no series

    def tokens(kind: str, deployment: str = "a") -> float | None:
        labels = {"model": "anthropic/m", "deployment": deployment, "gen_ai_token_type": kind}
        return metrics.registry.get_sample_value("gen_ai_client_token_usage_sum", labels)

    assert (tokens("input"), tokens("output"), tokens("cache_read")) == (15, 9, 100)
    assert tokens("cache_write") == tokens("reasoning") == 0  # looked up once, never observed
    assert (
        metrics.registry.get_sample_value(
            "gen_ai_client_token_usage_count", {"model": "anthropic/m", "deployment": "a", "gen_ai_token_type": "input"}
        )
        == 2
    )
    cost = metrics.registry.get_sample_value(
        "ezat_cost_microdollars_total", {"model": "anthropic/m", "deployment": "a"}
    )
    assert cost == 1_234_576
    assert tokens("input", "b") is None
    assert len(metrics._bills) == 1


def test_scrapes_and_probes_are_not_traffic_and_in_flight_is_zero_idle() -> None:
    metrics = Metrics(CollectorRegistry())
    log = RequestLog(metrics, logger=_quiet("t.probes"))
    for view in ("metrics", "healthz", "readyz"):
        record = log.start("r", "GET", "/" + view, "127.0.0.1", view)
        assert metrics.registry.get_sample_value("ezat_requests_in_flight") == 0
        record.answered(200)
    log.start("r", "GET", "/api/models", "127.0.0.1", "public_models").answered(200)
    text = generate_latest(metrics.registry).decode()
    assert 'route="public_models"' in text
    assert not any(f'route="{view}"' in text for view in ("metrics", "healthz", "readyz"))
    assert metrics.registry.get_sample_value("ezat_requests_in_flight") == 0


def test_a_request_log_finish_counts_the_billed_usage_once() -> None:
    metrics = Metrics(CollectorRegistry())
    record = RequestLog(metrics, logger=_quiet("t.billed")).start("r", "POST", "/v1/messages", "", "messages")
    record.route, record.canonical_model = "messages", "anthropic/m"
    record.settled(200, "a", 1)
    record.billed(Usage(input_tokens=5, output_tokens=1), 42)
    record.answered(200)
    record.answered(200)  # finished once
    labels = {"model": "anthropic/m", "deployment": "a"}
    assert metrics.registry.get_sample_value("ezat_cost_microdollars_total", labels) == 42


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")
def test_the_process_tree_is_the_master_and_its_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        registry = CollectorRegistry()
        registry.register(ProcessTreeCollector(os.getpid()))
        get = registry.get_sample_value
        assert get("ezat_processes") is not None and get("ezat_processes") >= 2  # this process and the child
        assert (get("process_cpu_seconds_total") or 0) > 0
        assert (get("process_resident_memory_bytes") or 0) > 2**20
        assert (get("process_open_fds") or 0) >= 3
        started = get("process_start_time_seconds") or 0
        assert time.time() - 86400 < started <= time.time()
    finally:
        child.kill()
        child.wait()
    gone = CollectorRegistry()
    gone.register(ProcessTreeCollector(2**22 + 1, proc="/nonexistent"))
    assert generate_latest(gone) == b""  # nowhere to read: nothing, and the scrape still answers


def test_log_files_are_configured_and_reopened_by_path(tmp_path: Path) -> None:
    config = logging_config(
        LoggingSettings(), "info", request_log=str(tmp_path / "access.log"), error_log=str(tmp_path / "error.log")
    )
    assert config["handlers"]["requests"]["filename"] == str(tmp_path / "access.log")
    assert config["handlers"]["stderr"]["filename"] == str(tmp_path / "error.log")
    assert logging_config(LoggingSettings(), "info")["handlers"]["requests"]["stream"] == "ext://sys.stderr"
    logger = logging.getLogger("t.rotated")
    logger.handlers.clear()
    logger.propagate = False
    handler = logging.FileHandler(tmp_path / "access.log")
    logger.addHandler(handler)
    try:
        logger.warning("before")
        (tmp_path / "access.log").rename(tmp_path / "access.log.1")
        logger.warning("still the old file")
        assert reopen_log_files([logger, logger]) == 1  # each handler once
        logger.warning("after")
    finally:
        handler.close()
    assert (tmp_path / "access.log.1").read_text() == "before\nstill the old file\n"
    assert (tmp_path / "access.log").read_text() == "after\n"


def test_the_grafana_dashboard_queries_only_metrics_the_gateway_exports() -> None:
    """deploy/grafana-dashboard.json is built on these names: a rename must update it."""
    metrics = Metrics(CollectorRegistry())
    registry = CollectorRegistry()
    registry.register(ProcessTreeCollector(os.getpid()))
    families = [*metrics.registry.collect(), *registry.collect()]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    known = {family.name + end for family in families for end in suffixes[family.type]}
    known |= {"ezat_deployments_in_cooldown", "ezat_build_info"}  # computed at scrape time
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    selectors = [re.sub(r"\bby \([^)]*\)", "", expr) for expr in exprs]  # label names aside
    used = {name for expr in selectors for name in re.findall(r"\b(?:ezat|gen_ai|process)_[a-z_]+", expr)}
    assert used and used <= known, used - known
    for wanted in ("ezat_cost_microdollars_total", "gen_ai_client_token_usage_sum", "ezat_failovers_total"):
        assert wanted in used


def test_the_dashboards_queries_are_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if IN_CI:
            pytest.fail("promtool is missing: .ci/run installs the Debian package prometheus")
        pytest.skip("promtool is not installed (Debian package prometheus; .ci/run installs it under CI=true)")
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    rules = [{"record": f"dashboard:q{n}", "expr": e.replace("$__rate_interval", "5m")} for n, e in enumerate(exprs)]
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
