"""Reload and shutdown keep streams (gunicorn for real): with the shipped defaults, streams of
60 s survive a SIGHUP and a SIGTERM, new requests keep answering during the reload and the
drain, and when the grace runs out a stream ends with an error event and ``[DONE]`` and is
settled as a gateway failure (not billed, not the client's close). Afterwards no reservation
is left and every request has exactly one ledger row."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = [pytest.mark.integration]
MODEL = "anthropic/claude-sonnet-5-5"


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[Sim]:
    server = Sim(name="sim-slow").start()
    yield server
    server.stop()


def start(root: Path, sim: Sim, **server: Any) -> Gateway:
    models = [ModelSpec(deployments=[{"name": "sim-slow", "base_url": sim.url}])]
    return Gateway(root=root, models=models, workers=2, server_settings=server).start()


def stream_body(seconds: float) -> dict[str, Any]:
    words = int(seconds * 5)  # one word every 200 ms
    return {
        "model": MODEL,
        "max_completion_tokens": 4000,
        "stream": True,
        "messages": [{"role": "user", "content": f"go [[sim:words={words},token_delay_ms=200]]"}],
    }


class Streams:
    """Streams read on threads; each records every line it got."""

    def __init__(self, gw: Gateway, key: str, count: int, seconds: float) -> None:
        self.lines: list[list[bytes]] = [[] for _ in range(count)]
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._read, args=(gw, key, seconds, i), daemon=True) for i in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, gw: Gateway, key: str, seconds: float, i: int) -> None:
        try:
            with requests.post(
                gw.url + "/openai/v1/chat/completions",
                json=stream_body(seconds),
                headers={"Authorization": f"Bearer {key}"},
                stream=True,
                timeout=seconds + 60,
            ) as response:
                assert response.status_code == 200, response.text
                for line in response.iter_lines():
                    if line:
                        self.lines[i].append(line)
        except BaseException as exc:
            self.errors.append(exc)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a stream did not end"


def poll_new_requests(gw: Gateway, key: str, seconds: float) -> list[int]:
    """Non-streaming requests one after another for ``seconds``: their statuses."""
    statuses = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            response = requests.post(
                gw.url + "/openai/v1/chat/completions",
                json={"model": MODEL, "max_completion_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
            statuses.append(response.status_code)
        except requests.RequestException:
            statuses.append(0)
        time.sleep(0.2)
    return statuses


def money_state(gw: Gateway) -> tuple[int, list[dict[str, Any]]]:
    with sqlite3.connect(gw.root / "ezat.db") as conn:
        held = conn.execute("SELECT count(*) FROM reservations").fetchone()[0]
    rows = json.loads(gw.cli("usage", "--json").stdout)
    return held, rows


def wait_exit(gw: Gateway, timeout_s: float) -> None:
    assert gw.proc is not None
    gw.proc.wait(timeout=timeout_s)


@pytest.mark.slow
def test_streams_of_60_s_survive_a_sighup(slow_sim: Sim, tmp_path: Path) -> None:
    gw = start(tmp_path, slow_sim)  # the shipped defaults: graceful_timeout_s, drain_s
    try:
        key = gw.new_key("acme")
        streams = Streams(gw, key, 20, 60)
        time.sleep(3)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGHUP)
        statuses = poll_new_requests(gw, key, 8)
        streams.join(120)
        assert statuses and set(statuses) == {200}, statuses
        assert not streams.errors, streams.errors
        for lines in streams.lines:
            assert lines[-1] == b"data: [DONE]" and not any(b'"error"' in line for line in lines)
        held, rows = money_state(gw)
        assert held == 0
        assert len(rows) == 20 + len(statuses) and {r["status"] for r in rows} == {200}
    finally:
        gw.stop()


@pytest.mark.slow
def test_streams_of_60_s_survive_a_sigterm_and_the_node_drains_first(slow_sim: Sim, tmp_path: Path) -> None:
    gw = start(tmp_path, slow_sim)
    try:
        key = gw.new_key("acme")
        streams = Streams(gw, key, 20, 60)
        time.sleep(3)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        statuses = poll_new_requests(gw, key, 6)  # within the drain (10 s): still served
        streams.join(120)
        wait_exit(gw, 60)
        assert statuses and set(statuses) == {200}, statuses
        assert not streams.errors, streams.errors
        for lines in streams.lines:
            assert lines[-1] == b"data: [DONE]" and not any(b'"error"' in line for line in lines)
        held, rows = money_state(gw)
        assert held == 0
        assert len(rows) == 20 + len(statuses) and {r["status"] for r in rows} == {200}
    finally:
        gw.stop()


def test_a_stream_open_when_the_grace_runs_out_gets_an_error_and_is_not_billed(slow_sim: Sim, tmp_path: Path) -> None:
    gw = start(tmp_path, slow_sim, graceful_timeout_s=6, drain_s=0)
    try:
        key = gw.new_key("acme")
        streams = Streams(gw, key, 3, 40)
        time.sleep(2)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        streams.join(30)
        wait_exit(gw, 30)
        assert not streams.errors, streams.errors
        for lines in streams.lines:
            assert lines[-1] == b"data: [DONE]"
            error = json.loads(lines[-2].removeprefix(b"data: "))["error"]
            assert error["code"] == "overloaded" and "restarting" in error["message"]
        held, rows = money_state(gw)
        assert held == 0
        assert len(rows) == 3 and {(r["status"], r["cost_usd"]) for r in rows} == {(503, "0.000000")}, rows
    finally:
        gw.stop()


def _ready_status(gw: Gateway) -> int:
    """``/readyz``'s status; 0 when nothing answers (the listeners are closed)."""
    try:
        return requests.get(gw.url + "/readyz", timeout=5).status_code
    except requests.RequestException:
        return 0


