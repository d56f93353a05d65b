"""The native Anthropic Messages request (``POST /v1/messages``, ``/v1/messages/count_tokens``),
as a marshmallow schema.

Native bodies go to the upstream as the client sent them (but for the model name), and the
upstream judges them in its own words. The gateway refuses only what it needs itself: a body
that is a JSON object with a ``model`` naming a model, in the wording every dialect uses for
the same fault ("model: Not a valid string."). Its other reads — ``stream`` (``true`` streams),
``max_tokens`` (the reservation; not an integer or below 1: the model's maximum) — cope with
any JSON, so a body the upstream would refuse still reaches it, but for an integer
``max_tokens`` above the model's ``max_output_tokens``, which the dialect refuses with the real
API's 400 (``dialects/anthropic_messages.py``). Unknown keys are left to the upstream.
"""

from __future__ import annotations

from typing import Any

from ezat_compat.wire.fields import Loose, StrictStr, refuse
from ezat_compat.wire.loading import load_request

BLANK_MESSAGE = "Must not be blank."


class MessagesRequestSchema(Loose):
    """What the gateway itself reads of a Messages body and can't do without (the rest passes
    through to the upstream, unchanged)."""

    model = StrictStr(required=True, validate=refuse(BLANK_MESSAGE, lambda name: bool(name.strip())))


MESSAGES_REQUEST = MessagesRequestSchema()  # one field: nothing for ByKeys to leave out


def load_messages_request(body: Any) -> dict[str, Any]:
    """Validate a parsed JSON body (the body itself is what goes upstream). Raises
    ``RequestValidationError`` with the first problem."""
    return load_request(MESSAGES_REQUEST, body)
