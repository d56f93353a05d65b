"""The simulator as a real subprocess on a loopback port, driven with requests and the anthropic SDK."""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
import requests

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LISTENING_RE = re.compile(r"^ezat-sim listening on (http://127\.0\.0\.1:(\d+))$")
MODEL = "claude-sim-test"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
}
LONG_SYSTEM = "You are a careful assistant who answers in short sentences. " * 100  # 6000 chars: 1500 tokens


class Sim:
    """A running simulator process."""

    def __init__(self, proc: subprocess.Popen[str], url: str, stderr_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.stderr_path = stderr_path

    def post(
        self, body: Any, path: str = "/v1/messages", headers: dict[str, str] | None = None, **kwargs: Any
    ) -> requests.Response:
        return requests.post(
            self.url + path, json=body, headers={"x-api-key": "x", **(headers or {})}, timeout=30, **kwargs
        )

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=10)

    def delete(self, path: str) -> requests.Response:
        return requests.delete(self.url + path, timeout=10)

    def stats(self) -> dict[str, int]:
        return self.get("/_sim/stats").json()

    def wait_stats(self, predicate: Callable[[dict[str, int]], bool], timeout: float = 15) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while not predicate(stats) and time.monotonic() < deadline:
            time.sleep(0.05)
            stats = self.stats()
        return stats

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def _start(tmp_path: Path, flags: tuple[str, ...]) -> Sim:
    stderr_path = tmp_path / f"sim-{len(list(tmp_path.glob('sim-*')))}.err"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ezat_compat.sim", "--bind", "127.0.0.1:0", *flags],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout=30)
    line = proc.stdout.readline().strip() if ready else ""
    match = LISTENING_RE.match(line)
    if not match:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        pytest.fail(f"simulator did not start: {line!r}; stderr: {stderr_path.read_text()}")
    return Sim(proc, match.group(1), stderr_path)


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    """Start a simulator with extra flags; stopped at teardown."""
    sims: list[Sim] = []

    def start(*flags: str) -> Sim:
        sims.append(_start(tmp_path, flags))
        return sims[-1]

    yield start
    for sim in sims:
        sim.stop()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One default simulator shared by the module's tests."""
    running = _start(tmp_path_factory.mktemp("sim"), ())
    yield running
    running.stop()


@pytest.fixture
def client(sim: Sim) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0) as sdk:
        yield sdk


def body(content: Any = "Hello there", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1024, "messages": [{"role": "user", "content": content}], **extra}


Event = tuple[str, dict[str, Any], float]


def read_events(response: requests.Response) -> tuple[list[Event], Exception | None]:
    """The SSE events of a streamed response (with arrival times) and the error that ended it, if any."""
    events: list[Event] = []
    buffer = b""
    error: Exception | None = None
    try:
        for chunk in response.iter_content(chunk_size=None):
            buffer += chunk
            while b"\n\n" in buffer:
                raw, buffer = buffer.split(b"\n\n", 1)
                fields = dict(line.split(": ", 1) for line in raw.decode().split("\n"))
                events.append((fields["event"], json.loads(fields["data"]), time.monotonic()))
    except requests.exceptions.ChunkedEncodingError as exc:
        error = exc
    return events, error


def stream(sim: Sim, payload: dict[str, Any]) -> tuple[list[Event], Exception | None]:
    with sim.post({**payload, "stream": True}, stream=True) as response:
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_events(response)


def names(events: list[Event]) -> list[str]:
    return [name for name, _, _ in events]


# --------------------------------------------------------------------------------------------
# basics
# --------------------------------------------------------------------------------------------


def test_healthz_and_identity_headers(sim: Sim) -> None:
    response = sim.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "name": "sim"}
    assert re.fullmatch(r"req_[0-9a-f]{24}", response.headers["request-id"])
    assert response.headers["x-sim-name"] == "sim"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/v2/nothing", 404, id="unknown-route"),
        pytest.param("GET", "/v1/messages", 405, id="wrong-method"),
    ],
)
def test_unknown_routes_answer_the_anthropic_envelope(sim: Sim, method: str, path: str, status: int) -> None:
    response = requests.request(method, sim.url + path, timeout=10)
    assert response.status_code == status
    data = response.json()
    assert data["type"] == "error"
    assert data["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert data["request_id"] == response.headers["request-id"]


def test_json_reply(sim: Sim) -> None:
    response = sim.post(body("Tell me something"))
    assert response.status_code == 200
    message = response.json()
    assert set(message) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert message["id"].startswith("msg_") and message["type"] == "message" and message["role"] == "assistant"
    assert message["model"] == MODEL
    assert message["content"] == [{"type": "text", "text": "Hello from the simulator. You said: Tell me something"}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    assert message["usage"] == {
        "input_tokens": 3 + 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 14,
        "output_tokens_details": {"thinking_tokens": 0},
    }
    assert response.headers["request-id"].startswith("req_")


def test_validation_error_over_http(sim: Sim) -> None:
    response = sim.post({**body(), "temperature": 0.5, "top_p": 0.5})
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "`temperature` and `top_p` cannot both be specified for this model. Please use only one.",
        },
        "request_id": response.headers["request-id"],
    }


