"""Validate that a request body is one Anthropic accepts, with the official ``anthropic``
SDK's request types (a test dependency only).

Two checks: pydantic validates the body against the SDK's ``MessageCreateParamsNonStreaming``
(iterables are validated lazily, so the result is consumed), and every object's keys are
checked against the keys of the SDK's *param* TypedDict for that object (pydantic would
otherwise drop unknown keys, or match a response model that allows extras).

``temperature``, ``top_p`` and ``top_k`` are not in this SDK's types: API version 2026-10-21
removed them, but the gateway's deployments speak ``anthropic-version: 2023-06-01``, where
they are valid for the models whose ``sampling`` is true; they are checked by hand.
"""

from __future__ import annotations

import collections.abc
import functools
from types import SimpleNamespace
from typing import Any

from tests.support.heap import freeze_what_is_loaded

LEGACY_SAMPLING = {"temperature", "top_p", "top_k"}


@functools.cache
def _sdk() -> SimpleNamespace:
    """The SDK's types and the tables of them, at the first validation: importing the ``anthropic``
    SDK takes seconds, which a test module that validates nothing (and its collection) doesn't pay."""
    from anthropic.types import (
        Base64ImageSourceParam,
        Base64PDFSourceParam,
        CacheControlEphemeralParam,
        DocumentBlockParam,
        ImageBlockParam,
        OutputConfigParam,
        TextBlockParam,
        ThinkingConfigAdaptiveParam,
        ThinkingConfigEnabledParam,
        ToolChoiceAnyParam,
        ToolChoiceAutoParam,
        ToolChoiceNoneParam,
        ToolChoiceToolParam,
        ToolParam,
        ToolResultBlockParam,
        ToolUseBlockParam,
        URLPDFSourceParam,
    )
    from anthropic.types.assistant_message_param import AssistantMessageParam
    from anthropic.types.json_output_format_param import JSONOutputFormatParam
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
    from anthropic.types.user_message_param import UserMessageParam
    from pydantic import TypeAdapter

    adapter = TypeAdapter(MessageCreateParamsNonStreaming)
    freeze_what_is_loaded()  # the SDK's types and validators: for the process's life
    return SimpleNamespace(
        adapter=adapter,
        request=MessageCreateParamsNonStreaming,
        user=UserMessageParam,
        assistant=AssistantMessageParam,
        text=TextBlockParam,
        tool=ToolParam,
        cache_control=CacheControlEphemeralParam,
        output_config=OutputConfigParam,
        json_output_format=JSONOutputFormatParam,
        blocks={
            "text": TextBlockParam,
            "image": ImageBlockParam,
            "document": DocumentBlockParam,
            "tool_use": ToolUseBlockParam,
            "tool_result": ToolResultBlockParam,
        },
        sources={
            ("image", "base64"): Base64ImageSourceParam,
            ("document", "base64"): Base64PDFSourceParam,
            ("document", "url"): URLPDFSourceParam,
        },
        tool_choices={
            "auto": ToolChoiceAutoParam,
            "any": ToolChoiceAnyParam,
            "tool": ToolChoiceToolParam,
            "none": ToolChoiceNoneParam,
        },
        thinking={"adaptive": ThinkingConfigAdaptiveParam, "enabled": ThinkingConfigEnabledParam},
    )


def _keys(typed_dict: Any) -> set[str]:
    return set(typed_dict.__required_keys__) | set(typed_dict.__optional_keys__)


def _consume(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _consume(v) for k, v in value.items()}
    if isinstance(value, list | tuple | collections.abc.Iterator):
        return [_consume(v) for v in value]
    return value


def _check(obj: Any, typed_dict: Any, path: str, problems: list[str]) -> None:
    assert isinstance(obj, dict), f"{path}: not an object"
    unknown = set(obj) - _keys(typed_dict)
    problems.extend(f"{path}.{k}" for k in sorted(unknown))
    if "cache_control" in obj and obj["cache_control"] is not None:
        _check(obj["cache_control"], _sdk().cache_control, f"{path}.cache_control", problems)


def _check_block(block: dict[str, Any], path: str, problems: list[str]) -> None:
    kind = block.get("type")
    typed = _sdk().blocks.get(kind)
    if typed is None:
        problems.append(f"{path}.type={kind!r}")
        return
    _check(block, typed, path, problems)
    source = block.get("source")
    if isinstance(source, dict):
        typed_source = _sdk().sources.get((kind, source.get("type")))
        if typed_source is None:
            problems.append(f"{path}.source.type={source.get('type')!r}")
        else:
            _check(source, typed_source, f"{path}.source", problems)
    if kind == "tool_result" and isinstance(block.get("content"), list):
        for i, inner in enumerate(block["content"]):
            _check_block(inner, f"{path}.content[{i}]", problems)


def validate_anthropic_request(body: dict[str, Any]) -> None:
    """Raise unless ``body`` (with or without ``stream``) is a valid ``MessageCreateParams``."""
    body = dict(body)
    body.pop("stream", None)
    body.setdefault("model", "claude-sonnet-5-5")
    sampling = {k: body.pop(k) for k in list(body) if k in LEGACY_SAMPLING}
    for name, value in sampling.items():
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{name} must be a number"
        assert 0 <= value <= 1, f"{name} out of range"
    assert not {"temperature", "top_p"} <= set(sampling), "temperature and top_p together"
    sdk = _sdk()
    _consume(sdk.adapter.validate_python(body))
    problems: list[str] = []
    _check(body, sdk.request, "", problems)
    for i, message in enumerate(body["messages"]):
        role_type = sdk.user if message["role"] == "user" else sdk.assistant
        _check(message, role_type, f"messages[{i}]", problems)
        if isinstance(message["content"], list):
            for j, block in enumerate(message["content"]):
                _check_block(block, f"messages[{i}].content[{j}]", problems)
    if isinstance(body.get("system"), list):
        for i, block in enumerate(body["system"]):
            _check(block, sdk.text, f"system[{i}]", problems)
    for i, tool in enumerate(body.get("tools", [])):
        _check(tool, sdk.tool, f"tools[{i}]", problems)
    if "tool_choice" in body:
        _check(body["tool_choice"], sdk.tool_choices[body["tool_choice"]["type"]], "tool_choice", problems)
    if "thinking" in body:
        _check(body["thinking"], sdk.thinking[body["thinking"]["type"]], "thinking", problems)
    if "output_config" in body:
        _check(body["output_config"], sdk.output_config, "output_config", problems)
        if "format" in body["output_config"]:
            _check(body["output_config"]["format"], sdk.json_output_format, "output_config.format", problems)
    assert not problems, f"fields the anthropic SDK does not define: {problems}"
