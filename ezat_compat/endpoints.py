"""Each provider's regional endpoint and its default key variable: what a deployment gets when
its configuration leaves ``base_url`` or ``api_key_env`` out. Pure: no I/O.

Sources:
- Bedrock: ``https://bedrock-runtime.{region}.amazonaws.com`` (Amazon Bedrock user guide,
  "Inference using Anthropic Messages API", the bedrock-runtime endpoint; InvokeModel's
  ``POST /model/{modelId}/invoke``).
- Vertex AI: ``https://{region}-aiplatform.googleapis.com``, or ``https://aiplatform.googleapis.com``
  for the ``global`` region (Anthropic, "Claude on Vertex AI"; Google Cloud, "Use Claude models").
- Claude Platform on AWS: ``https://aws-external-anthropic.{region}.api.aws`` (AWS, "Claude
  Platform on AWS User Guide", "Making requests"; the Anthropic SDK's ``AnthropicAWS``).
- Bedrock's Messages endpoint: ``https://bedrock-mantle.{region}.api.aws/anthropic`` (Amazon
  Bedrock user guide, "Inference using Anthropic Messages API"; the Anthropic SDK's Mantle
  client); bedrock-runtime's ``/anthropic`` is a ``base_url`` away.
- Foundry: no default: each resource has its own host, ``https://{resource}.services.ai.azure.com``
  (Anthropic, "Claude in Microsoft Foundry"), so ``base_url`` is required. The key variable is
  the one Anthropic's SDK reads for Foundry, ``ANTHROPIC_FOUNDRY_API_KEY``.
"""

from __future__ import annotations

from collections.abc import Mapping

# provider -> the key variable read when api_key_env is not given ("": no key, the cloud's credentials)
DEFAULT_KEY_VARIABLE: Mapping[str, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "foundry": "ANTHROPIC_FOUNDRY_API_KEY",
    "bedrock": "",  # SigV4 with botocore's credential chain; a Bedrock API key only when api_key_env is set
    "vertex": "",  # Google's application default credentials
    "claude_platform_aws": "",  # SigV4; a workspace API key (ANTHROPIC_AWS_API_KEY) only when api_key_env is set
    "bedrock_messages": "",  # SigV4; a Bedrock API key (AWS_BEARER_TOKEN_BEDROCK) only when api_key_env is set
}


def default_base_url(provider: str, region: str) -> str:
    """The provider's regional endpoint; "" when the provider has none (``base_url`` required)."""
    if provider == "bedrock" and region:
        return f"https://bedrock-runtime.{region}.amazonaws.com"
    if provider == "claude_platform_aws" and region:
        return f"https://aws-external-anthropic.{region}.api.aws"
    if provider == "bedrock_messages" and region:
        return f"https://bedrock-mantle.{region}.api.aws/anthropic"
    if provider == "vertex" and region:
        return (
            "https://aiplatform.googleapis.com" if region == "global" else f"https://{region}-aiplatform.googleapis.com"
        )
    return ""


MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"

# provider -> the Messages API paths it offers (None: all). Each cloud counts tokens with an API
# of its own, which its provider calls (providers/bedrock.py, providers/vertex.py): Bedrock's
# CountTokens, ``POST /model/{modelId}/count-tokens`` (Amazon Bedrock API reference,
# "CountTokens"), and Vertex AI's ``publishers/anthropic/models/count-tokens:rawPredict`` (Google
# Cloud, "Count tokens" for Claude; Anthropic's Vertex SDK calls it for ``messages.count_tokens``).
PATHS_OFFERED: Mapping[str, frozenset[str] | None] = {
    "anthropic": None,
    "foundry": None,
    "bedrock": frozenset({MESSAGES, COUNT_TOKENS}),
    "vertex": frozenset({MESSAGES, COUNT_TOKENS}),
    "claude_platform_aws": None,  # Anthropic's API
    "bedrock_messages": frozenset({MESSAGES, COUNT_TOKENS}),  # Anthropic's own paths, on Bedrock
}


def offers(provider: str, path: str) -> bool:
    """True when a deployment of ``provider`` can serve a call to ``path``."""
    paths = PATHS_OFFERED.get(provider)
    return paths is None or path in paths
