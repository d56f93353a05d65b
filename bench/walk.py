"""The walk of one request through the gateway's modules.

Builds the app as ``create_app`` does (SQLite in a temporary folder, the upstream mocked with
``responses``), sends one warm-up request, then traces the next with ``sys.setprofile`` and
prints, for a JSON chat completion and a streamed one:

- hand-offs: how often the innermost ``ezat_compat`` module on the stack changes;
- back to a module already visited in that request, and the modules re-entered most (a call
  and its return, then another call into the same module: the walk of a layered design);
- re-entered for one step: a call into a module that is still on the stack below its caller
  (A calls B, which calls back into A: a callback, a hook or a lambda of A run by B), with
  each such chain named; the natural walk has none;
- how often the process id is read (``server.procid.pid`` / ``os.getpid``);
- how often the usage is parsed (``usage_from_anthropic``).

    .venv/bin/python bench/walk.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import responses

PACKAGE = "ezat_compat"
REPLY = {
    "id": "msg_walk",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-5-5",
    "content": [{"type": "text", "text": "Hello there, friend."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 6},
}
EVENTS = [
    ("message_start", {"type": "message_start", "message": {**REPLY, "content": [], "stop_reason": None}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    *[
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}})
        for w in ("Hello ", "there, ", "friend.")
    ],
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}}),
    ("message_stop", {"type": "message_stop"}),
]
SSE = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in EVENTS)
CONFIG = """
[gateway]
database_url = "sqlite:///{db}"
[[models]]
id = "anthropic/claude-sonnet-5-5"
aliases = ["claude-sonnet-5-5"]
price = {{ input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }}
[[models.deployments]]
name = "primary"
base_url = "http://upstream.invalid"
upstream_model = "claude-sonnet-5-5"
"""


class Walk:
    """Each call from one ``ezat_compat`` module into another (library frames in between are
    looked through: the caller is the innermost ``ezat_compat`` frame below the callee)."""

    def __init__(self) -> None:
        self.stack: list[str | None] = []
        self.hand_offs: list[tuple[str | None, str]] = []
        self.calls: Counter[str] = Counter()
        self.callbacks: Counter[str] = Counter()  # "A > B > A:function", for each call back into A

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            self.calls[f"{name}.{frame.f_code.co_name}"] += 1
            outer = self.stack[-1] if self.stack else None
            if name.startswith(PACKAGE):
                if name != outer:
                    self.hand_offs.append((outer, name))
                    if name in self.stack:
                        self.callbacks[self._chain(name, frame.f_code.co_name)] += 1
                self.stack.append(name)
            else:
                self.stack.append(outer)
        elif event == "return":
            if self.stack:
                self.stack.pop()
        elif event == "c_call":
            self.calls[f"c.{getattr(arg, '__name__', '?')}"] += 1

    def _chain(self, module: str, function: str) -> str:
        """The modules from ``module``'s innermost frame on the stack up to the call back into it."""
        start = len(self.stack) - 1 - self.stack[::-1].index(module)
        chain = [module]
        for name in self.stack[start + 1 :]:
            if name is not None and name != chain[-1]:
                chain.append(name)
        short = [part.removeprefix(PACKAGE + ".") for part in chain]
        return " > ".join(short) + f" > {short[0]}:{function}"

    def figures(self) -> dict[str, Any]:
        seen: set[str] = set()
        back = 0
        reentered: Counter[str] = Counter()
        for outer, module in self.hand_offs:
            if outer is not None:
                seen.add(outer)
            if module in seen:
                back += 1
                reentered[module] += 1
            seen.add(module)
        return {
            "hand_offs": len(self.hand_offs),
            "back_to_visited": back,
            "modules": len(seen),
            "re_entered": dict(reentered.most_common(8)),
            "re_entered_for_one_step": sum(self.callbacks.values()),
            "call_backs": dict(self.callbacks),
            "pid_reads": self.calls[f"{PACKAGE}.procid.pid"] + self.calls["c.getpid"],
            "usage_parses": sum(n for k, n in self.calls.items() if k.endswith(".usage_from_anthropic")),
        }


def _app(root: Path) -> tuple[Any, str]:
    from ezat_compat.app import create_app
    from ezat_compat.config import load_config
    from ezat_compat.server.serving import prepare_database

    path = root / "ezat.toml"
    path.write_text(CONFIG.format(db=(root / "ezat.db").as_posix()))
    os.environ["ANTHROPIC_API_KEY"] = "sk-ant-walk"
    config = load_config(path)
    prepare_database(config)
    app = create_app(config)
    gw = app.extensions["ezat"]
    gw.accounts.create_org("walk", 100_000_000)
    made = gw.accounts.create_key("walk")
    secret = next(x for x in made if isinstance(x, str) and x.startswith("ezat_sk_"))
    return app, secret


def walk(stream: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        if stream:
            mock.post("http://upstream.invalid/v1/messages", body=SSE, content_type="text/event-stream")
        else:
            mock.post("http://upstream.invalid/v1/messages", json=REPLY)
        app, secret = _app(Path(tmp))
        client = app.test_client()
        body = {"model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        headers = {"authorization": f"Bearer {secret}"}
        for _ in range(3):  # warm: caches, pools, lazily built collaborators
            resp = client.post("/openai/v1/chat/completions", json=body, headers=headers)
            assert resp.status_code == 200, resp.data
            resp.get_data()
        tracer = Walk()
        sys.setprofile(tracer)
        try:
            resp = client.post("/openai/v1/chat/completions", json=body, headers=headers)
            resp.get_data()
        finally:
            sys.setprofile(None)
        assert resp.status_code == 200
        return tracer.figures()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"json": walk(False), "stream": walk(True)}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, figures in out.items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
