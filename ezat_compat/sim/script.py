"""Tool results that script the next call, so a client that runs tools can be led through
several rounds by the output of its own tools (the Codex CLI in the Responses tests).

When the last user message carries tool results and no ``[[sim:…]]`` marker of its own, a
``[[sim:tool=NAME,args={…}]]`` marker in the results' text makes the reply call that tool with
those arguments, as the same marker in a user message does. Only the call is taken from a tool's
output (no faults or delays), and text that isn't a valid marker is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ezat_compat.sim.errors import InvalidRequestError
from ezat_compat.sim.markers import NO_MARKERS, Markers, parse_markers
from ezat_compat.sim.request import content_blocks, last_user_message, tool_result_text


def scripted_markers(body: Mapping[str, Any], clean_text: str, markers: Markers) -> tuple[str, Markers]:
    """``(clean_text, markers)`` of the last user text, or the call scripted by its tool results."""
    if markers != NO_MARKERS:
        return clean_text, markers
    message = last_user_message(body)
    results = [
        b
        for b in content_blocks(message.get("content") if message else None)
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    text = "\n".join(tool_result_text(b) for b in results)
    if "[[sim:" not in text:
        return clean_text, markers
    try:
        _, scripted = parse_markers(text)
    except InvalidRequestError:
        return clean_text, markers
    if scripted.tool is None:
        return clean_text, markers
    return clean_text, Markers(tool=scripted.tool, args=scripted.args)
