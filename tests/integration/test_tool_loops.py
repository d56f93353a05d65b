"""Agent tool loops with reasoning on, through the real gateway (two gunicorn workers) and the
strict simulator: the thinking blocks of each reply are kept server-side (SQLite, or PostgreSQL
with the stash in Redis) and put back at the start of every assistant tool turn of the next
round, so thinking is requested on every round and the prompt prefix, hence its cache, stays
the same from round to round (Chat Completions reference, "Reasoning": the thinking text isn't
returned; Anthropic's extended-thinking guide, "Preserving thinking blocks": "a final
`assistant` message must start with a thinking block"). When the kept blocks are gone the
request goes without thinking and still succeeds.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import redis
from sqlalchemy import Engine, create_engine, delete, func, select

from ezat_compat.store.tables import thinking_stash
from tests.integration.conftest import standard_models
from tests.integration.harness import Gateway, Sim
from tests.support.stacks import postgres_schema
from tests.support.tool_loops import TOOLS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "anthropic/claude-sonnet-5-5"
ROUNDS = 5  # tool-calling rounds; one more request gets the final answer
REDIS_DB = 12  # a database number no other suite uses; flushed before and after
ACCESS_FORMAT = "%(p)s %({request-id}o)s %(s)s"
SYSTEM = "You are a weather agent. Call one tool per round until the user's checklist is done. " * 8
CITIES = ("Oslo", "Paris", "Tōkyō", "Lima", "Nairobi")
STACKS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql+redis", id="postgresql+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
]


def ask_for(city: str) -> str:
    """A user text that makes the simulator call ``get_weather`` for ``city``."""
    return f"Next on the checklist: {city}. [[sim:tool=get_weather,args={json.dumps({'city': city})}]]"


@dataclass
class Stack:
    kind: str
    gateway: Gateway
    engine: Engine
    redis: redis.Redis | None
    key: str = ""
    access_log: Path = field(default_factory=Path)

    def workers_of(self, request_ids: list[str], timeout_s: float = 5) -> dict[str, str]:
        """request id -> pid of the worker that answered it (gunicorn's access log)."""
        wanted = set(request_ids)
        deadline = time.monotonic() + timeout_s
        while True:
            found: dict[str, str] = {}
            if self.access_log.exists():
                for line in self.access_log.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 3 and parts[1] in wanted:
                        found[parts[1]] = parts[0]
            if len(found) == len(wanted) or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def kept_count(self) -> int:
        """How many tool ids have kept thinking (in Redis when configured, else the table)."""
        if self.redis is not None:
            return len(list(self.redis.scan_iter(match="ezat:th:*")))
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(thinking_stash)).scalar_one())

    def forget_thinking(self) -> None:
        """Every kept block gone, as after ``thinking_ttl_s``."""
        if self.redis is not None:
            keys = list(self.redis.scan_iter(match="ezat:th:*"))
            if keys:
                self.redis.delete(*keys)
        with self.engine.begin() as conn:
            conn.execute(delete(thinking_stash))


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest, sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"loops-{kind.replace('+', '-')}")
    database_url = f"sqlite:///{(root / 'ezat.db').as_posix()}"
    redis_url = ""
    redis_client: redis.Redis | None = None
    with ExitStack() as cleanup:
        if kind.startswith("postgresql"):
            database_url = postgres_schema(cleanup, request.getfixturevalue("postgres_url"), "ezat_loops")
        if kind.endswith("+redis"):
            redis_url = urlsplit(request.getfixturevalue("redis_url"))._replace(path=f"/{REDIS_DB}").geturl()
            redis_client = redis.Redis.from_url(redis_url)
            cleanup.callback(redis_client.close)
            cleanup.callback(redis_client.flushdb)
            redis_client.flushdb()
        access_log = root / "access.log"
        gateway = Gateway(
            root=root,
            models=standard_models(sim.url),
            workers=2,
            gateway_settings={"keepalive_s": 1, "database_url": database_url, "redis_url": redis_url},
            env={
                "EZAT_DATABASE_URL": database_url,
                "EZAT_REDIS_URL": redis_url,
                "EZAT_ACCESS_LOG": str(access_log),
                "GUNICORN_CMD_ARGS": f"--access-logformat '{ACCESS_FORMAT}'",
            },
        )
        cleanup.callback(gateway.stop)
        gateway.start()
        engine = create_engine(database_url)
        cleanup.callback(engine.dispose)
        found = Stack(kind=kind, gateway=gateway, engine=engine, redis=redis_client, access_log=access_log)
        found.key = gateway.new_key("loops")
        yield found


