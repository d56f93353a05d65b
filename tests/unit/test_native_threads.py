"""Message threads on native ``/v1/messages`` (beta ``message-threads-2026-08-12``): the gateway
keeps no upstream thread. A ``create`` is a whole request and goes upstream without ``thread``
and without the beta; any other ``thread`` answers the refusal clients read as "resend this
turn with the full history" (400, ``details.error_code`` ``thread_unsupported_request``),
before any upstream call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.dialects.anthropic_messages import THREAD_REFUSAL, AnthropicMessages, forwarded_headers
from ezat_compat.errors import ThreadUnsupportedError, render_anthropic

CATALOG = Catalog(
    parse_config(
        {
            "models": [
                {
                    "id": "anthropic/claude-sonnet-5-5",
                    "aliases": ["claude-sonnet-5-5"],
                    "price": {"input": 3, "output": 15},
                    "deployments": [{"name": "d", "base_url": "http://h", "upstream_model": "claude-sonnet-5-5"}],
                }
            ]
        }
    ).models
)
BETA = "message-threads-2026-08-12"


def parse(body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return AnthropicMessages().parse(body, headers or {}, lambda name: CATALOG.resolve(name) or pytest.fail(name))


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-5-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_a_thread_created_goes_upstream_as_the_whole_request_it_is() -> None:
    parsed = parse(body(thread={"type": "create"}), {"anthropic-beta": f"claude-code-20250219, {BETA}"})
    assert "thread" not in parsed.body
    assert parsed.body["messages"] == [{"role": "user", "content": "hi"}]
    assert parsed.headers == {"anthropic-beta": "claude-code-20250219"}


@pytest.mark.parametrize(
    ("beta", "forwarded"),
    [
        pytest.param(BETA, {}, id="alone"),
        pytest.param(f"a-1,{BETA},b-2", {"anthropic-beta": "a-1,b-2"}, id="among-others"),
        pytest.param("a-1, b-2", {"anthropic-beta": "a-1, b-2"}, id="absent: unchanged"),
    ],
)
def test_the_threads_beta_never_goes_upstream(beta: str, forwarded: dict[str, str]) -> None:
    assert forwarded_headers({"anthropic-beta": beta}) == forwarded


@pytest.mark.parametrize(
    "thread",
    [
        pytest.param({"type": "continue", "previous_message_id": "msg_01abc"}, id="continue"),
        pytest.param(None, id="null"),
        pytest.param("continue", id="string"),
        pytest.param({}, id="empty-object"),
        pytest.param({"type": "resume"}, id="unknown-type"),
    ],
)
def test_every_other_thread_is_the_client_compatible_refusal(thread: Any) -> None:
    with pytest.raises(ThreadUnsupportedError) as caught:
        parse(body(thread=thread))
    status, envelope, _ = render_anthropic(caught.value, "req_1")
    assert status == 400
    assert envelope == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": THREAD_REFUSAL,
            "details": {"error_code": "thread_unsupported_request"},
        },
        "request_id": "req_1",
    }
    assert json.dumps(envelope)  # plain JSON


def test_without_a_thread_nothing_changes() -> None:
    parsed = parse(body(metadata={"user_id": "u"}))
    assert parsed.body == {
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "u"},
    }
