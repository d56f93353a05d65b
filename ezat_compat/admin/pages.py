"""The admin API's list envelopes and query helpers, as the ``anthropic`` SDK pages them
(``anthropic/pagination.py``):

- ``sync_page``: ``SyncPage`` (workspaces, api_keys, users): ``after_id``/``before_id``/``limit``
  in, ``{"data", "has_more", "first_id", "last_id"}`` out. The SDK asks for the next page with
  ``after_id=<last_id>`` (or ``before_id=<first_id>`` when it started with ``before_id``) and
  stops when ``has_more`` is false.
- ``cursor_page``: ``SyncPageCursor`` (rate limits, spend limits…): ``page``/``limit`` in,
  ``{"data", "has_more", "next_page"}`` out; ``next_page`` is an opaque token, null on the last page.

``parse_time`` takes RFC 3339 times with ``Z`` or an offset (the SDK sends a ``datetime`` as
``2026-01-01T00:00:00+00:00`` and a string as given); ``parse_list`` a list sent as ``name[]=a&
name[]=b`` (the SDK's brackets) or ``name=a&name=b``; ``rfc3339`` writes times as the Admin API
does (``2025-01-31T12:00:00Z``).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from ezat_compat.admin.errors import AdminInvalidRequestError

T = TypeVar("T")
DEFAULT_LIMIT = 20
MAX_LIMIT = 1000


def rfc3339(moment: datetime | None) -> str | None:
    """An aware time as RFC 3339 in UTC with ``Z`` (microseconds only when there are some)."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_time(text: str, name: str = "time") -> datetime:
    """An RFC 3339 time with ``Z`` or an offset (``+00:00``), as an aware UTC datetime; 400
    naming ``name`` for anything else (a time without an offset included: it would be a guess)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise AdminInvalidRequestError(
            f"{name}: {text!r} is not an RFC 3339 time; write it like 2026-01-31T12:00:00Z"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise AdminInvalidRequestError(f"{name}: {text!r} has no time zone; end it with Z or an offset like +00:00")
    return moment.astimezone(UTC)


def parse_list(args: Any, name: str) -> list[str]:
    """The values of list parameter ``name`` in a query (a werkzeug ``MultiDict``, or any
    mapping): ``name[]`` repeated (the SDK's form) and ``name`` repeated, in that order."""
    getlist = getattr(args, "getlist", None)
    if getlist is not None:
        return [*getlist(name + "[]"), *getlist(name)]
    values: list[str] = []
    for key in (name + "[]", name):
        value = args.get(key) if isinstance(args, Mapping) else None
        if isinstance(value, str):
            values.append(value)
        elif isinstance(value, list | tuple):
            values.extend(str(v) for v in value)
    return values


def parse_limit(value: Any, *, default: int = DEFAULT_LIMIT, most: int = MAX_LIMIT, name: str = "limit") -> int:
    """A page size between 1 and ``most`` (``default`` when not given); 400 otherwise (never clamped)."""
    if value is None or value == "":
        return default
    try:
        limit = int(value)
    except (TypeError, ValueError):
        raise AdminInvalidRequestError(f"{name}: {value!r} is not a whole number") from None
    if not 1 <= limit <= most:
        raise AdminInvalidRequestError(f"{name}: must be between 1 and {most}, got {limit}")
    return limit


def sync_page(
    rows: Sequence[T],
    *,
    limit: int,
    after_id: str | None,
    before_id: str | None,
    id_of: Callable[[T], str],
) -> dict[str, Any]:
    """One ``SyncPage`` of ``rows`` (the whole list, in its order): the ``limit`` rows after
    ``after_id``, or the ``limit`` rows just before ``before_id``, or the first ``limit``.
    ``has_more`` says whether more rows lie in the direction of travel. A cursor id that isn't in
    ``rows`` (or both cursors) is a 400. ``data`` holds the rows as given: map them after."""
    if after_id is not None and before_id is not None:
        raise AdminInvalidRequestError("after_id and before_id: send one of them, not both")
    ids = [id_of(row) for row in rows]
    if before_id is not None:
        end = _position(ids, before_id, "before_id")
        start = max(0, end - limit)
        data, has_more = list(rows[start:end]), start > 0
    else:
        start = 0 if after_id is None else _position(ids, after_id, "after_id") + 1
        data, has_more = list(rows[start : start + limit]), start + limit < len(rows)
    return {
        "data": data,
        "has_more": has_more,
        "first_id": id_of(data[0]) if data else None,
        "last_id": id_of(data[-1]) if data else None,
    }


def _position(ids: list[str], wanted: str, name: str) -> int:
    try:
        return ids.index(wanted)
    except ValueError:
        raise AdminInvalidRequestError(f"{name}: {wanted!r} is not in this list") from None


def encode_cursor(key: Any) -> str:
    """An opaque ``next_page`` token for a sort key (JSON-ready)."""
    raw = json.dumps(key, separators=(",", ":")).encode()
    return "page_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(token: str, name: str = "page") -> Any:
    """The sort key a ``next_page`` token holds; 400 for a token this gateway didn't make."""
    if not token.startswith("page_"):
        raise AdminInvalidRequestError(f"{name}: {token!r} is not a page token of this list")
    body = token[len("page_") :]
    try:
        return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, binascii.Error):
        raise AdminInvalidRequestError(f"{name}: {token!r} is not a page token of this list") from None


def cursor_page(
    rows: Sequence[T], *, limit: int | None, page: str | None, key_of: Callable[[T], Any]
) -> dict[str, Any]:
    """One cursor page of ``rows`` (sorted by ``key_of``, ascending; keys JSON-ready and
    comparable): the rows after the token ``page`` (None: from the start), at most ``limit``
    (None: all of them, ``next_page`` null). ``next_page`` is the token of the page after."""
    start = 0
    if page:
        after = decode_cursor(page)
        if isinstance(after, list):
            after = tuple(after)
        start = len(rows)
        for index, row in enumerate(rows):
            key = key_of(row)
            if (tuple(key) if isinstance(key, list) else key) > after:
                start = index
                break
    end = len(rows) if limit is None else start + limit
    data = list(rows[start:end])
    has_more = end < len(rows)
    return {
        "data": data,
        "has_more": has_more,
        "next_page": encode_cursor(key_of(data[-1])) if has_more and data else None,
    }
