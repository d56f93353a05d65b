"""Billing and configuration of the Responses API (docs/responses.md): web searches billed at the
model's price per search, the [responses] settings and the per-model web_search switch."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from ezat_compat.config import ConfigError, parse_config
from ezat_compat.domain import Price, ResponsesSettings, Usage
from ezat_compat.pricing import cost_micros
from ezat_compat.store.ledger import ENDPOINTS
from ezat_compat.translate.response import merge_usage, usage_from_anthropic

MODEL = {
    "id": "anthropic/test",
    "aliases": ["test"],
    "price": {"input": 3, "output": 15},
    "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "claude-sonnet-5-5"}],
}
PRICE = Price(Decimal(3), Decimal(15), Decimal("3.75"), Decimal("0.3"), web_search=Decimal("0.01"))


def config(**extra: Any) -> Any:
    return parse_config({"models": [{**MODEL, **extra.pop("model", {})}], **extra})


@pytest.mark.parametrize(
    ("usage", "micros"),
    [
        pytest.param(Usage(input_tokens=1000, output_tokens=100), 4500, id="no-search"),
        pytest.param(Usage(input_tokens=1000, output_tokens=100, web_searches=2), 24500, id="two-searches"),
    ],
)
def test_web_searches_are_billed_per_search(usage: Usage, micros: int) -> None:
    assert cost_micros(usage, PRICE) == micros  # 0.01 USD a search = 10,000 micro-USD


def test_web_searches_are_read_from_the_usage() -> None:
    usage = usage_from_anthropic({"input_tokens": 5, "output_tokens": 2, "server_tool_use": {"web_search_requests": 3}})
    assert usage.web_searches == 3
    assert merge_usage(Usage(web_searches=1), {"output_tokens": 9}).web_searches == 1
    assert merge_usage(Usage(), {"server_tool_use": {"web_search_requests": 2}}).web_searches == 2


def test_responses_is_a_ledger_endpoint() -> None:
    assert "responses" in ENDPOINTS


def test_configuration_defaults_and_values() -> None:
    default = config()
    assert default.responses == ResponsesSettings(store=True, ttl_days=30.0)
    assert default.models[0].web_search is False and default.models[0].price.web_search == 0
    set_ = config(
        responses={"store": False, "ttl_days": 7},
        model={"web_search": True, "price": {"input": 3, "output": 15, "web_search": "0.01"}},
    )
    assert set_.responses == ResponsesSettings(store=False, ttl_days=7.0)
    assert set_.models[0].web_search is True and set_.models[0].price.web_search == Decimal("0.01")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        pytest.param({"responses": {"ttl_days": 0}}, "responses.ttl_days", id="ttl-positive"),
        pytest.param({"responses": {"keep": True}}, "responses.keep", id="unknown-key"),
        pytest.param(
            {"model": {"price": {"input": 3, "output": 15, "web_search": -1}}}, "price.web_search", id="price"
        ),
    ],
)
def test_configuration_mistakes_name_the_key(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        config(**extra)
