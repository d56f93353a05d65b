"""Item references of the Responses API (docs/responses.md, "Item references"): an output
item's id names its response, a reference becomes the stored item, and one the organisation
doesn't have (unknown, expired, another organisation's) is OpenAI's 404 naming
``input[N].id``; through the dialect with a fake store, a request without references reads
nothing more."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ezat_compat.dialects.openai_responses import OpenAIResponses, ResponsesServices
from ezat_compat.domain import ResponsesSettings
from ezat_compat.errors import InvalidRequestError, NotFoundError
from ezat_compat.pipeline import Reply
from ezat_compat.translate.item_references import (
    STORE_FALSE_HINT,
    is_reference,
    item_key,
    referenced_responses,
    references,
    resolve_references,
    response_id_of_item,
)
from tests.support.pipeline import AUTH, LOOKUP, SEALER, THINKING, TOOL_REPLY, gateway
from tests.support.pipeline import responses_request as request

RID = "0197a0c2-5d1e-7a3b-8c4d-0123456789ab"  # request ids are UUIDv7 (api/common.new_request_id)
RESPONSE_ID = "resp_" + RID
KEY = item_key(RESPONSE_ID)
MSG, FC, RS = f"msg_{KEY}002", f"fc_{KEY}003", f"rs_{KEY}001"
OUTPUT = [
    {"id": RS, "type": "reasoning", "summary": [], "encrypted_content": "ezs1.sealed"},
    {"id": MSG, "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
    {"id": FC, "type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
]
USER = {"role": "user", "content": "hi"}


def ref(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


def pairs(*items: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    return [(item, f"input[{i}]") for i, item in enumerate(items)]


# ---------------------------------------------------------------- ids


def test_item_key_is_the_request_id_without_dashes() -> None:
    assert KEY == "0197a0c25d1e7a3b8c4d0123456789ab"


@pytest.mark.parametrize(
    ("item_id", "response_id"),
    [
        pytest.param(MSG, RESPONSE_ID, id="message"),
        pytest.param(FC, RESPONSE_ID, id="function-call"),
        pytest.param(RS, RESPONSE_ID, id="reasoning"),
        pytest.param(f"ctc_{KEY}004", RESPONSE_ID, id="custom-tool-call"),
        pytest.param(f"ws_{KEY}005", RESPONSE_ID, id="web-search-call"),
        pytest.param(f"msg_{KEY}1000", RESPONSE_ID, id="thousandth-item"),
        pytest.param("msg_1", None, id="too-short"),
        pytest.param(f"msg_{KEY}", None, id="no-item-number"),
        pytest.param(f"msg_{KEY}01", None, id="item-number-too-short"),
        pytest.param(f"msg_{KEY.upper()}001", None, id="upper-case-hex"),
        pytest.param(f"msg_{RID}001", None, id="dashed"),
        pytest.param(f"{KEY}001", None, id="no-prefix"),
        pytest.param(f"msg_{KEY}001\n", None, id="trailing-newline"),
        pytest.param("msg_6834a1b2c3d4e5f60718293a4b5c6d7e0123456789abcdef", None, id="openai-id"),
    ],
)
def test_an_item_id_names_its_response(item_id: str, response_id: str | None) -> None:
    assert response_id_of_item(item_id) == response_id


# ---------------------------------------------------------------- finding and resolving


def test_references_are_listed_with_their_paths() -> None:
    items = pairs(USER, ref(MSG), {"type": "function_call_output", "call_id": "c", "output": "x"}, ref(FC))
    assert references(items) == [(MSG, "input[1]"), (FC, "input[3]")]
    assert references(pairs(USER)) == []


def test_each_referenced_response_is_read_once() -> None:
    other = "resp_0197a0c2-5d1e-7a3b-8c4d-ffffffffffff"
    refs = [(MSG, "input[1]"), (FC, "input[2]"), (f"msg_{item_key(other)}001", "input[3]")]
    assert referenced_responses(refs, store=True) == [RESPONSE_ID, other]


@pytest.mark.parametrize(
    ("store", "message"),
    [
        pytest.param(True, "Item with id 'msg_1' not found.", id="store"),
        pytest.param(False, "Item with id 'msg_1' not found." + STORE_FALSE_HINT, id="store-false"),
    ],
)
def test_an_id_of_no_response_of_ours_is_not_found_without_a_lookup(store: bool, message: str) -> None:
    with pytest.raises(NotFoundError) as caught:
        referenced_responses([(MSG, "input[1]"), ("msg_1", "input[2]")], store=store)
    assert caught.value.status == 404 and caught.value.openai_type == "invalid_request_error"
    assert caught.value.param == "input[2].id" and caught.value.message == message


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        pytest.param([USER, ref(MSG)], [USER, OUTPUT[1]], id="message"),
        pytest.param([USER, ref(RS), ref(FC)], [USER, OUTPUT[0], OUTPUT[2]], id="reasoning-and-call"),
        pytest.param([USER, ref(FC), ref(MSG)], [USER, OUTPUT[2], OUTPUT[1]], id="in-the-clients-order"),
        pytest.param([USER, ref(MSG), ref(MSG)], [USER, OUTPUT[1], OUTPUT[1]], id="twice-as-sent"),
        pytest.param([USER], [USER], id="no-reference"),
    ],
)
def test_a_reference_becomes_the_stored_item(items: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    resolved = resolve_references(pairs(*items), {RESPONSE_ID: OUTPUT}, store=True)
    assert resolved == pairs(*expected)


@pytest.mark.parametrize(
    ("outputs", "item_id"),
    [
        pytest.param({}, MSG, id="response-not-found"),  # unknown, expired, or another organisation's
        pytest.param({RESPONSE_ID: OUTPUT[:1]}, MSG, id="item-not-in-its-response"),
        pytest.param({RESPONSE_ID: OUTPUT}, f"msg_{KEY}009", id="unknown-item-number"),
        pytest.param({RESPONSE_ID: OUTPUT}, "msg_1", id="not-an-id-of-ours"),
    ],
)
def test_a_reference_not_found_is_404_naming_its_id(outputs: dict[str, Any], item_id: str) -> None:
    with pytest.raises(NotFoundError) as caught:
        resolve_references(pairs(USER, ref(item_id)), outputs, store=True)
    assert caught.value.message == f"Item with id '{item_id}' not found." and caught.value.param == "input[1].id"


# ---------------------------------------------------------------- through the dialect


class FakeStore:
    """The response store's interface, in memory, recording every read."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str], dict[str, Any]] = {}
        self.reads: list[tuple[str, Any]] = []

    def put(self, org_id: int, response: dict[str, Any], *_: Any, **__: Any) -> None:
        self.rows[(org_id, response["id"])] = json.loads(json.dumps(response))

    def get(self, org_id: int, response_id: str, now: float) -> None:
        self.reads.append(("get", response_id))

    def outputs(self, org_id: int, response_ids: list[str], now: float) -> dict[str, list[dict[str, Any]]]:
        self.reads.append(("outputs", list(response_ids)))
        found = {r: self.rows.get((org_id, r)) for r in response_ids}
        return {r: response["output"] for r, response in found.items() if response is not None}


