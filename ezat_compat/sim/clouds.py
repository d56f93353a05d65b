"""What the simulator needs to speak Amazon Bedrock and Google Vertex AI (``app.py`` routes),
and Anthropic's API on AWS's endpoints (Claude Platform on AWS, Bedrock's Messages endpoint).

Bedrock (InvokeModel / InvokeModelWithResponseStream):
- SigV4 is verified as AWS does: the signature is recomputed with botocore's ``SigV4Auth`` from
  the known test credentials (``SIM_AWS_ACCESS_KEY_ID`` / ``SIM_AWS_SECRET_ACCESS_KEY``), the
  request's method, URL, body and the header fields it signed, at the time its ``X-Amz-Date``
  names; an unknown key id (``UnrecognizedClientException``), a wrong signature or a changed
  body (``InvalidSignatureException``) and a date more than five minutes away (``Signature
  expired``) are refused with 403 in Bedrock's shape. A ``Bearer`` token is a Bedrock API key.
- Errors: ``{"message": …}`` with ``x-amzn-ErrorType: <Type>:http://internal.amazon.com/coral/…``.
- Streams: AWS event-stream framing (``encode_message``: prelude, headers, payload, two CRC-32s),
  each Anthropic event a ``chunk`` event whose payload is ``{"bytes": "<base64 of the event>"}``;
  botocore's ``EventStreamBuffer`` decodes it (``tests/unit/test_bedrock_eventstream.py``).

Claude Platform on AWS and Bedrock's Messages endpoint (``AWS_MESSAGES_PREFIXES``): Anthropic's
Messages API and SSE, SigV4 verified as above for each one's service (or a key), and Claude
Platform on AWS's ``anthropic-workspace-id`` required (``check_aws_caller``).

Vertex AI (rawPredict / streamRawPredict):
- A token endpoint (``POST /token``) for a service account: the JWT bearer grant
  (RFC 7523) signed RS256 with the account's key, verified with ``cryptography`` against the
  key of the service-account file the simulator was given; it issues short-lived tokens, and
  only those are accepted as ``Authorization: Bearer`` on the Vertex paths.
- Errors: Google's JSON, ``{"error": {"code": 429, "message": …, "status": "RESOURCE_EXHAUSTED"}}``.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import os
import struct
import time
import zlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, quote

from ezat_compat.sim.request import utf8_json

SIM_AWS_ACCESS_KEY_ID = "AKIDEZATSIMULATOR01"
SIM_AWS_SECRET_ACCESS_KEY = "ezat-sim/aws-secret-access-key-for-tests"
SIGNATURE_WINDOW_S = 300  # AWS refuses a request signed more than 5 minutes from its clock
BEDROCK_VERSION = "bedrock-2023-05-31"
VERTEX_VERSION = "vertex-2023-10-16"
# Betas each cloud was seen refusing, the simulator's own knowledge (each with the public thread
# quoting the refusal), so a value wrongly added to the gateway's allow-lists
# (``upstream/providers/betas.py``) is still refused here, as the cloud would.
BEDROCK_REFUSED_BETAS = frozenset(
    {
        "claude-code-20250219",  # anthropics/claude-code#49370: "invalid beta flag"
        "extended-cache-ttl-2025-04-11",  # anthropics/claude-code#56595
        "mcp-servers-2025-12-04",  # BerriAI/litellm#19875
    }
)
# The Claude models whose Bedrock schema refuses ``output_config.format`` ("The model returned
# the following errors: output_config.format: Extra inputs are not permitted"): vercel/ai#19988
# (2026-08-29) lists claude-opus-4-7, -4-8, claude-opus-5, claude-fable-5, claude-sonnet-5 and
# claude-haiku-4-5; anomalyco/models.dev#1765 quotes it for Opus 4.7 from AWS's model card.
BEDROCK_NO_OUTPUT_FORMAT = (
    "claude-opus-4-7",
    "claude-opus-4-8",
    "claude-opus-5",
    "claude-fable-5",
    "claude-sonnet-5",
    "claude-haiku-4-5",
)


def refuses_output_format(model: str) -> bool:
    """Does Bedrock refuse ``output_config.format`` for ``model`` (a model or profile id)?"""
    return any(name in model for name in BEDROCK_NO_OUTPUT_FORMAT)


VERTEX_REFUSED_BETAS = frozenset(
    {
        "prompt-caching-scope-2026-01-05",  # BerriAI/litellm#19984: "Unexpected value(s)"
        "web-search-2025-03-05",  # anthropics/claude-code#12429
        "structured-outputs-2025-11-13",  # BerriAI/litellm#17755
        "effort-2025-11-24",  # anthropics/claude-code#34802
        "adaptive-thinking-2026-01-28",  # anthropics/claude-code#34802
    }
)
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
UNRECOGNIZED = "UnrecognizedClientException"
BAD_SIGNATURE = "InvalidSignatureException"
_CORAL = ":http://internal.amazon.com/coral/com.amazon.bedrock/"

# status -> the Bedrock error type the simulator answers with (injected faults included)
BEDROCK_STATUS_TO_TYPE: Mapping[int, str] = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
    529: "ServiceUnavailableException",
}
GOOGLE_STATUS_TO_NAME: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class CloudError(Exception):
    """An answer in a cloud's own error shape: ``status``, ``headers``, ``body``."""

    def __init__(self, status: int, body: Mapping[str, Any], headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body
        self.headers = headers


def bedrock_error(status: int, message: str, kind: str | None = None) -> CloudError:
    """Bedrock's error answer (status mapped to its type unless ``kind`` names it)."""
    kind = kind or BEDROCK_STATUS_TO_TYPE.get(status, "InternalServerException")
    return CloudError(529 if status == 529 else status, {"message": message}, (("x-amzn-ErrorType", kind + _CORAL),))


def google_error(status: int, message: str) -> CloudError:
    name = GOOGLE_STATUS_TO_NAME.get(status, "UNKNOWN")
    return CloudError(status, {"error": {"code": status, "message": message, "status": name}})


MISSING_MAX_TOKENS = (
    "Malformed input request: #: required key [max_tokens] not found, please reformat your input and try again."
)


def count_tokens_input(model: str, body: Mapping[str, Any]) -> Any:
    """The InvokeModel body a CountTokens request carries (``input.invokeModel.body``, base64),
    parsed; Bedrock's 400 when it isn't there, isn't JSON or isn't a whole InvokeModel body
    (``max_tokens``: "formatted according to the model's expected input format", the API
    reference's InvokeModelTokensRequest), or when ``model`` is an inference
    profile, which CountTokens doesn't take (alchemy.run's Bedrock CountTokens binding:
    "cross-region inference-profile ids are rejected with a ValidationException (The provided
    model doesn't support counting tokens)")."""
    if model.split(".", 1)[0] in ("us", "eu", "apac", "jp", "au", "ca", "us-gov", "global"):
        raise bedrock_error(400, "The provided model doesn't support counting tokens.")
    invoke = body.get("input", {}).get("invokeModel") if isinstance(body.get("input"), dict) else None
    encoded = invoke.get("body") if isinstance(invoke, dict) else None
    try:
        parsed = json.loads(base64.b64decode(encoded, validate=True)) if isinstance(encoded, str) else None
    except (ValueError, binascii.Error):
        parsed = None
    if not isinstance(parsed, dict):
        raise bedrock_error(400, "Malformed input request, please reformat your input and try again.")
    max_tokens = parsed.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):  # an InvokeModel body, checked as one
        # Bedrock's words for an InvokeModel body without it, as quoted in public code and
        # threads (e.g. "ValidationException … Malformed input request: #: required key
        # [max_tokens] not found, please reformat your input and try again.").
        raise bedrock_error(400, MISSING_MAX_TOKENS)
    return parsed