@dataclass
class Round:
    """One answer of the loop, as the OpenAI client saw it."""

    request_id: str
    finish_reason: str | None
    content: str | None
    tool_calls: list[dict[str, Any]]
    prompt_tokens: int
    cached_tokens: int
    reasoning_tokens: int


def _client(stack: Stack) -> openai.OpenAI:
    """A fresh client (a fresh connection: any of the two workers may take the round)."""
    return openai.OpenAI(base_url=stack.gateway.url + "/openai/v1", api_key=stack.key, max_retries=0, timeout=30)


def _round(stack: Stack, messages: list[Any], stream: bool) -> Round:
    params: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "tools": TOOLS,
        "reasoning_effort": "high",
        "max_completion_tokens": 4000,
    }
    with _client(stack) as client:
        if not stream:
            raw = client.chat.completions.with_raw_response.create(**params)
            completion = raw.parse()
            choice = completion.choices[0]
            usage = completion.usage
            assert usage is not None and usage.prompt_tokens_details is not None
            assert usage.completion_tokens_details is not None
            return Round(
                request_id=raw.headers["request-id"],
                finish_reason=choice.finish_reason,
                content=choice.message.content,
                tool_calls=[
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in choice.message.tool_calls or []
                    if c.type == "function"
                ],
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.prompt_tokens_details.cached_tokens or 0,
                reasoning_tokens=usage.completion_tokens_details.reasoning_tokens or 0,
            )
        with client.chat.completions.with_streaming_response.create(
            **params, stream=True, stream_options={"include_usage": True}
        ) as response:
            request_id = response.headers["request-id"]
            content, finish, calls, usage_seen = "", None, {}, None
            for chunk in response.parse():
                if chunk.usage is not None:
                    usage_seen = chunk.usage
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    finish = choice.finish_reason or finish
                    for delta in choice.delta.tool_calls or []:
                        call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                        call["id"] += delta.id or ""
                        if delta.function is not None:
                            call["name"] += delta.function.name or ""
                            call["arguments"] += delta.function.arguments or ""
        assert usage_seen is not None and usage_seen.prompt_tokens_details is not None
        assert usage_seen.completion_tokens_details is not None
        return Round(
            request_id=request_id,
            finish_reason=finish,
            content=content or None,
            tool_calls=[
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(calls.items())
            ],
            prompt_tokens=usage_seen.prompt_tokens,
            cached_tokens=usage_seen.prompt_tokens_details.cached_tokens or 0,
            reasoning_tokens=usage_seen.completion_tokens_details.reasoning_tokens or 0,
        )


