"""A stored response's input items as ``GET /openai/v1/responses/{id}/input_items`` lists them
(docs/responses.md, "Stored responses"; the API reference's "List input items").

An item keeps its own ``id`` when it has one; one without gets ``in_<response key><n>`` (its
place among the response's own input, three digits at least), so a page's ``first_id`` /
``last_id`` can be sent back as ``after`` / ``before``. The list shows message content as parts:
a string becomes one ``input_text`` part (``output_text`` for the assistant's).

The id rule is written once here: the store keeps each item's listed id when it stores the
response (its index of ids, so ``after`` is found without reading the items), and the list
shows the same id for the same item.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ezat_compat.translate.item_references import item_key

INPUT_ID_PREFIX = "in_"


def input_item_id(item: Mapping[str, Any], key: str, n: int) -> Any:
    """The id the list shows for input item ``n`` of the response whose ``item_key`` is ``key``:
    its own, or one made from the response's."""
    own = item.get("id")
    return own if own is not None else f"{INPUT_ID_PREFIX}{key}{n:03d}"


def listed_input_item(item: Mapping[str, Any], response_id: str, n: int) -> dict[str, Any]:
    """Input item ``n`` of ``response_id`` as the list shows it: with an id, ``type`` given, and
    message content as parts."""
    out = dict(item)
    out.setdefault("type", "message")
    out["id"] = input_item_id(item, item_key(response_id), n)
    if out["type"] == "message" and isinstance(out.get("content"), str):
        kind = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": kind, "text": out["content"]}]
    return out
