"""A key's limits and funds are checked before the gateway works for it.

- ``count_tokens`` is unbilled, but a key whose organisation can't pay for the same request
  with one token of output gets the 402 a completion would, before any image is read or
  anything goes upstream.
- A continue of a stored response (``previous_response_id``) is counted against the key's rpm,
  and its organisation's funds checked, before the stored conversation is loaded: past the rpm a
  429, with nothing sent upstream.
One gevent worker, the simulator upstream, loopback only."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from PIL import Image

from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Sim]]:
    root: Path = tmp_path_factory.mktemp("admission")
    sim = Sim(name="sim-admission").start()
    gateway = Gateway(root=root, models=[ModelSpec(deployments=[{"name": "sim", "base_url": sim.url}])]).start()
    try:
        yield gateway, sim
    finally:
        gateway.stop()
        sim.stop()


def _png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def _count(gateway: Gateway, key: str) -> requests.Response:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _png()}}
    return requests.post(
        f"{gateway.url}/v1/messages/count_tokens",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json={
            "model": "claude-sonnet-5-5",
            "messages": [{"role": "user", "content": [image, {"type": "text", "text": "hi"}]}],
        },
        timeout=30,
    )


def test_count_tokens_for_a_key_that_cannot_pay_is_a_402_before_any_work(rig: tuple[Gateway, Sim]) -> None:
    gateway, sim = rig
    broke = gateway.new_key("broke", balance="0")
    paying = gateway.new_key("paying", balance="5")
    sim.clear()
    resp = _count(gateway, broke)
    assert resp.status_code == 402, resp.text[:300]
    body = resp.json()
    assert body["type"] == "error"
    assert "Insufficient balance" in body["error"]["message"]
    assert "'broke'" in body["error"]["message"]
    assert not [r for r in sim.requests() if r["path"].endswith("count_tokens")]
    resp = _count(gateway, paying)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["input_tokens"] > 0


def _respond(gateway: Gateway, key: str, previous: str | None = None) -> requests.Response:
    body: dict[str, object] = {"model": "claude-sonnet-5-5", "input": "hello there", "max_output_tokens": 16}
    if previous is not None:
        body["previous_response_id"] = previous
    return requests.post(
        f"{gateway.url}/openai/v1/responses", headers={"authorization": f"Bearer {key}"}, json=body, timeout=30
    )


def test_a_continue_past_the_rpm_is_refused_before_anything_is_loaded_or_sent(rig: tuple[Gateway, Sim]) -> None:
    gateway, sim = rig
    key = gateway.new_key("rpm-org", "--rpm", "2", balance="5")
    first = _respond(gateway, key)
    assert first.status_code == 200, first.text[:300]
    second = _respond(gateway, key, first.json()["id"])
    assert second.status_code == 200, second.text[:300]
    sim.clear()
    third = _respond(gateway, key, second.json()["id"])
    assert third.status_code == 429, third.text[:300]
    assert "requests per minute (2)" in third.json()["error"]["message"]
    # the stored conversation is not even looked up: an unknown id is a 429 too, not a 404
    assert _respond(gateway, key, "resp_unknown").status_code == 429
    assert sim.requests() == []


def test_a_continue_for_a_key_that_cannot_pay_is_a_402_before_anything_is_sent(rig: tuple[Gateway, Sim]) -> None:
    gateway, sim = rig
    key = gateway.new_key("spent-org", balance="5")
    capped = gateway.new_key("spent-org", "--spend-limit", "0")
    first = _respond(gateway, key)
    assert first.status_code == 200, first.text[:300]
    sim.clear()
    resp = _respond(gateway, capped, first.json()["id"])
    assert resp.status_code == 402, resp.text[:300]
    assert "spend limit" in resp.json()["error"]["message"]
    assert _respond(gateway, capped, "resp_unknown").status_code == 402  # not looked up: no 404
    assert sim.requests() == []