def run_loop(stack: Stack, stream: bool, forget_before: int | None = None) -> list[Round]:
    """``ROUNDS`` tool rounds (one ``get_weather`` call each, its result sent back with the next
    checklist item), then the final answer. ``forget_before=N``: the kept thinking is dropped
    just before round N (1-based)."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask_for(CITIES[0])}]
    rounds: list[Round] = []
    for n in range(1, ROUNDS + 2):
        if forget_before == n:
            stack.forget_thinking()
            assert stack.kept_count() == 0
        answer = _round(stack, messages, stream)
        rounds.append(answer)
        if n > ROUNDS:
            break
        assert answer.finish_reason == "tool_calls", (n, answer)
        assert answer.content is None  # the thinking text never reaches the client
        assert len(answer.tool_calls) == 1
        call = answer.tool_calls[0]
        assert json.loads(call["function"]["arguments"]) == {"city": CITIES[n - 1]}
        messages.append({"role": "assistant", "content": None, "tool_calls": answer.tool_calls})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{CITIES[n - 1]}: 9°C, clear"})
        if n < ROUNDS:
            messages.append({"role": "user", "content": ask_for(CITIES[n])})
    final = rounds[-1]
    assert final.finish_reason == "stop" and final.content is not None
    assert f"{CITIES[-1]}: 9°C, clear" in final.content
    return rounds


def _tool_turns(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [
        m["content"]
        for m in body["messages"]
        if m["role"] == "assistant" and any(b.get("type") == "tool_use" for b in m["content"])
    ]


def _loop_with_both_workers(stack: Stack, sim: Sim, stream: bool, most: int = 6) -> tuple[list[Round], list[Any]]:
    """Run the loop (on fresh connections) until one loop had rounds answered by both workers:
    the thinking a worker kept was found by the other one."""
    for _attempt in range(most):
        sim.clear()
        rounds = run_loop(stack, stream)
        workers = stack.workers_of([r.request_id for r in rounds])
        assert len(workers) == len(rounds), "every round must be in the access log"
        if len(set(workers.values())) == 2:
            return rounds, sim.bodies()
    raise AssertionError(f"one worker answered every round of {most} loops")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_five_rounds_with_thinking_on_every_round(stack: Stack, sim: Sim, stream: bool) -> None:
    rounds, bodies = _loop_with_both_workers(stack, sim, stream)
    assert len(bodies) == len(rounds), "each round reached the upstream once, and was accepted"
    for n, (answer, body) in enumerate(zip(rounds, bodies, strict=True), start=1):
        assert body["thinking"] == {"type": "adaptive"}, f"round {n}: thinking must be requested"
        assert body["output_config"]["effort"] == "high"
        assert answer.reasoning_tokens > 0, f"round {n}: the upstream thought"
        turns = _tool_turns(body)
        assert len(turns) == n - 1
        for turn in turns:  # every earlier tool turn starts with its own thinking, as the upstream signed it
            assert turn[0]["type"] == "thinking" and turn[0]["signature"], (n, turn)
            assert [b["type"] for b in turn] == ["thinking", "tool_use"]
    # The blocks put back are the ones the upstream sent: the same turn carries the same block
    # byte for byte from one round to the next (the prompt prefix doesn't change).
    for before, after in itertools.pairwise(bodies[1:]):
        for old, new in zip(_tool_turns(before), _tool_turns(after), strict=False):
            assert json.dumps(old[0], sort_keys=True) == json.dumps(new[0], sort_keys=True)
    # Cache reads of round N cover every round before it: the prompt of round N-1 is read back.
    for previous, answer in itertools.pairwise(rounds):
        assert answer.prompt_tokens > previous.prompt_tokens
        assert answer.cached_tokens >= previous.prompt_tokens, (previous, answer)
    assert rounds[-1].cached_tokens > rounds[1].cached_tokens > 0
    if stack.redis is not None:  # the stash is in Redis, not the database, when Redis is configured
        assert stack.kept_count() > 0
        with stack.engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(thinking_stash)).scalar_one() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_loop_succeeds_when_the_kept_thinking_is_gone(stack: Stack, sim: Sim, stream: bool) -> None:
    sim.clear()
    forget = 3
    rounds = run_loop(stack, stream, forget_before=forget)
    bodies = sim.bodies()
    assert len(bodies) == len(rounds)
    for n, body in enumerate(bodies, start=1):
        if n < forget:
            assert body["thinking"] == {"type": "adaptive"}, n
        else:  # the last tool turn's thinking is unknown: thinking off, so the upstream accepts it
            assert "thinking" not in body, n
            assert body["output_config"]["effort"] == "high"
        # never invented: an assistant tool turn starts with thinking only where the upstream sent one
        for k, turn in enumerate(_tool_turns(body), start=1):
            assert (turn[0]["type"] == "thinking") == (k < forget and n < forget), (n, k, turn)
