"""Client input never causes a 500: hostile bodies against the real gateway and simulator.

Hypothesis mutates valid bodies of both endpoints (``POST /openai/v1/chat/completions`` and
``POST /v1/messages``, streaming and not): any value replaced by a hostile one (lone surrogates,
huge, negative and fractional numbers, ``NaN``/``Infinity``, nesting far past the limit, wrong
types, empty and huge arrays, null), keys deleted, unknown keys added, duplicate keys, invalid
UTF-8; and it sends random JSON and random bytes. Every answer must be a success or a 4xx in
the dialect's envelope (OpenAI's ``{"error": {...}}`` on /openai/v1, Anthropic's
``{"type": "error", ...}`` on /v1), never a 5xx, never a traceback or an internal path, and the
gateway must log no unexpected error. Bounded: a fixed number of examples per test, each request
under a timeout (Chat Completions reference, "Errors").

Failures are collected rather than raised, so one run reports every distinct problem with the
bodies that caused it (hypothesis' shrinking is not needed to read them).
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, make_url, text

from ezat_compat.app import embedded_limits_path
from tests.integration.conftest import standard_models
from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration

OPENAI_PATH = "/openai/v1/chat/completions"
NATIVE_PATH = "/v1/messages"
EXAMPLES = int(os.environ.get("EZAT_FUZZ_EXAMPLES", "300"))
# A valid 8.7 MB body of 200,000 messages takes 13-14 s in the gateway on an idle 2-core machine
# (validation, translation and encoding); under the suite's 4 processes it took over 30 s once.
TIMEOUT_S = 90
LEAKS = ("Traceback", "/ezat_compat/", '.py"', 'File "', "site-packages")
PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


# ---------------------------------------------------------------- valid bodies to mutate

OPENAI_BASES: list[dict[str, Any]] = [
    {"model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 16},
    {
        "model": "claude-haiku-4-5",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 32,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["\n\n", "END"],
        "n": 1,
        "logprobs": False,
        "top_logprobs": 0,
        "seed": 7,
        "user": "u-1",
        "metadata": {"k": "v"},
        "prompt_cache_key": "conv-1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Really brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?", "cache_control": {"type": "ephemeral"}},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1PX}", "detail": "low"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": '{"q": "png"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a pixel"}]},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "look",
                    "description": "Look something up.",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                    "strict": False,
                },
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    },
    {
        "model": "claude-sonnet-5-5",
        "stream": True,
        "reasoning_effort": "low",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Answer in JSON."}]}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "answer",
                "strict": True,
                "schema": {
                    "type": "object",
                    "properties": {"answer": {"type": "string"}, "score": {"type": "integer", "minimum": 0}},
                    "required": ["answer", "score"],
                    "additionalProperties": False,
                },
            },
        },
    },
    {
        "model": "claude-haiku-4-5",
        "max_completion_tokens": 64,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "messages": [
            {"role": "user", "content": "Call f."},
            {"role": "assistant", "content": "Sure:"},
        ],
    },
]

NATIVE_BASES: list[dict[str, Any]] = [
    {"model": "claude-sonnet-5-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    {
        "model": "claude-haiku-4-5",
        "max_tokens": 2048,
        "stream": True,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": "u-1"},
        "stop_sequences": ["END"],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX}},
                ],
            },
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a pixel"}],
            },
        ],
        "tools": [
            {
                "name": "look",
                "description": "Look something up.",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            }
        ],
        "tool_choice": {"type": "auto"},
    },
    {
        "model": "claude-haiku-4-5",
        "max_tokens": 32,
        "temperature": 0.3,
        "top_k": 5,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}],
    },
    {
        "model": "claude-sonnet-5-5",
        "max_tokens": 64,
        "stream": True,
        "output_config": {"effort": "low"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    },
]


# ---------------------------------------------------------------- hostile values


@dataclass(frozen=True)
class Raw:
    """JSON text (or bytes that are not UTF-8) put into the body as is, where no Python value
    serialises to it: ``NaN``, ``1e400``, 5,000-digit integers, deep nesting, ``\\xff``."""

    data: bytes


def deep(levels: int, opener: str = "[") -> Raw:
    closer = "]" if opener == "[" else "}"
    inner = "[" * levels + "1" + "]" * levels if opener == "[" else '{"a":' * levels + "1" + closer * levels
    return Raw(inner.encode())


HOSTILE_FIXED: list[Any] = [
    "\ud800",
    "x\udfff",
    "\udbff\ud800",  # reversed pair: two lone surrogates
    "",
    " ",
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    0.5,
    -0.0,
    1e-320,
    64.0,
    [],
    {},
    [None],
    {"": None},
    {"type": None},
    [{}],
    "x" * 100_000,
    [0] * 20_000,
    ["a"] * 5_000,
    Raw(b"NaN"),
    Raw(b"Infinity"),
    Raw(b"-Infinity"),
    Raw(b"1e400"),
    Raw(b"-1e400"),
    Raw(b"9" * 5000),
    Raw(b'"\xff\xfe"'),
    Raw(b'"\xed\xa0\x80"'),  # a surrogate encoded as UTF-8 bytes (CESU): not UTF-8
    Raw(b'"\\ud800\\u0041"'),
    deep(199),
    deep(200),
    deep(201),
    deep(1_000),
    deep(5_000),
    deep(199, "{"),
    deep(250, "{"),
    deep(2_000, "{"),
]

# JSON inside strings (tool call arguments, data URLs): parsed again by the gateway.
JSON_IN_STRINGS = [
    '{"a": NaN}',
    '{"a": 1e400}',
    '{"a": "\\ud800"}',
    "[" * 5_000 + "]" * 5_000,
    '{"a": ' + "[" * 300 + "]" * 300 + "}",
    "{" * 3,
    "data:image/png;base64,",
    "data:image/png;base64,!!!!",
    "data:;base64," + "A" * 64,
    "data:application/pdf;base64,JVBERi0=",
]
HOSTILE_FIXED += JSON_IN_STRINGS


def same_type(value: Any) -> st.SearchStrategy[Any]:
    """Hostile values of the type a field already has, so that more bodies pass the schema and
    reach translation, admission and the upstream."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.sampled_from([0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(10**30)]) | st.integers()
    if isinstance(value, float):
        return st.sampled_from([0.0, -0.0, 1e308, -1e308, 1e-320, 2.0, 1.0000001]) | st.floats(allow_nan=False)
    if isinstance(value, str):
        strings = ["", " ", "x" * 100_000, "\ud800", "a\udc00b", "\u0000", "é" * 50, *JSON_IN_STRINGS]
        return st.sampled_from([*strings, Raw(b'"\xed\xa0\x80"'), Raw(b'"\xff"'), Raw(b'"\\udfff"')]) | st.text()
    if isinstance(value, list):
        return st.sampled_from([[], value * 500, [*value, *value]]) if value else st.just([None])
    if isinstance(value, dict):
        return st.sampled_from([{}, {**value, "unknown": 1}, {k: v for k, v in list(value.items())[1:]}])
    return st.none()


