"""The upstream request body as bytes: serialized once per request, with the deployment's model
put in front per attempt (a failover doesn't re-serialize the whole body)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def with_model(body_without_model: bytes, model: str, *, stream: bool | None = None) -> bytes:
    """Prefix an already serialized JSON object with ``"model"`` (and ``"stream"``), so a
    failover to another deployment doesn't re-serialize the whole body."""
    head = b'{"model":' + json.dumps(model).encode()
    if stream is not None:
        head += b',"stream":' + (b"true" if stream else b"false")
    if body_without_model == b"{}":
        return head + b"}"
    return head + b"," + body_without_model[1:]


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as sent upstream."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