def test_invalid_json_body(sim: Sim) -> None:
    response = requests.post(sim.url + "/v1/messages", data=b"{not json", headers={"x-api-key": "x"}, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_missing_api_key_is_401(sim: Sim) -> None:
    response = requests.post(sim.url + "/v1/messages", json=body(), timeout=10)
    assert response.status_code == 401
    assert response.json()["error"] == {"type": "authentication_error", "message": "x-api-key header is required"}


def test_api_key_flag(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--api-key", "sekret")
    wrong = sim.post(body(), headers={"x-api-key": "other"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert sim.post(body(), headers={"x-api-key": "sekret"}).status_code == 200
    with anthropic.Anthropic(base_url=sim.url, api_key="sekret", max_retries=0) as sdk:
        assert sdk.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}]).content
    with (
        anthropic.Anthropic(base_url=sim.url, api_key="nope", max_retries=0) as sdk,
        pytest.raises(anthropic.AuthenticationError),
    ):
        sdk.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}])


def test_count_tokens(sim: Sim, client: anthropic.Anthropic) -> None:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
        "tools": [WEATHER],
    }
    counted = sim.post(payload, path="/v1/messages/count_tokens")
    assert counted.status_code == 200
    created = sim.post({**payload, "max_tokens": 100}).json()
    assert counted.json() == {"input_tokens": created["usage"]["input_tokens"]}
    assert client.messages.count_tokens(**payload).input_tokens == counted.json()["input_tokens"]


def test_prompt_cache_over_http(sim: Sim) -> None:
    sim.delete("/_sim/cache")
    payload = body("Hi", system=[{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}])
    first, second = sim.post(payload).json()["usage"], sim.post(payload).json()["usage"]
    assert (first["cache_creation_input_tokens"], first["cache_read_input_tokens"]) == (1500, 0)
    assert (second["cache_creation_input_tokens"], second["cache_read_input_tokens"]) == (0, 1500)
    assert first["input_tokens"] == second["input_tokens"] == 3 + 1


# --------------------------------------------------------------------------------------------
# streaming
# --------------------------------------------------------------------------------------------


def test_sse_sequence(sim: Sim) -> None:
    events, error = stream(
        sim, body("Stream me a few words please", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024})
    )
    assert error is None
    sequence = names(events)
    assert sequence[:2] == ["message_start", "ping"]
    assert sequence[-2:] == ["message_delta", "message_stop"]
    blocks = sequence[2:-2]
    assert [n for n in blocks if n != "content_block_delta"] == ["content_block_start", "content_block_stop"] * 2
    assert blocks.count("content_block_delta") >= 5
    deltas = [(data["index"], data["delta"]["type"]) for name, data, _ in events if name == "content_block_delta"]
    assert [t for i, t in deltas if i == 0][-1] == "signature_delta"
    assert {t for i, t in deltas if i == 1} == {"text_delta"}
    text = "".join(
        data["delta"]["text"]
        for name, data, _ in events
        if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
    )
    assert text == "Hello from the simulator. You said: Stream me a few words please"
    start, final = events[0][1]["message"], events[-2][1]
    assert start["usage"]["output_tokens"] == 1 and start["stop_reason"] is None
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens_details"]["thinking_tokens"] > 0


# --------------------------------------------------------------------------------------------
# the anthropic SDK parses every shape
# --------------------------------------------------------------------------------------------


def test_sdk_create_text(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Hi"}])
    assert isinstance(message.content[0], anthropic.types.TextBlock)
    assert message.content[0].text == "Hello from the simulator. You said: Hi"
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens_details is not None
    assert message.usage.output_tokens_details.thinking_tokens == 0


def test_sdk_create_tool_use(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL, max_tokens=500, tools=[WEATHER], messages=[{"role": "user", "content": "Use a tool for Paris"}]
    )
    assert message.stop_reason == "tool_use"
    block = message.content[0]
    assert isinstance(block, anthropic.types.ToolUseBlock)
    assert (block.name, block.input) == ("get_weather", {"city": "example", "unit": "celsius"})
    follow_up = client.messages.create(
        model=MODEL,
        max_tokens=500,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Use a tool for Paris"},
            message.to_param(),
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "9°C and clear"}]},
        ],
    )
    assert follow_up.content[0].type == "text"
    assert follow_up.content[0].text == "Tool results: 9°C and clear"


