"""Tool loops on the simulator: the weather agent's one tool, ``get_weather``, which the simulator
calls when a user text asks it to (``[[sim:tool=get_weather,args=…]]``)."""

from __future__ import annotations

from typing import Any

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
