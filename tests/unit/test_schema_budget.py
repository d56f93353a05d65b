"""Schema inlining capped per request, not per schema: every schema a request
fits (strict tools' parameters, ``response_format``, Responses' strict tools and ``text.format``)
shares one ``SchemaBudget``, so 2,000 strict tools each just under the cap are refused at the
first one that passes it, after about one budget's work, never after 2,000 of them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ezat_compat.config import parse_config
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.request import openai_to_anthropic
from ezat_compat.translate.responses_request import input_items, responses_to_anthropic
from ezat_compat.translate.responses_tools import tools_to_anthropic
from ezat_compat.translate.schema import MAX_INLINED, SchemaBudget, fit_schema, fit_tool_schema
from ezat_compat.wire.openai import load_chat_request
from ezat_compat.wire.responses import load_responses_request
from tests.support.cpu import cpu_spent

MODEL = parse_config(
    {
        "models": [
            {
                "id": "anthropic/test",
                "aliases": ["test"],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "claude-sonnet-5-5"}],
            }
        ]
    }
).models[0]
USER = {"role": "user", "content": "go"}
TOO_MANY = "the request's schemas are too large once their allOf $refs are inlined"
ALONE = "the schema is too large once its allOf $refs are inlined"


def chain(levels: int = 8) -> dict[str, Any]:
    """$defs D0…Dn, each listing the next twice in allOf: ~630 characters that inline to ~74,000
    (~99,000 charged with the definitions' copies), under the cap alone; three of them are not."""
    defs: dict[str, Any] = {
        f"D{i}": {"allOf": [{"$ref": f"#/$defs/D{i + 1}"}, {"$ref": f"#/$defs/D{i + 1}"}]} for i in range(levels)
    }
    defs[f"D{levels}"] = {"type": "object", "properties": {"a": {"type": "string"}}}
    return {"type": "object", "properties": {"x": {"allOf": [{"$ref": "#/$defs/D0"}]}}, "$defs": defs}


def spent_by_one() -> int:
    budget = SchemaBudget()
    fit_schema(chain(), "p", budget)
    return budget.spent


def chat_tool(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "strict": True, "parameters": schema or chain()}}


def chat(extra: dict[str, Any]) -> dict[str, Any]:
    return openai_to_anthropic(load_chat_request({"model": "test", "messages": [USER], **extra}), MODEL).body


def chat_refusal(extra: dict[str, Any]) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        chat(extra)
    assert caught.value.status == 400
    return caught.value


def responses(extra: dict[str, Any]) -> dict[str, Any]:
    req = load_responses_request({"model": "test", "input": "go", **extra})
    return responses_to_anthropic(req, input_items(req), MODEL, unseal=lambda sealed, path: []).body


def responses_refusal(extra: dict[str, Any]) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        responses(extra)
    assert caught.value.status == 400
    return caught.value


def test_one_chain_fits_alone_and_three_pass_the_budget() -> None:
    """The premise of every row below: one schema is well under the cap, three are over it."""
    assert MAX_INLINED // 3 < spent_by_one() < MAX_INLINED // 2


# ---------------------------------------------------------------- the budget itself


def test_a_budget_is_spent_across_schemas_and_refuses_the_one_that_passes_it() -> None:
    budget = SchemaBudget()
    fit_schema(chain(), "a", budget)
    fit_schema(chain(), "b", budget)
    assert budget.spent == 2 * spent_by_one()
    with pytest.raises(InvalidRequestError) as caught:
        fit_schema(chain(), "c", budget)
    assert caught.value.param == "c"
    assert caught.value.message.startswith(f"c: {TOO_MANY} (more than {MAX_INLINED} characters in all")
    assert caught.value.message.endswith("refer to shared definitions with $ref outside allOf, which is sent as is")


def test_without_a_budget_each_schema_has_its_own() -> None:
    for _ in range(5):
        fit_schema(chain(), "p")


def test_a_schema_over_the_budget_alone_is_told_so() -> None:
    budget = SchemaBudget(limit=spent_by_one() - 1)
    with pytest.raises(InvalidRequestError) as caught:
        fit_schema(chain(), "p", budget)
    assert caught.value.message.startswith(f"p: {ALONE} (more than {budget.limit} characters)")


def test_a_tool_over_the_budget_is_named() -> None:
    budget = SchemaBudget(limit=spent_by_one() + 10)
    fit_tool_schema(chain(), "tools[0].function.parameters", "first", budget)
    with pytest.raises(InvalidRequestError) as caught:
        fit_tool_schema(chain(), "tools[1].function.parameters", "second", budget)
    assert caught.value.param == "tools[1].function.parameters"
    assert caught.value.message.endswith('(tool "second")')


