"""Message threads on native ``/v1/messages`` (beta ``message-threads-2026-08-12``), held by the
gateway: what a ``thread`` asks, the whole request a continue stands for, the turn kept from a JSON
reply or a stream, and the rejections the SDKs act on (``thread_not_found``: resend the whole
history; ``thread_unsupported_request``: go on without threads). The protocol's source: the
Anthropic Python SDK 2.17, ``lib/threads`` (quoted in ``dialects/native_threads.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.dialects import ReplyIds
from ezat_compat.dialects.anthropic_messages import AnthropicMessages, forwarded_headers
from ezat_compat.dialects.native_threads import (
    THREAD_REFUSAL,
    ReplyAssembler,
    ThreadTurn,
    breakpoints,
    joined,
    thread_of,
    turn_messages,
    whole_request,
)
from ezat_compat.errors import (
    InvalidRequestError,
    ThreadNotFoundError,
    ThreadUnsupportedError,
    render_anthropic,
)
from ezat_compat.store.db import make_engine
from ezat_compat.store.threads import ThreadStore
from tests.support.migrated import migrated_sqlite

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
EPH = {"type": "ephemeral"}
IDS = ReplyIds("chatcmpl-x", 0)
NOW = 1_800_000_000.0


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-5-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **extra}


def resolve(name: str) -> Any:
    return CATALOG.resolve(name) or pytest.fail(name)


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    engine = make_engine(migrated_sqlite(tmp_path / "ezat.db"))
    return ThreadStore(engine, 3600.0)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- what a ``thread`` asks


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param({}, None, id="absent"),
        pytest.param({"thread": None}, None, id="null: no thread"),
        pytest.param(
            {"thread": {"type": "create"}, "system": "s", "tools": [{"name": "t", "input_schema": {}}]},
            ThreadTurn(
                None, {"system": "s", "tools": [{"name": "t", "input_schema": {}}]}, [{"role": "user", "content": "hi"}]
            ),
            id="create keeps system and tools",
        ),
        pytest.param(
            {"thread": {"type": "continue", "previous_message_id": "msg_1"}},
            ThreadTurn("msg_1", None, [{"role": "user", "content": "hi"}]),
            id="continue",
        ),
        pytest.param(
            {"thread": {"type": "continue", "previous_message_id": "msg_1"}, "messages": []},
            ThreadTurn("msg_1", None, []),
            id="continue with no messages (after pause_turn)",
        ),
    ],
)
def test_what_a_thread_asks(extra: dict[str, Any], expected: ThreadTurn | None) -> None:
    assert thread_of(body(**extra)) == expected


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        pytest.param({"thread": "continue"}, "thread.type", id="string"),
        pytest.param({"thread": {}}, "thread.type", id="empty-object"),
        pytest.param({"thread": {"type": "resume"}}, "thread.type", id="unknown-type"),
        pytest.param({"thread": {"type": "continue"}}, "thread.previous_message_id", id="no-previous"),
        pytest.param(
            {"thread": {"type": "continue", "previous_message_id": 7}}, "thread.previous_message_id", id="id-int"
        ),
        pytest.param(
            {"thread": {"type": "continue", "previous_message_id": "msg_1"}, "system": "s"},
            "system",
            id="continue+system",
        ),
        pytest.param(
            {"thread": {"type": "continue", "previous_message_id": "msg_1"}, "tools": []}, "tools", id="continue+tools"
        ),
    ],
)
def test_a_thread_the_api_would_refuse_is_a_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        AnthropicMessages().parse(body(**extra), {}, resolve)
    assert caught.value.param == param
    assert render_anthropic(caught.value, "r")[0] == 400
    assert str(caught.value).startswith(param + ":")


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


# ---------------------------------------------------------------- a gateway that keeps no threads


def test_without_a_store_a_create_goes_upstream_whole_and_nothing_is_kept() -> None:
    parsed = AnthropicMessages(None).parse(body(thread={"type": "create"}), {"anthropic-beta": BETA}, resolve)
    assert "thread" not in parsed.body
    assert parsed.body["messages"] == [{"role": "user", "content": "hi"}]
    assert parsed.context is None and parsed.prepare is None
    assert parsed.headers == {}


def test_without_a_store_a_continue_is_the_refusal_tool_runners_go_on_unthreaded_after() -> None:
    with pytest.raises(ThreadUnsupportedError) as caught:
        AnthropicMessages(None).parse(body(thread={"type": "continue", "previous_message_id": "msg_1"}), {}, resolve)
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


def test_without_a_thread_nothing_changes(store: ThreadStore) -> None:
    parsed = AnthropicMessages(store).parse(body(metadata={"user_id": "u"}), {}, resolve)
    assert parsed.body == {
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "u"},
    }
    assert parsed.context is None and parsed.prepare is None


# ---------------------------------------------------------------- the whole request of a continue


def test_a_continue_goes_as_the_whole_request_with_the_threads_system_and_tools() -> None:
    history = [{"role": "user", "content": "one"}, {"role": "assistant", "content": [{"type": "text", "text": "1"}]}]
    upstream = {"max_tokens": 9, "messages": [{"role": "user", "content": "two"}], "temperature": 0}
    fields = {"system": "be brief", "tools": [{"name": "t", "input_schema": {"type": "object"}}]}
    out = whole_request(upstream, fields, history, caching=False)
    assert out == {
        "max_tokens": 9,
        "temperature": 0,
        "system": "be brief",
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "messages": [*history, {"role": "user", "content": "two"}],
    }
    assert upstream["messages"] == [{"role": "user", "content": "two"}]  # the client's body is not changed


@pytest.mark.parametrize(
    ("last", "marked"),
    [
        pytest.param(
            {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a", "cache_control": EPH}]},
            id="text",
        ),
        pytest.param(
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": [{"type": "text", "text": "a", "cache_control": EPH}]},
            id="string content",
        ),
        pytest.param(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                    {"type": "thinking", "thinking": "x", "signature": "s"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}, "cache_control": EPH},
                    {"type": "thinking", "thinking": "x", "signature": "s"},
                ],
            },
            id="never on a thinking block",
        ),
        pytest.param(
            {"role": "assistant", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": ""}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "b", "cache_control": EPH}, {"type": "text", "text": ""}],
            },
            id="never on an empty text",
        ),
    ],
)
def test_the_history_ends_on_a_cache_breakpoint(last: dict[str, Any], marked: dict[str, Any]) -> None:
    out = whole_request({"messages": []}, {}, [{"role": "user", "content": "q"}, last], caching=True)
    assert out["messages"] == [{"role": "user", "content": "q"}, marked]


def test_no_breakpoint_when_the_request_has_no_room_or_the_model_caches_nothing() -> None:
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    four = [{"type": "text", "text": str(i), "cache_control": EPH} for i in range(4)]
    full = whole_request({"messages": [{"role": "user", "content": four}]}, {}, history, caching=True)
    assert breakpoints(full["messages"]) == 4
    assert full["messages"][:2] == history
    assert whole_request({"messages": []}, {}, history, caching=False)["messages"] == history


def test_the_historys_breakpoint_is_1h_when_a_later_one_is_as_the_api_orders_them() -> None:
    """The API refuses a ttl='1h' mark after a ttl='5m' one (the simulator's rule ``cache_ttl_order``)."""
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    hour = {"type": "ephemeral", "ttl": "1h"}
    own = [{"role": "user", "content": [{"type": "text", "text": "b", "cache_control": hour}]}]
    out = whole_request({"messages": own}, {}, history, caching=True)
    assert out["messages"][1]["content"] == [{"type": "text", "text": "a", "cache_control": hour}]
    five = [{"role": "user", "content": [{"type": "text", "text": "b", "cache_control": EPH}]}]
    out = whole_request({"messages": five}, {}, history, caching=True)
    assert out["messages"][1]["content"] == [{"type": "text", "text": "a", "cache_control": EPH}]


def test_a_paused_turn_continued_is_one_assistant_message() -> None:
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "part 1"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "part 2"}]},
    ]
    assert joined(history) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "part 1"}, {"type": "text", "text": "part 2"}]},
    ]