# Vertex AI's own list of the tool types it takes, as its refusal words it (coder/xum#2922,
# 2026-03-12: "tools.0: Input tag 'web_fetch_20250910' found using 'type' does not match any of
# the expected tags: …", claude-opus-4-6 on streamRawPredict): web fetch, code execution and the
# newer web search are not among them.
VERTEX_EXPECTED_TAGS = (
    "'bash_20250124', 'custom', 'memory_20250818', 'text_editor_20250124', 'text_editor_20250429', "
    "'text_editor_20250728', 'tool_search_tool_bm25', 'tool_search_tool_bm25_20251119', "
    "'tool_search_tool_regex', 'tool_search_tool_regex_20251119', 'web_search_20250305'"
)
# Bedrock: web search is not offered there (Claude Code's "Feature availability": Web search ✗
# on Amazon Bedrock), nor the MCP connector (its beta is refused, BerriAI/litellm#19875).
BEDROCK_MISSING_TOOLS = ("web_search_", "mcp_toolset")
# Fields that exist only with a beta neither cloud takes: fast mode's ``speed``
# (fast-mode-2026-02-01; Claude Code's "Feature availability": fast mode ✗ on Amazon Bedrock and
# Google Vertex AI) and the MCP connector's ``mcp_servers``.
CLOUD_MISSING_FIELDS = ("speed", "mcp_servers")


