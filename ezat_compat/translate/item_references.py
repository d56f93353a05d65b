"""Item references of the Responses API (docs/responses.md, "Item references").

A client that lets responses be stored (the AI SDK's ``openai(model)`` with its defaults) sends
an earlier output item back as ``{"type": "item_reference", "id": "msg_…"}``; the item is the
stored one, as if the client had sent it (a reasoning item with its sealed thinking).

Output item ids carry the response they belong to: a response ``resp_<uuid>`` (the request's
id, ``api/common.new_request_id``) names its items ``<kind>_<uuid without dashes><n>``
(``translate/responses_response.ItemIds``), so a reference is looked up by its response's key
with no index of items: ``item_key`` and ``response_id_of_item`` are the two directions of that
one rule. An id of another form belongs to no stored response and is not found.

Pure: the caller finds the stored outputs (one statement for all the responses referenced) and
passes them to ``resolve_references``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ezat_compat.errors import NotFoundError

RESPONSE_PREFIX = "resp_"
_ITEM_ID = re.compile(r"[a-z]+_([0-9a-f]{32})[0-9]{3,}")
STORE_FALSE_HINT = (
    " Items are not persisted when `store` is set to false. Try again with `store` set to true,"
    " or remove this item from your input."
)

Items = Sequence[tuple[dict[str, Any], str]]  # (item, its client path)


def item_key(response_id: str) -> str:
    """What the ids of ``response_id``'s items are made of: the request id without dashes."""
    return response_id.removeprefix(RESPONSE_PREFIX).replace("-", "")


def response_id_of_item(item_id: str) -> str | None:
    """The response whose output ``item_id`` is (``resp_`` + the dashed UUID), or None for an
    id no response of ours gave."""
    found = _ITEM_ID.fullmatch(item_id)
    if found is None:
        return None
    h = found.group(1)
    return f"{RESPONSE_PREFIX}{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def item_not_found(item_id: str, path: str, store: bool) -> NotFoundError:
    """OpenAI's answer for an item it doesn't hold (for this organisation), with its hint when
    the request itself asks not to be stored."""
    return NotFoundError(f"Item with id '{item_id}' not found." + ("" if store else STORE_FALSE_HINT), param=path)


def is_reference(item: Mapping[str, Any]) -> bool:
    """``{"type": "item_reference", "id": …}``, or ``{"id": …}`` alone: the reference's
    ``type`` may be left out (the API reference: "item_reference" or null)."""
    kind = item.get("type")
    return kind == "item_reference" or (kind is None and "role" not in item and "id" in item)


def references(items: Items) -> list[tuple[str, str]]:
    """The (id, path) of each item reference in ``items``, in order."""
    return [(str(item.get("id")), path) for item, path in items if is_reference(item)]


def referenced_responses(refs: Sequence[tuple[str, str]], store: bool) -> list[str]:
    """The stored responses to read for ``refs``, each once; an id that names none is not
    found at once (no lookup)."""
    out: dict[str, None] = {}
    for item_id, path in refs:
        response_id = response_id_of_item(item_id)
        if response_id is None:
            raise item_not_found(item_id, f"{path}.id", store)
        out[response_id] = None
    return list(out)


def resolve_references(
    items: Items, outputs: Mapping[str, Sequence[Any]], store: bool
) -> list[tuple[dict[str, Any], str]]:
    """``items`` with each ``item_reference`` replaced by the output item it names, found in
    ``outputs`` (response id -> its stored output items: the organisation's live responses
    only); 404 naming ``input[N].id`` for one not found there."""
    out: list[tuple[dict[str, Any], str]] = []
    for item, path in items:
        if not is_reference(item):
            out.append((item, path))
            continue
        item_id = str(item.get("id"))
        stored = outputs.get(response_id_of_item(item_id) or "", ())
        found = next((o for o in stored if isinstance(o, dict) and o.get("id") == item_id), None)
        if found is None:
            raise item_not_found(item_id, f"{path}.id", store)
        out.append((found, path))
    return out