def stored_dialect() -> tuple[OpenAIResponses, FakeStore]:
    store = FakeStore()
    services = ResponsesServices(ResponsesSettings(store=True), store, SEALER, lambda: 1000.0)  # type: ignore[arg-type]
    return OpenAIResponses(services), store


TOOL_TURN = {"tools": [LOOKUP], "reasoning": {"effort": "high"}}


def first_turn(dialect: OpenAIResponses) -> dict[str, Any]:
    """A tool round with thinking, stored (its reasoning sealed in the store, not shown)."""
    gw, _, _ = gateway({"a": TOOL_REPLY})
    reply = gw.handle(dialect, request({"input": "look x up", **TOOL_TURN}, rid=RID))
    assert isinstance(reply, Reply)
    response: dict[str, Any] = json.loads(reply.body)
    return response


def test_references_to_a_stored_tool_round_restore_its_call_and_sealed_thinking() -> None:
    dialect, store = stored_dialect()
    first = first_turn(dialect)
    assert all("encrypted_content" not in item for item in first["output"])  # not asked for: not shown
    rs, fc = (item["id"] for item in first["output"])
    store.reads.clear()
    gw, upstream, _ = gateway({"a": TOOL_REPLY})
    second = [
        USER | {"content": "look x up"},
        ref(rs),
        ref(fc),
        {"type": "function_call_output", "call_id": "toolu_1", "output": "found"},
    ]
    gw.handle(dialect, request({"input": second, **TOOL_TURN}, rid="0197a0c2-5d1e-7a3b-8c4d-000000000002"))
    assert store.reads == [("outputs", [RESPONSE_ID])]  # one read for both references
    sent = json.loads(upstream.calls[-1][1])
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [THINKING, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}],
    }
    kept = store.rows[(AUTH.org_id, "resp_0197a0c2-5d1e-7a3b-8c4d-000000000002")]
    assert kept["id"].endswith("000000000002")