def test_a_turn_keeps_its_messages_and_the_reply_without_cache_control() -> None:
    turn = ThreadTurn(
        None,
        {},
        [{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": EPH}]}],
    )
    reply = {"id": "msg_1", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"cache_control": 1}}]}
    assert turn_messages(turn, reply) == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        # a tool's input is free-form: left as it is
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"cache_control": 1}}]},
    ]


# ---------------------------------------------------------------- the reply of a stream


def sse(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(name, json.dumps(data)) for name, data in events]


STREAM = [
    (
        "message_start",
        {"type": "message_start", "message": {"id": "msg_s", "content": [], "usage": {"input_tokens": 3}}},
    ),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("ping", {"type": "ping"}),
    ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hel"}},
    ),
    ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "lo"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        },
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"a": '}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "[1]}"}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 3}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
    ("message_stop", {"type": "message_stop"}),
]


def test_a_streams_reply_is_assembled_as_the_json_reply_would_be() -> None:
    assembler = ReplyAssembler()
    for name, data in STREAM:
        assembler.feed(name, data)
    assert assembler.reply() == {
        "id": "msg_s",
        "stop_reason": "tool_use",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1]}},
            {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
        ],
    }


# ---------------------------------------------------------------- turns kept and continued


def reply_json(message_id: str, text: str, stop: str = "end_turn") -> bytes:
    return json.dumps(
        {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5-5",
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop,
            "usage": {"input_tokens": 5, "output_tokens": 2},
        }
    ).encode()


def turn(dialect: AnthropicMessages, org: int, extra: dict[str, Any], *, messages: list[Any] | None = None) -> Any:
    parsed = dialect.parse(body(**extra) | ({"messages": messages} if messages is not None else {}), {}, resolve)
    if parsed.prepare is not None:
        parsed.prepare(parsed, org)
    return parsed


