"""Anthropic API versions as data: what each ``anthropic-version`` refuses, and a request shaped
for the version of the deployment it goes to.

Each deployment speaks one configured version (``Deployment.anthropic_version``); a request of
any dialect is shaped for it on each attempt (``shape_for_version``), so a failover across
deployments of different versions never sends one a field its version refuses. Two kinds of
row, as the Chat Completions reference treats sampling:

- ``drop``: a field the version refuses that the spec already lets the gateway drop without an
  error. Chat Completions reference, "Sampling parameters": ``temperature`` and ``top_p`` "are
  dropped without an error, because those models accept only their defaults" (and the API
  reference: "otherwise dropped"); ``top_k`` is the same kind of sampling field. The answer is
  one the model gives with its defaults, which is what a deployment of that version gives anyway.
- ``refuse``: dropping it would change the answer (a document the model has read, a citation
  the client relies on). A deployment of that version is passed over for the request
  (``refused_path``); when no deployment of the model can take it, the request is a 400 naming
  the field's path (``VersionRefusedError``), never a call the upstream would refuse.

Version 2023-06-01 refuses none of these. 2026-10-21 (Anthropic, "Versions", the 2026-10-21
entry; the first new ``anthropic-version`` since 2023, sent by default by the Python SDK 2.x and
the TypeScript SDK 1.x) refuses ``temperature``, ``top_p`` and ``top_k`` with a 400, a document
block in an assistant message and citations on a user message's text.

Which provider serves which version is ``offers_version`` (Bedrock: by model), which the
configuration checks.

Pure: plain data in, new plain data out (the request's own body is never changed: a failover
sends it again to another deployment).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ezat_compat.domain import Deployment
from ezat_compat.errors import InvalidRequestError

V2023 = "2023-06-01"
V2026 = "2026-10-21"
VERSIONS = (V2023, V2026)  # the versions a deployment may be configured to speak, oldest first
VERSIONS_SOURCE = 'Anthropic, "Versions" (docs.claude.com/en/api/versioning), the 2026-10-21 entry'


class VersionRefusedError(InvalidRequestError):
    """The request holds a field that every deployment of its model refuses under the API version
    it speaks, and leaving the field out would change the answer: the client must leave it out
    (or use a model with a deployment on another version). Retrying won't change it."""


def _sampling(name: str) -> Callable[[Mapping[str, Any]], Iterator[str]]:
    def found(body: Mapping[str, Any]) -> Iterator[str]:
        if name in body:
            yield name

    return found


def _assistant_documents(body: Mapping[str, Any]) -> Iterator[str]:
    for i, j, block in _blocks(body, "assistant"):
        if block.get("type") == "document":
            yield f"messages.{i}.content.{j}"


def _user_citations(body: Mapping[str, Any]) -> Iterator[str]:
    for i, j, block in _blocks(body, "user"):
        if block.get("type") == "text" and block.get("citations"):
            yield f"messages.{i}.content.{j}.citations"


def _blocks(body: Mapping[str, Any], role: str) -> Iterator[tuple[int, int, Mapping[str, Any]]]:
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, Mapping) or message.get("role") != role:
            continue
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block, Mapping):
                yield i, j, block


@dataclass(frozen=True)
class VersionRule:
    """One field a version refuses: ``find`` yields the paths of it in a body; ``drop`` says
    whether the gateway takes it out (the spec's "dropped" rule) or refuses the request."""

    name: str
    action: str  # "drop" | "refuse"
    source: str
    find: Callable[[Mapping[str, Any]], Iterator[str]] = field(repr=False)


_SAMPLING_SOURCE = VERSIONS_SOURCE + '; dropped per the Chat Completions reference, "Sampling parameters"'

VERSION_RULES: Mapping[str, tuple[VersionRule, ...]] = {
    V2023: (),
    V2026: (
        VersionRule("temperature", "drop", _SAMPLING_SOURCE, _sampling("temperature")),
        VersionRule("top_p", "drop", _SAMPLING_SOURCE, _sampling("top_p")),
        VersionRule("top_k", "drop", _SAMPLING_SOURCE, _sampling("top_k")),
        VersionRule("assistant_document", "refuse", VERSIONS_SOURCE, _assistant_documents),
        VersionRule("user_text_citations", "refuse", VERSIONS_SOURCE, _user_citations),
    ),
}
DROPPED: Mapping[str, frozenset[str]] = {
    version: frozenset(r.name for r in rules if r.action == "drop") for version, rules in VERSION_RULES.items()
}


