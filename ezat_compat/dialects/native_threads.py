"""Message threads on native ``/v1/messages``, held by the gateway (beta
``message-threads-2026-08-12``): the pure part — what a ``thread`` field asks, the whole request a
continuation stands for, the reply as the message the next turn continues from, and the reply
assembled from a stream. The rows are ``store/threads.py``'s.

The protocol, from the Anthropic SDKs (Python ``anthropic`` 2.17, ``lib/threads``;
``types/beta/beta_message_thread_param.py``):

- ``thread: {"type": "create"}`` "asks the server to hold this conversation's state under the
  response's ``id``"; the request is whole.
- ``thread: {"type": "continue", "previous_message_id": "msg_…"}`` "resumes from a previous
  response so only the new turn's messages are sent"; ``system`` and ``tools`` are "request
  fields the server takes from the thread on a continue and rejects if the request repeats
  them". ``messages`` may be empty: after a ``pause_turn`` reply the server resumes the
  unfinished turn.
- "The response shape is unchanged."
- A rejection whose ``error.details.error_code`` is ``thread_not_found`` (or
  ``thread_already_continued``, ``thread_continue_in_flight``) makes the SDK send the whole
  history again under a new thread; ``thread_unsupported_request`` makes its tool runner go on
  without threads (``unsupported_request_behavior="continue_unthreaded"``).
- A turn the SDK sends again whole carries no ``cache_control`` on the messages already answered
  ("each was set for the turn that sent it first, and a request takes only a few of them").
- A refused reply (``stop_reason: "refusal"``) is not continued: the next turn starts a new
  thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ezat_compat.errors import InvalidRequestError, ThreadNotFoundError, ThreadUnsupportedError
from ezat_compat.jsonfast import loads
from ezat_compat.translate.cache_marks import cache_marks, without_marks

THREADS_BETA = "message-threads-2026-08-12"
CREATE_ONLY_FIELDS = ("system", "tools")
MAX_CACHE_BREAKPOINTS = 4  # the API's limit of blocks with cache_control in one request
# Blocks that can't carry cache_control (the API refuses it on thinking blocks).
UNCACHEABLE = frozenset(("thinking", "redacted_thinking"))
THREAD_REFUSAL = (
    "thread: this gateway keeps no conversation state (message threads are off on this gateway); "
    "resend this turn with the full message history."
)


@dataclass(slots=True)
class ThreadTurn:
    """A threaded request's part of a parsed request (``Parsed.context``)."""

    previous_id: str | None  # the turn a continue continues; None for a create
    fields: dict[str, Any] | None  # a create's ``system`` and ``tools``, as given
    messages: list[dict[str, Any]]  # this turn's messages, as the client sent them
    org_id: int = 0
    root_id: str | None = None  # the thread's first reply id, known on a continue
    auto_cache: bool = True  # False with ``x-ezat-cache: off``: no breakpoint is added


def thread_of(body: Mapping[str, Any]) -> ThreadTurn | None:
    """What ``body``'s ``thread`` asks: None without one (absent or null); a turn for a create or a
    continue; ``InvalidRequestError`` naming the field for anything else, or for a continue that
    repeats a field the thread keeps."""
    thread = body.get("thread")
    if thread is None:
        return None
    kind = thread.get("type") if isinstance(thread, dict) else None
    messages = body.get("messages")
    given = list(messages) if isinstance(messages, list) else []
    if kind == "create":
        return ThreadTurn(None, {f: body[f] for f in CREATE_ONLY_FIELDS if f in body}, given)
    if kind != "continue":
        raise InvalidRequestError('thread.type: Input should be "create" or "continue"', param="thread.type")
    previous = thread.get("previous_message_id")
    if not isinstance(previous, str) or not previous:
        raise InvalidRequestError(
            "thread.previous_message_id: Field required (the id of the reply this turn continues)",
            param="thread.previous_message_id",
        )
    for name in CREATE_ONLY_FIELDS:
        if name in body:
            raise InvalidRequestError(
                f"{name}: a thread keeps the {name} it was created with; a continue can't send it "
                "(start a new thread to change it)",
                param=name,
            )
    return ThreadTurn(previous, None, given)


def not_found(previous_id: str) -> ThreadNotFoundError:
    """The rejection that makes the SDKs resend the whole history under a new thread."""
    return ThreadNotFoundError(
        f"thread.previous_message_id: no thread holds the message '{previous_id}' (unknown, expired or "
        'another organisation\'s); resend the full message history with thread: {"type": "create"}.',
        param="thread.previous_message_id",
    )


def too_long(limit: int) -> ThreadUnsupportedError:
    """A continue of a thread whose history is over what the gateway reads back (``ThreadStore
    .max_chain_bytes``): the SDKs' tool runners go on without threads."""
    return ThreadUnsupportedError(
        f"thread.previous_message_id: this thread's history is over {limit / (1024 * 1024):g} MB, more than the "
        "gateway reads back for a continue; resend this turn with the message history it still needs, without thread.",
        param="thread.previous_message_id",
    )


def unsupported() -> ThreadUnsupportedError:
    """A continue on a gateway that keeps no threads (``[responses] store = false``)."""
    return ThreadUnsupportedError(THREAD_REFUSAL, param="thread")