json_leaves = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
)
random_json = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
surrogate_text = st.text(st.characters(categories=("Cs", "Lu", "Nd", "Zs")), min_size=1, max_size=10)
fixed_hostile = st.sampled_from(HOSTILE_FIXED).map(copy.deepcopy)
hostile = fixed_hostile | fixed_hostile | fixed_hostile | random_json | surrogate_text
unknown_key = st.sampled_from(["x", "extra", "type", "role", "content", "text", "\ud800", ""]) | st.text(max_size=8)


# ---------------------------------------------------------------- mutation


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every location in a body, the body itself included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def _parent(body: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        body = body[part]
    return body


@st.composite
def mutated(draw: st.DrawFn, bases: list[dict[str, Any]]) -> Any:
    """A valid body with one to three hostile changes."""
    body: Any = json.loads(json.dumps(draw(st.sampled_from(bases))))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        locations = list(paths(body))
        path = draw(st.sampled_from(locations))
        action = draw(st.sampled_from(["typed"] * 4 + ["replace"] * 3 + ["delete", "add", "wrap"]))
        if not path:
            if action in ("typed", "replace", "wrap"):
                body = draw(hostile) if action == "replace" else [body]
                continue
            action = "add"
        if action == "add":
            target = _parent(body, (*path, None)) if path else body
            if isinstance(target, dict):
                target[draw(unknown_key)] = draw(hostile)
            elif isinstance(target, list):
                target.append(draw(hostile))
            continue
        parent, last = _parent(body, path), path[-1]
        if action == "delete":
            del parent[last]
        elif action == "typed":
            parent[last] = copy.deepcopy(draw(same_type(parent[last])))
        elif action == "wrap":
            parent[last] = draw(st.sampled_from([[parent[last]], {"value": parent[last]}]))
        else:
            parent[last] = draw(hostile)
    return body


def encode(body: Any) -> bytes:
    """``body`` as JSON bytes (ASCII escapes, so a lone surrogate travels as ``\\ud800``), each
    ``Raw`` spliced in where it stands."""
    raws: list[bytes] = []

    def marker(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.data)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(value, dict):
            return {(marker(k) if isinstance(k, Raw) else k): marker(v) for k, v in value.items()}
        if isinstance(value, list):
            return [marker(v) for v in value]
        return value

    text = json.dumps(marker(body)).encode()
    for index, data in enumerate(raws):
        text = text.replace(f'"\\u0000raw{index}\\u0000"'.encode(), data, 1)
    return text


@st.composite
def hostile_bytes(draw: st.DrawFn, bases: list[dict[str, Any]]) -> bytes:
    """A mutated body as bytes, sometimes with a duplicated key (the last one wins) or cut short."""
    raw = encode(draw(mutated(bases)))
    twist = draw(st.sampled_from(["none", "none", "none", "duplicate", "truncate"]))
    if twist == "duplicate" and raw.startswith(b"{") and len(raw) > 2:
        key = draw(st.sampled_from(["model", "max_tokens", "messages", "stream", "max_completion_tokens", "system"]))
        raw = raw[:-1] + b"," + json.dumps(key).encode() + b":" + encode(draw(hostile)) + b"}"
    elif twist == "truncate" and len(raw) > 1:
        raw = raw[: draw(st.integers(1, len(raw) - 1))]
    return raw


# ---------------------------------------------------------------- the checks


def _sse_data(text: str) -> Iterator[str]:
    for line in text.splitlines():
        if line.startswith("data:"):
            yield line[5:].strip()


def problems(dialect: str, response: requests.Response) -> list[str]:
    """What is wrong with one answer (empty when it is a success or a proper 4xx)."""
    found = []
    text = response.content.decode("utf-8", "replace")
    status = response.status_code
    if status >= 500:
        found.append(f"status {status}")
    found += [f"leaks {leak!r}" for leak in LEAKS if leak in text]
    if status == 200 and response.headers.get("content-type", "").startswith("text/event-stream"):
        for data in _sse_data(text):
            if data == "[DONE]":
                continue
            event = json.loads(data)
            error = event.get("error") if dialect == "openai" else (event if event.get("type") == "error" else None)
            if error is not None:
                found.append(f"stream error event {data[:300]}")
        return found
    try:
        body = json.loads(text)
    except ValueError:
        return [*found, f"not JSON: {text[:200]!r}"]
    if status == 200:
        expected = "chat.completion" if dialect == "openai" else "message"
        if body.get("object" if dialect == "openai" else "type") != expected:
            found.append(f"200 that is no {expected}")
        return found
    if dialect == "openai":
        error = body.get("error") if isinstance(body, dict) else None
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
        ok = ok and "param" in error and "code" in error
    else:
        error = body.get("error") if isinstance(body, dict) else None
        ok = body.get("type") == "error" and isinstance(error, dict)
        ok = ok and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)
    if not ok:
        found.append("body outside the envelope")
    return found


