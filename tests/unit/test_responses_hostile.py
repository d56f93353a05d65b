"""Hostile Responses bodies (docs/responses.md; client input never causes a 500): any JSON in
any field or item answers a 400 naming where, never another error."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ezat_compat.errors import InvalidRequestError
from ezat_compat.pipeline import ClientRequest, Reply
from tests.support.pipeline import MESSAGE, gateway
from tests.support.pipeline import RESPONSES as DIALECT

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
TYPES = st.sampled_from(
    [
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "input_text",
        "input_image",
        "input_file",
        "output_text",
        "function",
        "custom",
        "namespace",
        "web_search",
        "json_schema",
        "text",
        "json_object",
        "user",
        "assistant",
        "system",
    ]
)
KEYS = st.sampled_from(
    [
        "type",
        "role",
        "content",
        "call_id",
        "name",
        "arguments",
        "input",
        "output",
        "text",
        "image_url",
        "file_data",
        "encrypted_content",
        "namespace",
        "tools",
        "parameters",
        "strict",
        "format",
        "schema",
    ]
)
SHAPED = st.recursive(
    SCALARS | TYPES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=16,
)
FIELDS = st.sampled_from(
    [
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "max_output_tokens",
        "temperature",
        "top_p",
        "include",
        "store",
        "stream",
        "background",
        "prompt_cache_key",
        "top_logprobs",
        "user",
    ]
)


def run(body: dict[str, Any]) -> None:
    gw, _, _ = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    raw = json.dumps({"model": "m", **body}).encode()
    try:
        result = gw.handle(DIALECT, ClientRequest(request_id="r1", api_key="k", headers={}, read_body=lambda: raw))
    except InvalidRequestError as err:
        assert err.status == 400 and err.message
        return
    assert isinstance(result, Reply) and json.loads(result.body)["object"] == "response"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(FIELDS, JSON | SHAPED, max_size=4))
def test_any_json_in_the_fields_is_a_400_or_an_answer(fields: dict[str, Any]) -> None:
    run({"input": "hi", **fields, "stream": False})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SHAPED, min_size=1, max_size=4), st.lists(SHAPED, max_size=2))
def test_any_items_and_tools_are_a_400_or_an_answer(items: list[Any], tools: list[Any]) -> None:
    run({"input": [{"role": "user", "content": "hi"}, *items], "tools": tools})
