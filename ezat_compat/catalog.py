"""The model catalog: canonical ids and aliases, and the public views of a model.

Pure: built once from the config. A name matches in any letter case with surrounding
spaces ignored (API reference, "ModelName"); responses echo the name exactly as sent.

An alias with ``*`` in it is a pattern: ``*`` stands for any run of characters (nothing else
is special, so ``claude-opus-4-8[1m]`` is a plain name). A name that is an id or a plain alias
resolves to that model; otherwise the first model, in catalog order, with a pattern that
matches it. ``claude-opus-*`` lets clients that pick their own model names (Claude Code asks
for its default, ``claude-opus-4-8`` in 2.1.197) reach the operator's opus deployment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ezat_compat.domain import Model
from ezat_compat.errors import ModelNotFoundError, PermissionDeniedError

WILDCARD = "*"


def _key(name: str) -> str:
    return name.strip().lower()


def is_pattern(name: str) -> bool:
    """Whether an alias is a pattern (it has a ``*``)."""
    return WILDCARD in name


def compile_pattern(alias: str) -> re.Pattern[str]:
    """The whole-name matcher of a pattern alias, in any letter case: each ``*`` matches any
    run of characters (none included); every other character stands for itself."""
    parts = (re.escape(part) for part in _key(alias).split(WILDCARD))
    return re.compile(".*".join(parts), re.DOTALL)


class Catalog:
    def __init__(self, models: Iterable[Model], *, created: int = 0) -> None:
        self.models: tuple[Model, ...] = tuple(models)
        self.created = created
        self._by_name: dict[str, Model] = {}
        self._patterns: list[tuple[re.Pattern[str], Model]] = []
        for model in self.models:
            for name in (model.id, *model.aliases):
                if is_pattern(name):
                    self._patterns.append((compile_pattern(name), model))
                else:
                    self._by_name[_key(name)] = model

    def resolve(self, name: str) -> Model | None:
        """The model a client's name refers to, or None (the caller answers 404): an id or
        plain alias first, then the first pattern alias that matches the whole name."""
        model = self._by_name.get(name)
        if model is None:
            key = _key(name)
            model = self._by_name.get(key)
            if model is None and key:
                for pattern, candidate in self._patterns:
                    if pattern.fullmatch(key):
                        return candidate
        return model

    def openai_object(self, model: Model) -> dict[str, Any]:
        """OpenAI's ``model`` object (GET /openai/v1/models)."""
        return {"id": model.id, "object": "model", "created": self.created, "owned_by": "anthropic"}

    def openai_list(self, models: Iterable[Model]) -> dict[str, Any]:
        return {"object": "list", "data": [self.openai_object(m) for m in models]}

    def public_entry(self, model: Model) -> dict[str, Any]:
        """One model of GET /api/models: ids, limits, capabilities and prices."""
        price = model.price
        return {
            "id": model.id,
            "aliases": list(model.aliases),
            "contextWindow": model.context_window,
            "maxOutputTokens": model.max_output_tokens,
            "capabilities": {
                "sampling": model.sampling,
                "caching": model.caching,
                "minCacheTokens": model.min_cache_tokens,
                "vision": model.vision,
                "pdf": model.pdf,
                "tools": model.tools,
                "efforts": list(model.efforts),
                "forcedToolChoice": model.forced_tool_choice,
                "thinking": model.thinking,
                "prefill": model.prefill,
                "structuredOutput": model.structured_output,
            },
            "pricing": {
                "currency": "USD",
                "unit": "1M tokens",
                "input": str(price.input),
                "output": str(price.output),
                "cacheWrite": str(price.cache_write),
                "cacheRead": str(price.cache_read),
            },
        }

    def public_catalog(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.public_entry(m) for m in self.models]}


class Caller(Protocol):
    """Who asks (``store.accounts.AuthContext``): may they use a model?"""

    def allows(self, model_id: str, aliases: Sequence[str] = ()) -> bool: ...


class Named(Protocol):
    """Where the names a client sent are recorded (``server.logs.RequestRecord``)."""

    model: str | None
    canonical_model: str | None


class ModelAccess:
    """The catalog as one caller sees it: the ``resolve`` a dialect's parse is given. Called
    with the client's model name, it records the name and the canonical id on ``record``, and
    returns the model; 404 ``ModelNotFoundError`` if no model has that name, 403
    ``PermissionDeniedError`` if the caller may not use it."""

    __slots__ = ("_caller", "_catalog", "_record")

    def __init__(self, catalog: Catalog, caller: Caller, record: Named | None = None) -> None:
        self._catalog = catalog
        self._caller = caller
        self._record = record

    def __call__(self, name: Any) -> Model:
        model = self._catalog.resolve(name) if isinstance(name, str) else None
        record = self._record
        if record is not None:
            record.model = name if isinstance(name, str) else None
            record.canonical_model = model.id if model is not None else None
        if model is None:
            raise ModelNotFoundError(str(name))
        if not self._caller.allows(model.id, model.aliases):
            raise PermissionDeniedError(f"This key may not use the model `{name}`.", param="model")
        return model
