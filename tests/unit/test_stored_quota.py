"""Storage quotas per organisation and stored conversations, without a database (store/quota.py,
the dialects' prepare): the quota's settings and its refusals in each dialect's envelope, made
before anything is read; a response stores its own input and the link to the one it continued;
a conversation that can't be read back is refused naming previous_response_id; ``input_items``
validates, then lists the store's page."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from ezat_compat.dialects import Parsed
from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.dialects.openai_responses import OpenAIResponses, ResponsesServices
from ezat_compat.domain import Deployment, Model, Price, ResponsesSettings
from ezat_compat.errors import (
    InvalidRequestError,
    NotFoundError,
    ThreadUnsupportedError,
    render_anthropic,
    render_openai,
)
from ezat_compat.sealing import Sealer
from ezat_compat.store.quota import (
    DEFAULT_QUOTA_COUNT,
    DEFAULT_QUOTA_MB,
    MIB,
    QuotaRefusal,
    StorageQuota,
    StorageQuotaError,
    ThreadQuotaError,
    quota_of,
    refusal,
)
from ezat_compat.store.responses import BrokenChainError, InputPage, LongChainError, StoredResponse
from ezat_compat.store.threads import LongThreadError, StoredThread
from ezat_compat.translate.item_references import item_key

MODEL = Model(
    id="anthropic/m",
    aliases=("m",),
    price=Price(input=Decimal("3"), output=Decimal("15"), cache_write=Decimal("3.75"), cache_read=Decimal("0.3")),
    deployments=(Deployment(name="a", base_url="http://upstream.invalid", upstream_model="m"),),
)
RESPONSE_ID = "resp_0b7e8b8e-6d5c-4c2e-9a51-0c1f2a3b4c5d"
OVER = QuotaRefusal("[responses] org_quota_mb", "1 MB", "1.0 MB")


def resolve(name: str) -> Model:
    return MODEL


# ---------------------------------------------------------------- the quota and its refusals


def test_the_quota_has_documented_defaults_until_the_settings_name_it() -> None:
    assert quota_of(ResponsesSettings()) == StorageQuota(int(DEFAULT_QUOTA_MB * MIB), DEFAULT_QUOTA_COUNT)
    assert quota_of(SimpleNamespace(org_quota_mb=2.5, org_quota_count=7)) == StorageQuota(int(2.5 * MIB), 7)
    assert not quota_of(SimpleNamespace(org_quota_mb=0, org_quota_count=0)).limited


@pytest.mark.parametrize(
    ("quota", "used", "setting"),
    [
        pytest.param(StorageQuota(10 * MIB, 5), (10 * MIB - 1, 4), None, id="under-both"),
        pytest.param(StorageQuota(10 * MIB, 5), (10 * MIB, 0), "[responses] org_quota_mb", id="bytes-reached"),
        pytest.param(StorageQuota(10 * MIB, 5), (0, 5), "[responses] org_quota_count", id="count-reached"),
        pytest.param(StorageQuota(0, 5), (10**12, 4), None, id="no-byte-limit"),
        pytest.param(StorageQuota(10 * MIB, 0), (0, 10**9), None, id="no-count-limit"),
    ],
)
def test_a_refusal_names_the_limit_reached(quota: StorageQuota, used: tuple[int, int], setting: str | None) -> None:
    found = refusal(quota, *used)
    assert (found.setting if found else None) == setting


def test_the_responses_refusal_is_a_400_naming_store_and_the_setting() -> None:
    over = refusal(StorageQuota(1024 * MIB, 0), 1024 * MIB + 1, 3)
    assert over is not None
    status, body, _ = render_openai(StorageQuotaError(over))
    assert status == 400
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "storage_quota_exceeded"
    assert error["param"] == "store"
    assert "[responses] org_quota_mb" in error["message"] and "1024 MB" in error["message"]
    assert '"store": false' in error["message"]


def test_the_thread_refusal_lets_the_sdks_go_on_without_threads() -> None:
    over = refusal(StorageQuota(0, 10), 0, 10)
    assert over is not None
    status, body, _ = render_anthropic(ThreadQuotaError(over))
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["details"] == {"error_code": "thread_unsupported_request"}
    assert "[responses] org_quota_count" in body["error"]["message"] and "10 stored objects" in body["error"]["message"]


# ---------------------------------------------------------------- the Responses dialect, with a fake store


class FakeStore:
    """What the dialect asks of a ``ResponseStore``, recorded."""

    def __init__(self, *, over: QuotaRefusal | None = None, stored: Any = None) -> None:
        self.over = over
        self.stored = stored
        self.calls: list[str] = []
        self.puts: list[dict[str, Any]] = []
        self.page: InputPage | None = None

    def over_quota(self, org_id: int, now: float | None = None) -> QuotaRefusal | None:
        self.calls.append("over_quota")
        return self.over

    def get(self, org_id: int, response_id: str, now: float, *, context: bool = True) -> StoredResponse | None:
        self.calls.append("get")
        if isinstance(self.stored, Exception):
            raise self.stored
        return self.stored

    def put(
        self, org_id: int, response: dict[str, Any], context: list[Any], input_start: int, *a: Any, **kw: Any
    ) -> None:
        self.puts.append({"context": context, "input_start": input_start, **kw})

    def input_page(self, org_id: int, response_id: str, now: float, **kw: Any) -> InputPage | None:
        self.calls.append(f"input_page {sorted(kw.items())}")
        return self.page


def responses_dialect(store: FakeStore) -> OpenAIResponses:
    services = ResponsesServices(
        ResponsesSettings(),
        store,  # type: ignore[arg-type]
        Sealer(bytes(range(32))),
        lambda: 1000.0,
        store.over_quota,
    )
    return OpenAIResponses(services)


def prepared(dialect: OpenAIResponses, body: dict[str, Any]) -> Parsed:
    parsed = dialect.parse({"model": "m", **body}, {}, resolve)
    assert parsed.prepare is not None
    parsed.prepare(parsed, 7)
    return parsed


def test_a_response_to_store_is_refused_at_the_quota_before_its_conversation_is_read() -> None:
    store = FakeStore(over=OVER, stored=StoredResponse({"output": []}, [], 0, False))
    with pytest.raises(StorageQuotaError) as refused:
        prepared(responses_dialect(store), {"input": "hi", "previous_response_id": "resp_x"})
    assert refused.value.param == "store" and store.calls == ["over_quota"]


def test_a_response_not_stored_is_served_at_the_quota() -> None:
    store = FakeStore(over=OVER, stored=StoredResponse({"output": []}, [{"role": "user", "content": "a"}], 0, False))
    parsed = prepared(responses_dialect(store), {"input": "hi", "previous_response_id": "resp_x", "store": False})
    assert store.calls == ["get"]  # no quota read: nothing will be stored
    assert [m["role"] for m in parsed.body["messages"]] == ["user"]


def test_a_continue_stores_its_own_input_and_the_link_not_the_conversation() -> None:
    earlier = [{"role": "user", "content": "one"}]
    output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]}]
    store = FakeStore(stored=StoredResponse({"output": output}, earlier, 0, False))
    dialect = responses_dialect(store)
    parsed = prepared(dialect, {"input": "two", "previous_response_id": "resp_x"})
    assert len(parsed.body["messages"]) == 3  # the whole conversation goes upstream
    dialect.services.record(parsed.context, {"id": "resp_new", "output": []})
    (put,) = store.puts
    assert put["context"] == [{"type": "message", "role": "user", "content": "two"}]
    assert put["input_start"] == 0 and put["previous_id"] == "resp_x"


@pytest.mark.parametrize(
    ("failure", "status", "param", "words"),
    [
        pytest.param(BrokenChainError("resp_x"), 404, "previous_response_id", "deleted or has expired", id="broken"),
        pytest.param(LongChainError(64 * MIB), 400, "previous_response_id", "over 64 MB", id="too-long"),
    ],
)
def test_a_conversation_that_cant_be_read_back_is_refused_naming_previous_response_id(
    failure: Exception, status: int, param: str, words: str
) -> None:
    store = FakeStore(stored=failure)
    with pytest.raises(InvalidRequestError) as refused:
        prepared(responses_dialect(store), {"input": "hi", "previous_response_id": "resp_x"})
    assert refused.value.status == status and refused.value.param == param and words in refused.value.message


def test_input_items_validates_then_lists_the_stores_page() -> None:
    store = FakeStore()
    dialect = responses_dialect(store)
    for args, param in (({"order": "up"}, "order"), ({"limit": "x"}, "limit"), ({"limit": "101"}, "limit")):
        with pytest.raises(InvalidRequestError) as bad:
            dialect.input_items(1, RESPONSE_ID, args)
        assert bad.value.param == param
    assert store.calls == []  # refused before any read
    with pytest.raises(NotFoundError):
        dialect.input_items(1, RESPONSE_ID, {})
    store.page = InputPage([(3, {"role": "user", "content": "x"}), (2, {"id": "own", "type": "message"})], True)
    listed = dialect.input_items(1, RESPONSE_ID, {"limit": "2", "after": "z"})
    generated = f"in_{item_key(RESPONSE_ID)}003"
    assert [i["id"] for i in listed["data"]] == [generated, "own"]
    assert listed["data"][0]["content"] == [{"type": "input_text", "text": "x"}]
    assert (listed["first_id"], listed["last_id"], listed["has_more"]) == (generated, "own", True)
    assert store.calls[-1] == "input_page [('after', 'z'), ('before', None), ('descending', True), ('limit', 2)]"


# ---------------------------------------------------------------- threads, with a fake store


class FakeThreads:
    def __init__(self, *, over: QuotaRefusal | None = None, stored: Any = None) -> None:
        self.over = over
        self.stored = stored
        self.calls: list[str] = []

    def over_quota(self, org_id: int, now: float | None = None) -> QuotaRefusal | None:
        self.calls.append("over_quota")
        return self.over

    def get(self, org_id: int, message_id: str, now: float) -> StoredThread | None:
        self.calls.append("get")
        if isinstance(self.stored, Exception):
            raise self.stored
        return self.stored


def thread_turn(threads: FakeThreads, thread: dict[str, Any]) -> Parsed:
    dialect = AnthropicMessages(threads)  # type: ignore[arg-type]
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "thread": thread}
    parsed = dialect.parse(body, {}, resolve)
    assert parsed.prepare is not None
    parsed.prepare(parsed, 7)
    return parsed


@pytest.mark.parametrize(
    "thread", [{"type": "create"}, {"type": "continue", "previous_message_id": "msg_1"}], ids=["create", "continue"]
)
def test_a_threads_turn_is_refused_at_the_quota_before_its_history_is_read(thread: dict[str, Any]) -> None:
    threads = FakeThreads(over=OVER, stored=StoredThread("msg_0", {}, []))
    with pytest.raises(ThreadQuotaError) as refused:
        thread_turn(threads, thread)
    assert refused.value.param == "thread" and threads.calls == ["over_quota"]


def test_a_thread_too_long_to_read_back_goes_on_without_threads() -> None:
    threads = FakeThreads(stored=LongThreadError(64 * MIB))
    with pytest.raises(ThreadUnsupportedError) as refused:
        thread_turn(threads, {"type": "continue", "previous_message_id": "msg_1"})
    assert refused.value.param == "thread.previous_message_id" and "over 64 MB" in refused.value.message
