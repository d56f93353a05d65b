"""Routing, failover, cooldowns, session affinity, timeouts and metrics through the real gateway
(gunicorn, gevent) with several simulators as the deployments of one model (Chat
Completions reference, "Errors", "Prompt caching").

Every scenario gets a model of its own, so the cooldown state one test leaves behind (health is
kept per model and deployment) never reaches another test. The simulators are shared; each test
clears their records first and counts what each one received.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from ezat_compat.domain import Deployment
from ezat_compat.routing import rendezvous_order
from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration

COOLDOWN_S = 1.0
TIMEOUT_S = 1.0
KEEPALIVE_S = 0.25
# --fail-rate 0.3 --seed 72: random.Random(72) draws 0.07 first (< 0.3: fail), then nine
# draws >= 0.3 (answer). So this simulator fails exactly its first /v1/messages request.
FLAKY_FLAGS = ("--fail-status", "529", "--fail-rate", "0.3", "--seed", "72")
SIM_FLAGS: dict[str, tuple[str, ...]] = {
    "ok-a": (),
    "ok-b": (),
    "ok-c": (),
    "down": ("--fail-status", "529"),
    "down-ra": ("--fail-status", "529", "--retry-after", "7"),
    "flaky": FLAKY_FLAGS,
    "flaky-2": FLAKY_FLAGS,
}


# ---------------------------------------------------------------- servers


def start_sims(names: Sequence[str]) -> dict[str, Sim]:
    with ThreadPoolExecutor(len(names)) as pool:
        started = list(pool.map(lambda n: Sim(name=n, flags=SIM_FLAGS[n]).start(), names))
    return dict(zip(names, started, strict=True))


def dep(name: str, urls: dict[str, str], priority: int = 0, weight: float = 1) -> dict[str, Any]:
    return {"name": name, "base_url": urls[name], "priority": priority, "weight": weight}


def model(name: str, *deployments: dict[str, Any]) -> ModelSpec:
    return ModelSpec(id=f"test/{name}", aliases=(), deployments=deployments)


def main_models(s: dict[str, str]) -> list[ModelSpec]:
    """One model per scenario; tier 0 is what a healthy request tries first."""
    return [
        model("m-529", dep("down", s), dep("ok-b", s, 1)),
        model("m-refused", dep("closed", s), dep("ok-b", s, 1)),
        model("m-400", dep("ok-a", s), dep("ok-b", s, 1)),
        model("m-stream-529", dep("down", s), dep("ok-b", s, 1)),
        model("m-stream-error-first", dep("ok-a", s), dep("ok-b", s, 1)),
        model("m-cut", dep("ok-a", s), dep("ok-b", s, 1)),
        model("m-error-after", dep("ok-a", s), dep("ok-b", s, 1)),
        model("m-all-down", dep("down", s), dep("down-ra", s, 1)),
        model("m-prio", dep("ok-a", s), dep("ok-b", s, 1), dep("ok-c", s, 1)),
        model("m-tier", dep("ok-a", s), dep("ok-b", s), dep("ok-c", s, 1)),
        model("m-affinity", dep("ok-a", s), dep("ok-b", s), dep("ok-c", s)),
        model("m-affinity-down", dep("closed", s), dep("ok-a", s), dep("ok-b", s), dep("ok-c", s)),
        model("m-cooldown", dep("flaky", s), dep("ok-b", s, 1)),
        model("m-probe", dep("flaky-2", s), dep("ok-b", s, 1)),
        model("m-slow", dep("ok-a", s)),
        model("m-slow-native", dep("ok-a", s)),
        model("m-stall", dep("ok-a", s)),
        model("m-stall-native", dep("ok-a", s)),
        model("m-metrics", dep("down-ra", s), dep("ok-b", s, 1)),
        model("m-metrics-refused", dep("closed", s), dep("ok-b", s, 1)),
        model("m-metrics-native", dep("down-ra", s), dep("ok-b", s, 1)),
        model("m-metrics-fail", dep("ok-a", s)),
        model("m-metrics-fail-2", dep("ok-a", s)),
    ]


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    servers = start_sims(list(SIM_FLAGS))
    yield servers
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(Sim.stop, servers.values()))


@pytest.fixture(scope="module")
def closed_url() -> Iterator[str]:
    """A port that refuses connections: bound (so nobody else gets it) but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def urls(sims: dict[str, Sim], closed_url: str) -> dict[str, str]:
    """Each deployment's base_url by name; "closed" refuses connections."""
    return {**{name: sim.url for name, sim in sims.items()}, "closed": closed_url}