# InvokeModel's options as header fields (botocore's bedrock-runtime service model): the
# service tier, one of ServiceTierType's values, and a guardrail, whose version is required
# with its identifier ("You provide a guardrail identifier, but guardrailVersion isn't
# specified" is an error), and which needs a JSON body ("You enable the guardrail but the
# contentType isn't application/json" is one too).
SERVICE_TIERS = ("priority", "default", "flex", "reserved")
GUARDRAIL_BLOCKED = "Sorry, the model cannot answer this question."  # a guardrail's configured message


def invoke_options(headers: Mapping[str, str]) -> tuple[bool, str]:
    """(a guardrail applies, the service tier) of an InvokeModel request's header fields
    (lower-case names); ``CloudError`` (400 ValidationException) for values Bedrock refuses,
    in AWS's validation words for an enum."""
    tier = headers.get("x-amzn-bedrock-service-tier", "")
    if tier and tier not in SERVICE_TIERS:
        raise bedrock_error(
            400,
            f"1 validation error detected: Value '{tier}' at 'serviceTier' failed to satisfy constraint: "
            f"Member must satisfy enum value set: [{', '.join(SERVICE_TIERS)}]",
        )
    guardrail = headers.get("x-amzn-bedrock-guardrailidentifier", "")
    if guardrail and headers.get("content-type", "").split(";")[0].strip() != "application/json":
        # "You enable the guardrail but the contentType isn't application/json" (same source)
        raise bedrock_error(400, "A guardrail needs the request's content type to be application/json.")
    if guardrail and not headers.get("x-amzn-bedrock-guardrailversion"):
        # the rule is AWS's; these words are the simulator's (the real ones aren't public)
        raise bedrock_error(400, "Guardrail version is required when a guardrail identifier is provided.")
    return bool(guardrail), tier or "default"