def test_sdk_create_thinking(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Think first"}],
    )
    thinking, text = message.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock) and thinking.signature and thinking.thinking
    assert isinstance(text, anthropic.types.TextBlock)
    assert message.usage.output_tokens_details is not None
    assert message.usage.output_tokens_details.thinking_tokens > 0
    assert message.usage.output_tokens > message.usage.output_tokens_details.thinking_tokens


def test_sdk_structured_output(client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "score": {"type": "number"}},
        "required": ["answer", "score"],
        "additionalProperties": False,
    }
    message = client.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "Rate it"}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert message.content[0].type == "text"
    assert json.loads(message.content[0].text) == {"answer": "example", "score": 1.5}


@pytest.mark.parametrize(
    ("extra", "content"),
    [
        pytest.param({}, "Stream a reply", id="text"),
        pytest.param({"tools": [WEATHER]}, "Call the tool twice [[sim:tools=2]]", id="tool-use"),
        pytest.param({"thinking": {"type": "adaptive"}}, "Think then answer", id="thinking"),
    ],
)
def test_sdk_stream_matches_create(client: anthropic.Anthropic, extra: dict[str, Any], content: str) -> None:
    params: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }
    created = client.messages.create(**params)
    with client.messages.stream(**params) as events:
        seen = [event.type for event in events]
        streamed = events.get_final_message()
    assert "message_stop" in seen and "content_block_delta" in seen
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in created.content]
    assert streamed.stop_reason == created.stop_reason
    assert streamed.usage.output_tokens == created.usage.output_tokens
    assert streamed.usage.input_tokens == created.usage.input_tokens
    assert streamed.usage.output_tokens_details == created.usage.output_tokens_details


def test_sdk_raw_stream_events(client: anthropic.Anthropic) -> None:
    raw = client.messages.create(
        model=MODEL,
        max_tokens=100,
        stream=True,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Go"}],
    )
    with raw:
        events = list(raw)
    assert [e.type for e in events[:1]] == ["message_start"]
    start = next(e for e in events if e.type == "content_block_start")
    assert isinstance(start.content_block, anthropic.types.ToolUseBlock) and start.content_block.input == {}
    partial = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert 2 <= len(partial) <= 3
    assert json.loads("".join(partial)) == {"city": "example", "unit": "celsius"}
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "tool_use"


# --------------------------------------------------------------------------------------------
# markers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        pytest.param(429, "rate_limit_error", id="429"),
        pytest.param(500, "api_error", id="500"),
        pytest.param(529, "overloaded_error", id="529"),
        pytest.param(504, "timeout_error", id="504"),
        pytest.param(413, "request_too_large", id="413"),
        pytest.param(403, "permission_error", id="403"),
    ],
)
def test_status_marker(sim: Sim, status: int, error_type: str) -> None:
    response = sim.post(body(f"fail please [[sim:status={status},retry_after=3]]"))
    assert response.status_code == status
    assert response.json()["error"]["type"] == error_type
    assert response.headers["retry-after"] == "3"


def test_status_marker_with_stream_answers_before_the_stream(sim: Sim) -> None:
    response = sim.post(body("[[sim:status=529]]", stream=True))
    assert response.status_code == 529
    assert "retry-after" not in response.headers
    assert response.json()["error"] == {"type": "overloaded_error", "message": "Overloaded"}


def test_sdk_sees_status_marker(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "[[sim:status=429]]"}])
    assert caught.value.status_code == 429


def test_delay_marker(sim: Sim) -> None:
    started = time.monotonic()
    assert sim.post(body("slow [[sim:delay=0.5]]")).status_code == 200
    assert time.monotonic() - started >= 0.45


def test_stall_marker(sim: Sim) -> None:
    events, error = stream(sim, body("[[sim:stall=1]] hi"))
    assert error is None
    assert names(events)[:2] == ["message_start", "ping"]
    assert events[2][2] - events[1][2] >= 0.8
    assert names(events)[-1] == "message_stop"


def test_cut_marker(sim: Sim) -> None:
    events, error = stream(sim, body("[[sim:cut=4]] a b c d e f g h"))
    assert isinstance(error, requests.exceptions.ChunkedEncodingError)
    assert names(events) == ["message_start", "ping", "content_block_start", "content_block_delta"]


