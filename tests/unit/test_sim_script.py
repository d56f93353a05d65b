"""Tool results that script the simulator's next call (sim/script.py): a ``tool=``/``args=``
marker in the results' text makes the reply call that tool; nothing else is taken from them."""

from __future__ import annotations

from typing import Any

import pytest

from ezat_compat.sim.markers import parse_markers
from ezat_compat.sim.replies import build_reply
from ezat_compat.sim.request import last_user_text
from ezat_compat.sim.script import scripted_markers

TOOL = {"name": "exec_command", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "exec_command", "input": {"cmd": "ls"}}


def reply_to(result_text: str, user_text: str | None = None) -> list[dict[str, Any]]:
    last: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result_text}]
    if user_text is not None:
        last.append({"type": "text", "text": user_text})
    body = {
        "model": "m",
        "max_tokens": 100,
        "tools": [TOOL],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [CALL]},
            {"role": "user", "content": last},
        ],
    }
    clean, markers = scripted_markers(body, *parse_markers(last_user_text(body)))
    return build_reply(body, clean, markers).content


def test_a_marker_in_a_tool_result_scripts_the_next_call() -> None:
    content = reply_to('done\n[[sim:tool=exec_command,args={"cmd": "cat notes.txt"}]]\n')
    assert [(b["type"], b.get("input")) for b in content] == [("tool_use", {"cmd": "cat notes.txt"})]


@pytest.mark.parametrize(
    ("result", "user"),
    [
        pytest.param("plain output", None, id="no-marker"),
        pytest.param("[[sim:status=500]]", None, id="no-tool-no-fault"),
        pytest.param("[[sim:nonsense=1]]", None, id="invalid-marker-ignored"),
        pytest.param('[[sim:tool=exec_command,args={"cmd": "x"}]]', "thanks [[sim:words=3]]", id="user-marker-wins"),
    ],
)
def test_otherwise_the_reply_quotes_the_results(result: str, user: str | None) -> None:
    content = reply_to(result, user)
    assert [b["type"] for b in content] == ["text"]
