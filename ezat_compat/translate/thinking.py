"""Thinking kept across tool loops (Chat Completions reference, "Reasoning": the thinking text
isn't returned to the client).

When thinking is requested, Anthropic's reply carries ``thinking`` blocks (with a
``signature``) or ``redacted_thinking`` blocks (with ``data``) before its ``tool_use`` blocks.
An OpenAI client never sees them, so its next request carries an assistant turn that starts
with the tool calls, and Anthropic refuses it while thinking is on: the final assistant message
must start with a thinking block, and the blocks must come back complete, unmodified and in
their original order (Anthropic's extended-thinking guide, "Preserving thinking blocks").

The pipeline keeps the blocks server-side, keyed by the tool call ids the client sees, and puts
them back. This module is the pure part of that:

- ``thinking_of_reply(content)``: a non-streaming reply -> (client tool ids, blocks) or None.
- ``ThinkingCollector``: the same from a stream's events, fed one at a time.
- ``assistant_tool_ids(body)``: the client ids of each assistant turn with tool calls in a
  translated request, to look them up in one call.
- ``restore_thinking(body, found)``: put the found blocks back at the start of those turns.
- ``without_thinking(body, req, model)``: the request as it is sent when thinking can't be
  kept (Anthropic's own advice: "To avoid this requirement, disable thinking").
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from ezat_compat.domain import Model
from ezat_compat.translate.ids import decode_tool_id
from ezat_compat.translate.request import _sampling

THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})

KeptThinking = tuple[list[str], list[dict[str, Any]]]  # (client tool ids, blocks as received)


# ---------------------------------------------------------------- replies


def blocks_to_keep(content: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The ``thinking``/``redacted_thinking`` blocks that come before the reply's first
    ``tool_use`` block, in order and unmodified (copies); None when the reply calls no tool
    or thought nothing before calling one. Only a turn with tool calls needs them back."""
    kept: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "tool_use":
            return kept or None
        if kind in THINKING_TYPES:
            kept.append(copy.deepcopy(dict(block)))
    return None


def reply_tool_ids(content: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ids the client sees for the reply's tool calls (``decode_tool_id``, as the response
    translators do), in order."""
    return [decode_tool_id(str(b.get("id", ""))) for b in content if b.get("type") == "tool_use"]


def thinking_of_reply(content: Sequence[Mapping[str, Any]]) -> KeptThinking | None:
    """What to keep from a non-streaming reply's ``content``: (client tool ids, blocks), or
    None when there is nothing to keep. Store the blocks under each of the ids."""
    blocks = blocks_to_keep(content)
    if blocks is None:
        return None
    return reply_tool_ids(content), blocks


class ThinkingCollector:
    """Rebuilds, from a stream's events, what ``thinking_of_reply`` gives for the same reply
    as a whole message: ``feed`` every event (name and parsed data, pings and unknown events
    included: they are ignored), then call ``result`` once the stream ended successfully.

    A thinking block is built from its ``content_block_start`` plus its ``thinking_delta`` and
    ``signature_delta`` deltas; a ``redacted_thinking`` block arrives whole in its start event.
    A block that never reached its ``content_block_stop`` is incomplete: ``result`` is None.
    """

    __slots__ = ("_blocks", "_open", "_tool_ids", "_tool_seen")

    def __init__(self) -> None:
        self._blocks: dict[int, dict[str, Any]] = {}  # index -> thinking block before the first tool_use
        self._open: set[int] = set()
        self._tool_ids: list[str] = []
        self._tool_seen = False

    def feed(self, event: str, data: Mapping[str, Any]) -> None:
        """Take one upstream event (``event`` decides, as in ``StreamTranslator.feed``)."""
        if not isinstance(data, Mapping):
            return
        index = data.get("index")
        if not isinstance(index, int):
            return
        if event == "content_block_start":
            block = data.get("content_block")
            if not isinstance(block, Mapping):
                return
            if block.get("type") == "tool_use":
                self._tool_seen = True
                self._tool_ids.append(decode_tool_id(str(block.get("id", ""))))
            elif block.get("type") in THINKING_TYPES and not self._tool_seen:
                self._blocks[index] = copy.deepcopy(dict(block))
                self._open.add(index)
        elif event == "content_block_delta" and index in self._open:
            delta = data.get("delta")
            if isinstance(delta, Mapping):
                _apply_delta(self._blocks[index], delta)
        elif event == "content_block_stop":
            self._open.discard(index)

    def result(self) -> KeptThinking | None:
        """(client tool ids, blocks) as ``thinking_of_reply`` would give; None if nothing to keep."""
        if not self._tool_ids or not self._blocks or self._open:
            return None
        return list(self._tool_ids), [copy.deepcopy(self._blocks[i]) for i in sorted(self._blocks)]


def _apply_delta(block: dict[str, Any], delta: Mapping[str, Any]) -> None:
    kind = delta.get("type")
    field = "thinking" if kind == "thinking_delta" else "signature" if kind == "signature_delta" else None
    if field is not None and isinstance(delta.get(field), str):
        block[field] = str(block.get(field) or "") + delta[field]


# ---------------------------------------------------------------- requests


def _tool_turns(body: Mapping[str, Any]) -> list[tuple[int, list[str]]]:
    """(message index, client tool ids) of each assistant message with ``tool_use`` blocks."""
    turns = []
    for k, message in enumerate(body.get("messages") or ()):
        if message.get("role") != "assistant" or isinstance(message.get("content"), str):
            continue
        ids = reply_tool_ids(message.get("content") or ())
        if ids:
            turns.append((k, ids))
    return turns


def assistant_tool_ids(body: Mapping[str, Any]) -> list[list[str]]:
    """The client tool ids of each assistant turn with tool calls in a translated request
    (``Translation.body``), oldest first. Look them all up at once and pass the result to
    ``restore_thinking``."""
    return [ids for _, ids in _tool_turns(body)]


def _found_for(ids: list[str], found: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]] | None:
    """The blocks kept for a turn: every one of its calls must be known and all must come from
    the same reply (same blocks); else the turn isn't one we answered (edited or foreign)."""
    first = found.get(ids[0])
    if not first:
        return None
    for call_id in ids[1:]:
        if found.get(call_id) != first:
            return None
    return first


