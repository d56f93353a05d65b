"""The names a cloud's model id may stand for in our catalog, most specific first (pure).

A client configured for Bedrock or Vertex names the model in the URL, in the cloud's spelling;
the catalog is asked each name in turn and the first it knows is the model (an operator who
wants another mapping adds the cloud's id as an alias: it is the first name asked).

- Bedrock (Amazon Bedrock user guide, "Supported foundation models", "Inference profiles"): a
  foundation model id ``anthropic.claude-sonnet-4-5-20250929-v1:0``, a cross-region inference
  profile ``us.anthropic.…`` (geography prefixes ``us.``, ``eu.``, ``apac.``, ``global.``…), or
  the ARN of either (``arn:aws:bedrock:…:inference-profile/us.anthropic.…``). The names asked:
  the id as sent, then without the ARN's head, the geography prefix, ``anthropic.``, the
  ``-v1:0`` version and, last, the ``-20250929`` date.
- Vertex AI (Google Cloud, "Use Anthropic's Claude models"): ``claude-sonnet-4-5@20250929``. The
  names asked: as sent, ``claude-sonnet-4-5-20250929``, ``claude-sonnet-4-5``.
"""

from __future__ import annotations

import re

# The geography prefixes of Bedrock's cross-region inference profiles.
BEDROCK_GEOGRAPHIES = ("us.", "eu.", "apac.", "jp.", "au.", "ca.", "us-gov.", "global.")
_BEDROCK_VERSION = re.compile(r"-v\d+(?::\d+)?$")
_DATE = re.compile(r"-\d{8}$")


def _unique(names: list[str]) -> list[str]:
    return [name for i, name in enumerate(names) if name and name not in names[:i]]


def bedrock_model_names(model_id: str) -> list[str]:
    """The catalog names a Bedrock model id may stand for, most specific first."""
    names = [model_id]
    name = model_id
    if name.startswith("arn:") and "/" in name:
        name = name.rsplit("/", 1)[1]
        names.append(name)
    for prefix in BEDROCK_GEOGRAPHIES:
        if name.startswith(prefix) and name[len(prefix) :].startswith("anthropic."):
            name = name[len(prefix) :]
            names.append(name)
            break
    if name.startswith("anthropic."):
        name = name.removeprefix("anthropic.")
        names.append(name)
    name = _BEDROCK_VERSION.sub("", name)
    names.append(name)
    names.append(_DATE.sub("", name))
    return _unique(names)


def vertex_model_names(model: str) -> list[str]:
    """The catalog names a Vertex model (``claude-sonnet-4-5@20250929``) may stand for."""
    base, _, date = model.partition("@")
    return _unique([model, f"{base}-{date}" if date else base, _DATE.sub("", base)])