def test_a_thread_is_kept_turn_by_turn_and_each_continue_is_the_whole_conversation(store: ThreadStore) -> None:
    dialect = AnthropicMessages(store, clock=Clock())
    first = turn(
        dialect, 1, {"thread": {"type": "create"}, "system": "sys", "tools": [{"name": "t", "input_schema": {}}]}
    )
    assert "thread" not in first.body and first.body["system"] == "sys"
    assert dialect.reply(first, reply_json("msg_a", "A"), IDS).record is None  # no hot path: written at once

    second = turn(
        dialect,
        1,
        {"thread": {"type": "continue", "previous_message_id": "msg_a"}},
        messages=[{"role": "user", "content": "two"}],
    )
    assert second.session == "msg_a"  # every turn of a thread routes with its first
    assert second.body["system"] == "sys" and second.body["tools"] == [{"name": "t", "input_schema": {}}]
    assert second.body["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "A", "cache_control": EPH}]},
        {"role": "user", "content": "two"},
    ]
    dialect.reply(second, reply_json("msg_b", "B"), IDS)

    third = turn(
        dialect,
        1,
        {"thread": {"type": "continue", "previous_message_id": "msg_b"}},
        messages=[{"role": "user", "content": "three"}],
    )
    assert [m["content"] for m in third.body["messages"]] == [
        "hi",
        [{"type": "text", "text": "A"}],
        "two",
        [{"type": "text", "text": "B", "cache_control": EPH}],
        "three",
    ]
    assert third.session == "msg_a"


def test_no_breakpoint_is_added_with_x_ezat_cache_off(store: ThreadStore) -> None:
    dialect = AnthropicMessages(store, clock=Clock())
    dialect.reply(turn(dialect, 1, {"thread": {"type": "create"}}), reply_json("msg_a", "A"), IDS)
    cont = {"thread": {"type": "continue", "previous_message_id": "msg_a"}}
    parsed = dialect.parse(body(**cont), {"x-ezat-cache": " OFF"}, resolve)
    assert parsed.prepare is not None
    parsed.prepare(parsed, 1)
    assert parsed.body["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "A"}]}
    assert breakpoints(parsed.body["messages"]) == 0


def test_a_thread_of_another_organisation_or_unknown_or_expired_is_thread_not_found(store: ThreadStore) -> None:
    clock = Clock()
    dialect = AnthropicMessages(store, clock=clock)
    dialect.reply(turn(dialect, 1, {"thread": {"type": "create"}}), reply_json("msg_a", "A"), IDS)
    for org, previous in ((2, "msg_a"), (1, "msg_unknown")):
        with pytest.raises(ThreadNotFoundError) as caught:
            turn(dialect, org, {"thread": {"type": "continue", "previous_message_id": previous}})
        status, envelope, _ = render_anthropic(caught.value, "r")
        assert status == 404
        assert envelope["error"]["type"] == "not_found_error"
        assert envelope["error"]["details"] == {"error_code": "thread_not_found"}
        assert previous in envelope["error"]["message"]
    clock.now += 3601
    with pytest.raises(ThreadNotFoundError):
        turn(dialect, 1, {"thread": {"type": "continue", "previous_message_id": "msg_a"}})


def test_a_chain_whose_first_turn_expired_is_not_found(store: ThreadStore) -> None:
    clock = Clock()
    dialect = AnthropicMessages(store, clock=clock)
    dialect.reply(turn(dialect, 1, {"thread": {"type": "create"}}), reply_json("msg_a", "A"), IDS)
    clock.now += 3000
    second = turn(dialect, 1, {"thread": {"type": "continue", "previous_message_id": "msg_a"}})
    dialect.reply(second, reply_json("msg_b", "B"), IDS)
    clock.now += 1000  # msg_a is past its hour, msg_b is not
    with pytest.raises(ThreadNotFoundError):
        turn(dialect, 1, {"thread": {"type": "continue", "previous_message_id": "msg_b"}})


def test_a_refused_reply_is_not_kept(store: ThreadStore) -> None:
    dialect = AnthropicMessages(store, clock=Clock())
    dialect.reply(turn(dialect, 1, {"thread": {"type": "create"}}), reply_json("msg_r", "", stop="refusal"), IDS)
    with pytest.raises(ThreadNotFoundError):
        turn(dialect, 1, {"thread": {"type": "continue", "previous_message_id": "msg_r"}})


def test_a_streamed_turn_is_kept_once_its_stream_ended_whole(store: ThreadStore) -> None:
    dialect = AnthropicMessages(store, clock=Clock())
    parsed = turn(dialect, 1, {"thread": {"type": "create"}, "stream": True})
    cut = dialect.translator(parsed, IDS)
    for name, data in sse(STREAM[:-1]):
        cut.feed(name, data)
    assert cut.record() is None  # no message_stop: the reply is not whole
    meter = dialect.translator(parsed, IDS)
    for name, data in sse(STREAM):
        meter.feed(name, data)
    assert meter.record() is None  # written at once (no hot path)
    stored = store.get(1, "msg_s", NOW)
    assert stored is not None
    assert stored.messages[-1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1]}},
            {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
        ],
    }
