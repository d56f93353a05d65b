"""A deployment whose own limit its answers say is spent (``anthropic-ratelimit-*``) is tried
after the model's others, through the real gateway (gunicorn, gevent) and a simulator that keeps
an organisation's request limit as Anthropic's API does (``--rpm-limit``): the requests it would
have refused with a 429 go to the other deployment and never reach it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Sim, Sim, str]]:
    limited = Sim(name="limited", flags=("--rpm-limit", "2")).start()
    roomy = Sim(name="roomy").start()
    models = [
        ModelSpec(
            id="test/headroom",
            aliases=("headroom",),
            deployments=(
                {"name": "limited", "base_url": limited.url, "priority": 0},
                {"name": "roomy", "base_url": roomy.url, "priority": 1},
            ),
        ),
    ]
    gw = Gateway(root=tmp_path_factory.mktemp("headroom"), models=models).start()
    try:
        yield gw, limited, roomy, gw.new_key("headroom")
    finally:
        gw.stop()
        limited.stop()
        roomy.stop()


def _remaining(gw: Gateway, deployment: str) -> float | None:
    text = requests.get(gw.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "ezat_upstream_ratelimit_remaining" and labels.get("deployment") == deployment:
                assert labels == {"model": "test/headroom", "deployment": deployment, "limit": "requests"}
                return sample.value
    return None


def test_a_spent_deployment_gives_way_before_it_refuses(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    gw, limited, roomy, key = stack
    with openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=key, max_retries=0, timeout=30) as client:
        first = client.chat.completions.create(model="headroom", messages=[{"role": "user", "content": "One"}])
        assert first.choices[0].message.content
        assert _remaining(gw, "limited") == 1
        streamed = list(
            client.chat.completions.create(model="headroom", messages=[{"role": "user", "content": "Two"}], stream=True)
        )
        assert any(c.choices and c.choices[0].delta.content for c in streamed)
        assert _remaining(gw, "limited") == 0  # read from the stream's head
        for n in range(3):  # the tier-0 deployment is spent: these go to tier 1, at once
            reply = client.chat.completions.create(
                model="headroom", messages=[{"role": "user", "content": f"More {n}"}]
            )
            assert reply.choices[0].message.content
    assert len(limited.bodies()) == 2  # it was never sent a request it would have refused
    assert len(roomy.bodies()) == 3
    served = sorted(r["deployment"] for r in gw.usage())
    assert served == ["limited", "limited", "roomy", "roomy", "roomy"]
    assert _remaining(gw, "roomy") is None  # a deployment that reports no limits has no figure
    failovers = requests.get(gw.url + "/metrics", timeout=10).text
    assert "ezat_failovers_total{" not in failovers  # no attempt failed on the way


def test_the_simulated_limit_refuses_as_anthropics_api_does(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    """Past the gateway, straight to the simulator until its limit is spent: a 429 with the
    limit's header fields."""
    _, limited, _, _ = stack
    body = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):  # the limit is 2 a minute: spent by the third at the latest
        refused = requests.post(limited.url + "/v1/messages", json=body, headers={"x-api-key": "k"}, timeout=10)
        if refused.status_code != 200:
            break
    assert refused.status_code == 429
    assert refused.json()["error"] == {
        "type": "rate_limit_error",
        "message": "This request would exceed your account's rate limit. Please try again later.",
    }
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert refused.headers["anthropic-ratelimit-requests-limit"] == "2"
