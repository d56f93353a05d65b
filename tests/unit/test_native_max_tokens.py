"""``max_tokens`` on native ``/v1/messages``: above the model's ``max_output_tokens`` it is
refused before any upstream call with the real API's 400 and words, naming the model as the
client sent it; any other value the upstream would refuse goes to it (its own words), and the
reservation is the model's maximum."""

from __future__ import annotations

from typing import Any

import pytest

from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.dialects.anthropic_messages import AnthropicCountTokens, AnthropicMessages
from ezat_compat.errors import InvalidRequestError, render_anthropic

LIMIT = 64000
CATALOG = Catalog(
    parse_config(
        {
            "models": [
                {
                    "id": "anthropic/claude-sonnet-5-5",
                    "aliases": ["claude-sonnet-5-5", "claude-sonnet-5.5"],
                    "max_output_tokens": LIMIT,
                    "price": {"input": 3, "output": 15},
                    "deployments": [{"name": "d", "base_url": "http://h", "upstream_model": "claude-sonnet-5-5"}],
                }
            ]
        }
    ).models
)


def body(max_tokens: Any, model: str = "claude-sonnet-5.5") -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}


def parse(payload: dict[str, Any], dialect: AnthropicMessages | None = None) -> Any:
    return (dialect or AnthropicMessages()).parse(payload, {}, lambda n: CATALOG.resolve(n) or pytest.fail(n))


@pytest.mark.parametrize(
    ("max_tokens", "model", "message"),
    [
        pytest.param(
            LIMIT + 1,
            "claude-sonnet-5.5",
            "max_tokens: 64001 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-5.5",
            id="one-above",
        ),
        pytest.param(
            100000,
            "anthropic/claude-sonnet-5-5",
            "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for "
            "anthropic/claude-sonnet-5-5",
            id="canonical-name-as-sent",
        ),
        pytest.param(
            2**63 - 1,
            "claude-sonnet-5-5",
            "max_tokens: 9223372036854775807 > 64000, which is the maximum allowed number of output tokens for "
            "claude-sonnet-5-5",
            id="int64-max",
        ),
        pytest.param(
            2**70,
            "claude-sonnet-5-5",
            f"max_tokens: {2**70} > 64000, which is the maximum allowed number of output tokens for claude-sonnet-5-5",
            id="above-2-63",
        ),
    ],
)
def test_max_tokens_above_the_models_limit_is_the_real_apis_400(max_tokens: int, model: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse(body(max_tokens, model))
    status, envelope, _ = render_anthropic(info.value)
    assert status == 400
    assert envelope["type"] == "error"
    assert envelope["error"] == {"type": "invalid_request_error", "message": message}


@pytest.mark.parametrize(
    ("max_tokens", "reserved"),
    [
        pytest.param(1, 1, id="one"),
        pytest.param(LIMIT, LIMIT, id="the-limit"),
        pytest.param(0, LIMIT, id="zero-left-to-the-upstream"),
        pytest.param(-(2**70), LIMIT, id="huge-negative-left-to-the-upstream"),
        pytest.param(True, LIMIT, id="bool-left-to-the-upstream"),
        pytest.param(100000.0, LIMIT, id="float-left-to-the-upstream"),
        pytest.param("100000", LIMIT, id="string-left-to-the-upstream"),
        pytest.param(None, LIMIT, id="null-left-to-the-upstream"),
    ],
)
def test_other_values_pass_through_with_a_bounded_reservation(max_tokens: Any, reserved: int) -> None:
    parsed = parse(body(max_tokens))
    assert parsed.max_tokens == reserved
    assert parsed.body["max_tokens"] == max_tokens  # the body goes upstream as sent


def test_count_tokens_bodies_are_left_to_the_upstream() -> None:
    parsed = parse(body(LIMIT + 1), AnthropicCountTokens())
    assert parsed.body["max_tokens"] == LIMIT + 1