def test_error_after_marker(sim: Sim, client: anthropic.Anthropic) -> None:
    events, error = stream(sim, body("[[sim:error_after=3]] a b c d e f g h"))
    assert error is None
    assert names(events) == ["message_start", "ping", "content_block_start", "error"]
    assert events[-1][1] == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with (
        pytest.raises(anthropic.APIStatusError, match="Overloaded"),
        client.messages.stream(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "[[sim:error_after=3]]"}]
        ) as sdk_stream,
    ):
        sdk_stream.get_final_message()


def test_token_delay_marker(sim: Sim) -> None:
    events, _ = stream(sim, body("[[sim:words=12,token_delay_ms=150]]"))
    delta_times = [at for name, _, at in events if name == "content_block_delta"]
    assert len(delta_times) == 4
    assert delta_times[-1] - delta_times[0] >= 0.4


def test_words_and_tools_markers(sim: Sim) -> None:
    words = sim.post(body("[[sim:words=7]]")).json()
    assert len(words["content"][0]["text"].split()) == 7
    tools = sim.post(body("[[sim:tools=2]]", tools=[WEATHER])).json()
    assert [b["type"] for b in tools["content"]] == ["tool_use", "tool_use"]
    assert tools["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("marker", "stop_reason"),
    [
        pytest.param("refusal", "refusal", id="refusal"),
        pytest.param("pause", "pause_turn", id="pause"),
        pytest.param("context", "model_context_window_exceeded", id="context"),
    ],
)
def test_stop_reason_markers(client: anthropic.Anthropic, marker: str, stop_reason: str) -> None:
    message = client.messages.create(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": f"hi [[sim:{marker}]]"}]
    )
    assert message.stop_reason == stop_reason
    assert "[[sim" not in message.content[0].text


def test_thinking_tokens_marker(sim: Sim) -> None:
    message = sim.post(body("[[sim:thinking_tokens=7]] hi")).json()
    assert message["usage"]["output_tokens_details"] == {"thinking_tokens": 7}
    assert [b["type"] for b in message["content"]] == ["text"]


# --------------------------------------------------------------------------------------------
# instance flags
# --------------------------------------------------------------------------------------------