def strict(version: str) -> bool:
    """Does ``version`` refuse anything a 2023-06-01 request may hold?"""
    return bool(VERSION_RULES.get(version))


def refused_path(body: Mapping[str, Any], version: str) -> str | None:
    """The path of the first field of ``body`` that ``version`` refuses and the gateway can't drop
    (a ``refuse`` row), or None when a deployment of that version can take the request."""
    for rule in VERSION_RULES.get(version, ()):
        if rule.action == "refuse":
            for path in rule.find(body):
                return path
    return None


def shape_for_version(body: Mapping[str, Any], version: str) -> Mapping[str, Any]:
    """``body`` (an Anthropic Messages body) as a deployment speaking ``version`` takes it: the
    ``drop`` rows' fields left out (a new dict; ``body`` itself when nothing is dropped).
    ``VersionRefusedError`` naming the path when it holds a ``refuse`` row's field."""
    path = refused_path(body, version)
    if path is not None:
        raise version_refused(path, version)
    dropped = DROPPED.get(version)
    if not dropped or dropped.isdisjoint(body):
        return body
    return {k: v for k, v in body.items() if k not in dropped}


def version_refused(path: str, version: str, model: str | None = None) -> VersionRefusedError:
    """The 400 of a field no deployment can take under its version, naming the field's path."""
    whose = f"model {model}'s deployments speak" if model else "the deployment speaks"
    return VersionRefusedError(
        f"{path}: not accepted under anthropic-version {version}, which {whose}; leave it out.",
        param=path,
    )


def version_takers(model: str, deployments: tuple[Deployment, ...], body: Mapping[str, Any]) -> tuple[Deployment, ...]:
    """The deployments whose API version takes ``body`` once shaped (``deployments`` itself when
    all do): one whose version refuses a field of ``body`` that can't be dropped is passed over.
    ``VersionRefusedError`` naming the field when none takes it (the client's own request is what
    no deployment of the model can serve; retrying won't change that)."""
    refused = {d.anthropic_version: refused_path(body, d.anthropic_version) for d in deployments}
    taking = tuple(d for d in deployments if refused[d.anthropic_version] is None)
    if len(taking) == len(deployments):
        return deployments
    if taking:
        return taking
    version = deployments[0].anthropic_version
    raise version_refused(refused[version] or "", version, model)


# Which ``anthropic-version`` each provider serves. Anthropic's API, Google Cloud's Vertex AI and
# Microsoft Foundry serve 2026-10-21 for every model; Amazon Bedrock only for Claude 4.7 and later
# (Anthropic, "Versions", the 2026-10-21 entry: the Claude API, Claude Platform on AWS, Google
# Cloud and Foundry serve it; Bedrock only for Claude 4.7 and later). Bedrock's Messages endpoint
# (``bedrock_messages``) is held to the same floor: its models are Bedrock's, and the entry names
# no endpoint of Bedrock apart. A Bedrock model id
# names the family and version (``anthropic.claude-opus-4-7-v1:0``,
# ``us.anthropic.claude-sonnet-5-5-…``); a date after the major version is no minor one
# (``claude-sonnet-4-20250514`` is 4.0), and the ids of the 3.x models start with the number.
BEDROCK_VERSION_FLOOR: Mapping[str, tuple[int, int]] = {"2026-10-21": (4, 7)}
_CLAUDE_VERSION = re.compile(r"claude-[a-z]+-(\d+)(?:-(\d{1,2})(?!\d))?")


def claude_version(upstream_model: str) -> tuple[int, int] | None:
    """(major, minor) of a Claude model id of the family-first form, or None (a 3.x id, an ARN)."""
    found = _CLAUDE_VERSION.search(upstream_model)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2) or 0)


def offers_version(provider: str, upstream_model: str, version: str) -> bool:
    """Does ``provider`` serve ``version`` of the API for ``upstream_model``?"""
    floor = BEDROCK_VERSION_FLOOR.get(version) if provider in ("bedrock", "bedrock_messages") else None
    if floor is None:
        return True
    found = claude_version(upstream_model)
    return found is not None and found >= floor
