"""Readiness, the request log and the metrics, through the real gateway under gunicorn.

One gateway (one worker) serves most tests here: ``[logging]`` at info with the request log
on, gunicorn's access log on (``EZAT_ACCESS_LOG``), ``[server] metrics_bind`` on a second
port, and a drain marker file the tests create as the shutdown code would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests

from ezat_compat import __version__
from tests.conftest import IN_CI, free_port
from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
MODEL = "anthropic/claude-sonnet-5-5"
SLOW = "test/slow"


@dataclass
class ObsGateway(Gateway):
    """The harness's gateway with extra ``[server]`` keys and a ``[logging]`` table."""

    server_extra: dict[str, Any] = field(default_factory=dict)
    logging: dict[str, Any] = field(default_factory=dict)

    def write_config(self) -> None:
        super().write_config()
        text = self.config_path.read_text()
        extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in self.server_extra.items())
        text = text.replace("[server]\n", "[server]\n" + extra, 1)
        if self.logging:
            text += "\n[logging]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in self.logging.items())
        self.config_path.write_text(text)


def wait_for(check: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def log_records(gw: Gateway) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gw.log_text().splitlines() if line.strip()]


def access_record(gw: Gateway, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for rec in log_records(gw):
            if rec.get("logger") == "access" and rec.get("request_id") == request_id:
                return rec
        return None

    found: dict[str, Any] = wait_for(find, timeout_s, f"the log line of {request_id}")
    return found


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', rest))
        out[(name, labels)] = float(value)
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    fast = Sim(name="sim-a", flags=("--min-cache-tokens", "16")).start()
    slow = Sim(name="slow", flags=("--token-delay-ms", "150")).start()
    yield {"fast": fast, "slow": slow}
    fast.stop()
    slow.stop()


@pytest.fixture(scope="module")
def obs(sims: dict[str, Sim], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObsGateway]:
    root = tmp_path_factory.mktemp("obs")
    models = [
        ModelSpec(deployments=[{"name": "sim-a", "base_url": sims["fast"].url}]),
        ModelSpec(id=SLOW, aliases=("slow",), deployments=[{"name": "slow-a", "base_url": sims["slow"].url}]),
        ModelSpec(id="test/cool", aliases=("cool",), deployments=[{"name": "cool-a", "base_url": sims["fast"].url}]),
    ]
    server = ObsGateway(
        root=root,
        models=models,
        gateway_settings={"keepalive_s": 1},
        env={"EZAT_ACCESS_LOG": "-", "EZAT_DRAIN_FILE": str(root / "draining")},
        server_extra={"metrics_bind": f"127.0.0.1:{free_port()}"},
        logging={"level": "info", "format": "json", "access_log": True},
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(obs: ObsGateway) -> str:
    return obs.new_key("acme")


def metrics_url(gw: ObsGateway) -> str:
    return "http://" + gw.server_extra["metrics_bind"] + "/metrics"


def scrape(gw: ObsGateway) -> str:
    resp = requests.get(metrics_url(gw), timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.text


def chat(gw: Gateway, key: str, model: str = MODEL, content: str = "hi", **extra: Any) -> requests.Response:
    body = {"model": model, "max_completion_tokens": 16, "messages": [{"role": "user", "content": content}], **extra}
    return requests.post(
        gw.url + "/openai/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


# ---------------------------------------------------------------- the request log


def test_one_json_line_per_request_with_its_facts_and_no_text_or_key(obs: ObsGateway, key: str) -> None:
    secret_word = f"zebra{uuid.uuid4().hex[:8]}"
    ok = chat(obs, key, content=f"tell me about {secret_word}")
    assert ok.status_code == 200
    line = access_record(obs, ok.headers["request-id"])
    usage = ok.json()["usage"]
    assert line["status"] == 200 and line["stream"] is False and line["error"] is None
    assert line["org"] == "acme" and line["key_id"].startswith("key_")
    assert line["model"] == MODEL and line["canonical_model"] == MODEL
    assert line["deployment"] == "sim-a" and line["attempts"] == 1
    assert line["endpoint"] == "chat.completions" and line["path"] == "/openai/v1/chat/completions"
    assert line["input_tokens"] + line["cache_read_tokens"] + line["cache_write_tokens"] == usage["prompt_tokens"]
    assert line["output_tokens"] == usage["completion_tokens"]
    assert float(line["cost_usd"]) > 0 and line["latency_ms"] > 0 and line["ttfb_ms"] <= line["latency_ms"]
    assert RFC3339.match(line["time"])

    aliased = chat(obs, key, model="Claude-Sonnet-5.5")
    line = access_record(obs, aliased.headers["request-id"])
    assert (line["model"], line["canonical_model"]) == ("Claude-Sonnet-5.5", MODEL)

    bad_key = chat(obs, "ezat_sk_" + "x" * 32)
    assert bad_key.status_code == 401
    line = access_record(obs, bad_key.headers["request-id"])
    assert (line["status"], line["error"], line["org"], line["key_id"]) == (401, "AuthenticationError", None, None)

    unknown = chat(obs, key, model="nobody-configured-this")
    line = access_record(obs, unknown.headers["request-id"])
    assert (line["status"], line["error"], line["model"], line["canonical_model"]) == (
        404,
        "ModelNotFoundError",
        "nobody-configured-this",
        None,
    )

    text = obs.log_text()
    assert secret_word not in text  # never prompt or completion text
    assert ok.json()["choices"][0]["message"]["content"] not in text
    assert key not in text  # never a key


def test_query_string_keys_never_reach_any_log_line(obs: ObsGateway, key: str) -> None:
    resp = requests.post(
        obs.url + f"/openai/v1/chat/completions?api_key={key}&x=1",
        json={"model": MODEL, "max_completion_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert resp.status_code == 200
    access_record(obs, resp.headers["request-id"])

    def gunicorn_line() -> dict[str, Any] | None:
        return next(
            (r for r in log_records(obs) if r["logger"] == "gunicorn.access" and "api_key=" in r["message"]), None
        )

    line = wait_for(gunicorn_line, what="gunicorn's access line")
    assert "?api_key=…&x=… " in line["message"]
    assert key not in obs.log_text()


def test_every_line_is_json_with_one_timestamp_format(obs: ObsGateway, key: str) -> None:
    assert chat(obs, key).status_code == 200
    records = log_records(obs)  # raises on any line that is not JSON
    assert {"gunicorn.error", "gunicorn.access", "access"} <= {r["logger"] for r in records}
    for rec in records:
        assert RFC3339.match(rec["time"]), rec
    starting = next(r for r in records if r["logger"] == "gunicorn.error")
    assert starting["level"] == "info" and "pid" in starting


def test_a_stream_is_logged_when_it_ends_not_when_its_headers_go_out(obs: ObsGateway, key: str) -> None:
    body = {"model": SLOW, "stream": True, "max_completion_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"}
    with requests.post(
        obs.url + "/openai/v1/chat/completions", json=body, headers=headers, stream=True, timeout=30
    ) as resp:
        rid = resp.headers["request-id"]
        lines = resp.iter_lines()
        assert next(lines).startswith(b"data: ")
        in_flight = value(scrape(obs), "ezat_requests_in_flight")
        assert in_flight >= 1  # this stream (a scrape is not traffic)
        assert rid not in obs.log_text()  # still streaming: no line yet
        started = time.monotonic()
        rest = [chunk for chunk in lines if chunk]
        streamed_s = time.monotonic() - started
    assert rest[-1] == b"data: [DONE]"
    line = access_record(obs, rid)
    assert (line["status"], line["stream"], line["deployment"]) == (200, True, "slow-a")
    assert line["latency_ms"] - line["ttfb_ms"] >= streamed_s * 1000 * 0.8
    assert line["output_tokens"] > 0


def test_a_stream_the_client_leaves_is_logged_as_499(obs: ObsGateway, key: str) -> None:
    body = {"model": SLOW, "stream": True, "max_completion_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    resp = requests.post(
        obs.url + "/openai/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=30,
    )
    rid = resp.headers["request-id"]
    next(resp.iter_lines())
    resp.close()
    line = access_record(obs, rid, timeout_s=15)
    assert (line["status"], line["stream"]) == (499, True)


# ---------------------------------------------------------------- metrics


def test_every_answer_is_counted_with_bounded_labels(obs: ObsGateway, key: str) -> None:
    limited = obs.new_key("acme", "--rpm", "1")
    before = scrape(obs)
    assert chat(obs, key).status_code == 200
    assert chat(obs, "ezat_sk_" + "y" * 32).status_code == 401
    stranger = f"stranger-{uuid.uuid4().hex[:8]}"
    assert chat(obs, key, model=stranger).status_code == 404
    assert chat(obs, limited).status_code == 200
    assert chat(obs, limited).status_code == 429
    assert requests.get(obs.url + "/no/such/route", timeout=10).status_code == 404
    after = scrape(obs)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    req = "ezat_requests_total"
    route = "chat.completions"
    assert delta(req, route=route, model=MODEL, deployment="sim-a", status="200") == 2
    assert delta(req, route=route, model="unknown", deployment="-", status="401") == 1
    assert delta(req, route=route, model="unknown", deployment="-", status="404") == 1
    assert delta(req, route=route, model=MODEL, deployment="-", status="429") == 1
    assert delta(req, route="unmatched", model="-", deployment="-", status="404") == 1
    assert stranger not in after
    hist = "gen_ai_server_request_duration_seconds_count"
    assert delta(hist, route=route, status_class="2xx") == 2
    assert delta(hist, route=route, status_class="4xx") == 3
    assert value(after, "ezat_build_info", version=__version__, python=samples_python(after)) == 1


def samples_python(text: str) -> str:
    match = re.search(r'ezat_build_info\{[^}]*python="([^"]+)"', text)
    assert match, "no ezat_build_info"
    return match.group(1)


def test_stream_histograms_and_in_flight(obs: ObsGateway, key: str) -> None:
    before = scrape(obs)
    assert chat(obs, key, stream=True).status_code == 200
    completed = {"route": "chat.completions", "outcome": "completed"}

    def stream_counted() -> str | None:
        text = scrape(obs)
        grew = value(text, "ezat_stream_duration_seconds_count", **completed) > value(
            before, "ezat_stream_duration_seconds_count", **completed
        )
        return text if grew else None

    after = wait_for(stream_counted, what="the stream's histograms")
    assert value(after, "gen_ai_server_time_to_first_token_seconds_count", route="chat.completions") > value(
        before, "gen_ai_server_time_to_first_token_seconds_count", route="chat.completions"
    )
    assert value(after, "ezat_requests_in_flight") == 0  # idle: the scrape itself is not traffic


def test_cooldown_gauge_names_model_and_deployment(obs: ObsGateway, key: str) -> None:
    assert chat(obs, key, model="cool", content="hi [[sim:status=529,retry_after=30]]").status_code == 503
    text = scrape(obs)
    assert value(text, "ezat_deployments_in_cooldown", model="test/cool", deployment="cool-a") == 1
    assert "test/cool/cool-a" not in text


def test_metrics_only_on_their_own_bind(obs: ObsGateway, key: str) -> None:
    assert requests.get(obs.url + "/metrics", timeout=10).status_code == 404
    metrics_host = obs.server_extra["metrics_bind"]
    spoofed = requests.get(obs.url + "/metrics", headers={"host": metrics_host}, timeout=10)
    assert spoofed.status_code == 404  # the listener decides, never the Host header
    assert "ezat_requests_total" in scrape(obs)
    base = "http://" + metrics_host
    assert requests.get(base + "/healthz", timeout=10).status_code == 200
    models = requests.get(base + "/openai/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10)
    assert models.status_code == 404


def test_promtool_check_metrics_is_clean(obs: ObsGateway, key: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if IN_CI:
            pytest.fail("promtool is missing: .ci/run installs the Debian package prometheus")
        pytest.skip("promtool is not installed (Debian package prometheus; .ci/run installs it under CI=true)")
    assert chat(obs, key).status_code == 200
    assert chat(obs, key, stream=True).status_code == 200
    done = subprocess.run([promtool, "check", "metrics"], input=scrape(obs), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


# ---------------------------------------------------------------- readiness


def test_readyz_answers_503_while_draining_and_serves_on(obs: ObsGateway, key: str) -> None:
    ready = requests.get(obs.url + "/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "database": "ok",
        "redis": "not configured",
        "journal": "ok",
        "draining": False,
    }
    marker = Path(obs.env["EZAT_DRAIN_FILE"])
    marker.touch()  # what ezat_compat.server.drain.start_draining() does in the master
    try:
        draining = requests.get(obs.url + "/readyz", timeout=10)
        assert draining.status_code == 503 and draining.json()["draining"] is True
        assert chat(obs, key).status_code == 200  # still serving
        assert requests.get(obs.url + "/healthz", timeout=10).status_code == 200
    finally:
        marker.unlink()
    assert requests.get(obs.url + "/readyz", timeout=10).status_code == 200


def test_readyz_answers_503_without_the_database(obs: ObsGateway) -> None:
    db = obs.root / "ezat.db"
    aside = obs.root / "ezat.db.aside"
    time.sleep(1.1)  # past the cached result
    db.rename(aside)
    try:
        (resp,) = wait_for(  # a Response is falsy when it is an error: wrap it
            lambda: [r] if (r := requests.get(obs.url + "/readyz", timeout=10)).status_code == 503 else None,
            what="/readyz to see the database gone",
        )
        assert resp.json()["database"].startswith("unreachable: ")
    finally:
        aside.rename(db)
    wait_for(lambda: requests.get(obs.url + "/readyz", timeout=10).status_code == 200, what="ready again")
    messages = [r["message"] for r in log_records(obs) if r["logger"] == "ezat_compat"]
    assert sum(m.startswith("database unreachable: ") for m in messages) == 1
    assert any(m.startswith("database reachable again") for m in messages)


class Forwarder:
    """A TCP forwarder on loopback that the test can cut and restore (a Redis outage)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> Forwarder:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                ready, _, _ = select.select([a, b], [], [], 30)
                if not ready:
                    continue
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the other thread
            self._listener.close()
            self._listener = None
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns = []


def test_a_redis_outage_is_503_and_logged_once(sims: dict[str, Sim], redis_url: str, tmp_path: Path) -> None:
    forwarder = Forwarder(("127.0.0.1", 6379)).start()
    db_index = redis_url.rsplit("/", 1)[1]
    gw = ObsGateway(
        root=tmp_path / "gw",
        models=[ModelSpec(deployments=[{"name": "sim-a", "base_url": sims["fast"].url}])],
        gateway_settings={"redis_url": f"redis://127.0.0.1:{forwarder.port}/{db_index}"},
        logging={"level": "info"},
    )
    try:
        gw.start()
        limited = gw.new_key("acme", "--rpm", "1000")
        assert chat(gw, limited).status_code == 200
        assert requests.get(gw.url + "/readyz", timeout=10).json()["redis"] == "ok"
        forwarder.stop()
        time.sleep(1.1)
        started = time.monotonic()
        resp = requests.get(gw.url + "/readyz", timeout=10)
        assert time.monotonic() - started < 5  # bounded, never hangs
        assert resp.status_code == 503 and resp.json()["redis"].startswith("unreachable: "), resp.text
        for _ in range(4):
            assert chat(gw, limited).status_code == 500
            requests.get(gw.url + "/readyz", timeout=10)
        forwarder.start()
        wait_for(lambda: requests.get(gw.url + "/readyz", timeout=10).status_code == 200, what="ready again")
        messages = [r["message"] for r in log_records(gw) if r["logger"] == "ezat_compat"]
        assert sum(m.startswith("redis unreachable: ") for m in messages) == 1, messages
        assert any(m.startswith("redis reachable again") for m in messages)
    finally:
        gw.stop()
        forwarder.stop()


# ---------------------------------------------------------------- the multiprocess folder


def _children(pid: int) -> set[int]:
    with contextlib.suppress(OSError):
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    return set()


def test_the_metrics_folder_is_removed_on_exit_also_after_a_sighup(sims: dict[str, Sim], tmp_path: Path) -> None:
    """The multiprocess folder is in the data folder (the gateway's root here), 0700 with 0600
    files, as everything the gateway writes; nothing goes to the machine's temporary folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    root = tmp_path / "gw"
    gw = ObsGateway(
        root=root,
        models=[ModelSpec(deployments=[{"name": "sim-a", "base_url": sims["fast"].url}])],
        env={"TMPDIR": str(tmp)},
    )
    try:
        gw.start()
        assert gw.proc is not None
        key = gw.new_key("acme")
        chat = {"model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": "hi"}]}
        for stream in (False, True):
            resp = requests.post(
                gw.url + "/openai/v1/chat/completions",
                json={**chat, "stream": stream},
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert resp.status_code == 200
        assert requests.get(gw.url + "/metrics", timeout=10).status_code == 200
        (metrics,) = [p for p in root.iterdir() if p.name.startswith("metrics-")]
        assert metrics.is_dir() and list(metrics.iterdir())  # the workers' files
        for path in root.rglob("*"):  # the root itself is the test's (an operator's folder is left as it is)
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                continue
            mode = stat.S_IMODE(path.stat().st_mode)
            if path.is_dir():
                assert mode == 0o700, (path, oct(mode))
            elif path.parent == root and path.suffix in (".toml", ".log"):
                continue  # the test's own config and the harness's log capture
            else:
                assert mode == 0o600, (path, oct(mode))
        assert list(tmp.iterdir()) == []
        workers = wait_for(lambda: _children(gw.proc.pid), what="the worker")
        gw.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: (c := _children(gw.proc.pid)) and not (c & workers), timeout_s=30, what="new workers")
        wait_for(lambda: requests.get(gw.url + "/healthz", timeout=5).status_code == 200, what="healthy")
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.wait(timeout=60)
    finally:
        gw.stop()
    assert not [p.name for p in root.iterdir() if p.name.startswith("metrics-")]
    assert os.path.isdir(tmp)


# ---------------------------------------------------------------- tokens, cost and the process tree


def _native(gw: Gateway, key: str, system: str, stream: bool = False) -> requests.Response:
    body = {
        "model": MODEL,
        "max_tokens": 32,
        "stream": stream,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    return requests.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)


def test_token_and_cost_counters_match_usage_json_across_two_workers(sims: dict[str, Sim], tmp_path: Path) -> None:
    """Through real gunicorn with 2 workers: ``/metrics`` (summed over the workers) counts the
    tokens of each type and the micro-dollars that ``usage --json`` lists, exactly; scrapes and
    probes are not traffic, in-flight reads 0 when idle, and ``process_*`` describe the tree."""
    gw = Gateway(
        root=tmp_path / "gw",
        models=[ModelSpec(deployments=[{"name": "sim-a", "base_url": sims["fast"].url}])],
        workers=2,
    ).start()
    try:
        key = gw.new_key("acme")
        system = "You are terse. " * 40  # past the simulator's --min-cache-tokens: written, then read
        answers = [chat(gw, key, content=f"hello {n}") for n in range(6)]
        answers += [chat(gw, key, content="streamed", stream=True)]
        answers += [_native(gw, key, system), _native(gw, key, system), _native(gw, key, system, stream=True)]
        assert [a.status_code for a in answers] == [200] * len(answers)
        assert chat(gw, "ezat_sk_" + "n" * 32).status_code == 401  # counted as a request, never billed
        for _ in range(3):
            assert requests.get(gw.url + "/healthz", timeout=10).status_code == 200
            assert requests.get(gw.url + "/readyz", timeout=10).status_code == 200
            requests.get(gw.url + "/metrics", timeout=10).raise_for_status()

        def all_rows() -> list[dict[str, Any]] | None:
            found = gw.usage()
            return found if len(found) == len(answers) else None

        def idle() -> str | None:
            found = requests.get(gw.url + "/metrics", timeout=10).text
            return found if value(found, "ezat_requests_in_flight") == 0 else None

        rows = wait_for(all_rows, what="every usage row")
        text = wait_for(idle, what="in-flight 0 when idle")
    finally:
        gw.stop()
    columns = {
        "input": "input_tokens",
        "output": "output_tokens",
        "cache_read": "cache_read_tokens",
        "cache_write": "cache_write_tokens",
        "reasoning": "reasoning_tokens",
    }
    labels = {"model": MODEL, "deployment": "sim-a"}
    assert {(r["canonical_model"], r["deployment"]) for r in rows} == {(MODEL, "sim-a")}
    for kind, column in columns.items():
        expected = sum(int(r[column]) for r in rows)
        counted = value(text, "gen_ai_client_token_usage_sum", gen_ai_token_type=kind, **labels)
        assert counted == expected, (kind, counted, expected)
    for kind in ("input", "output", "cache_read", "cache_write"):  # the run exercised each of them
        assert value(text, "gen_ai_client_token_usage_sum", gen_ai_token_type=kind, **labels) > 0, kind
    micros = sum(int(Decimal(r["cost_usd"]) * 1_000_000) for r in rows)
    assert micros > 0 and sum(Decimal(r["cost_usd"]) for r in rows) * 1_000_000 == micros
    assert value(text, "ezat_cost_microdollars_total", **labels) == micros
    requests_total = sum(v for (name, _), v in samples(text).items() if name == "ezat_requests_total")
    assert requests_total == len(answers) + 1  # the 401 too; no scrape, no probe
    assert not re.search(r'route="(metrics|healthz|readyz)"', text)
    assert value(text, "ezat_requests_in_flight") == 0
    assert value(text, "ezat_processes") == 3  # the master and its 2 workers
    assert value(text, "process_cpu_seconds_total") > 0
    assert value(text, "process_resident_memory_bytes") > 10 * 2**20
    assert value(text, "process_open_fds") > 3
    assert 0 < time.time() - value(text, "process_start_time_seconds") < 3600