def guardrail_intervened(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as Bedrock answers when the request's guardrail blocks it: the guardrail's
    message as the only text, stop reason ``guardrail_intervened`` (the value langchain-ai/
    langchain-aws#937 shows in a stream's message_delta) and the body's
    ``amazon-bedrock-guardrailAction: INTERVENED``."""
    usage = dict(message["usage"], output_tokens=len(GUARDRAIL_BLOCKED.split()))
    usage["output_tokens_details"] = {"thinking_tokens": 0}
    return {
        **message,
        "content": [{"type": "text", "text": GUARDRAIL_BLOCKED}],
        "stop_reason": "guardrail_intervened",
        "stop_sequence": None,
        "usage": usage,
        "amazon-bedrock-guardrailAction": "INTERVENED",
    }


# Bedrock's older Claude models refuse a ``ttl`` in ``cache_control`` ("Extra inputs are not
# permitted": Claude Opus 4 and 4.1, Sonnet 4, Sonnet 3.7 and the 3.5 models in
# earendil-works/pi#1570's table); the one-hour cache came for Opus, Sonnet and Haiku 4.5 (AWS
# "Prompt caching", as aws-samples/bedrock-access-gateway#224 quotes it).
BEDROCK_OLD_CACHE = ("claude-3", "claude-opus-4-2", "claude-sonnet-4-2", "claude-opus-4-1-", "claude-haiku-4-2")


def refused_cache_ttl(model: str, body: Mapping[str, Any]) -> str | None:
    """The refusal of the first ``cache_control.ttl`` in ``body`` when ``model`` (a Bedrock
    model or profile id) is one of the older ones; None otherwise."""
    if not any(old in model for old in BEDROCK_OLD_CACHE):
        return None
    places: list[tuple[str, Any]] = []
    for key in ("system", "tools"):
        value = body.get(key)
        places.extend((f"{key}.{i}", item) for i, item in enumerate(value if isinstance(value, list) else ()))
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        places.extend(
            (f"messages.{i}.content.{j}", b) for j, b in enumerate(content if isinstance(content, list) else ())
        )
    for path, block in places:
        mark = block.get("cache_control") if isinstance(block, dict) else None
        if isinstance(mark, dict) and "ttl" in mark:
            return f"{path}.cache_control.ttl: Extra inputs are not permitted"
    return None


def refused_tool(provider: str, body: Mapping[str, Any]) -> str | None:
    """The refusal of the first tool of ``body`` that ``provider`` ("bedrock", "vertex") doesn't
    offer, in the validator's words (``tools.N: Input tag …``); None when it offers them all. A
    field the cloud lacks (``CLOUD_MISSING_FIELDS``) is refused as an extra input. Vertex's words
    are quoted; Bedrock's for tools aren't public, so the validator's form is used without a list."""
    for key in CLOUD_MISSING_FIELDS:
        if key in body:
            return f"{key}: Extra inputs are not permitted"
    tools = body.get("tools")
    vertex_tags = {tag.strip("' ") for tag in VERTEX_EXPECTED_TAGS.split(",")}
    for k, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str) or kind == "custom":
            continue
        if provider == "vertex" and kind not in vertex_tags:
            return (
                f"tools.{k}: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
                + VERTEX_EXPECTED_TAGS
            )
        if provider == "bedrock" and kind.startswith(BEDROCK_MISSING_TOOLS):
            return f"tools.{k}: Input tag '{kind}' found using 'type' does not match any of the expected tags"
    return None


def url_source_path(body: Mapping[str, Any]) -> str | None:
    """The path of the first image or document block with a ``url`` source (in a message or a
    tool_result), or None. Claude on Bedrock and on Vertex AI takes base64 sources only
    (pollinations/pollinations#5862, Portkey-AI/gateway#1078: image URLs fail there and work as
    base64); the exact wording of their refusal isn't public, the 400 is."""
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(block, dict):
                continue
            nested = block.get("content") if block.get("type") == "tool_result" else None
            inner = (
                [(f"messages.{i}.content.{j}.content.{k}", b) for k, b in enumerate(nested)]
                if isinstance(nested, list)
                else []
            )
            for where, candidate in [(f"messages.{i}.content.{j}", block), *inner]:
                source = candidate.get("source") if isinstance(candidate, dict) else None
                if isinstance(source, dict) and source.get("type") == "url":
                    return f"{where}.{candidate.get('type')}.source"
    return None


# ---------------------------------------------------------------- Bedrock: SigV4


def verify_sigv4(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float | None = None,
    service: str = "bedrock",
) -> None:
    """Refuse (``CloudError``, AWS's 403) a request whose SigV4 signature is not what the test
    credentials give for it, for ``service`` in the region its credential scope names.
    ``headers``: the request's, names in lower case."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    authorization = headers.get("authorization", "")
    scheme, _, rest = authorization.partition(" ")
    if scheme != "AWS4-HMAC-SHA256":
        raise bedrock_error(403, "Missing Authentication Token", "MissingAuthenticationTokenException")
    parts = dict(item.strip().split("=", 1) for item in rest.split(",") if "=" in item)
    credential = parts.get("Credential", "").split("/")
    if len(credential) != 5 or credential[3] != service or credential[4] != "aws4_request":
        raise bedrock_error(403, "Authorization header requires a valid Credential.", "IncompleteSignatureException")
    if credential[0] != SIM_AWS_ACCESS_KEY_ID:
        raise bedrock_error(
            403, "The security token included in the request is invalid.", "UnrecognizedClientException"
        )
    amz_date = headers.get("x-amz-date", "")
    try:
        signed_at = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise bedrock_error(403, "X-Amz-Date is missing or malformed.", "IncompleteSignatureException") from None
    if abs((now if now is not None else time.time()) - signed_at) > SIGNATURE_WINDOW_S:
        raise bedrock_error(
            403, f"Signature expired: {amz_date} is now earlier than allowed.", "InvalidSignatureException"
        )
    names = parts.get("SignedHeaders", "").split(";")
    signed = {name: headers.get(name, "") for name in names if name != "host"}
    request = AWSRequest(method=method, url=url, data=body, headers=signed)
    request.context["timestamp"] = amz_date
    auth = SigV4Auth(Credentials(SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY), service, credential[2])
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if expected != parts.get("Signature"):
        raise bedrock_error(
            403,
            "The request signature we calculated does not match the signature you provided.",
            BAD_SIGNATURE,
        )


def bedrock_url(host: str, model: str, operation: str) -> str:
    """The URL a client signed: the model id percent-encoded as one path segment."""
    return f"http://{host}/model/{quote(model, safe='')}/{operation}"


# ---------------------------------------------------------------- Anthropic's API on AWS endpoints

# Claude Platform on AWS and Bedrock's Messages endpoint (the gateway's ``aws_messages.py``), at
# path prefixes of their own on the simulator: prefix -> (the SigV4 service, the key's header).
# Claude Platform on AWS: service ``aws-external-anthropic`` (AWS, "Claude Platform on AWS User
# Guide", "Making requests"), a workspace API key in ``x-api-key`` (the Anthropic SDK's
# ``AnthropicAWS``). Bedrock's Messages endpoint: ``bedrock-mantle`` (the SDK's Mantle client), or
# ``bedrock`` on bedrock-runtime's ``/anthropic``; a Bedrock API key as a bearer.
CLAUDE_PLATFORM_AWS = "/claude-platform-aws"
BEDROCK_MANTLE = "/bedrock-mantle/anthropic"
BEDROCK_RUNTIME_MESSAGES = "/bedrock-runtime/anthropic"
AWS_MESSAGES_PREFIXES: Mapping[str, tuple[str, str]] = {
    CLAUDE_PLATFORM_AWS: ("aws-external-anthropic", "x-api-key"),
    BEDROCK_MANTLE: ("bedrock-mantle", "authorization"),
    BEDROCK_RUNTIME_MESSAGES: ("bedrock", "authorization"),
}
SIM_AWS_WORKSPACE_ID = "wrkspc_ezatsim01"  # the one workspace of the simulated Claude Platform on AWS
WORKSPACE_HEADER = "anthropic-workspace-id"


def aws_messages_route(path: str) -> tuple[str, bool] | None:
    """(the prefix, whether it counts tokens) of a path of Anthropic's API on an AWS endpoint,
    or None."""
    for prefix in AWS_MESSAGES_PREFIXES:
        if path == prefix + "/v1/messages":
            return prefix, False
        if path == prefix + "/v1/messages/count_tokens":
            return prefix, True
    return None


def check_aws_caller(prefix: str, url: str, headers: Mapping[str, str], body: bytes, api_key: str | None) -> None:
    """Authenticate a request to Anthropic's API on an AWS endpoint: a key in the endpoint's
    header (``api_key`` set: only that one), else a SigV4 signature for the endpoint's service;
    then, on Claude Platform on AWS, the workspace. ``CloudError`` in AWS's shape otherwise (403;
    400 for a missing workspace header). The words of the workspace refusals are the
    simulator's: AWS's aren't public."""
    service, key_header = AWS_MESSAGES_PREFIXES[prefix]
    value = headers.get(key_header, "").strip()
    if key_header == "authorization":
        scheme, _, value = value.partition(" ")
        value = value.strip() if scheme.lower() == "bearer" else ""
    if value:
        if api_key is not None and value != api_key:
            raise bedrock_error(403, "Invalid API Key format", "AccessDeniedException")
    else:
        verify_sigv4("POST", url, headers, body, service=service)
    if prefix != CLAUDE_PLATFORM_AWS:
        return
    workspace = headers.get(WORKSPACE_HEADER, "").strip()
    if not workspace:
        raise bedrock_error(400, f"Missing required header: {WORKSPACE_HEADER}", "ValidationException")
    if workspace != SIM_AWS_WORKSPACE_ID:
        raise bedrock_error(403, f"The caller is not authorized to use workspace {workspace}.", "AccessDeniedException")


