"""A client that leaves during a non-streaming request is recorded as having left (499, billed
for what the upstream produced, as an early-closed stream is), not as a 200 nobody received."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

from tests.integration.harness import Gateway


def test_a_client_that_leaves_a_non_streaming_request_is_recorded_as_left(gateway: Gateway, key: str) -> None:
    body = json.dumps(
        {
            "model": "anthropic/claude-sonnet-5-5",
            "max_completion_tokens": 64,
            "messages": [{"role": "user", "content": "slow one [[sim:delay=2]]"}],
        }
    ).encode()
    url = urlparse(gateway.url)
    before = len(json.loads(gateway.cli("usage", "--json").stdout))
    with socket.create_connection((url.hostname, url.port), timeout=10) as conn:
        conn.sendall(
            b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.5)  # the upstream is still working: the client leaves
    deadline = time.monotonic() + 20
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        rows = json.loads(gateway.cli("usage", "--json").stdout)[before:]
        if rows:
            break
        time.sleep(0.5)
    ((row,),) = [rows]
    assert row["status"] == 499 and row["cost_usd"] != "0.000000" and row["output_tokens"] > 0  # type: ignore[operator]