def test_fail_status_flag_with_retry_after(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--fail-status", "529", "--retry-after", "2", "--name", "flaky")
    response = sim.post(body())
    assert response.status_code == 529
    assert response.headers["retry-after"] == "2"
    assert response.headers["x-sim-name"] == "flaky"
    assert response.json()["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    overridden = sim.post(body("[[sim:status=429]]"))
    assert overridden.status_code == 429 and overridden.headers["retry-after"] == "2"
    with (
        anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0) as sdk,
        pytest.raises(anthropic.APIStatusError) as caught,
    ):
        sdk.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 529


def test_fail_rate_is_deterministic_with_a_seed(start_sim: Callable[..., Sim]) -> None:
    flags = ("--fail-status", "500", "--fail-rate", "0.5", "--seed", "7")
    runs = []
    for _ in range(2):
        sim = start_sim(*flags)
        runs.append([sim.post(body()).status_code for _ in range(20)])
    assert runs[0] == runs[1]
    assert set(runs[0]) == {200, 500}


def test_cut_after_flag(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--cut-after", "3")
    events, error = stream(sim, body("cut me"))
    assert isinstance(error, requests.exceptions.ChunkedEncodingError)
    assert names(events) == ["message_start", "ping", "content_block_start"]
    assert sim.post(body("not streamed")).status_code == 200
    assert sim.wait_stats(lambda s: s["streams_faulted"] == 1)["streams_faulted"] == 1


def test_stall_flag(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--stall-s", "1")
    events, error = stream(sim, body("stall"))
    assert error is None
    assert events[2][2] - events[1][2] >= 0.8


def test_latency_flag(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--latency-ms", "400")
    started = time.monotonic()
    assert sim.post(body()).status_code == 200
    assert time.monotonic() - started >= 0.35


def test_token_delay_flag(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--token-delay-ms", "100")
    events, _ = stream(sim, body("[[sim:words=9]]"))
    delta_times = [at for name, _, at in events if name == "content_block_delta"]
    assert len(delta_times) == 3 and delta_times[-1] - delta_times[0] >= 0.15


def test_no_prefill_flag(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--no-prefill")
    payload = body()
    payload["messages"].append({"role": "assistant", "content": "Sure"})
    response = sim.post(payload)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "This model does not support assistant message prefill. The conversation must end with a user message."
    )


@pytest.mark.parametrize(
    ("flags", "max_tokens", "limit"),
    [
        pytest.param((), "128001", 128000, id="default-limit"),
        pytest.param(("--max-output-tokens", "64000"), "64001", 64000, id="flag"),
        pytest.param(("--max-output-tokens", "64000"), "9223372036854775807", 64000, id="int64-max"),
        pytest.param(("--max-output-tokens", "64000"), "9" * 40, 64000, id="past-int64"),
    ],
)
def test_max_tokens_above_the_output_limit_is_400(
    start_sim: Callable[..., Sim], flags: tuple[str, ...], max_tokens: str, limit: int
) -> None:
    sim = start_sim(*flags)
    raw = json.dumps(body()).replace('"max_tokens": 1024', f'"max_tokens": {max_tokens}')
    assert max_tokens in raw
    response = requests.post(sim.url + "/v1/messages", data=raw.encode(), headers={"x-api-key": "x"}, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": f"max_tokens: {max_tokens} > {limit}, which is the maximum allowed number of output tokens "
        f"for {MODEL}",
    }
    at_the_limit = {**body(), "max_tokens": limit}
    assert sim.post(at_the_limit).status_code == 200


def test_min_cache_tokens_flag(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--min-cache-tokens", "1")
    payload = body("Hi", system=[{"type": "text", "text": "short", "cache_control": {"type": "ephemeral"}}])
    assert sim.post(payload).json()["usage"]["cache_creation_input_tokens"] == 2
    assert sim.post(payload).json()["usage"]["cache_read_input_tokens"] == 2


def test_bad_flags_exit_with_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ezat_compat.sim", "--fail-rate", "0.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2
    assert "--fail-rate needs --fail-status" in result.stderr


def test_sigterm_stops_cleanly(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim()
    assert sim.post(body()).status_code == 200
    assert sim.stop() == 0
    assert "Traceback" not in sim.stderr_path.read_text()


# --------------------------------------------------------------------------------------------
# test hooks
# --------------------------------------------------------------------------------------------


def test_requests_are_recorded(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--name", "recorder")
    payload = body("record me")
    sim.post(payload, headers={"Anthropic-Version": "2023-06-01", "anthropic-beta": "tools-2024"})
    sim.post({"model": MODEL, "messages": payload["messages"]}, path="/v1/messages/count_tokens")
    records = sim.get("/_sim/requests").json()["requests"]
    assert [r["path"] for r in records] == ["/v1/messages", "/v1/messages/count_tokens"]
    first = records[0]
    assert first["body"] == payload
    assert first["name"] == "recorder"
    assert first["headers"]["anthropic-version"] == "2023-06-01"
    assert first["headers"]["anthropic-beta"] == "tools-2024"
    assert first["headers"]["x-api-key"] == "x"
    assert isinstance(first["time"], float) and abs(first["time"] - time.time()) < 60
    assert sim.delete("/_sim/requests").status_code == 200
    assert sim.get("/_sim/requests").json() == {"requests": []}


def test_stats_count_completed_and_aborted_streams(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim()
    stream(sim, body("complete"))
    with sim.post(body("[[sim:stall=1,words=50,token_delay_ms=20]]", stream=True), stream=True) as response:
        first = next(response.iter_content(chunk_size=None))
        assert b"message_start" in first
    stats = sim.wait_stats(lambda s: s["streams_aborted"] == 1 and s["open_streams"] == 0)
    assert stats == {
        "requests": 2,
        "streams_started": 2,
        "streams_completed": 1,
        "streams_aborted": 1,
        "streams_faulted": 0,
        "open_streams": 0,
    }
    sim.delete("/_sim/stats")
    assert sim.stats() == dict.fromkeys(stats, 0)


@pytest.mark.slow
def test_holds_a_thousand_concurrent_slow_streams(start_sim: Callable[..., Sim]) -> None:
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1000 + 200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the open-file limit ({hard}) is too low for 1000 connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    sim = start_sim()
    payload = json.dumps(body("[[sim:stall=20]] slow", stream=True)).encode()
    request = (
        b"POST /v1/messages HTTP/1.1\r\nHost: sim\r\nx-api-key: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    sockets: list[socket.socket] = []
    try:
        for _ in range(1000):
            sock = socket.create_connection(("127.0.0.1", sim.port), timeout=30)
            sock.sendall(request)
            sockets.append(sock)
        stats = sim.wait_stats(lambda s: s["open_streams"] >= 1000, timeout=60)
        assert stats["open_streams"] == 1000
        for sock in sockets[::50]:
            received = b""
            while b"event: ping" not in received:
                chunk = sock.recv(65536)
                assert chunk, "connection closed before the ping"
                received += chunk
            assert b"event: message_start" in received
        assert sim.get("/healthz").status_code == 200
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
