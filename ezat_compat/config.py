"""The configuration: one TOML file, validated once, loaded into the frozen dataclasses of
``domain.py``.

Named by ``--config PATH`` or ``EZAT_CONFIG``; ``EZAT_DATABASE_URL`` and ``EZAT_REDIS_URL``
override the file's URLs, ``EZAT_DATA_DIR`` its ``data_dir``, ``EZAT_ADMIN_BIND`` its ``[admin]
bind``. Relative paths are relative to the configuration file's folder: ``data_dir``, TLS files,
and a SQLite database (relative to the data folder, which is that folder unless ``data_dir``
moves it). Every key beyond ``id``, ``aliases``,
``price`` and a deployment's ``name``/``base_url``/``upstream_model`` has a default; unknown keys
are errors that name them.
A bad file raises ``ConfigError`` whose message names the file and the key path
(``ezat.toml: models[0].price.input: Not a valid number.``).
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from marshmallow import RAISE, Schema, ValidationError, fields, pre_load, validate, validates_schema
from sqlalchemy import make_url

from ezat_compat.catalog import is_pattern
from ezat_compat.domain import (
    EFFORTS,
    LOG_FORMATS,
    LOG_LEVELS,
    OTLP_PROTOCOLS,
    PROVIDERS,
    THINKING_STYLES,
    AdminSettings,
    AlertsSettings,
    Config,
    ConsoleSettings,
    Deployment,
    GatewaySettings,
    GroupSettings,
    IdentitySettings,
    LoggingSettings,
    Model,
    Price,
    ResponsesSettings,
    ServerSettings,
    SpendSettings,
    TelemetrySettings,
)
from ezat_compat.endpoints import DEFAULT_KEY_VARIABLE, default_base_url
from ezat_compat.periods import time_zone
from ezat_compat.translate.versions import V2023, VERSIONS, offers_version
from ezat_compat.wire.paths import flatten_errors, format_error

DEFAULT_CONFIG_NAME = "ezat.toml"
DATA_DIR_ENV = "EZAT_DATA_DIR"  # overrides [gateway] data_dir (the systemd unit sets its StateDirectory)
ADMIN_BIND_ENV = "EZAT_ADMIN_BIND"  # overrides [admin] bind, even with "" (no admin listener)
_MIB = 1024 * 1024


class ConfigError(Exception):
    """The configuration can't be used; the message says which file and key, and why."""


# ---------------------------------------------------------------- schemas


class _Strict(Schema):
    class Meta:
        unknown = RAISE


class _PriceSchema(_Strict):
    input = fields.Decimal(required=True, validate=validate.Range(min=0))
    output = fields.Decimal(required=True, validate=validate.Range(min=0))
    cache_write = fields.Decimal(load_default=None, validate=validate.Range(min=0))
    cache_read = fields.Decimal(load_default=None, validate=validate.Range(min=0))
    web_search = fields.Decimal(load_default=Decimal(0), validate=validate.Range(min=0))  # USD per search


def _proxy_url(value: str) -> None:
    """``proxy``: "" (none) or an http(s) URL with a host, as requests takes it."""
    if value == "":
        return
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError('Not a proxy URL: use "http://[user:password@]host:port" (or "" for none).')
    try:
        parts.port  # noqa: B018 - raises for a port that isn't a number
    except ValueError:
        raise ValidationError("Not a proxy URL: the port is not a number.") from None


# provider -> the keys only it takes, and those it requires (docs/config.md, "Providers")
_PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "bedrock": ("region", "aws_profile", "guardrail", "guardrail_version", "service_tier"),
    "vertex": ("project", "region"),
    "foundry": ("tenant_id", "client_id", "client_secret_env", "authority_host"),
    "claude_platform_aws": ("region", "aws_profile", "workspace_id"),
    "bedrock_messages": ("region", "aws_profile"),
}
FOUNDRY_HOSTINGS = ("azure", "anthropic")  # Foundry's hosting options ("Hosted on Azure" is the portal's default)
FOUNDRY_AUTHS = ("api_key", "entra_id")  # the resource's key, or Microsoft Entra ID tokens (azure-identity)
# InvokeModel's serviceTier values (botocore's bedrock-runtime service model, ServiceTierType)
BEDROCK_SERVICE_TIERS = ("priority", "default", "flex", "reserved")
_PROVIDER_REQUIRED: dict[str, tuple[str, ...]] = {
    "bedrock": ("region",),
    "vertex": ("project", "region"),
    "claude_platform_aws": ("region", "workspace_id"),  # SigV4 signs for the region, even at a base_url
    "bedrock_messages": ("region",),
}
_PROVIDER_ONLY = tuple(dict.fromkeys(key for keys in _PROVIDER_KEYS.values() for key in keys))  # refused elsewhere


