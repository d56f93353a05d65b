"""API versions as data (``translate/versions.py``), by tables: a request is shaped for the version
of the deployment it goes to (sampling dropped under 2026-10-21, as the Chat Completions
reference drops it), a field that can't be dropped passes such a deployment over or is a 400
naming it, each provider sends the deployment's version whatever the client sent, Bedrock
serves 2026-10-21 only for Claude 4.7 and later, and the simulator refuses what each version
refuses."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ezat_compat.domain import Deployment
from ezat_compat.sim.validate import version_refusal
from ezat_compat.translate.versions import (
    V2023,
    V2026,
    VERSION_RULES,
    VersionRefusedError,
    claude_version,
    offers_version,
    refused_path,
    shape_for_version,
    version_takers,
)
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.providers import make_provider
from tests.support.deployments import BEDROCK, VERTEX

USER = {"role": "user", "content": "hi"}
DOC = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a"}}
CITED = {"type": "text", "text": "as said", "citations": [{"type": "char_location", "cited_text": "a"}]}
OLD = Deployment(name="old", base_url="http://127.0.0.1:9", upstream_model="claude-x", api_key_env="K")
NEW = replace(OLD, name="new", anthropic_version=V2026)


def _body(**fields: Any) -> dict[str, Any]:
    return {"max_tokens": 10, "messages": [USER], **fields}


SHAPES = [
    ("2023-keeps-sampling", V2023, _body(temperature=0.2, top_p=0.5, top_k=3),
     _body(temperature=0.2, top_p=0.5, top_k=3)),
    ("2026-drops-temperature", V2026, _body(temperature=0), _body()),
    ("2026-drops-top-p-and-top-k", V2026, _body(top_p=0.9, top_k=40), _body()),
    ("2026-keeps-the-rest", V2026, _body(system="s", temperature=1, metadata={"user_id": "u"}),
     _body(system="s", metadata={"user_id": "u"})),
    ("2026-nothing-to-drop", V2026, _body(stop_sequences=["x"]), _body(stop_sequences=["x"])),
    ("2026-assistant-text-citations-kept", V2026,
     {"messages": [USER, {"role": "assistant", "content": [CITED]}, USER]},
     {"messages": [USER, {"role": "assistant", "content": [CITED]}, USER]}),
    ("2026-user-document-kept", V2026,
     {"messages": [{"role": "user", "content": [DOC, {"type": "text", "text": "sum up"}]}]},
     {"messages": [{"role": "user", "content": [DOC, {"type": "text", "text": "sum up"}]}]}),
]  # fmt: skip


@pytest.mark.parametrize(("version", "body", "shaped"), [r[1:] for r in SHAPES], ids=[r[0] for r in SHAPES])
def test_a_body_is_shaped_for_the_version(version: str, body: dict[str, Any], shaped: dict[str, Any]) -> None:
    before = json.dumps(body)
    out = shape_for_version(body, version)
    assert out == shaped
    assert json.dumps(body) == before  # the request's own body is never changed (a failover resends it)
    if out == body:
        assert out is body  # nothing dropped: no copy


REFUSALS = [
    ("assistant-document", {"messages": [USER, {"role": "assistant", "content": [DOC]}, USER]}, "messages.1.content.0"),
    ("user-text-citations", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, CITED]}]},
     "messages.0.content.1.citations"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "path"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_field_that_cant_be_dropped_is_refused_by_name(body: dict[str, Any], path: str) -> None:
    assert refused_path(body, V2023) is None
    assert refused_path(body, V2026) == path
    with pytest.raises(VersionRefusedError) as caught:
        shape_for_version(body, V2026)
    assert (caught.value.status, caught.value.param) == (400, path)
    assert caught.value.message.startswith(f"{path}: not accepted under anthropic-version 2026-10-21")


def test_every_rule_names_its_source_and_what_the_gateway_does() -> None:
    for rules in VERSION_RULES.values():
        for rule in rules:
            assert rule.action in ("drop", "refuse") and "Versions" in rule.source
    assert [r.name for r in VERSION_RULES[V2026] if r.action == "drop"] == ["temperature", "top_p", "top_k"]


def test_a_deployment_whose_version_refuses_a_field_is_passed_over() -> None:
    document = {"messages": [USER, {"role": "assistant", "content": [DOC]}, USER]}
    assert version_takers("m", (NEW, OLD), document) == (OLD,)
    both = (NEW, OLD)
    assert version_takers("m", both, _body(temperature=0.3)) is both  # dropped per attempt, not passed over
    with pytest.raises(VersionRefusedError) as caught:
        version_takers("m", (NEW, replace(NEW, name="new2")), document)
    assert caught.value.message == (
        "messages.1.content.0: not accepted under anthropic-version 2026-10-21, "
        "which model m's deployments speak; leave it out."
    )


# ---------------------------------------------------------------- each provider, per attempt


@pytest.mark.parametrize("deployment", [OLD, NEW, replace(NEW, provider="foundry", hosting="anthropic")])
def test_the_deployments_version_goes_out_never_the_clients(deployment: Deployment) -> None:
    provider = make_provider(deployment)
    for client_version in ("2023-06-01", "2026-10-21"):
        headers = provider.headers({"anthropic-version": client_version, "anthropic-beta": "b"}, "application/json")
        assert headers["anthropic-version"] == deployment.anthropic_version and headers["anthropic-beta"] == "b"


@pytest.mark.parametrize(("deployment", "sent"), [(OLD, 0.2), (NEW, None)], ids=["2023-06-01", "2026-10-21"])
def test_each_attempt_is_shaped_for_its_deployment(deployment: Deployment, sent: float | None) -> None:
    source = _body(temperature=0.2)
    out, _ = make_provider(deployment).shape(encode_body(source), source, True, None)
    body = json.loads(out)
    assert body.get("temperature") == sent and body["model"] == "claude-x" and body["stream"] is True
    assert source["temperature"] == 0.2


@pytest.mark.parametrize("cloud", [BEDROCK, VERTEX], ids=["bedrock", "vertex"])
def test_the_clouds_keep_their_own_body_version(cloud: Deployment) -> None:
    source = _body(temperature=0.2)
    out, _ = make_provider(cloud).shape(encode_body(source), source, False, {"anthropic-version": V2026})
    body = json.loads(out)
    assert body["anthropic_version"] in ("bedrock-2023-05-31", "vertex-2023-10-16") and body["temperature"] == 0.2


# ---------------------------------------------------------------- which provider serves which version

MODELS = [
    ("anthropic.claude-opus-4-7-v1:0", (4, 7), True),
    ("us.anthropic.claude-opus-4-8-20260601-v1:0", (4, 8), True),
    ("global.anthropic.claude-sonnet-5-5-v1:0", (5, 5), True),
    ("anthropic.claude-fable-5-v1:0", (5, 0), True),
    ("anthropic.claude-opus-4-6-v1:0", (4, 6), False),
    ("anthropic.claude-sonnet-4-20250514-v1:0", (4, 0), False),
    ("anthropic.claude-opus-4-1-20250805-v1:0", (4, 1), False),
    ("anthropic.claude-3-7-sonnet-20250219-v1:0", None, False),
    ("arn:aws:bedrock:us-east-1:123:application-inference-profile/abc", None, False),
]


@pytest.mark.parametrize(("model", "version", "serves"), MODELS, ids=[m[0] for m in MODELS])
def test_bedrock_serves_2026_10_21_only_for_claude_4_7_and_later(
    model: str, version: tuple[int, int] | None, serves: bool
) -> None:
    assert claude_version(model) == version
    assert offers_version("bedrock", model, V2026) is serves
    assert offers_version("bedrock", model, V2023)
    for provider in ("anthropic", "vertex", "foundry"):
        assert offers_version(provider, model, V2026)


# ---------------------------------------------------------------- the simulator's own rules

SIM = [
    ("2023-takes-sampling", V2023, _body(temperature=0.5), None),
    ("2026-temperature", V2026, _body(temperature=0.5), "temperature: Extra inputs are not permitted"),
    ("2026-top-k", V2026, _body(top_k=5), "top_k: Extra inputs are not permitted"),
    ("2026-assistant-document", V2026, {"messages": [USER, {"role": "assistant", "content": [DOC]}]},
     "messages.1.content.0: document blocks are not accepted in assistant messages"),
    ("2026-user-citations", V2026, {"messages": [{"role": "user", "content": [CITED]}]},
     "messages.0.content.0.text.citations: Extra inputs are not permitted"),
    ("2026-plain", V2026, _body(), None),
    ("no-version-header", "", _body(temperature=0.5), None),
]  # fmt: skip


@pytest.mark.parametrize(("version", "body", "message"), [r[1:] for r in SIM], ids=[r[0] for r in SIM])
def test_the_simulator_refuses_what_each_version_refuses(
    version: str, body: dict[str, Any], message: str | None
) -> None:
    assert version_refusal(body, version) == message
    if message is not None:  # what the gateway sends a deployment of that version, the simulator takes
        try:
            shaped = shape_for_version(body, version)
        except VersionRefusedError:
            return
        assert version_refusal(dict(shaped), version) is None