def restore_thinking(
    body: dict[str, Any],
    found: Mapping[str, list[dict[str, Any]]],
    source_map: MutableMapping[tuple[Any, ...], str] | None = None,
) -> bool:
    """Put kept thinking blocks back at the start of every assistant turn with tool calls whose
    blocks were found (``found``: client tool id -> blocks, as the stash returns them), exactly
    as received, so the prompt prefix stays the same from round to round. The translation
    merges consecutive assistant messages into one turn; a turn counts as ours when each of its
    calls maps to the same kept blocks.

    Returns False, and changes nothing, when the last assistant message has tool calls and no
    kept blocks (expired, another gateway's history, a turn the client edited): the upstream
    refuses such a request while thinking is on, so send it through ``without_thinking``.
    Earlier turns without blocks stay as they are: Anthropic lets prior assistant turns omit
    their thinking ("Preserving thinking blocks"). A turn that already starts with a thinking
    block is left alone. With ``source_map`` (``Translation.source_map``), the content indexes
    of the turns that grew are shifted and the new blocks map to the turn's first message.
    """
    messages = body.get("messages") or []
    last_assistant = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    plan: list[tuple[int, list[dict[str, Any]]]] = []
    for k, ids in _tool_turns(body):
        content = messages[k]["content"]
        if content and content[0].get("type") in THINKING_TYPES:
            continue
        blocks = _found_for(ids, found)
        if blocks is None:
            if k == last_assistant:
                return False
            continue
        plan.append((k, blocks))
    for k, blocks in plan:
        messages[k]["content"] = [copy.deepcopy(b) for b in blocks] + list(messages[k]["content"])
        if source_map is not None:
            _shift(source_map, k, len(blocks), len(messages[k]["content"]))
    return True


def _shift(source_map: MutableMapping[tuple[Any, ...], str], k: int, added: int, total: int) -> None:
    """Content indexes of message ``k`` move up by ``added``; the new blocks map to the turn."""
    for m in range(total - 1, added - 1, -1):
        path = source_map.pop(("messages", k, m - added), None)
        if path is not None:
            source_map[("messages", k, m)] = path
    turn_path = source_map.get(("messages", k))
    for m in range(added):
        if turn_path is not None:
            source_map[("messages", k, m)] = turn_path
        else:
            source_map.pop(("messages", k, m), None)


def without_thinking(body: dict[str, Any], req: Mapping[str, Any], model: Model) -> None:
    """Turn thinking off for this request, as the translation does when thinking isn't
    requested (spec "Reasoning": a forced tool call; "Sampling parameters"): ``thinking`` is
    removed, ``output_config.effort`` stays (effort applies without thinking; budget models
    never get one), ``max_tokens`` is unchanged (the budget was taken inside it), and
    ``temperature``/``top_p`` are forwarded if the model takes them while thinking is off.
    ``req`` is the validated client request and ``model`` its model, as given to
    ``openai_to_anthropic``. Kept blocks already in the body are left there (call it only
    when ``restore_thinking`` returned False, which changed nothing)."""
    if body.pop("thinking", None) is None:
        return
    body.update(_sampling(dict(req), model, False))