class _DeploymentSchema(_Strict):
    name = fields.Str(required=True, validate=validate.Length(min=1, max=128))
    base_url = fields.Url(load_default="", require_tld=False, schemes={"http", "https"})
    upstream_model = fields.Str(required=True, validate=validate.Length(min=1))
    api_key_env = fields.Str(load_default=None)
    provider = fields.Str(load_default="anthropic", validate=validate.OneOf(PROVIDERS))
    region = fields.Str(load_default="", validate=validate.Regexp(r"^[a-z0-9-]*$", error="Not a region name."))
    aws_profile = fields.Str(load_default="")
    workspace_id = fields.Str(load_default="", validate=validate.Length(max=256))
    project = fields.Str(load_default="")
    guardrail = fields.Str(load_default="", validate=validate.Length(max=2048))
    guardrail_version = fields.Str(
        load_default="", validate=validate.Regexp(r"^(|[1-9][0-9]{0,7}|DRAFT)$", error="A version number or DRAFT.")
    )
    service_tier = fields.Str(load_default="", validate=validate.OneOf(("", *BEDROCK_SERVICE_TIERS)))
    price = fields.Nested(_PriceSchema, load_default=None)
    anthropic_version = fields.Str(load_default="2023-06-01", validate=validate.OneOf(VERSIONS))
    hosting = fields.Str(load_default="azure", validate=validate.OneOf(FOUNDRY_HOSTINGS))
    auth = fields.Str(load_default="api_key", validate=validate.OneOf(FOUNDRY_AUTHS))
    tenant_id = fields.Str(load_default="")
    client_id = fields.Str(load_default="")
    client_secret_env = fields.Str(load_default="")
    authority_host = fields.Url(load_default="", require_tld=False, schemes={"https"})
    priority = fields.Int(load_default=0, strict=True)
    weight = fields.Float(load_default=1.0, validate=validate.Range(min=0, min_inclusive=False))
    proxy = fields.Str(load_default=None, validate=_proxy_url)
    ca_file = fields.Str(load_default="")
    client_cert = fields.Str(load_default="")
    client_key = fields.Str(load_default="")

    @pre_load
    def _version_where_it_is_sent(self, data: Any, **_: Any) -> Any:
        """``anthropic_version`` only where it goes out as the header (Anthropic, Foundry): the
        clouds put their own version in the body (``bedrock-2023-05-31``, ``vertex-2023-10-16``),
        so a value there would silently do nothing."""
        if isinstance(data, dict) and "anthropic_version" in data and data.get("provider") in ("bedrock", "vertex"):
            provider = data["provider"]
            raise ValidationError(
                {"anthropic_version": [f"anthropic_version is not used by provider {provider!r} (it sends its own)."]}
            )
        for key in ("hosting", "auth"):  # Foundry's own, with defaults: refused where written elsewhere
            if isinstance(data, dict) and key in data and data.get("provider") != "foundry":
                raise ValidationError({key: [f"{key} is not used by provider {data.get('provider', 'anthropic')!r}."]})
        return data

    @validates_schema
    def _key_goes_with_a_cert(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("client_key") and not data.get("client_cert"):
            raise ValidationError({"client_key": ["client_key needs client_cert."]})

    @validates_schema
    def _provider_keys(self, data: dict[str, Any], **_: Any) -> None:
        """Each provider's own keys, required where it needs them and refused where it doesn't
        (a ``region`` on an Anthropic deployment would silently do nothing)."""
        provider = data.get("provider", "anthropic")
        takes = _PROVIDER_KEYS.get(provider, ())
        for key in _PROVIDER_ONLY:
            if data.get(key) and key not in takes:
                raise ValidationError({key: [f"{key} is not used by provider {provider!r}."]})
        # InvokeModel: "You provide a guardrail identifier, but guardrailVersion isn't specified"
        # is an error (botocore's bedrock-runtime service model, guardrailIdentifier).
        if bool(data.get("guardrail")) != bool(data.get("guardrail_version")):
            key = "guardrail_version" if data.get("guardrail") else "guardrail"
            raise ValidationError({key: ["guardrail and guardrail_version go together."]})
        for key in _PROVIDER_REQUIRED.get(provider, ()):
            if not data.get(key):
                raise ValidationError({key: [f"provider {provider!r} needs {key}."]})
        if not data.get("base_url") and not default_base_url(provider, data.get("region", "")):
            raise ValidationError({"base_url": [f"Missing data for required field (provider {provider!r})."]})
        if provider == "vertex" and data.get("api_key_env"):
            raise ValidationError({"api_key_env": ["provider 'vertex' authenticates with Google's credentials."]})
        self._entra_keys(data)
        version = data.get("anthropic_version", V2023)
        if not offers_version(provider, data.get("upstream_model", ""), version):
            raise ValidationError(
                {"anthropic_version": [f"provider {provider!r} does not serve {version} for this model."]}
            )

    @staticmethod
    def _entra_keys(data: dict[str, Any]) -> None:
        """Foundry with Microsoft Entra ID: no key variable; the client secret goes with its
        tenant and client (else azure-identity's DefaultAzureCredential chain finds the identity)."""
        entra = data.get("auth") == "entra_id"
        for key in ("tenant_id", "client_id", "client_secret_env", "authority_host"):
            if data.get(key) and not entra:
                raise ValidationError({key: [f'{key} is used only with auth = "entra_id".']})
        if entra and data.get("api_key_env"):
            raise ValidationError({"api_key_env": ['auth = "entra_id" authenticates with Entra ID tokens, not a key.']})
        if data.get("client_secret_env") and not (data.get("tenant_id") and data.get("client_id")):
            raise ValidationError({"client_secret_env": ["client_secret_env needs tenant_id and client_id."]})


class _ModelSchema(_Strict):
    id = fields.Str(required=True, validate=validate.Length(min=1, max=128))
    aliases = fields.List(fields.Str(validate=validate.Length(min=1, max=128)), required=True)
    price = fields.Nested(_PriceSchema, required=True)
    deployments = fields.List(fields.Nested(_DeploymentSchema), required=True, validate=validate.Length(min=1))
    context_window = fields.Int(load_default=200_000, strict=True, validate=validate.Range(min=1))
    max_output_tokens = fields.Int(load_default=64_000, strict=True, validate=validate.Range(min=1))
    sampling = fields.Bool(load_default=False)
    caching = fields.Bool(load_default=True)
    min_cache_tokens = fields.Int(load_default=1024, strict=True, validate=validate.Range(min=0))
    efforts = fields.List(fields.Str(validate=validate.OneOf(EFFORTS)), load_default=list(EFFORTS))
    thinking = fields.Str(load_default="adaptive", validate=validate.OneOf(THINKING_STYLES))
    forced_tool_choice = fields.Bool(load_default=True)
    prefill = fields.Bool(load_default=False)
    structured_output = fields.Bool(load_default=True)
    vision = fields.Bool(load_default=True)
    pdf = fields.Bool(load_default=True)
    tools = fields.Bool(load_default=True)
    web_search = fields.Bool(load_default=False)
    max_image_bytes = fields.Int(load_default=5 * _MIB, strict=True, validate=validate.Range(min=1024))
    max_image_px = fields.Int(load_default=8000, strict=True, validate=validate.Range(min=1))
    many_images = fields.Int(load_default=20, strict=True, validate=validate.Range(min=0))
    many_images_max_px = fields.Int(load_default=2000, strict=True, validate=validate.Range(min=1))
    max_request_bytes = fields.Int(load_default=32 * _MIB, strict=True, validate=validate.Range(min=1024 * 1024))

    @validates_schema
    def _id_is_a_name(self, data: dict[str, Any], **_: Any) -> None:
        if is_pattern(data.get("id", "")):
            raise ValidationError({"id": ["A model id is a name, not a pattern: '*' is allowed in aliases only."]})

    @validates_schema
    def _names_unique(self, data: dict[str, Any], **_: Any) -> None:
        names = [d["name"] for d in data.get("deployments", [])]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValidationError({"deployments": {i: {"name": [f"Duplicate deployment name {name!r}."]}}})


class _GatewaySchema(_Strict):
    database_url = fields.Str(load_default="sqlite:///ezat.db", validate=validate.Length(min=1))
    redis_url = fields.Str(load_default="")
    upstream_timeout_s = fields.Float(load_default=590.0, validate=validate.Range(min=0, min_inclusive=False))
    stream_idle_timeout_s = fields.Float(load_default=600.0, validate=validate.Range(min=0, min_inclusive=False))
    connect_timeout_s = fields.Float(load_default=10.0, validate=validate.Range(min=0, min_inclusive=False))
    keepalive_s = fields.Float(load_default=15.0, validate=validate.Range(min=0, min_inclusive=False))
    max_body_mb = fields.Float(load_default=32.0, validate=validate.Range(min=0, min_inclusive=False))
    max_upstream_body_mb = fields.Float(load_default=64.0, validate=validate.Range(min=0, min_inclusive=False))
    allow_private_image_hosts = fields.Bool(load_default=False)
    image_fetch_threads = fields.Int(load_default=64, strict=True, validate=validate.Range(min=1, max=1024))
    image_fetch_org_threads = fields.Int(load_default=20, strict=True, validate=validate.Range(min=1, max=1024))
    image_decode_threads = fields.Int(load_default=2, strict=True, validate=validate.Range(min=1, max=64))
    image_fetch_request_threads = fields.Int(load_default=20, strict=True, validate=validate.Range(min=1, max=1024))
    cooldown_failures = fields.Int(load_default=3, strict=True, validate=validate.Range(min=1))
    cooldown_s = fields.Float(load_default=30.0, validate=validate.Range(min=0))
    max_cooldown_s = fields.Float(load_default=300.0, validate=validate.Range(min=0))
    thinking_ttl_s = fields.Float(load_default=86400.0, validate=validate.Range(min=0, min_inclusive=False))
    data_dir = fields.Str(load_default="")
    first_event_timeout_s = fields.Float(load_default=30.0, validate=validate.Range(min=0, min_inclusive=False))
    web_search_max_uses = fields.Int(load_default=10, strict=True, validate=validate.Range(min=1, max=1000))
    ca_file = fields.Str(load_default="")
    isolate_prompt_cache = fields.Bool(load_default=True)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_allow_list(value: str) -> tuple[Network, ...] | None:
    """gunicorn's comma-separated list of addresses or networks (``[server]
    forwarded_allow_ips``); ``*`` (None) trusts every peer. Raises ``ValueError`` naming an entry
    that is neither."""
    entries = [item.strip() for item in value.split(",") if item.strip()]
    if "*" in entries:
        return None
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or network") from None
    return tuple(networks)


def _allow_list(value: str) -> None:
    """``forwarded_allow_ips``: gunicorn's comma-separated addresses or networks, or ``*``."""
    try:
        parse_allow_list(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def _public_url(value: str) -> None:
    """``[server] public_url``: empty, or an http(s) URL without a query or fragment."""
    if value and (not value.startswith(("http://", "https://")) or "?" in value or "#" in value):
        raise ValidationError("Must be an http:// or https:// URL without a query or fragment (or empty).")


class _ServerSchema(_Strict):
    bind = fields.Str(load_default="127.0.0.1:8080")
    workers = fields.Int(load_default=2, strict=True, validate=validate.Range(min=1, max=256))
    worker_connections = fields.Int(load_default=4000, strict=True, validate=validate.Range(min=1))
    timeout_s = fields.Int(load_default=30, strict=True, validate=validate.Range(min=1))
    graceful_timeout_s = fields.Int(load_default=630, strict=True, validate=validate.Range(min=1))
    drain_s = fields.Float(load_default=10.0, validate=validate.Range(min=0))
    http_keepalive_s = fields.Int(load_default=5, strict=True, validate=validate.Range(min=0))
    log_level = fields.Str(load_default="info", validate=validate.OneOf(LOG_LEVELS))
    pidfile = fields.Str(load_default="")
    name = fields.Str(load_default="", validate=validate.Length(max=64))
    metrics_bind = fields.Str(load_default="")
    body_grace_s = fields.Float(load_default=10.0, validate=validate.Range(min=0, min_inclusive=False))
    body_min_rate_kbps = fields.Float(load_default=64.0, validate=validate.Range(min=0, min_inclusive=False))
    forwarded_allow_ips = fields.Str(load_default="127.0.0.1", validate=_allow_list)
    access_log = fields.Str(load_default="-", validate=validate.Length(min=1))
    error_log = fields.Str(load_default="-", validate=validate.Length(min=1))
    public_url = fields.Str(load_default="", validate=_public_url)

    @validates_schema
    def _metrics_bind_apart(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("metrics_bind") and data["metrics_bind"] == data.get("bind"):
            raise ValidationError({"metrics_bind": ["Must differ from bind: it serves /metrics on its own address."]})


class _LoggingSchema(_Strict):
    format = fields.Str(load_default="json", validate=validate.OneOf(LOG_FORMATS))
    level = fields.Str(load_default="", validate=validate.OneOf(("", *LOG_LEVELS)))
    access_log = fields.Bool(load_default=True)


class _ResponsesSchema(_Strict):
    store = fields.Bool(load_default=True)
    ttl_days = fields.Float(load_default=30.0, validate=validate.Range(min=0, min_inclusive=False))
    org_quota_mb = fields.Float(load_default=1024.0, validate=validate.Range(min=0))
    org_quota_count = fields.Int(load_default=200_000, strict=True, validate=validate.Range(min=0))


def _time_zone(value: str) -> None:
    try:
        time_zone(value)
    except ValueError:
        raise ValidationError("Not a time zone name (IANA, like UTC or Europe/Paris).") from None


def _webhook_url(value: str) -> None:
    """ "" (no webhook) or an http(s) URL."""
    if value:
        validate.URL(require_tld=False, schemes={"http", "https"})(value)


class _SpendSchema(_Strict):
    time_zone = fields.Str(load_default="UTC", validate=_time_zone)


class _AlertsSchema(_Strict):
    webhook_url = fields.Str(load_default="", validate=_webhook_url)
    webhook_secret_env = fields.Str(
        load_default="EZAT_ALERTS_WEBHOOK_SECRET",
        validate=validate.Regexp(r"^[A-Za-z_][A-Za-z0-9_]*$", error="Not an environment variable name."),
    )
    thresholds = fields.List(
        fields.Int(strict=True, validate=validate.Range(min=1, max=1000)),
        load_default=[80, 100],  # never changed: _alerts copies it into a tuple
        validate=validate.Length(min=1),
    )
    every_s = fields.Float(load_default=5.0, validate=validate.Range(min=0.1, max=3600))


class _AdminSchema(_Strict):
    bind = fields.Str(load_default="127.0.0.1:8081")
    on_main_listener = fields.Bool(load_default=False)


_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_VARIABLE_NAME = validate.Regexp(r"^[A-Za-z_][A-Za-z0-9_]*$", error="Not an environment variable name.")


def _issuer(value: str) -> None:
    """``[identity] issuer``: "" (no IdP) or the issuer's URL, https (http only on a loopback
    host: a test IdP), without query or fragment (OpenID Connect Discovery 1.0, section 4)."""
    if value == "":
        return
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError("Not an issuer URL: use https://host[/path], as the IdP names itself.")
    if parts.query or parts.fragment:
        raise ValidationError("An issuer URL has no query or fragment.")
    if parts.scheme == "http" and parts.hostname not in _LOOPBACK_HOSTS:
        raise ValidationError("The issuer must be https (http only on localhost, for a test IdP).")


class _GroupSchema(_Strict):
    org = fields.Str(load_default="", validate=validate.Length(max=128))
    models = fields.List(fields.Str(validate=validate.Length(min=1, max=200)), load_default=[])
    daily_usd = fields.Decimal(load_default=None, validate=validate.Range(min=0))
    weekly_usd = fields.Decimal(load_default=None, validate=validate.Range(min=0))
    monthly_usd = fields.Decimal(load_default=None, validate=validate.Range(min=0))
    rpm = fields.Int(load_default=None, validate=validate.Range(min=1))
    tpm = fields.Int(load_default=None, validate=validate.Range(min=1))

    @validates_schema
    def _whole_cents(self, data: dict[str, Any], **_: Any) -> None:
        for name in ("daily_usd", "weekly_usd", "monthly_usd"):
            value = data.get(name)
            if value is not None and value * 100 != int(value * 100):
                raise ValidationError({name: ["A spend cap is a whole number of cents (e.g. 20 or 19.99)."]})


def _usd_micros(value: Decimal | None) -> int | None:
    return None if value is None else int(value * 1_000_000)


class _IdentitySchema(_Strict):
    issuer = fields.Str(load_default="", validate=_issuer)
    client_id = fields.Str(load_default="", validate=validate.Length(max=255))
    client_secret_env = fields.Str(load_default="EZAT_OIDC_CLIENT_SECRET", validate=_VARIABLE_NAME)
    groups_claim = fields.Str(load_default="groups", validate=validate.Length(min=1, max=128))
    # the defaults are never changed: _identity copies them into tuples
    admins = fields.List(fields.Str(validate=validate.Length(min=1)), load_default=[])
    viewers = fields.List(fields.Str(validate=validate.Length(min=1)), load_default=[])
    org_admins = fields.Dict(
        keys=fields.Str(validate=validate.Length(min=1)),
        values=fields.Str(validate=validate.Length(min=1, max=128)),
        load_default={},
    )
    scopes = fields.Str(load_default="openid email profile")
    audience = fields.Str(load_default="", validate=validate.Length(max=255))
    jwt_bearers = fields.Bool(load_default=False)
    clock_skew_s = fields.Int(load_default=60, validate=validate.Range(min=0, max=600))
    key_hours = fields.Float(load_default=8.0, validate=validate.Range(min=0.05, max=24 * 30))
    session_days = fields.Int(load_default=30, validate=validate.Range(min=1, max=366))
    default_org = fields.Str(load_default="", validate=validate.Length(max=128))
    groups = fields.Dict(
        keys=fields.Str(validate=validate.Length(min=1, max=255)),
        values=fields.Nested(lambda: _GroupSchema()),
        load_default={},
    )

    @validates_schema
    def _usable(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("jwt_bearers") and not data.get("issuer"):
            raise ValidationError({"jwt_bearers": ["Needs an issuer: the JWTs are checked against its keys."]})
        if "openid" not in data.get("scopes", "openid").split():
            raise ValidationError({"scopes": ["Must include openid (the ID token says who signed in)."]})
        if data.get("issuer") and not data.get("client_id"):
            raise ValidationError({"client_id": ["Required with an issuer: the client registered at the IdP."]})


_30_DAYS = 30 * 86400  # the longest a console session may live (store/console.py keeps no older one)


class _ConsoleSchema(_Strict):
    idle_timeout_s = fields.Int(load_default=1800, strict=True, validate=validate.Range(min=60, max=_30_DAYS))
    absolute_timeout_s = fields.Int(load_default=43200, strict=True, validate=validate.Range(min=60, max=_30_DAYS))
    secure_cookies = fields.Bool(load_default=True)
    sign_in_attempts_per_minute = fields.Int(load_default=10, strict=True, validate=validate.Range(min=1))

    @validates_schema
    def _absolute_covers_idle(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("absolute_timeout_s", 43200) < data.get("idle_timeout_s", 1800):
            raise ValidationError({"absolute_timeout_s": ["Must be at least idle_timeout_s."]})


def _otlp_endpoint(value: str) -> None:
    """``[telemetry] otlp_endpoint``: "" (off) or the collector's http(s) URL."""
    if value == "":
        return
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValidationError('Not a collector URL: use "http://host:4318" (or "" for none).')


class _TelemetrySchema(_Strict):
    otlp_endpoint = fields.Str(load_default="", validate=_otlp_endpoint)
    from_environment = fields.Bool(load_default=False)
    protocol = fields.Str(load_default="http/protobuf", validate=validate.OneOf(OTLP_PROTOCOLS))
    headers = fields.Dict(
        keys=fields.Str(validate=validate.Regexp(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", error="Not a header name.")),
        values=fields.Str(validate=validate.Regexp(r"^[^\r\n\x00]*$", error="Not a header value.")),
        load_default={},  # never changed: _telemetry copies it into a tuple
    )
    service_name = fields.Str(load_default="ezat-compat", validate=validate.Length(min=1, max=255))
    sample_ratio = fields.Float(load_default=1.0, validate=validate.Range(min=0, max=1))
    record_person = fields.Bool(load_default=False)
    timeout_s = fields.Float(load_default=10.0, validate=validate.Range(min=0, min_inclusive=False, max=600))


class _ConfigSchema(_Strict):
    gateway = fields.Nested(_GatewaySchema, load_default=dict)
    server = fields.Nested(_ServerSchema, load_default=dict)
    responses = fields.Nested(_ResponsesSchema, load_default=dict)
    logging = fields.Nested(_LoggingSchema, load_default=dict)
    admin = fields.Nested(_AdminSchema, load_default=dict)
    spend = fields.Nested(_SpendSchema, load_default=dict)
    alerts = fields.Nested(_AlertsSchema, load_default=dict)
    identity = fields.Nested(_IdentitySchema, load_default=dict)
    console = fields.Nested(_ConsoleSchema, load_default=dict)
    telemetry = fields.Nested(_TelemetrySchema, load_default=dict)
    models = fields.List(fields.Nested(_ModelSchema), required=True, validate=validate.Length(min=1))

    @validates_schema
    def _admin_bind_apart(self, data: dict[str, Any], **_: Any) -> None:
        """``[admin] bind`` is a listener of its own: never ``[server] bind`` nor ``metrics_bind``
        (the app tells the admin listener by its socket)."""
        bind = data.get("admin", {}).get("bind", AdminSettings.bind)
        server = data.get("server", {})
        if bind and bind in (server.get("bind", ServerSettings.bind), server.get("metrics_bind")):
            raise ValidationError(
                {
                    "admin": {
                        "bind": ["Must differ from [server] bind and metrics_bind: the admin API has its own address."]
                    }
                }
            )

    @validates_schema
    def _model_names_unique(self, data: dict[str, Any], **_: Any) -> None:
        seen: dict[str, str] = {}
        for i, model in enumerate(data.get("models", [])):
            for j, name in enumerate([model["id"], *model["aliases"]]):
                key = name.strip().lower()
                where = "id" if j == 0 else f"aliases[{j - 1}]"
                if key in seen:
                    raise ValidationError(f"models[{i}].{where}: {name!r} is already used by {seen[key]}.")
                seen[key] = model["id"]

    @validates_schema
    def _one_tls_per_origin(self, data: dict[str, Any], **_: Any) -> None:
        """Deployments on one origin share its connections, so they must name the same TLS files."""
        seen: dict[str, tuple[str, tuple[str, ...]]] = {}
        for i, model in enumerate(data.get("models", [])):
            for j, deployment in enumerate(model.get("deployments", [])):
                parts = urlsplit(_base_url(deployment))
                origin = f"{parts.scheme.lower()}://{parts.netloc.lower()}"
                files = tuple(deployment.get(k, "") for k in _PATH_KEYS)
                first = seen.setdefault(origin, (deployment["name"], files))
                if first[1] != files:
                    raise ValidationError(
                        f"models[{i}].deployments[{j}]: deployment {deployment['name']!r} shares {origin} with "
                        f"{first[0]!r} but not its ca_file, client_cert and client_key; give both the same."
                    )


_SCHEMA = _ConfigSchema()


# ---------------------------------------------------------------- loading


_PATH_KEYS = ("ca_file", "client_cert", "client_key")  # file paths: relative ones are beside the config file


def _beside(folder: str, value: str) -> str:
    return os.path.join(folder, value) if value and not os.path.isabs(value) else value


def sqlite_beside(url: str, folder: str) -> str:
    """``url`` with a relative SQLite path made absolute in ``folder`` (the data folder, which is
    the configuration file's folder unless ``data_dir`` says otherwise), so that every command
    finds the same database wherever it is run from; other URLs, absolute paths, ``:memory:``
    and ``file:`` URIs are left as they are."""
    if not url.startswith("sqlite"):
        return url
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return url
    if os.path.isabs(database):
        return url
    return parsed.set(database=os.path.join(folder, database)).render_as_string(hide_password=False)


def _base_url(deployment: Mapping[str, Any]) -> str:
    """The deployment's ``base_url``, else its provider's regional endpoint."""
    return deployment.get("base_url") or default_base_url(
        deployment.get("provider", "anthropic"), deployment.get("region", "")
    )


def _price(price: Mapping[str, Any]) -> Price:
    """A price table; cache writes default to 1.25 times the input price, reads to 0.1 times."""
    cache_write = price["cache_write"] if price["cache_write"] is not None else price["input"] * Decimal("1.25")
    cache_read = price["cache_read"] if price["cache_read"] is not None else price["input"] * Decimal("0.1")
    return Price(
        input=price["input"],
        output=price["output"],
        cache_write=cache_write,
        cache_read=cache_read,
        web_search=price["web_search"],
    )


def _build_deployment(d: Mapping[str, Any], environ: Mapping[str, str], folder: str) -> Deployment:
    entra = d["auth"] == "entra_id"
    key_env = d["api_key_env"] if d["api_key_env"] is not None else DEFAULT_KEY_VARIABLE[d["provider"]]
    key_env = "" if entra else key_env
    values = {k: _beside(folder, v) if k in _PATH_KEYS else v for k, v in d.items() if k != "price"}
    values.update(base_url=_base_url(d), api_key_env=key_env)
    return Deployment(
        **values,  # type: ignore[arg-type]
        client_secret=environ.get(d["client_secret_env"], "") if d["client_secret_env"] else "",
        api_key=environ.get(key_env, "") if key_env else "",
        price=_price(d["price"]) if d["price"] is not None else None,
    )


def _build_model(raw: Mapping[str, Any], environ: Mapping[str, str], folder: str = "") -> Model:
    deployments = tuple(_build_deployment(d, environ, folder) for d in raw["deployments"])
    simple = {k: v for k, v in raw.items() if k not in {"price", "deployments", "aliases", "efforts"}}
    return Model(
        **simple,
        aliases=tuple(raw["aliases"]),
        efforts=tuple(e for e in EFFORTS if e in raw["efforts"]),
        price=_price(raw["price"]),
        deployments=deployments,
    )


def _log_files(server: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """``[server]`` with its files' relative paths taken beside the config file: the log files
    ("-": stderr) and the pidfile ("": none), as every other path of the file."""
    out = dict(server)
    for name in ("access_log", "error_log"):
        if out.get(name, "-") != "-":
            out[name] = _beside(folder, out[name])
    if out.get("pidfile"):
        out["pidfile"] = _beside(folder, out["pidfile"])
    return out


def _alerts(alerts: Mapping[str, Any], environ: Mapping[str, str]) -> AlertsSettings:
    """``[alerts]`` with the webhook's secret read from its variable and the thresholds sorted."""
    settings = AlertsSettings(**alerts)  # an absent table: the defaults
    return replace(
        settings,
        thresholds=tuple(sorted(set(settings.thresholds))),
        webhook_secret=environ.get(settings.webhook_secret_env, ""),
    )


def _identity(identity: Mapping[str, Any], environ: Mapping[str, str]) -> IdentitySettings:
    """``[identity]`` with the client's secret read from its variable (never from the file); an
    absent table: the defaults."""
    listed = ("admins", "viewers", "org_admins", "groups")
    settings = IdentitySettings(**{k: v for k, v in identity.items() if k not in listed})
    groups = tuple(
        GroupSettings(
            name=name,
            org=group["org"],
            models=tuple(group["models"]),
            daily_micros=_usd_micros(group["daily_usd"]),
            weekly_micros=_usd_micros(group["weekly_usd"]),
            monthly_micros=_usd_micros(group["monthly_usd"]),
            rpm=group["rpm"],
            tpm=group["tpm"],
        )
        for name, group in sorted(identity.get("groups", {}).items())
    )
    return replace(
        settings,
        groups=groups,
        client_secret=environ.get(settings.client_secret_env, ""),
        admins=tuple(identity.get("admins", ())),
        viewers=tuple(identity.get("viewers", ())),
        org_admins=tuple(sorted(identity.get("org_admins", {}).items())),
        scopes=" ".join(settings.scopes.split()),
    )


OTLP_TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path of traces on a collector's address


def traces_url(address: str) -> str:
    """The OTLP/HTTP traces URL of a collector's ``address``: as it is when it names the path
    already, else with ``/v1/traces`` added (as OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    base = address.rstrip("/")
    return base if base.endswith(OTLP_TRACES_PATH) else base + OTLP_TRACES_PATH


def _telemetry(telemetry: Mapping[str, Any], environ: Mapping[str, str]) -> TelemetrySettings:
    """``[telemetry]`` with the traces URL resolved: ``otlp_endpoint``, else (``from_environment``)
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is or OTEL_EXPORTER_OTLP_ENDPOINT's traces URL, the
    OpenTelemetry SDK's own order; "" leaves telemetry off."""
    settings = TelemetrySettings(**{k: v for k, v in telemetry.items() if k != "headers"})
    endpoint = traces_url(settings.otlp_endpoint) if settings.otlp_endpoint else ""
    if not endpoint and settings.from_environment:
        if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            endpoint = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            endpoint = traces_url(environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    return replace(settings, headers=tuple(sorted(telemetry.get("headers", {}).items())), endpoint=endpoint)


def parse_config(
    data: Mapping[str, Any], *, path: str = DEFAULT_CONFIG_NAME, environ: Mapping[str, str] | None = None
) -> Config:
    """Validate already-parsed TOML data and build the frozen ``Config``."""
    environ = os.environ if environ is None else environ
    label = os.path.basename(path) or path
    try:
        loaded = _SCHEMA.load(data)
    except ValidationError as exc:
        problems = [format_error(p, m) for p, m in flatten_errors(exc.messages)]
        raise ConfigError("\n".join(f"{label}: {p}" for p in problems)) from None
    gateway = dict(loaded["gateway"])
    folder = os.path.dirname(os.path.abspath(path))
    gateway["ca_file"] = _beside(folder, gateway.get("ca_file", ""))
    if environ.get("EZAT_DATABASE_URL"):
        gateway["database_url"] = environ["EZAT_DATABASE_URL"]
    if "EZAT_REDIS_URL" in environ:
        gateway["redis_url"] = environ["EZAT_REDIS_URL"]
    if environ.get(DATA_DIR_ENV):
        gateway["data_dir"] = environ[DATA_DIR_ENV]
    admin = dict(loaded["admin"])
    if ADMIN_BIND_ENV in environ:  # even "": no admin listener (tests give each gateway its own port)
        admin["bind"] = environ[ADMIN_BIND_ENV]
    data_path = _beside(folder, gateway.get("data_dir", "")) or folder
    gateway["database_url"] = sqlite_beside(gateway.get("database_url", GatewaySettings.database_url), data_path)
    return Config(
        gateway=GatewaySettings(**gateway),
        server=ServerSettings(**_log_files(loaded["server"], folder)),
        models=tuple(_build_model(m, environ, folder) for m in loaded["models"]),
        path=path,
        responses=ResponsesSettings(**loaded["responses"]),
        logging=LoggingSettings(**loaded["logging"]),
        admin=AdminSettings(**admin),
        spend=SpendSettings(**loaded["spend"]),
        alerts=_alerts(loaded["alerts"], environ),
        identity=_identity(loaded["identity"], environ),
        console=ConsoleSettings(**loaded["console"]),
        telemetry=_telemetry(loaded["telemetry"], environ),
    )


def resolve_config_path(cli_path: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``--config`` wins, then ``EZAT_CONFIG``, then ``./ezat.toml``."""
    environ = os.environ if environ is None else environ
    return cli_path or environ.get("EZAT_CONFIG") or DEFAULT_CONFIG_NAME


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate the TOML file at ``path``; raise ``ConfigError`` naming the file."""
    label = os.path.basename(os.fspath(path))
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"{label}: no such configuration file ({os.path.abspath(path)}); pass --config PATH or set EZAT_CONFIG"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read the file: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: the file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: invalid TOML: {exc}") from None
    return parse_config(data, path=os.fspath(path), environ=environ)
