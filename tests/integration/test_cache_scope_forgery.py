"""A cache scope nobody can forge, through the real gateway and the
simulator's prompt cache: organisation B sends organisation A's exact scope block (read from
what the upstream received for A) before A's exact prefix, and reads nothing A cached; the
gateway's own block goes first, B's copy after it, on chat, Responses and ``/v1/messages``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from ezat_compat.translate.cache_scope import SCOPE_PREFIX
from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration

EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="cache-forgery").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    model = ModelSpec(
        id="anthropic/claude-c",
        aliases=("claude-c",),
        deployments=({"name": "a", "base_url": sim.url, "upstream_model": "claude-c"},),
    )
    gw = Gateway(root=Path(tmp_path_factory.mktemp("forgery")), models=(model,)).start()  # isolation: the default
    yield gw
    gw.stop()


def long_prefix() -> str:
    """A system prompt over the cache's minimum, new for each test (no earlier entry to read)."""
    return f"[{uuid.uuid4()}] You are a careful assistant who answers briefly. " * 120


def native(gateway: Gateway, key: str, system: list[str]) -> int:
    """``system``'s texts as blocks, the last one a breakpoint; the tokens read from the cache."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in system]
    blocks[-1]["cache_control"] = EPHEMERAL
    resp = requests.post(
        gateway.url + "/v1/messages",
        json={"model": "claude-c", "max_tokens": 16, "system": blocks, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": key},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    read: int = resp.json()["usage"]["cache_read_input_tokens"]
    return read


def chat(gateway: Gateway, key: str, system: list[str]) -> int:
    """``system``'s texts as the parts of a system message, the last one a breakpoint."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text} for text in system]
    parts[-1]["cache_control"] = EPHEMERAL
    resp = requests.post(
        gateway.url + "/openai/v1/chat/completions",
        json={
            "model": "claude-c",
            "max_completion_tokens": 16,
            "messages": [{"role": "system", "content": parts}, {"role": "user", "content": "hi"}],
        },
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    read: int = resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return read


def responses(gateway: Gateway, key: str, system: list[str]) -> int:
    """``system``'s texts as the parts of a developer item (the gateway's automatic breakpoints)."""
    parts = [{"type": "input_text", "text": text} for text in system]
    resp = requests.post(
        gateway.url + "/openai/v1/responses",
        json={
            "model": "claude-c",
            "max_output_tokens": 16,
            "store": False,
            "input": [{"role": "developer", "content": parts}, {"role": "user", "content": "hi"}],
        },
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    read: int = resp.json()["usage"]["input_tokens_details"]["cached_tokens"]
    return read


Send = Callable[[Gateway, str, list[str]], int]


def first_block(sim: Sim) -> dict[str, Any]:
    system = sim.bodies()[-1]["system"]
    assert isinstance(system, list), system
    block: dict[str, Any] = system[0]
    return block


@pytest.mark.parametrize("send", [native, chat, responses], ids=["messages", "chat", "responses"])
def test_another_organisations_exact_scope_text_reads_nothing_of_its_prefix(
    gateway: Gateway, sim: Sim, send: Send
) -> None:
    suffix = uuid.uuid4().hex[:8]
    a, b = gateway.new_key(f"org-a-{suffix}"), gateway.new_key(f"org-b-{suffix}")
    prefix = long_prefix()
    send(gateway, a, [prefix])
    a_scope = first_block(sim)["text"]
    assert a_scope.startswith(SCOPE_PREFIX)
    assert send(gateway, a, [prefix]) > 1024  # A reads its own prefix back
    # B sends what the upstream received for A: A's scope block, then A's prefix
    assert send(gateway, b, [a_scope, prefix]) == 0
    b_system = sim.bodies()[-1]["system"]
    assert b_system[0]["text"].startswith(SCOPE_PREFIX) and b_system[0]["text"] != a_scope  # the gateway's, first
    assert b_system[1]["text"] == a_scope  # B's copy is B's own text, after it
    assert send(gateway, b, [a_scope, prefix]) > 1024  # and B's own cache works as ever


def test_text_that_only_looks_like_a_scope_never_replaces_the_gateways(gateway: Gateway, sim: Sim) -> None:
    """A system prompt that starts with ``cache scope `` (once enough to be left alone) is the
    client's text: the organisation's scope block still goes first."""
    key = gateway.new_key(f"org-c-{uuid.uuid4().hex[:8]}")
    lookalike = SCOPE_PREFIX + "0123456789abcdef"
    native(gateway, key, [lookalike + "\n\n" + long_prefix()])
    system = sim.bodies()[-1]["system"]
    assert system[0]["text"].startswith(SCOPE_PREFIX) and system[0]["text"] != lookalike
    assert system[1]["text"].startswith(lookalike)
