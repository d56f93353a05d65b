"""The legacy Completions request (``POST /openai/v1/completions``), as a marshmallow schema
(docs/clients.md, "Routes"; openai-python ``types/completion_create_params.py``).

One prompt (a string, or an array of exactly one string) becomes one user message of a Chat
Completions request (``translate/completions.py``), so every field chat also has is judged as
chat judges it: ``max_tokens``, ``stop``, ``temperature``, ``top_p``, ``stream`` and
``stream_options``, ``n``, ``logit_bias``; ``user``, ``seed`` and the penalties are ignored.
What has no Messages counterpart is refused naming the field: ``suffix``, ``echo``,
``logprobs``, ``best_of`` above 1.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, validate
from marshmallow.fields import Dict, Nested, Raw

from ezat_compat.translate.completions import prompt_text
from ezat_compat.wire.fields import Loose, StrictBool, StrictInt, StrictNumber, StrictStr, StrOrList, refuse
from ezat_compat.wire.loading import ByKeys, load_request
from ezat_compat.wire.openai import (
    LOGIT_BIAS_MESSAGE,
    LOGPROBS_MESSAGE,
    MODEL_NAME_MAX,
    N_MESSAGE,
    TEMPERATURE_MAX,
    TOP_P_MAX,
    StreamOptionsSchema,
)

PROMPT_MESSAGE = "send one prompt: a string, or an array of one string (token ids are not supported)"
BLANK_PROMPT_MESSAGE = "must not be empty"
SUFFIX_MESSAGE = "text insertion is not supported; send the text before the insertion point as the prompt"
ECHO_MESSAGE = "echoing the prompt is not supported"
BEST_OF_MESSAGE = "only 1 completion per request is supported"


def _prompt(value: Any) -> None:
    text = prompt_text(value)
    if text is None:
        raise ValidationError(PROMPT_MESSAGE)
    if not text or text.isspace():
        raise ValidationError(BLANK_PROMPT_MESSAGE)


class CompletionRequestSchema(Loose):
    model = StrictStr(required=True, validate=validate.Length(min=1, max=MODEL_NAME_MAX))
    prompt = Raw(required=True, validate=_prompt)
    stream = StrictBool(allow_none=True)
    stream_options = Nested(StreamOptionsSchema, allow_none=True)
    max_tokens = StrictInt(validate=validate.Range(min=1), allow_none=True)
    temperature = StrictNumber(validate=validate.Range(min=0, max=TEMPERATURE_MAX), allow_none=True)
    top_p = StrictNumber(validate=validate.Range(min=0, max=TOP_P_MAX), allow_none=True)
    stop = StrOrList(StrictStr(), allow_none=True)
    n = StrictInt(validate=[validate.Range(min=1), refuse(N_MESSAGE, lambda value: value <= 1)], allow_none=True)
    best_of = StrictInt(
        validate=[validate.Range(min=1), refuse(BEST_OF_MESSAGE, lambda value: value <= 1)], allow_none=True
    )
    logprobs = Raw(allow_none=True, validate=refuse(LOGPROBS_MESSAGE))
    echo = StrictBool(allow_none=True, validate=refuse(ECHO_MESSAGE, lambda value: not value))
    suffix = Raw(allow_none=True, validate=refuse(SUFFIX_MESSAGE, lambda value: value == ""))
    logit_bias = Dict(validate=refuse(LOGIT_BIAS_MESSAGE, lambda value: not value), allow_none=True)


COMPLETION_REQUEST = ByKeys(CompletionRequestSchema)


def load_completion_request(body: Any) -> dict[str, Any]:
    """Validate a parsed JSON body. Raises ``RequestValidationError`` with the first problem."""
    return load_request(COMPLETION_REQUEST, body)