def test_a_reference_by_its_id_alone_is_a_reference() -> None:
    """The API reference's ``ItemReference``: ``type`` "item_reference" or null, so ``{"id": …}``
    alone names a stored item too (it was read as a message missing its ``role``)."""
    dialect, _ = stored_dialect()
    first = first_turn(dialect)
    rs, fc = (item["id"] for item in first["output"])
    gw, upstream, _ = gateway({"a": TOOL_REPLY})
    output = {"type": "function_call_output", "call_id": "toolu_1", "output": "found"}
    body = {"input": [USER | {"content": "look x up"}, {"id": rs}, {"id": fc}, output], **TOOL_TURN}
    gw.handle(dialect, request(body, rid="0197a0c2-5d1e-7a3b-8c4d-000000000004"))
    sent = json.loads(upstream.calls[-1][1])
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [THINKING, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}],
    }
    assert not is_reference({"id": "msg_1", "role": "user", "content": "hi"})  # a message with an id stays one


def test_a_request_without_references_reads_nothing_more() -> None:
    dialect, store = stored_dialect()
    gw, _, _ = gateway({"a": TOOL_REPLY})
    gw.handle(dialect, request({"input": [USER], **TOOL_TURN}, rid=RID))
    assert store.reads == []


@pytest.mark.parametrize(
    ("org", "store", "item", "message"),
    [
        pytest.param(AUTH.org_id, True, f"msg_{KEY}009", f"Item with id 'msg_{KEY}009' not found.", id="unknown"),
        pytest.param(AUTH.org_id + 1, True, f"fc_{KEY}002", f"Item with id 'fc_{KEY}002' not found.", id="other-org"),
        pytest.param(
            AUTH.org_id + 1,
            False,
            f"fc_{KEY}002",
            f"Item with id 'fc_{KEY}002' not found." + STORE_FALSE_HINT,
            id="other-org-store-false",
        ),
    ],
)
def test_a_reference_the_organisation_has_not_is_404_before_admission(
    org: int, store: bool, item: str, message: str
) -> None:
    dialect, _ = stored_dialect()
    first_turn(dialect)
    gw, upstream, ledger = gateway({"a": TOOL_REPLY})
    gw.accounts.authenticate = lambda *_: dataclasses.replace(AUTH, org_id=org)  # type: ignore[method-assign]
    with pytest.raises(NotFoundError) as caught:
        gw.handle(dialect, request({"input": [USER, ref(item)], "store": store, **TOOL_TURN}))
    assert (caught.value.status, caught.value.param, caught.value.message) == (404, "input[1].id", message)
    assert upstream.calls == [] and ledger.rows == []


def test_a_store_false_request_resolves_references_to_a_stored_response() -> None:
    dialect, store = stored_dialect()
    first = first_turn(dialect)
    rs, fc = (item["id"] for item in first["output"])
    gw, upstream, _ = gateway({"a": TOOL_REPLY})
    output = {"type": "function_call_output", "call_id": "toolu_1", "output": "found"}
    body = {"input": [USER, ref(rs), ref(fc), output], "store": False, **TOOL_TURN}
    gw.handle(dialect, request(body, rid="0197a0c2-5d1e-7a3b-8c4d-000000000003"))
    assert json.loads(upstream.calls[-1][1])["messages"][1]["content"][0] == THINKING
    assert len(store.rows) == 1  # the store: false response is not kept


def test_references_with_storage_off_are_400() -> None:
    dialect = OpenAIResponses(ResponsesServices(ResponsesSettings(store=False), None, SEALER, lambda: 1000.0))
    gw, upstream, _ = gateway({"a": TOOL_REPLY})
    with pytest.raises(InvalidRequestError) as caught:
        gw.handle(dialect, request({"input": [USER, ref(MSG)]}))
    assert caught.value.status == 400 and caught.value.param == "input[1].id"
    assert "switched off" in caught.value.message and upstream.calls == []