@pytest.fixture(scope="module")
def gateway(urls: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    server = Gateway(
        root=tmp_path_factory.mktemp("routing"),
        models=main_models(urls),
        gateway_settings={
            "cooldown_failures": 1,
            "cooldown_s": COOLDOWN_S,
            "upstream_timeout_s": TIMEOUT_S,
            "keepalive_s": KEEPALIVE_S,
        },
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(gateway: Gateway) -> str:
    return gateway.new_key("routing-org", balance="1000")


# ---------------------------------------------------------------- helpers


def chat(
    gw: Gateway,
    key: str,
    name: str,
    text: str = "hello",
    *,
    stream: bool = False,
    session: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    url: str | None = None,
) -> requests.Response:
    body: dict[str, Any] = {
        "model": f"test/{name}",
        "max_completion_tokens": 32,
        "messages": [{"role": "user", "content": text}],
    }
    if stream:
        body["stream"] = True
    if session is not None:
        body["prompt_cache_key"] = session
    return requests.post(
        (url or gw.url) + "/openai/v1/chat/completions",
        json=body,
        stream=stream,
        headers={"authorization": f"Bearer {key}", **(headers or {})},
        timeout=timeout,
    )


def counts(sims: dict[str, Sim], *names: str) -> dict[str, int]:
    return {n: len(sims[n].bodies()) for n in names}


def sse_events(resp: requests.Response) -> list[str]:
    """The stream's non-empty lines: ``data: …`` lines and ``: ping`` comments."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    return [line for line in resp.iter_lines(decode_unicode=True) if line]


def stream_data(lines: list[str]) -> list[Any]:
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def landed(sims: dict[str, Sim], names: Sequence[str]) -> list[str]:
    """Which simulators received requests since the last clear (those with any)."""
    return [n for n in names if sims[n].bodies()]


def rendezvous_first(session: str, names: Sequence[str]) -> str:
    """The deployment a session should land on, by the router's contract (same weights)."""
    tier = [Deployment(name=n, base_url="http://unused", upstream_model="m") for n in names]
    return rendezvous_order(tier, session)[0].name


def metric_samples(gw: Gateway) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = requests.get(gw.url + "/metrics", timeout=10).text
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def assert_openai_error(resp: requests.Response, status: int, code: str | None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    return error


# ---------------------------------------------------------------- failover


def test_a_529_fails_over_to_the_next_deployment(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    resp = chat(gateway, key, "m-529")
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]
    assert counts(clean, "down", "ok-b") == {"down": 1, "ok-b": 1}
    # The same request went to both, model name included (one upstream_model for both here).
    assert clean["down"].bodies() == clean["ok-b"].bodies()


def test_a_refused_connection_fails_over(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    resp = chat(gateway, key, "m-refused")
    assert resp.status_code == 200, resp.text
    assert counts(clean, "ok-b") == {"ok-b": 1}


def test_a_400_does_not_fail_over(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    resp = chat(gateway, key, "m-400", "hello [[sim:status=400]]")
    error = assert_openai_error(resp, 400, None)
    assert error["type"] == "invalid_request_error"
    assert counts(clean, "ok-a", "ok-b") == {"ok-a": 1, "ok-b": 0}
    # The 400 was the client's fault: the deployment stays healthy and keeps tier 0's traffic.
    assert chat(gateway, key, "m-400").status_code == 200
    assert counts(clean, "ok-a", "ok-b") == {"ok-a": 2, "ok-b": 0}


def test_a_stream_that_fails_before_its_first_byte_fails_over(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    data = stream_data(sse_events(chat(gateway, key, "m-stream-529", stream=True)))
    assert data[-1] == "[DONE]"
    assert not any(isinstance(d, dict) and "error" in d for d in data)
    assert "".join(d["choices"][0]["delta"].get("content") or "" for d in data[:-1] if d["choices"])
    assert counts(clean, "down", "ok-b") == {"down": 1, "ok-b": 1}
    assert clean["down"].bodies()[0]["stream"] is True


def test_an_error_event_before_anything_was_sent_fails_over_too(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    # error_after=0: the upstream answers 200 and its very first event is an overloaded error.
    resp = chat(gateway, key, "m-stream-error-first", "hi [[sim:error_after=0]]", stream=True)
    # Every deployment did the same: the client gets a plain JSON error, not a broken stream.
    assert_openai_error(resp, 503, "overloaded")
    assert resp.headers["retry-after"] == "1"
    assert counts(clean, "ok-a", "ok-b") == {"ok-a": 1, "ok-b": 1}


@pytest.mark.parametrize(
    "marker, code", [("[[sim:cut=3]]", None), ("[[sim:error_after=3]]", "overloaded")], ids=["cut", "error-event"]
)
def test_a_stream_that_fails_after_its_first_byte_does_not_fail_over(
    gateway: Gateway, key: str, clean: dict[str, Sim], marker: str, code: str | None
) -> None:
    name = "m-cut" if "cut" in marker else "m-error-after"
    lines = sse_events(chat(gateway, key, name, f"tell me more {marker}", stream=True))
    data = stream_data(lines)
    assert data[-1] == "[DONE]"
    error = data[-2]
    assert set(error) == {"error"} and set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["type"] == "server_error" and error["error"]["code"] == code
    assert all("choices" in d for d in data[:-2])  # chunks came before the error
    assert counts(clean, "ok-a", "ok-b") == {"ok-a": 1, "ok-b": 0}


def test_when_every_deployment_fails_the_last_failure_is_mapped(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    resp = chat(gateway, key, "m-all-down")
    error = assert_openai_error(resp, 503, "overloaded")
    assert error["type"] == "server_error"
    assert resp.headers["retry-after"] == "7"  # the last deployment's (down-ra's) retry-after
    assert counts(clean, "down", "down-ra") == {"down": 1, "down-ra": 1}
    # Both are cooling down now: the next request is refused without reaching either.
    again = chat(gateway, key, "m-all-down")
    assert_openai_error(again, 503, "overloaded")
    assert int(again.headers["retry-after"]) >= 1
    assert counts(clean, "down", "down-ra") == {"down": 1, "down-ra": 1}


# ---------------------------------------------------------------- routing


def test_tier_zero_gets_all_traffic_while_healthy(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    for _ in range(20):
        assert chat(gateway, key, "m-prio").status_code == 200
    assert counts(clean, "ok-a", "ok-b", "ok-c") == {"ok-a": 20, "ok-b": 0, "ok-c": 0}


def test_traffic_is_shared_inside_a_tier_and_never_reaches_the_next(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    for _ in range(30):
        assert chat(gateway, key, "m-tier").status_code == 200
    seen = counts(clean, "ok-a", "ok-b", "ok-c")
    assert seen["ok-c"] == 0 and seen["ok-a"] + seen["ok-b"] == 30
    assert seen["ok-a"] > 0 and seen["ok-b"] > 0  # each has 1 - 2**-29 odds of some traffic


def test_one_prompt_cache_key_lands_on_one_deployment(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    names = ("ok-a", "ok-b", "ok-c")
    for _ in range(50):
        assert chat(gateway, key, "m-affinity", session="conversation-42").status_code == 200
    assert landed(clean, names) == [rendezvous_first("conversation-42", names)]
    assert sum(counts(clean, *names).values()) == 50


def _two_sessions_on_different_deployments(names: Sequence[str]) -> tuple[str, str]:
    sessions = [f"session-{i}" for i in range(100)]
    first = rendezvous_first(sessions[0], names)
    other = next(s for s in sessions if rendezvous_first(s, names) != first)
    return sessions[0], other


def test_the_session_header_beats_the_body_field(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    names = ("ok-a", "ok-b", "ok-c")
    header, body = _two_sessions_on_different_deployments(names)
    for _ in range(10):
        assert chat(gateway, key, "m-affinity", session=body).status_code == 200
    assert landed(clean, names) == [rendezvous_first(body, names)]
    for server in clean.values():
        server.clear()
    for _ in range(10):
        resp = chat(gateway, key, "m-affinity", session=body, headers={"x-ezat-session": header})
        assert resp.status_code == 200
    assert landed(clean, names) == [rendezvous_first(header, names)]


def test_a_session_falls_over_in_its_hash_order(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    names = ("closed", "ok-a", "ok-b", "ok-c")
    tier = [Deployment(name=n, base_url="http://unused", upstream_model="m") for n in names]
    sessions = [f"fallover-{i}" for i in range(200)]
    orphan = next(s for s in sessions if rendezvous_order(tier, s)[0].name == "closed")
    settled = next(s for s in sessions if rendezvous_order(tier, s)[0].name != "closed")
    for _ in range(5):  # the first finds the port closed; the others skip it (cooldown): same landing
        assert chat(gateway, key, "m-affinity-down", session=orphan).status_code == 200
    assert landed(clean, names[1:]) == [rendezvous_order(tier, orphan)[1].name]
    for server in clean.values():
        server.clear()
    for _ in range(5):  # sessions whose first choice is up keep it
        assert chat(gateway, key, "m-affinity-down", session=settled).status_code == 200
    assert landed(clean, names[1:]) == [rendezvous_order(tier, settled)[0].name]


def test_sessions_spread_over_the_tier(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    names = ("ok-a", "ok-b", "ok-c")
    for i in range(30):
        assert chat(gateway, key, "m-affinity", session=f"spread-{i}").status_code == 200
    expected = {n: sum(rendezvous_first(f"spread-{i}", names) == n for i in range(30)) for n in names}
    assert counts(clean, *names) == expected
    assert len([n for n in names if expected[n]]) >= 2


# ---------------------------------------------------------------- cooldowns


def test_a_deployment_in_cooldown_gets_no_traffic_until_its_probe(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    started = time.time()
    assert chat(gateway, key, "m-cooldown").status_code == 200  # flaky fails its first: cooldown
    assert counts(clean, "flaky", "ok-b") == {"flaky": 1, "ok-b": 1}
    for _ in range(4):
        assert chat(gateway, key, "m-cooldown").status_code == 200
    assert time.time() < started + COOLDOWN_S, "the machine is too slow for this test's cooldown"
    assert counts(clean, "flaky", "ok-b") == {"flaky": 1, "ok-b": 5}
    time.sleep(max(0.0, started + COOLDOWN_S + 0.1 - time.time()))  # the rule: wait out the cooldown
    assert chat(gateway, key, "m-cooldown").status_code == 200  # the probe: flaky answers now
    assert counts(clean, "flaky", "ok-b") == {"flaky": 2, "ok-b": 5}
    for _ in range(3):  # healthy again: tier 0 takes it all
        assert chat(gateway, key, "m-cooldown").status_code == 200
    assert counts(clean, "flaky", "ok-b") == {"flaky": 5, "ok-b": 5}


def test_only_one_probe_goes_out_when_a_cooldown_ends(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    started = time.time()
    assert chat(gateway, key, "m-probe").status_code == 200  # flaky-2 fails its first: cooldown
    time.sleep(max(0.0, started + COOLDOWN_S + 0.1 - time.time()))
    with ThreadPoolExecutor(6) as pool:
        probe = pool.submit(chat, gateway, key, "m-probe", "slow probe [[sim:delay=0.6]]")
        deadline = time.monotonic() + 0.5
        while not clean["flaky-2"].bodies()[1:] and time.monotonic() < deadline:
            time.sleep(0.01)  # until the probe reached flaky-2
        assert len(clean["flaky-2"].bodies()) == 2
        others = list(pool.map(lambda _: chat(gateway, key, "m-probe").status_code, range(5)))
        assert probe.result().status_code == 200 and others == [200] * 5
    # While the probe was out, everything else went to tier 1.
    assert counts(clean, "flaky-2", "ok-b") == {"flaky-2": 2, "ok-b": 6}
    assert chat(gateway, key, "m-probe").status_code == 200  # the probe answered: healthy again
    assert counts(clean, "flaky-2", "ok-b") == {"flaky-2": 3, "ok-b": 6}


# ---------------------------------------------------------------- timeouts


def test_a_slow_upstream_answers_504_timeout(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    started = time.monotonic()
    resp = chat(gateway, key, "m-slow", "hello [[sim:delay=3]]")
    elapsed = time.monotonic() - started
    error = assert_openai_error(resp, 504, "timeout")
    assert error["type"] == "server_error"
    assert elapsed < 2.5, f"took {elapsed:.2f} s: the upstream_timeout_s of {TIMEOUT_S} s was not kept"
    assert counts(clean, "ok-a") == {"ok-a": 1}


def test_a_slow_upstream_answers_504_on_the_native_endpoint_too(gateway: Gateway, key: str) -> None:
    body = {
        "model": "test/m-slow-native",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "hello [[sim:delay=3]]"}],
    }
    resp = requests.post(gateway.url + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=30)
    assert resp.status_code == 504, resp.text
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "timeout_error"


def test_a_stream_may_stall_longer_than_the_timeout(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    lines = sse_events(chat(gateway, key, "m-stall", "hello [[sim:stall=2]]", stream=True))
    assert ": ping" in lines  # keep-alive while the upstream is silent
    data = stream_data(lines)
    assert data[-1] == "[DONE]"
    assert not any(isinstance(d, dict) and "error" in d for d in data), data[-3:]
    assert [d["choices"][0]["finish_reason"] for d in data[:-1] if d["choices"]][-1] == "stop"


def test_a_native_stream_may_stall_longer_than_the_timeout(gateway: Gateway, key: str) -> None:
    body = {
        "model": "test/m-stall-native",
        "max_tokens": 32,
        "stream": True,
        "messages": [{"role": "user", "content": "hello [[sim:stall=2]]"}],
    }
    resp = requests.post(gateway.url + "/v1/messages", json=body, headers={"x-api-key": key}, stream=True, timeout=30)
    events = [line.removeprefix("event: ") for line in sse_events(resp) if line.startswith("event: ")]
    assert "error" not in events and events[-1] == "message_stop"


# ---------------------------------------------------------------- metrics


def test_metrics_show_failovers_and_requests(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    before = metric_samples(gateway)
    assert chat(gateway, key, "m-metrics").status_code == 200  # down-ra: 529, retry-after 7
    assert chat(gateway, key, "m-metrics-refused").status_code == 200  # closed: connection refused
    native = {"model": "test/m-metrics-native", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    assert (
        requests.post(gateway.url + "/v1/messages", json=native, headers={"x-api-key": key}, timeout=30).status_code
        == 200
    )
    del native["max_tokens"]
    assert (
        requests.post(
            gateway.url + "/v1/messages/count_tokens", json=native, headers={"x-api-key": key}, timeout=30
        ).status_code
        == 200
    )
    after = metric_samples(gateway)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("ezat_failovers_total", model="test/m-metrics", deployment="down-ra", reason="529") == 1
    assert (
        delta(
            "ezat_failovers_total", model="test/m-metrics-refused", deployment="closed", reason="UpstreamConnectError"
        )
        == 1
    )
    assert delta("ezat_failovers_total", model="test/m-metrics-native", deployment="down-ra", reason="529") == 1
    for name in ("m-metrics", "m-metrics-refused"):
        assert (
            delta(
                "ezat_requests_total", route="chat.completions", model=f"test/{name}", deployment="ok-b", status="200"
            )
            == 1
        )
    for route in ("messages", "count_tokens"):
        assert (
            delta("ezat_requests_total", route=route, model="test/m-metrics-native", deployment="ok-b", status="200")
            == 1
        )
    for name in ("m-metrics", "m-metrics-refused"):
        upstream = "gen_ai_client_operation_duration_seconds_count"
        assert delta(upstream, model=f"test/{name}", deployment="ok-b", stream="false") == 1
    # down-ra asked for 7 s: the cooldown gauge shows it (health is per model and deployment).
    assert metric(after, "ezat_deployments_in_cooldown", model="test/m-metrics", deployment="down-ra") == 1


def test_metrics_count_failed_requests_by_status(gateway: Gateway, key: str) -> None:
    before = metric_samples(gateway)
    assert chat(gateway, key, "m-metrics-fail", "hello [[sim:status=400]]").status_code == 400
    assert chat(gateway, key, "m-metrics-fail", "hello [[sim:status=529]]").status_code == 503
    assert chat(gateway, key, "m-metrics-fail-2", "hello [[sim:status=504]]").status_code == 504
    after = metric_samples(gateway)
    for name, status in (("m-metrics-fail", "400"), ("m-metrics-fail", "503"), ("m-metrics-fail-2", "504")):
        labels = {"route": "chat.completions", "model": f"test/{name}", "deployment": "ok-a", "status": status}
        assert metric(after, "ezat_requests_total", **labels) - metric(before, "ezat_requests_total", **labels) == 1


# ---------------------------------------------------------------- several workers, several nodes


@pytest.fixture(scope="module")
def two_workers(urls: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    root = tmp_path_factory.mktemp("two-workers")
    access_log = root / "access.log"
    names = ("ok-a", "ok-b", "ok-c")
    server = Gateway(
        root=root,
        workers=2,
        models=[model("m-affinity", *(dep(n, urls) for n in names))],
        env={"EZAT_ACCESS_LOG": str(access_log), "GUNICORN_CMD_ARGS": "--access-logformat '%(p)s %(U)s %(s)s'"},
    ).start()
    yield server, access_log
    server.stop()


def test_affinity_holds_across_two_workers(two_workers: tuple[Gateway, Path], clean: dict[str, Sim]) -> None:
    gw, access_log = two_workers
    key = gw.new_key("workers-org")
    names = ("ok-a", "ok-b", "ok-c")

    def one(_: int) -> int:
        # A new connection each time (no session), so both workers accept some.
        return chat(gw, key, "m-affinity", session="shared-conversation").status_code

    pids: set[str] = set()
    sent = 0
    with ThreadPoolExecutor(16) as pool:
        for _ in range(5):  # until both workers were seen (almost always at once)
            assert set(pool.map(one, range(48))) == {200}
            sent += 48
            lines = access_log.read_text().splitlines()
            pids = {line.split()[0] for line in lines if "/openai/v1/chat/completions 200" in line}
            if len(pids) >= 2:
                break
    assert len(pids) == 2, f"only one worker served the requests: {pids}"
    expected = rendezvous_first("shared-conversation", names)
    assert landed(clean, names) == [expected]
    # /metrics adds up every worker's samples (prometheus multiprocess mode), whichever answers.
    samples = metric_samples(gw)
    assert (
        metric(
            samples,
            "ezat_requests_total",
            route="chat.completions",
            model="test/m-affinity",
            deployment=expected,
            status="200",
        )
        == sent
    )


@pytest.fixture(scope="module")
def node_redis_url(redis_url: str) -> str:
    """Database 14, ours: the gateway's cooldown prefix (``ezat:cd:``) is fixed."""
    return re.sub(r"/\d+$", "", redis_url) + "/14"


def _forget_cooldowns(client: redis.Redis, model_id: str) -> None:
    for name in client.scan_iter(f"ezat:cd:d:{model_id}/*"):
        client.delete(name)


@pytest.mark.redis
def test_a_cooldown_is_shared_by_gateways_on_one_redis(
    urls: dict[str, str], node_redis_url: str, tmp_path_factory: pytest.TempPathFactory, clean: dict[str, Sim]
) -> None:
    model_id = f"test/m-redis-{time.time_ns()}"
    models = [ModelSpec(id=model_id, aliases=(), deployments=[dep("down", urls), dep("ok-b", urls, 1)])]
    settings = {"redis_url": node_redis_url, "cooldown_failures": 1, "cooldown_s": 30}
    first = Gateway(root=tmp_path_factory.mktemp("node-1"), models=models, gateway_settings=settings)
    second = Gateway(root=tmp_path_factory.mktemp("node-2"), models=models, gateway_settings=settings)
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(Gateway.start, (first, second)))
        key_1, key_2 = first.new_key("node-org"), second.new_key("node-org")
        body = {"model": model_id, "max_completion_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}

        def post(gw: Gateway, key: str) -> requests.Response:
            return requests.post(
                gw.url + "/openai/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )

        assert post(first, key_1).status_code == 200  # down fails: cooldown in Redis
        assert counts(clean, "down", "ok-b") == {"down": 1, "ok-b": 1}
        for _ in range(3):
            assert post(second, key_2).status_code == 200  # the other node skips it
        assert counts(clean, "down", "ok-b") == {"down": 1, "ok-b": 4}
        cooling = metric_samples(second)
        assert metric(cooling, "ezat_deployments_in_cooldown", model=model_id, deployment="down") == 1
    finally:
        first.stop()
        second.stop()
        with redis.Redis.from_url(node_redis_url) as client:
            _forget_cooldowns(client, model_id)