# ---------------------------------------------------------------- Bedrock: event stream


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return struct.pack("!B", len(raw_name)) + raw_name + b"\x07" + struct.pack("!H", len(raw_value)) + raw_value


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message: total length, headers length, prelude CRC, string headers
    (type 7), the payload, the message CRC (AWS, "Event stream encoding")."""
    encoded = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    prelude += struct.pack("!I", zlib.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + encoded + payload
    return message + struct.pack("!I", zlib.crc32(message) & 0xFFFFFFFF)


def chunk_message(data: Mapping[str, Any]) -> bytes:
    """An Anthropic stream event as Bedrock's ``chunk`` event."""
    event = utf8_json(json.dumps(data, separators=(",", ":"), ensure_ascii=False))  # a lone surrogate escaped
    payload = json.dumps({"bytes": base64.b64encode(event).decode()}).encode()
    return encode_message(
        {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}, payload
    )


def exception_message(kind: str, message: str) -> bytes:
    """A stream's exception event (``throttlingException``, ``modelStreamErrorException``…)."""
    return encode_message(
        {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"},
        json.dumps({"message": message}).encode(),
    )


# ---------------------------------------------------------------- Vertex: tokens


class GoogleTokens:
    """The token endpoint of one test service account, and the tokens it issued."""

    def __init__(self, service_account_file: str) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        with open(service_account_file, encoding="utf-8") as f:
            info = json.load(f)
        key = load_pem_private_key(info["private_key"].encode(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError(f"{service_account_file}: not an RSA key (service accounts sign RS256)")
        self.public_key = key.public_key()
        self.email = info["client_email"]
        self.issued: dict[str, float] = {}  # token -> expiry (time.time())

    def grant(self, form: bytes, token_uri: str) -> dict[str, Any]:
        """The JWT bearer grant (RFC 7523): a token for a valid assertion; ``CloudError`` 400
        in OAuth's error shape otherwise."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        fields = parse_qs(form.decode("ascii", "replace"))
        if fields.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            raise CloudError(400, {"error": "unsupported_grant_type"})
        try:
            head, claims_b64, signature = fields["assertion"][0].split(".")
            claims = json.loads(_unb64(claims_b64))
            self.public_key.verify(
                _unb64(signature), f"{head}.{claims_b64}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
        except (KeyError, ValueError, binascii.Error, InvalidSignature):
            raise CloudError(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}) from None
        now = time.time()
        audiences = (GOOGLE_TOKEN_AUDIENCE, token_uri)  # google-auth names Google's endpoint, whatever token_uri says
        if claims.get("iss") != self.email or claims.get("aud") not in audiences or float(claims.get("exp", 0)) < now:
            raise CloudError(400, {"error": "invalid_grant", "error_description": "Invalid JWT: claims."})
        token = "ya29.sim-" + os.urandom(16).hex()
        self.issued[token] = now + 3600
        return {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}

    def check(self, authorization: str) -> None:
        scheme, _, token = authorization.partition(" ")
        expiry = self.issued.get(token.strip()) if scheme.lower() == "bearer" else None
        if expiry is None or expiry < time.time():
            raise google_error(401, "Request had invalid authentication credentials.")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
