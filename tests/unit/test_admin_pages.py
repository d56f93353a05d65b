"""The admin API's list envelopes and query helpers (admin/pages.py), its error envelope
(admin/errors.py), its money (admin/money.py) and who may call it (admin/auth.py), without a
database: the pages as the ``anthropic`` SDK walks them (``anthropic/pagination.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import MethodNotAllowed, NotFound, UnprocessableEntity

from ezat_compat.admin.auth import check_admin_key, presented_key
from ezat_compat.admin.errors import (
    AdminAuthenticationError,
    AdminConflictError,
    AdminInvalidRequestError,
    AdminMethodNotAllowedError,
    AdminNotFoundError,
    AdminPermissionError,
    from_http_exception,
    is_admin_path,
    render_admin_error,
)
from ezat_compat.admin.money import cents_to_micros, micros_to_cents
from ezat_compat.admin.pages import (
    cursor_page,
    decode_cursor,
    encode_cursor,
    parse_limit,
    parse_list,
    parse_time,
    rfc3339,
    sync_page,
)
from ezat_compat.admin.service import scrub
from ezat_compat.store.admin import AdminKeyInfo

ROWS = [f"id{n}" for n in range(7)]


def _ids(page: dict[str, Any]) -> list[str]:
    return list(page["data"])


# ---------------------------------------------------------------- SyncPage


def _walk(limit: int, **start: str) -> list[list[str]]:
    """Every page the SDK would fetch: after_id=<last_id> forward, before_id=<first_id> backward."""
    pages, cursor = [], dict(start)
    backward = "before_id" in start
    while True:
        page = sync_page(
            ROWS, limit=limit, after_id=cursor.get("after_id"), before_id=cursor.get("before_id"), id_of=str
        )
        pages.append(_ids(page))
        if not page["has_more"] or not page["data"]:
            return pages
        cursor = {"before_id": page["first_id"]} if backward else {"after_id": page["last_id"]}


def test_a_sync_page_walked_forward_gives_every_row_once_in_order() -> None:
    assert _walk(3) == [["id0", "id1", "id2"], ["id3", "id4", "id5"], ["id6"]]


def test_a_sync_page_walked_backward_from_before_id() -> None:
    assert _walk(2, before_id="id5") == [["id3", "id4"], ["id1", "id2"], ["id0"]]


def test_a_sync_page_names_its_first_and_last_ids_and_says_when_it_is_the_last() -> None:
    page = sync_page(ROWS, limit=7, after_id=None, before_id=None, id_of=str)
    assert (page["first_id"], page["last_id"], page["has_more"]) == ("id0", "id6", False)
    empty = sync_page(ROWS, limit=5, after_id="id6", before_id=None, id_of=str)
    assert empty == {"data": [], "has_more": False, "first_id": None, "last_id": None}


@pytest.mark.parametrize(
    "cursor",
    [{"after_id": "nope"}, {"before_id": "nope"}, {"after_id": "id1", "before_id": "id3"}],
    ids=["unknown-after", "unknown-before", "both"],
)
def test_a_sync_page_refuses_a_cursor_it_cannot_place(cursor: dict[str, str]) -> None:
    with pytest.raises(AdminInvalidRequestError):
        sync_page(ROWS, limit=2, after_id=cursor.get("after_id"), before_id=cursor.get("before_id"), id_of=str)


# ---------------------------------------------------------------- cursor pages


def test_a_cursor_page_walked_by_next_page_gives_every_row_once() -> None:
    rows = [(3, "c"), (1, "a"), (2, "b")]
    rows.sort()
    seen, token = [], None
    while True:
        page = cursor_page(rows, limit=2, page=token, key_of=lambda r: list(r))
        seen += page["data"]
        token = page["next_page"]
        if token is None:
            break
        assert page["has_more"] is True
    assert seen == rows


def test_a_cursor_page_without_a_limit_is_every_row_and_no_next_page() -> None:
    page = cursor_page(ROWS, limit=None, page=None, key_of=str)
    assert page == {"data": ROWS, "has_more": False, "next_page": None}


def test_a_page_token_is_opaque_and_a_foreign_one_is_refused() -> None:
    token = encode_cursor([5, "x"])
    assert token.startswith("page_") and "x" not in token
    assert decode_cursor(token) == [5, "x"]
    for bad in ("5", "page_!!!", "page_bm90IGpzb24"):
        with pytest.raises(AdminInvalidRequestError):
            decode_cursor(bad)


# ---------------------------------------------------------------- query values


@pytest.mark.parametrize(
    "text", ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00z"]
)
def test_times_take_z_and_offsets(text: str) -> None:
    assert parse_time(text) == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("text", ["2026-01-01T00:00:00", "yesterday", ""])
def test_a_time_without_a_zone_or_not_a_time_is_refused(text: str) -> None:
    with pytest.raises(AdminInvalidRequestError, match="since"):
        parse_time(text, "since")


def test_times_are_written_in_utc_with_a_z() -> None:
    assert rfc3339(datetime(2026, 1, 1, 1, tzinfo=UTC) + timedelta(microseconds=5)) == "2026-01-01T01:00:00.000005Z"
    assert rfc3339(None) is None


def test_lists_come_with_brackets_or_repeated() -> None:
    args = MultiDict([("ids[]", "a"), ("ids[]", "b"), ("ids", "c"), ("other", "x")])
    assert parse_list(args, "ids") == ["a", "b", "c"]
    assert parse_list({"ids[]": ["a"], "ids": "b"}, "ids") == ["a", "b"]


@pytest.mark.parametrize(("value", "expected"), [(None, 20), ("", 20), ("1", 1), ("1000", 1000)])
def test_a_limit_defaults_and_is_kept(value: Any, expected: int) -> None:
    assert parse_limit(value) == expected


@pytest.mark.parametrize("value", ["0", "1001", "x", "-1"])
def test_a_limit_out_of_range_is_refused_not_clamped(value: str) -> None:
    with pytest.raises(AdminInvalidRequestError, match="limit"):
        parse_limit(value)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (AdminInvalidRequestError("x"), 400, "invalid_request_error"),
        (AdminAuthenticationError("x"), 401, "authentication_error"),
        (AdminPermissionError("x"), 403, "permission_error"),
        (AdminNotFoundError("x"), 404, "not_found_error"),
        (AdminMethodNotAllowedError("x"), 405, "invalid_request_error"),
        (AdminConflictError("x"), 409, "conflict_error"),
    ],
)
def test_admin_errors_are_anthropics_envelope_and_never_retried(error: Any, status: int, kind: str) -> None:
    got, body, headers = render_admin_error(error, "req_1")
    assert got == status
    assert body == {"type": "error", "error": {"type": kind, "message": "x"}, "request_id": "req_1"}
    assert headers["x-should-retry"] == "false"


def test_routing_and_parser_errors_become_admin_errors() -> None:
    assert isinstance(from_http_exception(NotFound(), "GET", "/v1/organizations/x"), AdminNotFoundError)
    allowed = from_http_exception(MethodNotAllowed(["GET", "POST", "HEAD"]), "PUT", "/v1/organizations/workspaces")
    assert isinstance(allowed, AdminMethodNotAllowedError) and allowed.message.endswith("use GET, POST.")
    unprocessable = UnprocessableEntity()
    unprocessable.data = {
        "messages": {"json": {"name": ["Missing data for required field."], "limits": {0: {"type": ["x"]}}}}
    }  # type: ignore[attr-defined]
    err = from_http_exception(unprocessable, "POST", "/v1/organizations/workspaces")
    assert isinstance(err, AdminInvalidRequestError) and err.status == 400
    assert err.message == "name: Missing data for required field.; limits[0].type: x"


@pytest.mark.parametrize(
    ("path", "admin"),
    [
        ("/v1/organizations", True),
        ("/v1/organizations/me", True),
        ("/v1/organizationsx", False),
        ("/v1/messages", False),
    ],
)
def test_the_admin_paths(path: str, admin: bool) -> None:
    assert is_admin_path(path) is admin


# ---------------------------------------------------------------- money


@pytest.mark.parametrize(
    ("micros", "cents"),
    [(0, "0"), (10_000, "1"), (1_234_500, "123.45"), (1, "0.0001"), (5_000_000_000, "500000"), (-15_000, "-1.5")],
)
def test_cents_both_ways(micros: int, cents: str) -> None:
    assert micros_to_cents(micros) == cents
    if micros >= 0:
        assert cents_to_micros(cents) == micros


@pytest.mark.parametrize("bad", ["-1", "1.00001", "1e3", "", "abc", 5, None, "9" * 19])
def test_cents_refuse_what_is_not_a_plain_amount(bad: Any) -> None:
    with pytest.raises(ValueError, match="amount"):
        cents_to_micros(bad)


# ---------------------------------------------------------------- who calls


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"x-api-key": "ezat_admin_a"}, "ezat_admin_a"),
        ({"authorization": "Bearer ezat_admin_b"}, "ezat_admin_b"),
        ({"authorization": "bearer  ezat_admin_c "}, "ezat_admin_c"),
        ({"x-api-key": "ezat_admin_a", "authorization": "Bearer other"}, "ezat_admin_a"),
        ({"authorization": "Basic abc"}, ""),
        ({}, ""),
    ],
)
def test_the_key_comes_in_x_api_key_or_as_a_bearer(headers: dict[str, str], key: str) -> None:
    assert presented_key(headers) == key


class _Keys:
    def __init__(self, key: AdminKeyInfo | None) -> None:
        self.key, self.asked = key, 0

    def find_key(self, secret: str) -> AdminKeyInfo | None:
        self.asked += 1
        return self.key


NOW = datetime(2026, 3, 1, tzinfo=UTC)


def _admin(**changes: Any) -> AdminKeyInfo:
    values: dict[str, Any] = {
        "id": "adminkey_1",
        "name": "",
        "prefix": "ezat_admin_abcd",
        "read_only": False,
        "created_at": NOW,
        "created_by": "cli:root",
        "expires_at": None,
        "revoked_at": None,
        "last_used_at": None,
    }
    return AdminKeyInfo(**{**values, **changes})


@pytest.mark.parametrize(
    ("secret", "key", "error", "words"),
    [
        ("", _admin(), AdminAuthenticationError, "admin key is required"),
        ("ezat_sk_0123456789", _admin(), AdminPermissionError, "inference API key"),
        ("ezat_admin_unknown", None, AdminAuthenticationError, "Invalid admin key"),
        ("something-else", _admin(), AdminAuthenticationError, "Invalid admin key"),
        ("ezat_admin_x", _admin(revoked_at=NOW), AdminAuthenticationError, "revoked"),
        ("ezat_admin_x", _admin(expires_at=NOW), AdminAuthenticationError, "expired"),
    ],
    ids=["none", "inference-key", "unknown", "not-an-admin-key", "revoked", "expired"],
)
def test_who_may_not_call_the_admin_api(secret: str, key: AdminKeyInfo | None, error: type, words: str) -> None:
    keys = _Keys(key)
    with pytest.raises(error, match=words):
        check_admin_key(keys, secret, NOW)  # type: ignore[arg-type]
    if secret.startswith("ezat_sk_"):
        assert keys.asked == 0  # an inference key is never looked up as an admin key


def test_a_valid_admin_key_is_let_in() -> None:
    key = _admin(expires_at=NOW + timedelta(seconds=1))
    assert check_admin_key(_Keys(key), "ezat_admin_x", NOW) is key  # type: ignore[arg-type]


# ---------------------------------------------------------------- secrets never in the trail


def test_scrub_drops_secret_fields_and_whole_keys_wherever_they_are() -> None:
    secret = "ezat_sk_" + "A" * 32
    admin = "ezat_admin_" + "B" * 32
    value = {
        "name": "ci",
        "secret": secret,
        "nested": [{"api_key": "x", "note": admin}, {"prefix": secret[:12]}],
        "Authorization": "Bearer x",
    }
    cleaned = scrub(value)
    assert cleaned == {"name": "ci", "nested": [{"note": "[redacted]"}, {"prefix": secret[:12]}]}
    assert secret not in repr(cleaned) and admin not in repr(cleaned)
