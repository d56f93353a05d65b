"""What the two cloud dialects (``bedrock_invoke``, ``vertex_predict``) share: a cloud's body
made into the native Messages body, and the model named in the URL found in the catalog.

A cloud's body is Anthropic's Messages body without ``model`` (it is in the URL), with the
cloud's ``anthropic_version`` ("bedrock-2023-05-31", "vertex-2023-10-16") and, on Bedrock, the
betas as ``anthropic_beta`` (Anthropic, "Claude on Amazon Bedrock", "Claude on Vertex AI"; Claude
Code's "LLM gateway configuration": a gateway must keep both). The version names the cloud's
body format, not an API version: each deployment is sent its own ``anthropic-version``, as for
native clients. The betas of the body and of the ``anthropic-beta`` header (Claude Code sends
both) go upstream together, through the same per-provider filter as native requests'.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ezat_compat.dialects import Headers, Resolve
from ezat_compat.domain import Model
from ezat_compat.errors import GatewayError, InvalidRequestError, ModelNotFoundError

CLOUD_FIELDS = ("anthropic_version", "anthropic_beta", "model", "stream")  # never go upstream as sent


class HeaderView:
    """The request's headers with some fields replaced (None: absent), looked up in any case."""

    __slots__ = ("_headers", "_overrides")

    def __init__(self, headers: Headers, overrides: Mapping[str, str | None]) -> None:
        self._headers = headers
        self._overrides = {k.lower(): v for k, v in overrides.items()}

    def get(self, key: str, /) -> str | None:
        lowered = key.lower()
        if lowered in self._overrides:
            return self._overrides[lowered]
        return self._headers.get(key)


def checked_version(body: Mapping[str, Any], cloud: str, expected: str, *, required: bool) -> None:
    """``anthropic_version`` as the cloud takes it: ``<cloud>-YYYY-MM-DD`` (``expected`` is the one
    published) or an API version's date (the ``anthropic`` SDK 2.x's ``AnthropicVertex`` sends
    ``2026-10-21``); missing (when ``required``) or anything else is a 400 naming the field."""
    version = body.get("anthropic_version")
    if version is None:
        if required:
            raise InvalidRequestError(
                f"anthropic_version: Field required; send {expected!r}.", param="anthropic_version"
            )
        return
    if not isinstance(version, str) or not re.fullmatch(rf"(?:{cloud}-)?\d{{4}}-\d{{2}}-\d{{2}}", version):
        raise InvalidRequestError(
            f"anthropic_version: {version!r} is not a version of {cloud}'s body format; send {expected!r}.",
            param="anthropic_version",
        )


def merged_betas(body: Mapping[str, Any], headers: Headers) -> str | None:
    """The ``anthropic-beta`` value to forward: the header's betas, then the body's
    ``anthropic_beta`` list (a list of strings, else a 400), each once; None when there are none."""
    listed = body.get("anthropic_beta")
    if listed is not None and (not isinstance(listed, list) or not all(isinstance(b, str) for b in listed)):
        raise InvalidRequestError("anthropic_beta: must be a list of strings.", param="anthropic_beta")
    betas: list[str] = []
    for beta in [*(headers.get("anthropic-beta") or "").split(","), *(listed or ())]:
        beta = beta.strip(" \t")
        if beta and beta not in betas:
            betas.append(beta)
    return ",".join(betas) or None


def native_body(body: Mapping[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    """The native Messages body of a cloud's body: ``model`` in front, the cloud's own fields
    out, ``"stream": true`` for a stream (the URL says so)."""
    native: dict[str, Any] = {"model": model}
    native.update((k, v) for k, v in body.items() if k not in CLOUD_FIELDS)
    if stream:
        native["stream"] = True
    return native


def first_known(resolve: Resolve, names: Sequence[str], not_found: Callable[[], GatewayError]) -> Resolve:
    """A ``resolve`` that tries each of ``names`` (``translate/cloud_models.py``) and takes the
    first the catalog knows; a key that may not use it is a 403 as usual; none known:
    ``not_found()``, in the cloud's words."""

    def resolved(_name: Any) -> Model:
        for name in names:
            try:
                return resolve(name)
            except ModelNotFoundError:
                continue
        raise not_found()

    return resolved


def object_body(body: Any) -> dict[str, Any]:
    """The body as a JSON object; anything else is a 400."""
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    return body
