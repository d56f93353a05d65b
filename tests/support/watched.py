"""Another organisation's stream, held open and read on a thread while a test attacks the same
worker: when each of its lines (the keep-alive pings included) arrived, so a test can assert the
largest gap between them."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import requests

from tests.integration.harness import Gateway


class Watched:
    """A chat stream of ``key`` on ``model`` that the simulator keeps silent for ``stall_s``: its
    lines' arrival times; ``done`` is set when it ends (or the test closes ``response``)."""

    def __init__(self, gateway: Gateway, key: str, *, model: str, stall_s: int = 60) -> None:
        self.times: list[float] = []
        self.done = threading.Event()
        body: dict[str, Any] = {
            "model": model,
            "stream": True,
            "max_completion_tokens": 32,
            "messages": [{"role": "user", "content": f"Keep me waiting [[sim:stall={stall_s}]]"}],
        }
        self.response = requests.post(
            gateway.url + "/openai/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            stream=True,
            timeout=stall_s + 60,
        )
        assert self.response.status_code == 200
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for _line in self.response.iter_lines():
                self.times.append(time.monotonic())
        except Exception:  # the test closes the response under this thread at the end
            pass
        self.done.set()

    def largest_gap(self, since: float) -> float:
        """The longest time without a line since ``since`` (up to now)."""
        stamps = [since, *(t for t in self.times if t >= since), time.monotonic()]
        return max(b - a for a, b in itertools.pairwise(stamps))