def test_the_budget_bounds_what_fitting_adds_definitions_copies_included() -> None:
    """Each copy counts, those of ``$defs`` too: the output is the input (with its few additions,
    ``additionalProperties`` on each object) plus what was charged, never more."""
    schema = chain(9)
    budget = SchemaBudget()
    fitted = fit_schema(schema, "p", budget)
    assert len(json.dumps(fitted, separators=(",", ":"))) <= 3 * len(json.dumps(schema)) + budget.spent
    assert budget.spent <= MAX_INLINED


def test_a_definition_inlined_before_its_own_turn_is_charged_for_its_copy_too() -> None:
    """``A`` inlines ``B`` (fitted there, charged); ``$defs.B`` is then a copy: charged as well,
    exactly its compact JSON."""
    big = {"type": "object", "properties": {f"p{k}": {"type": "string", "description": "d" * 50} for k in range(50)}}
    schema = {"type": "object", "properties": {}, "$defs": {"A": {"allOf": [{"$ref": "#/$defs/B"}]}, "B": big}}
    budget = SchemaBudget()
    fitted = fit_schema(schema, "p", budget)
    size = len(json.dumps(fitted["$defs"]["B"], separators=(",", ":")))
    assert fitted["$defs"]["A"]["allOf"][0] == fitted["$defs"]["B"]
    assert budget.spent == 2 * size


# ---------------------------------------------------------------- one budget per request


def test_chat_strict_tools_share_one_budget() -> None:
    assert len(chat({"tools": [chat_tool("t0"), chat_tool("t1")]})["tools"]) == 2
    exc = chat_refusal({"tools": [chat_tool(f"t{i}") for i in range(5)]})
    assert exc.param == "tools[2].function.parameters"
    assert exc.message.startswith(f"tools[2].function.parameters: {TOO_MANY}")
    assert exc.message.endswith('(tool "t2")')


def test_chat_tools_that_are_not_strict_spend_nothing() -> None:
    loose = [{"type": "function", "function": {"name": f"t{i}", "parameters": chain()}} for i in range(5)]
    assert len(chat({"tools": loose})["tools"]) == 5


def test_chat_response_format_shares_the_tools_budget() -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "out", "schema": chain()}}
    tools = [chat_tool("t0"), chat_tool("t1")]
    assert chat({"tools": tools[:1], "response_format": response_format})["output_config"]["format"]
    exc = chat_refusal({"tools": tools, "response_format": response_format})
    assert exc.param == "response_format.json_schema.schema"
    assert exc.message.startswith(f"response_format.json_schema.schema: {TOO_MANY}")


def test_two_thousand_strict_tools_are_refused_after_one_budget_of_work() -> None:
    """The issue's attack: 2,000 strict tools of a ~630-character chain (1.3 MB). Each inlined
    alone (the old per-schema cap) they took GBs and the worker; now the third is refused, and
    the translation's CPU is the validation's and one budget's."""
    body = load_chat_request({"model": "test", "messages": [USER], "tools": [chat_tool(f"t{i}") for i in range(2000)]})
    with cpu_spent() as spent, pytest.raises(InvalidRequestError) as caught:
        openai_to_anthropic(body, MODEL)
    assert spent.seconds < 0.5  # every tool fitted: ~7 s and GBs
    assert caught.value.param == "tools[2].function.parameters"


def test_responses_strict_tools_and_namespaces_and_text_format_share_one_budget() -> None:
    def tool(name: str) -> dict[str, Any]:
        return {"type": "function", "name": name, "strict": True, "parameters": chain()}

    text = {"format": {"type": "json_schema", "name": "out", "schema": chain()}}
    assert responses({"tools": [tool("a")], "text": text})["output_config"]["format"]
    exc = responses_refusal({"tools": [tool("a"), tool("b")], "text": text})
    assert exc.param == "text.format.schema"
    namespace = {"type": "namespace", "name": "ns", "description": "d", "tools": [tool("c"), tool("d")]}
    exc = responses_refusal({"tools": [tool("a"), namespace]})
    assert exc.param == "tools[1].tools[1].parameters"
    assert exc.message.startswith(f"tools[1].tools[1].parameters: {TOO_MANY}")


def test_responses_tools_take_the_callers_budget() -> None:
    """``tools_to_anthropic`` spends the budget it is given (the request's), or one of its own."""
    tools = [({"type": "function", "name": "t", "strict": True, "parameters": chain()}, "tools[0]", False)]
    budget = SchemaBudget(limit=spent_by_one() + 10)
    for _ in range(3):
        tools_to_anthropic(tools, MODEL, "test")
    tools_to_anthropic(tools, MODEL, "test", budget=budget)
    with pytest.raises(InvalidRequestError):
        tools_to_anthropic(tools, MODEL, "test", budget=budget)