def breakpoints(value: Any) -> int:
    """How many ``cache_control`` marks ``value`` (a system prompt, tools or messages) holds."""
    return sum(1 for _ in cache_marks(value))


def _ttls(value: Any) -> Iterator[str]:
    """The TTL of every ``cache_control`` mark in ``value`` (``5m`` when it names none)."""
    return (str(mark.get("ttl", "5m")) for mark in cache_marks(value) if isinstance(mark, dict))


def _mark_last(messages: list[dict[str, Any]], later: Any) -> None:
    """Put an ephemeral ``cache_control`` on the last block of ``messages`` that can carry one
    (the history's end: the next turn reads it from the cache), if any; ``messages`` is the
    gateway's own copy. Its TTL is the default 5 minutes unless a mark in ``later`` (the
    request's own messages, after it) is 1 hour: the API refuses a 1h mark after a 5m one."""
    mark: dict[str, Any] = {"type": "ephemeral"}
    if "1h" in _ttls(later):
        mark["ttl"] = "1h"
    for message in reversed(messages):
        content = message.get("content")
        if isinstance(content, str):
            if content:
                message["content"] = [{"type": "text", "text": content, "cache_control": mark}]
                return
            continue
        blocks: list[Any] = content if isinstance(content, list) else []
        for block in reversed(blocks):
            if not isinstance(block, dict) or block.get("type") in UNCACHEABLE:
                continue
            if block.get("type") == "text" and not block.get("text"):
                continue
            block["cache_control"] = mark
            return


def whole_request(
    upstream: dict[str, Any], fields: Mapping[str, Any], history: list[dict[str, Any]], *, caching: bool
) -> dict[str, Any]:
    """The whole request a continuation stands for: ``upstream`` (the request without ``thread``)
    with the thread's ``system`` and ``tools`` and the stored ``history`` before its own messages.
    The history's end gets a cache breakpoint when the model caches and the request has room for
    one, so each turn reads the conversation so far from the upstream's cache."""
    own = upstream.get("messages")
    body = {k: v for k, v in upstream.items() if k != "messages"}
    body.update(fields)
    kept = joined([dict(m) for m in history])  # the stored history is this request's own copy
    if (
        caching
        and kept
        and breakpoints(body.get("system")) + breakpoints(body.get("tools")) + breakpoints(own) < MAX_CACHE_BREAKPOINTS
    ):
        _mark_last(kept, own)
    body["messages"] = kept + (list(own) if isinstance(own, list) else [])
    return body


def turn_messages(turn: ThreadTurn, reply: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a turn adds to its thread: its messages, then the reply as an assistant message, as
    the SDKs send a reply back (its content blocks as received), all without cache_control. A
    reply that continues a paused assistant turn (no new messages) joins that turn's message
    when the history is read back (``joined``)."""
    content = reply.get("content")
    answer = {"role": "assistant", "content": list(content) if isinstance(content, list) else []}
    return without_marks([*turn.messages, answer])  # type: ignore[no-any-return]


def joined(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with consecutive assistant messages joined into one (a reply to a paused turn
    continues the paused reply; the API takes one assistant turn there)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if out and message.get("role") == "assistant" and out[-1].get("role") == "assistant":
            out[-1] = {**out[-1], "content": _blocks(out[-1].get("content")) + _blocks(message.get("content"))}
        else:
            out.append(message)
    return out


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


class ReplyAssembler:
    """The reply of a native stream, put together from its events as the SDKs' stream helpers do
    (``message_start``'s message, each block from its ``content_block_start`` and deltas), for the
    thread to keep once the stream has ended with ``message_stop``."""

    __slots__ = ("blocks", "message_id", "partial", "stop_reason")

    def __init__(self) -> None:
        self.message_id: str | None = None
        self.stop_reason: str | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}

    def feed(self, event: str, data: Mapping[str, Any]) -> None:
        if event == "content_block_delta":
            self._delta(data.get("index"), data.get("delta"))
        elif event == "content_block_start":
            index, block = data.get("index"), data.get("content_block")
            if isinstance(index, int) and isinstance(block, dict):
                self.blocks[index] = dict(block)
        elif event == "content_block_stop":
            index = data.get("index")
            parts = self.partial.pop(index, None) if isinstance(index, int) else None
            if parts is not None and index in self.blocks:
                text = "".join(parts)
                try:
                    self.blocks[index]["input"] = loads(text) if text else {}
                except ValueError:
                    self.blocks[index]["input"] = {}
        elif event == "message_start":
            message = data.get("message")
            if isinstance(message, dict) and isinstance(message.get("id"), str):
                self.message_id = message["id"]
        elif event == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and "stop_reason" in delta:
                self.stop_reason = delta["stop_reason"]

    def _delta(self, index: Any, delta: Any) -> None:
        block = self.blocks.get(index) if isinstance(index, int) else None
        if block is None or not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = (block.get("text") or "") + str(delta.get("text") or "")
        elif kind == "input_json_delta":
            self.partial.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        elif kind == "thinking_delta":
            block["thinking"] = (block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            block["citations"] = [*(block.get("citations") or ()), delta.get("citation")]

    def reply(self) -> dict[str, Any]:
        """The reply as a message: its id, stop reason and content blocks in order."""
        return {
            "id": self.message_id,
            "stop_reason": self.stop_reason,
            "content": [self.blocks[i] for i in sorted(self.blocks)],
        }