@pytest.mark.slow
def test_a_sigterm_during_a_reloads_wait_is_heard_at_once(slow_sim: Sim, tmp_path: Path) -> None:
    """gunicorn's reload waits for the old workers to finish their requests (``Arbiter.reload``:
    up to ``graceful_timeout``) and only queues the signals that come meanwhile. A SIGTERM
    then must still start the stop at once: ``/readyz`` 503 within a second, the listeners
    closed once the drain is over (not when the old streams end), no stream cut, every
    request with its row and no reservation left; the whole stop within the drain plus the
    grace (what the unit's ``TimeoutStopSec`` covers)."""
    gw = start(tmp_path, slow_sim, drain_s=2, graceful_timeout_s=60)
    try:
        key = gw.new_key("acme")
        # ~25 s of stream (the simulator sends 3 words a delta: "75" streams for ~25 s), so that
        # they outlast the reload's new workers booting on a busy machine, the TERM and the drain
        streams = Streams(gw, key, 4, 75)
        time.sleep(2)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGHUP)
        time.sleep(3)  # the master is in the reload's wait: the old workers hold the streams
        deadline = time.monotonic() + 30
        while _ready_status(gw) != 200:  # the new workers answer (a busy machine boots them slowly)
            assert time.monotonic() < deadline, "the reload's new workers never answered"
            time.sleep(0.2)
        gw.proc.send_signal(signal.SIGTERM)
        termed = time.monotonic()
        readiness = []
        while time.monotonic() - termed < 1.0:
            readiness.append(_ready_status(gw))
            time.sleep(0.1)
        assert 503 in readiness, readiness
        time.sleep(3)  # past the drain (2 s): the listeners are closed, the old streams go on
        assert _ready_status(gw) == 0
        assert gw.proc.poll() is None  # still waiting for the streams to end
        streams.join(60)
        wait_exit(gw, 30)
        assert time.monotonic() - termed < 2 + 60
        assert not streams.errors, streams.errors
        for lines in streams.lines:
            assert lines[-1] == b"data: [DONE]" and not any(b'"error"' in line for line in lines)
        held, rows = money_state(gw)
        assert held == 0
        assert len(rows) == 4 and {r["status"] for r in rows} == {200}
    finally:
        gw.stop()
