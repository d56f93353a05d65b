"""The prompt-cache scope is keyed by the gateway's secret: what reaches the
upstream is the HMAC of the organisation's id under a key derived from the sealing key, never
a text anyone can compute from the small sequential ids; ``isolate_prompt_cache = false`` sends
none."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from ezat_compat.sealing import KEY_ENV, Sealer
from ezat_compat.translate.cache_scope import SCOPE_KEY_PURPOSE, SCOPE_PREFIX, cache_scope
from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration

SEALING_KEY = bytes(range(100, 132))


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="cache-keyed").start()
    yield server
    server.stop()


def _gateway(root: Path, sim: Sim, **settings: Any) -> Gateway:
    model = ModelSpec(
        id="anthropic/claude-c",
        aliases=("claude-c",),
        deployments=({"name": "a", "base_url": sim.url, "upstream_model": "claude-c"},),
    )
    return Gateway(root=root, models=(model,), gateway_settings=settings, env={KEY_ENV: SEALING_KEY.hex()}).start()


def _send(gateway: Gateway, key: str) -> None:
    system: list[dict[str, Any]] = [
        {"type": "text", "text": f"[{uuid.uuid4()}] Be brief. " * 50, "cache_control": {"type": "ephemeral"}}
    ]
    resp = requests.post(
        gateway.url + "/v1/messages",
        json={"model": "claude-c", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": key},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text


def test_the_scope_is_the_organisations_id_under_the_sealing_keys_derived_key(sim: Sim, tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "keyed", sim)
    try:
        _send(gateway, gateway.new_key(f"org-{uuid.uuid4().hex[:8]}"))
    finally:
        gateway.stop()
    scope = sim.bodies()[-1]["system"][0]["text"]
    assert scope.startswith(SCOPE_PREFIX)
    derived = Sealer(SEALING_KEY).derive(SCOPE_KEY_PURPOSE)
    assert scope in {cache_scope(org, derived) for org in range(1, 100)}
    assert scope not in {cache_scope(org) for org in range(1, 100)}  # not computable without the key


def test_without_isolation_no_key_and_no_scope(sim: Sim, tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "shared", sim, isolate_prompt_cache=False)
    try:
        _send(gateway, gateway.new_key("org-shared"))
    finally:
        gateway.stop()
    assert not sim.bodies()[-1]["system"][0]["text"].startswith(SCOPE_PREFIX)
