"""``/openai/v1/responses`` through the real gateway and the strict simulator (docs/responses.md):
JSON and streams, billing, stored responses, thinking across tool loops, refused fields, and a
request shaped like the Codex CLI's default one."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.conftest import standard_models
from tests.integration.harness import Gateway, ModelSpec, Sim, unscoped

MODEL = "anthropic/claude-sonnet-5-5"
pytestmark = pytest.mark.integration
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def post(gateway: Gateway, key: str, body: dict[str, Any], **headers: str) -> requests.Response:
    return requests.post(
        gateway.url + "/openai/v1/responses",
        json=body,
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=60,
    )


def create(gateway: Gateway, key: str, **body: Any) -> dict[str, Any]:
    resp = post(gateway, key, {"model": MODEL, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def get(gateway: Gateway, key: str, path: str) -> requests.Response:
    return requests.get(gateway.url + path, headers={"authorization": f"Bearer {key}"}, timeout=30)


def stream_events(gateway: Gateway, key: str, body: dict[str, Any]) -> tuple[requests.Response, list[str]]:
    with requests.post(
        gateway.url + "/openai/v1/responses",
        json={"model": MODEL, **body, "stream": True},
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=60,
    ) as resp:
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    return resp, lines


def payloads(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


# ---------------------------------------------------------------- JSON


def test_create_names_the_request_echoes_the_model_and_bills_the_responses_endpoint(gateway: Gateway) -> None:
    key = gateway.new_key("resp-billing")
    resp = post(gateway, key, {"model": "CLAUDE-SONNET-5.5", "input": "Hello", "max_output_tokens": 50})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"] == "resp_" + resp.headers["x-request-id"]
    assert body["model"] == "CLAUDE-SONNET-5.5" and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"].endswith("You said: Hello")
    usage = body["usage"]
    (row,) = gateway.usage("--org", "resp-billing")
    assert row["endpoint"] == "responses" and row["request_id"] == resp.headers["x-request-id"]
    assert row["model"] == "CLAUDE-SONNET-5.5" and row["status"] == 200 and float(row["cost_usd"]) > 0
    assert row["input_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"] == usage["input_tokens"]
    assert row["output_tokens"] == usage["output_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_instructions_and_parts_reach_the_upstream(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    create(
        gateway,
        key,
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi there"}]},
        ],
        client_metadata={"originator": "codex_exec"},
        metadata={"a": "b"},
    )
    (sent,) = map(unscoped, sim.bodies())
    assert [b["text"] for b in sent["system"]] == ["Be brief.", "Answer in English."]
    assert "client_metadata" not in sent and "metadata" not in sent


def test_automatic_cache_breakpoints_unless_x_ezat_cache_off(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    create(gateway, key, instructions="System text.", input="Hi")
    resp = post(
        gateway, key, {"model": MODEL, "instructions": "System text.", "input": "Hi"}, **{"x-ezat-cache": "off"}
    )
    assert resp.status_code == 200
    on, off = sim.bodies()
    assert on["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in json.dumps(off)


@pytest.mark.parametrize(
    ("body", "status", "param", "fragment"),
    [
        pytest.param({"background": True}, 400, "background", "not supported", id="background"),
        pytest.param({"conversation": "conv_1"}, 400, "conversation", "previous_response_id", id="conversation"),
        pytest.param({"include": ["message.output_text.logprobs"]}, 400, "include[0]", "not supported", id="include"),
        pytest.param({"tools": [{"type": "code_interpreter"}]}, 400, "tools[0].type", "not supported", id="builtin"),
        pytest.param(
            {"text": {"format": {"type": "json_object"}}}, 400, "text.format.type", "json_object", id="json-obj"
        ),
        pytest.param({"model": "gpt-9"}, 404, "model", "gpt-9", id="unknown-model"),
        pytest.param(
            {"previous_response_id": "resp_nope"}, 404, "previous_response_id", "resp_nope", id="unknown-previous"
        ),
    ],
)
def test_refusals_use_openais_envelope(
    gateway: Gateway, key: str, body: dict[str, Any], status: int, param: str, fragment: str
) -> None:
    resp = post(gateway, key, {"model": MODEL, "input": "Hi", **body})
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and fragment in error["message"]
    assert error["type"] == "invalid_request_error"


def test_a_missing_key_is_401(gateway: Gateway) -> None:
    resp = requests.post(gateway.url + "/openai/v1/responses", json={"model": MODEL, "input": "x"}, timeout=30)
    assert resp.status_code == 401 and set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_refused_requests_are_not_billed(gateway: Gateway) -> None:
    key = gateway.new_key("resp-refused")
    assert post(gateway, key, {"model": MODEL, "input": "x", "prompt": {"id": "p"}}).status_code == 400
    assert gateway.usage("--org", "resp-refused") == []


# ---------------------------------------------------------------- streams


def test_stream_event_sequence_with_sequence_numbers(gateway: Gateway, key: str) -> None:
    resp, lines = stream_events(gateway, key, {"input": "Count to three", "max_output_tokens": 64})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = payloads(lines)
    names = [line[7:] for line in lines if line.startswith("event: ")]
    assert names == [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    assert final["id"] == "resp_" + resp.headers["x-request-id"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_refusal_is_a_refusal_part_of_a_completed_billed_response(gateway: Gateway, stream: bool) -> None:
    org = f"resp-refusal-{stream}".lower()
    key = gateway.new_key(org)
    body = {"input": "Say no [[sim:refusal]]", "max_output_tokens": 64}
    if stream:
        _, lines = stream_events(gateway, key, body)
        events = payloads(lines)
        final = events[-1]["response"]
        kinds = [e["type"] for e in events]
        assert kinds[-6:] == [
            "response.content_part.added",
            "response.refusal.delta",
            "response.refusal.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert events[-6]["part"] == {"type": "refusal", "refusal": ""}
        assert events[-4]["refusal"] == events[-5]["delta"] == final["output"][-1]["content"][0]["refusal"]
    else:
        final = create(gateway, key, **body)
    assert final["status"] == "completed" and final["incomplete_details"] is None
    (part,) = final["output"][-1]["content"]
    assert part["type"] == "refusal" and part["refusal"]
    (row,) = gateway.usage("--org", org)
    assert row["status"] == 200 and row["output_tokens"] == final["usage"]["output_tokens"] > 0


def test_stream_usage_is_recorded_before_the_final_event(gateway: Gateway) -> None:
    key = gateway.new_key("resp-stream-usage")
    _, lines = stream_events(gateway, key, {"input": "Hello"})
    usage = payloads(lines)[-1]["response"]["usage"]
    (row,) = gateway.usage("--org", "resp-stream-usage")
    assert row["endpoint"] == "responses" and row["status"] == 200 and not row["estimated"]
    assert row["output_tokens"] == usage["output_tokens"]


def test_stream_pings_while_the_upstream_is_silent(gateway: Gateway, key: str) -> None:
    _, lines = stream_events(gateway, key, {"input": "Wait [[sim:stall=2.6]]"})
    assert lines.count(": ping") >= 2
    assert payloads(lines)[-1]["type"] == "response.completed"


@pytest.mark.parametrize("marker", ["[[sim:cut=5]]", "[[sim:error_after=5]]"], ids=["connection-cut", "error-event"])
def test_stream_failure_after_the_start_ends_with_error_then_failed_and_is_not_billed(
    gateway: Gateway, marker: str
) -> None:
    org = f"resp-midstream-{marker[6:9]}"
    key = gateway.new_key(org)
    resp, lines = stream_events(gateway, key, {"input": f"Tell me {marker} [[sim:words=40]]"})
    assert resp.status_code == 200
    events = payloads(lines)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"]
    (row,) = gateway.usage("--org", org)
    assert row["cost_usd"] == "0.000000" and row["status"] >= 500


def test_stream_tool_calls_and_reasoning_summaries(gateway: Gateway, key: str) -> None:
    _, lines = stream_events(
        gateway,
        key,
        {
            "input": "Use the tool [[sim:tools=2]]",
            "tools": [WEATHER],
            "reasoning": {"effort": "high", "summary": "auto"},
        },
    )
    events = payloads(lines)
    names = [e["type"] for e in events]
    assert "response.reasoning_summary_text.delta" in names
    assert names.count("response.function_call_arguments.done") == 2
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "function_call", "function_call"]
    assert final["output"][0]["summary"][0]["text"]
    assert "encrypted_content" not in json.dumps(events)


# ---------------------------------------------------------------- stored responses


def test_get_input_items_and_delete(gateway: Gateway, key: str) -> None:
    created = create(gateway, key, input=[{"role": "user", "content": "First"}, {"role": "user", "content": "Second"}])
    got = get(gateway, key, f"/openai/v1/responses/{created['id']}")
    assert got.status_code == 200 and got.json() == created
    items = get(gateway, key, f"/openai/v1/responses/{created['id']}/input_items").json()
    assert items["object"] == "list" and items["has_more"] is False
    assert [i["content"][0]["text"] for i in items["data"]] == ["Second", "First"]  # newest first
    asc = get(gateway, key, f"/openai/v1/responses/{created['id']}/input_items?order=asc&limit=1").json()
    assert [i["content"][0]["text"] for i in asc["data"]] == ["First"] and asc["has_more"] is True
    gone = requests.delete(
        gateway.url + f"/openai/v1/responses/{created['id']}", headers={"authorization": f"Bearer {key}"}, timeout=30
    )
    assert gone.json() == {"id": created["id"], "object": "response.deleted", "deleted": True}
    again = get(gateway, key, f"/openai/v1/responses/{created['id']}")
    assert (
        again.status_code == 404
        and again.json()["error"]["message"] == f"Response with id '{created['id']}' not found."
    )


def test_reading_stored_responses_counts_against_the_keys_rpm(gateway: Gateway) -> None:
    """GET, input_items and DELETE are requests like a POST: a key with ``--rpm 3`` gets three
    in a minute, whatever their kind, then 429 with retry-after."""
    key = gateway.new_key("resp-rpm", "--rpm", "3")
    created = create(gateway, key, input="Count me")  # 1
    path = f"/openai/v1/responses/{created['id']}"
    assert get(gateway, key, path).status_code == 200  # 2
    assert get(gateway, key, path + "/input_items").status_code == 200  # 3
    refused = get(gateway, key, path)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    listed = get(gateway, key, path + "/input_items")
    assert listed.status_code == 429


def test_input_items_page_through_a_long_conversation(gateway: Gateway, key: str) -> None:
    turns = [{"role": "user", "content": f"turn {n}"} for n in range(45)]
    created = create(gateway, key, input=turns)
    path = f"/openai/v1/responses/{created['id']}/input_items"
    first = get(gateway, key, path + "?order=asc&limit=20").json()
    assert [i["content"][0]["text"] for i in first["data"]] == [f"turn {n}" for n in range(20)]
    assert first["has_more"] is True
    second = get(gateway, key, path + f"?order=asc&limit=20&after={first['last_id']}").json()
    assert [i["content"][0]["text"] for i in second["data"]] == [f"turn {n}" for n in range(20, 40)]
    last = get(gateway, key, path + f"?order=asc&limit=20&after={second['last_id']}").json()
    assert [i["content"][0]["text"] for i in last["data"]] == [f"turn {n}" for n in range(40, 45)]
    assert last["has_more"] is False
    before = get(gateway, key, path + f"?order=asc&before={second['first_id']}&limit=3").json()
    assert [i["content"][0]["text"] for i in before["data"]] == ["turn 0", "turn 1", "turn 2"]
    newest = get(gateway, key, path + "?limit=2").json()
    assert [i["content"][0]["text"] for i in newest["data"]] == ["turn 44", "turn 43"]


def test_another_organisations_response_is_not_found(gateway: Gateway, key: str) -> None:
    created = create(gateway, key, input="Mine")
    other = gateway.new_key("resp-other-org")
    for path in (f"/openai/v1/responses/{created['id']}", f"/openai/v1/responses/{created['id']}/input_items"):
        assert get(gateway, other, path).status_code == 404
    resp = post(gateway, other, {"model": MODEL, "input": "x", "previous_response_id": created["id"]})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "previous_response_id"


def test_a_streamed_response_is_stored_before_its_last_event(gateway: Gateway) -> None:
    """The stored copy is written with the ledger row, before ``response.completed`` is sent:
    a client that reads that event can continue from it at once."""
    key = gateway.new_key("resp-stream-store")
    with requests.post(
        gateway.url + "/openai/v1/responses",
        json={"model": MODEL, "input": "Hello", "stream": True},
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=60,
    ) as resp:
        for line in resp.iter_lines(decode_unicode=True):
            if line.startswith("data: ") and '"response.completed"' in line:
                completed = json.loads(line[6:])["response"]
                stored = get(gateway, key, f"/openai/v1/responses/{completed['id']}")
                break
    assert stored.status_code == 200 and stored.json() == completed


def test_store_false_keeps_nothing(gateway: Gateway, key: str) -> None:
    created = create(gateway, key, input="Ephemeral", store=False)
    assert created["store"] is False
    assert get(gateway, key, f"/openai/v1/responses/{created['id']}").status_code == 404


def test_previous_response_id_rebuilds_the_whole_prompt_and_bills_it(gateway: Gateway, sim: Sim) -> None:
    key = gateway.new_key("resp-previous")
    first = create(gateway, key, instructions="Be brief.", input="One")
    sim.clear()
    second = create(gateway, key, input="Two", previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    (sent,) = map(unscoped, sim.bodies())
    assert "system" not in sent  # instructions are not carried over
    texts = [[b.get("text") for b in m["content"]] for m in sent["messages"]]
    assert texts == [["One"], [first["output"][0]["content"][0]["text"]], ["Two"]]
    rows = gateway.usage("--org", "resp-previous")
    assert len(rows) == 2 and all(float(r["cost_usd"]) > 0 for r in rows)
    third = create(gateway, key, input="Three", previous_response_id=second["id"])
    items = get(gateway, key, f"/openai/v1/responses/{third['id']}/input_items").json()["data"]
    assert [i["content"][0]["text"] for i in items] == ["Three"]


# ---------------------------------------------------------------- thinking across tool loops


def _outputs(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": "sunny"}
        for item in response["output"]
        if item["type"] == "function_call"
    ]


@pytest.mark.parametrize("mode", ["encrypted", "kept", "previous", "encrypted-stream"])
def test_thinking_is_requested_on_every_round_of_a_tool_loop(gateway: Gateway, sim: Sim, mode: str) -> None:
    key = gateway.new_key(f"resp-loop-{mode}")
    settings: dict[str, Any] = {"tools": [WEATHER], "reasoning": {"effort": "high"}}
    if mode.startswith("encrypted"):
        settings.update(store=False, include=["reasoning.encrypted_content"])
    sim.clear()
    items: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo? Use the tool [[sim:tools=2]]"}]
    previous: str | None = None
    for _round in range(3):
        body = {"input": items, **settings}
        if previous is not None:
            body["previous_response_id"] = previous
        if mode == "encrypted-stream":
            _, lines = stream_events(gateway, key, body)
            response = payloads(lines)[-1]["response"]
        else:
            response = create(gateway, key, **body)
        assert response["output"][0]["type"] == "reasoning"
        assert ("encrypted_content" in response["output"][0]) is mode.startswith("encrypted")
        follow = [{"role": "user", "content": "And tomorrow? Use the tool [[sim:tools=1]]"}]
        if mode == "previous":
            items, previous = _outputs(response) + follow, response["id"]
        else:
            items = items + response["output"] + _outputs(response) + follow
    bodies = sim.bodies()
    assert len(bodies) == 3 and all(b.get("thinking") == {"type": "adaptive"} for b in bodies)
    for sent in bodies[1:]:
        tool_turns = [
            m
            for m in sent["messages"]
            if m["role"] == "assistant" and any(b["type"] == "tool_use" for b in m["content"])
        ]
        assert tool_turns and all(m["content"][0]["type"] == "thinking" for m in tool_turns)


def test_a_tampered_or_foreign_encrypted_item_is_400(gateway: Gateway) -> None:
    key = gateway.new_key("resp-sealed")
    settings = {"tools": [WEATHER], "reasoning": {"effort": "high"}, "store": False}
    first = create(
        gateway, key, input="Use the tool [[sim:tools=1]]", include=["reasoning.encrypted_content"], **settings
    )
    history = [{"role": "user", "content": "Use the tool [[sim:tools=1]]"}, *first["output"], *_outputs(first)]
    tampered = copy.deepcopy(history)
    sealed = tampered[1]["encrypted_content"]
    tampered[1]["encrypted_content"] = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    resp = post(gateway, key, {"model": MODEL, "input": tampered, **settings})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input[1].encrypted_content"
    other = gateway.new_key("resp-sealed-other")
    resp = post(gateway, other, {"model": MODEL, "input": history, **settings})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input[1].encrypted_content"
    assert post(gateway, key, {"model": MODEL, "input": history, **settings}).status_code == 200


# ---------------------------------------------------------------- the Codex CLI's request


CODEX_TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command in a PTY.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Use the `apply_patch` tool to edit files.",
        "format": {
            "type": "grammar",
            "syntax": "lark",
            "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF',
        },
    },
    {
        "type": "namespace",
        "name": "multi_agent",
        "description": "Tools in the multi_agent namespace.",
        "tools": [
            {
                "type": "function",
                "name": "spawn_agent",
                "description": "Spawn a sub-agent.",
                "strict": False,
                "parameters": {
                    "type": "object",
                    "properties": {"message": {"type": "string"}},
                    "required": ["message"],
                },
            }
        ],
    },
    {"type": "web_search", "external_web_access": False},
]


def test_the_codex_default_request_works_unchanged(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    body = {
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "List files, use a tool [[sim:tools=3]]"}],
            },
        ],
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-thread",
        "text": {"verbosity": "medium"},
        "client_metadata": {"x-codex-installation-id": "abc"},
    }
    _, lines = stream_events(gateway, key, body)
    final = payloads(lines)[-1]
    assert final["type"] == "response.completed", lines[-3:]
    calls = [i for i in final["response"]["output"] if i["type"] != "reasoning"]
    assert [(c["type"], c["name"], c.get("namespace")) for c in calls] == [
        ("function_call", "exec_command", None),
        ("custom_tool_call", "apply_patch", None),
        ("function_call", "spawn_agent", "multi_agent"),
    ]
    (sent,) = sim.bodies()
    assert [t["name"] for t in sent["tools"]] == ["exec_command", "apply_patch", "multi_agent__spawn_agent"]
    # the next round, as Codex sends it: every item back, outputs for each call
    outputs = []
    for call in calls:
        kind = "custom_tool_call_output" if call["type"] == "custom_tool_call" else "function_call_output"
        outputs.append({"type": kind, "call_id": call["call_id"], "output": "ok"})
    body["input"] = body["input"] + final["response"]["output"] + outputs
    _, lines = stream_events(gateway, key, body)
    assert payloads(lines)[-1]["type"] == "response.completed"
    second = sim.bodies()[-1]
    assert second["messages"][1]["content"][0]["type"] == "thinking"
    assert [b["name"] for b in second["messages"][1]["content"][1:]] == [
        "exec_command",
        "apply_patch",
        "multi_agent__spawn_agent",
    ]


# ---------------------------------------------------------------- storage switched off


class _NoStoreGateway(Gateway):
    def write_config(self) -> None:
        super().write_config()
        text = self.config_path.read_text()
        self.config_path.write_text(text.replace("[server]", "[responses]\nstore = false\nttl_days = 1\n\n[server]", 1))


class _SearchModel(ModelSpec):
    """A model whose catalog entry enables web search, at 0.01 USD a search."""

    def toml(self) -> str:
        text = super().toml()
        text = text.replace("prefill = ", "web_search = true\nprefill = ", 1)
        return text.replace("cache_read = 0.30 }", "cache_read = 0.30, web_search = 0.01 }", 1)


@pytest.fixture(scope="module")
def no_store(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("gateway-no-store")
    searcher = _SearchModel(
        id="anthropic/claude-searcher", aliases=("claude-searcher",), deployments=[{"name": "s", "base_url": sim.url}]
    )
    server = _NoStoreGateway(root=root, models=[*standard_models(sim.url), searcher]).start()
    yield server
    server.stop()


def test_with_storage_switched_off_previous_response_id_is_400(no_store: Gateway) -> None:
    key = no_store.new_key("resp-no-store")
    created = create(no_store, key, input="Hi")
    assert created["store"] is False
    assert get(no_store, key, f"/openai/v1/responses/{created['id']}").status_code == 404
    resp = post(no_store, key, {"model": MODEL, "input": "x", "previous_response_id": created["id"]})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("previous_response_id: stored responses are switched off")


def test_the_sealing_key_is_generated_into_the_data_folder(gateway: Gateway) -> None:
    deadline = time.monotonic() + 5
    path = gateway.root / "ezat-sealing.key"
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"


# ---------------------------------------------------------------- failover and early close


@pytest.fixture(scope="module")
def failover(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Sim, Sim]]:
    down = Sim(name="down", flags=("--fail-status", "529")).start()
    up = Sim(name="up", flags=("--min-cache-tokens", "16")).start()
    root: Path = tmp_path_factory.mktemp("gateway-failover")
    deployments = [
        {"name": "down", "base_url": down.url, "priority": 0},
        {"name": "up", "base_url": up.url, "priority": 1},
    ]
    server = Gateway(root=root, models=[ModelSpec(deployments=deployments)]).start()
    yield server, down, up
    server.stop()
    down.stop()
    up.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_failing_deployment_fails_over(failover: tuple[Gateway, Sim, Sim], stream: bool) -> None:
    gateway, down, _ = failover
    down.clear()
    org = f"resp-failover-{stream}".lower()
    key = gateway.new_key(org)
    if stream:
        _, lines = stream_events(gateway, key, {"input": "Hello"})
        assert payloads(lines)[-1]["type"] == "response.completed"
    else:
        create(gateway, key, input="Hello")
    (row,) = gateway.usage("--org", org)
    assert row["deployment"] == "up" and row["status"] == 200 and row["endpoint"] == "responses"
    assert down.bodies()  # the first tier was tried and answered 529


def test_a_client_that_leaves_pays_for_what_was_produced(gateway: Gateway, sim: Sim) -> None:
    key = gateway.new_key("resp-early-close")
    sim.clear()
    resp = requests.post(
        gateway.url + "/openai/v1/responses",
        json={"model": MODEL, "input": "Long story [[sim:words=400,token_delay_ms=100]]", "stream": True},
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=60,
    )
    deltas = 0
    for line in resp.iter_lines():
        if line.startswith(b"data: ") and b"output_text.delta" in line:
            deltas += 1
            if deltas == 2:
                break
    resp.close()
    deadline = time.monotonic() + 15
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = gateway.usage("--org", "resp-early-close")
        if rows:
            break
        time.sleep(0.2)
    (row,) = rows
    assert row["estimated"] is True and row["status"] == 499 and row["endpoint"] == "responses"
    assert 0 < row["output_tokens"] < 400 and float(row["cost_usd"]) > 0


def test_web_search_is_translated_for_a_model_whose_catalog_enables_it(no_store: Gateway, sim: Sim) -> None:
    key = no_store.new_key("resp-search")
    sim.clear()
    tools = [{"type": "web_search", "filters": {"allowed_domains": ["example.com"]}}, WEATHER]
    searched = create(no_store, key, model="claude-searcher", input="Hi", tools=tools)
    plain = create(no_store, key, input="Hi", tools=tools)
    assert searched["status"] == plain["status"] == "completed"
    with_search, without = sim.bodies()
    assert with_search["tools"][0] == {
        "type": "web_search_20250305",
        "name": "web_search",
        "allowed_domains": ["example.com"],
        "max_uses": 10,  # [gateway] web_search_max_uses: the searches are reserved before it runs
    }
    assert [t["name"] for t in without["tools"]] == ["get_weather"]  # left out, never forwarded