@dataclass
class Fuzzer:
    gateway: Gateway
    key: str
    http: requests.Session
    examples: int = EXAMPLES
    sent: int = 0

    def __post_init__(self) -> None:
        self.failures: dict[str, list[str]] = {}
        self.statuses: dict[int, int] = {}
        self.logged = len(self.gateway.log_text())

    def send(self, dialect: str, raw: bytes) -> None:
        path = OPENAI_PATH if dialect == "openai" else NATIVE_PATH
        headers = {"authorization": f"Bearer {self.key}", "content-type": "application/json"}
        self.sent += 1
        try:
            response = self.http.post(self.gateway.url + path, data=raw, headers=headers, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            self.failures.setdefault(f"{dialect}: no answer ({type(exc).__name__})", []).append(repr(raw[:300]))
            self._save(path, raw)
            return
        self.statuses[response.status_code] = self.statuses.get(response.status_code, 0) + 1
        for problem in problems(dialect, response):
            self.failures.setdefault(f"{dialect}: {problem}", []).append(
                f"{raw[:300]!r} -> {response.status_code} {response.text[:300]!r}"
            )
            self._save(path, raw)

    def _save(self, path: str, raw: bytes) -> None:
        """The whole body, to replay (``body`` holds the bytes as latin-1)."""
        with (self.gateway.root / "fuzz-failures.jsonl").open("ab") as saved:
            saved.write(json.dumps({"path": path, "body": raw.decode("latin-1")}).encode() + b"\n")

    def check(self) -> None:
        """No bad answer, and nothing unexpected in the gateway's log since this test began."""
        print(f"{self.sent} bodies sent, statuses {sorted(self.statuses.items())}")
        assert self.sent > 0
        log = self.gateway.log_text()[self.logged :]
        assert not self.failures, self.report() + "\n" + log[-4000:]
        assert "Traceback" not in log and "unexpected error" not in log, log[-4000:]

    def report(self) -> str:
        lines = [f"{len(v)} x {k}\n    " + "\n    ".join(v[:3]) for k, v in sorted(self.failures.items())]
        head = f"{sum(map(len, self.failures.values()))} bad answers of {self.sent}"
        return f"{head} (bodies in {self.gateway.root / 'fuzz-failures.jsonl'}):\n" + "\n".join(lines)


# ---------------------------------------------------------------- servers


@dataclass(frozen=True)
class Served:
    gateway: Gateway
    key: str
    examples: int


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The gateway (with its own simulator) on SQLite, then on PostgreSQL in a schema of its own
    (numbers reach the database differently: SQLite's INTEGER is 64-bit, PostgreSQL's BIGINT too)."""
    root: Path = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    with ExitStack() as cleanup:
        settings_: dict[str, Any] = {"keepalive_s": 1}
        env: dict[str, str] = {}
        if request.param == "postgresql":
            base = request.getfixturevalue("postgres_url")
            schema = f"ezat_fuzz_{uuid.uuid4().hex[:12]}"
            admin = create_engine(base)
            cleanup.callback(admin.dispose)
            with admin.begin() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            cleanup.callback(lambda: _drop_schema(admin, schema))
            url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
            settings_["database_url"] = env["EZAT_DATABASE_URL"] = url.render_as_string(hide_password=False)
            counters = embedded_limits_path(settings_["database_url"], str(root))
            for suffix in ("", "-wal", "-shm"):
                cleanup.callback(Path(counters + suffix).unlink, missing_ok=True)
        sim = Sim(name="sim-a", flags=("--min-cache-tokens", "16")).start()
        cleanup.callback(sim.stop)
        gateway = Gateway(root=root, models=standard_models(sim.url), gateway_settings=settings_, env=env)
        cleanup.callback(gateway.stop)
        gateway.start()
        # PostgreSQL runs a third of the examples: the rules are the same, the 2-core budget is not.
        examples = EXAMPLES if request.param == "sqlite" else max(EXAMPLES // 3, 1)
        yield Served(gateway, gateway.new_key("fuzz", balance="100000"), examples)


def _drop_schema(admin: Engine, schema: str) -> None:
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def fuzzer(served: Served) -> Iterator[Fuzzer]:
    with requests.Session() as http:
        yield Fuzzer(served.gateway, served.key, http, examples=served.examples)


FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_mutated_bodies_never_cause_a_500(fuzzer: Fuzzer, dialect: str) -> None:
    bases = OPENAI_BASES if dialect == "openai" else NATIVE_BASES

    @settings(FUZZ, max_examples=fuzzer.examples)
    @given(raw=hostile_bytes(bases))
    def run(raw: bytes) -> None:
        fuzzer.send(dialect, raw)

    run()
    fuzzer.check()


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_random_bodies_never_cause_a_500(fuzzer: Fuzzer, dialect: str) -> None:
    objects = st.dictionaries(
        st.sampled_from(["model", "messages", "max_tokens", "stream", "system", "tools", "metadata"])
        | st.text(max_size=6),
        hostile,
        max_size=6,
    )

    @settings(FUZZ, max_examples=max(fuzzer.examples // 3, 1))
    @given(raw=st.binary(max_size=64) | objects.map(encode) | hostile.map(encode))
    def run(raw: bytes) -> None:
        fuzzer.send(dialect, raw)

    run()
    fuzzer.check()


def test_the_valid_bases_succeed(served: Served) -> None:
    """The fuzzer starts from bodies the gateway accepts (else it would only test refusals)."""
    gateway = served.gateway
    headers = {"authorization": f"Bearer {served.key}"}
    for path, bases in ((OPENAI_PATH, OPENAI_BASES), (NATIVE_PATH, NATIVE_BASES)):
        for base in bases:
            response = requests.post(gateway.url + path, json=base, headers=headers, timeout=TIMEOUT_S)
            assert response.status_code == 200, (base, response.text)
