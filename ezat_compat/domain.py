"""The gateway's domain types: models, deployments, prices, usage and the settings.

Plain frozen dataclasses and nothing else: no I/O, no framework, no TOML. ``config.py`` loads
the configuration file into them; the pure core (``translate/``, ``pricing``, ``routing``,
``catalog``) and the shell alike take them as parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

EFFORTS = ("low", "medium", "high", "xhigh", "max")
THINKING_STYLES = ("adaptive", "budget", "always", "none")
# how a deployment is reached (upstream/providers/)
PROVIDERS = ("anthropic", "bedrock", "vertex", "foundry", "claude_platform_aws", "bedrock_messages")
_MIB = 1024 * 1024


@dataclass(frozen=True)
class Price:
    """USD per million tokens (equivalently: micro-USD per token)."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal
    web_search: Decimal = Decimal(0)  # USD per web search (not per million)


@dataclass(frozen=True)
class Deployment:
    name: str
    base_url: str
    upstream_model: str
    api_key_env: str = "ANTHROPIC_API_KEY"
    api_key: str = field(default="", repr=False)
    anthropic_version: str = "2023-06-01"
    priority: int = 0
    weight: float = 1.0
    proxy: str | None = None  # None: the environment's (HTTPS_PROXY, NO_PROXY…); "": none
    ca_file: str = ""  # trusted besides the default bundle (and [gateway] ca_file)
    client_cert: str = ""  # PEM, for an upstream that asks for a client certificate (mTLS)
    client_key: str = ""  # PEM; "" when client_cert holds the key too
    provider: str = "anthropic"  # one of PROVIDERS
    region: str = ""  # the clouds (bedrock, vertex, claude_platform_aws, bedrock_messages): the region
    aws_profile: str = ""  # the AWS providers: a profile of the shared AWS files ("": botocore's default chain)
    workspace_id: str = ""  # claude_platform_aws: the workspace, sent as anthropic-workspace-id
    project: str = ""  # vertex: the Google Cloud project id
    guardrail: str = ""  # bedrock: the guardrail applied to each invocation ("": none)
    guardrail_version: str = ""  # bedrock: its version (a number or DRAFT), required with it
    service_tier: str = ""  # bedrock: priority, default, flex or reserved ("": Bedrock's default)
    hosting: str = "azure"  # foundry: "azure" (Hosted on Azure, the portal's default) or "anthropic"
    auth: str = "api_key"  # foundry: "api_key" (the resource's key) or "entra_id" (azure-identity's tokens)
    tenant_id: str = ""  # foundry, entra_id: with client_id and client_secret_env, a service principal
    client_id: str = ""  # foundry, entra_id: the app (or a user-assigned managed identity's) client id
    client_secret_env: str = ""  # foundry, entra_id: the variable holding the service principal's secret
    client_secret: str = field(default="", repr=False)  # its value, read when the file is loaded
    authority_host: str = ""  # foundry, entra_id: the Entra authority ("": azure-identity's, login.microsoftonline.com)
    price: Price | None = None  # overrides the model's price for requests this deployment serves

    @property
    def needs_key(self) -> bool:
        """True when the deployment authenticates with a key read from ``api_key_env`` (routing
        skips it while the variable is unset); False for SigV4 and Google's credentials."""
        return bool(self.api_key_env)


@dataclass(frozen=True)
class Model:
    id: str
    aliases: tuple[str, ...]
    price: Price
    deployments: tuple[Deployment, ...]
    context_window: int = 200_000
    max_output_tokens: int = 64_000
    sampling: bool = False
    caching: bool = True
    min_cache_tokens: int = 1024
    efforts: tuple[str, ...] = EFFORTS
    thinking: str = "adaptive"
    forced_tool_choice: bool = True
    prefill: bool = False
    structured_output: bool = True
    vision: bool = True
    pdf: bool = True
    tools: bool = True
    web_search: bool = False  # the Responses web_search tool becomes Anthropic's server-side web search
    # What the upstream accepts of images (Anthropic's Messages API; "Images and PDFs" fits
    # every image to these before a request goes out). Sizes are of the base64 text.
    max_image_bytes: int = 5 * _MIB  # one image's base64 data, as the API measures it
    max_image_px: int = 8000  # either side of one image
    many_images: int = 20  # more images than this in one request...
    many_images_max_px: int = 2000  # ...and each side is at most this
    max_request_bytes: int = 32 * _MIB  # the whole upstream request body


@dataclass(frozen=True)
class GatewaySettings:
    """``[gateway]``: the database, Redis, timeouts, keep-alive, body and image limits, cooldowns."""

    database_url: str = "sqlite:///ezat.db"
    redis_url: str = ""
    upstream_timeout_s: float = 590.0
    stream_idle_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    keepalive_s: float = 15.0
    max_body_mb: float = 32.0
    max_upstream_body_mb: float = 64.0  # a non-streaming upstream answer larger than this fails over
    allow_private_image_hosts: bool = False
    image_fetch_threads: int = 64  # the worker's download pool, shared by every organization
    image_fetch_org_threads: int = 20  # of which one organization holds at most this many (20: one request's URLs)
    image_decode_threads: int = 2  # image header reads, decodes and fits at once (one organization: all but one)
    image_fetch_request_threads: int = 20  # and one request at most this many
    cooldown_failures: int = 3
    cooldown_s: float = 30.0
    max_cooldown_s: float = 300.0
    thinking_ttl_s: float = 86400.0  # how long thinking blocks are kept for the client's next tool round
    # journal, counters, sealing key; relative to the config file's folder ("" = that folder);
    # EZAT_DATA_DIR overrides it (the systemd unit points it at its StateDirectory)
    data_dir: str = ""
    first_event_timeout_s: float = 30.0  # a stream without headers and a first event by then fails over
    web_search_max_uses: int = 10  # a web search tool sent without max_uses gets this many (and it is reserved)
    ca_file: str = ""  # a CA every deployment trusts besides the default bundle (a TLS-inspecting proxy's)
    # each organisation's upstream prompt cache its own (a scope block first in every cacheable prompt)
    isolate_prompt_cache: bool = True


@dataclass(frozen=True)
class ServerSettings:
    """``[server]``: how gunicorn serves the app."""

    bind: str = "127.0.0.1:8080"
    workers: int = 2
    worker_connections: int = 4000
    timeout_s: int = 30
    graceful_timeout_s: int = 630  # covers the longest non-streaming request (upstream_timeout_s) and a drain
    drain_s: float = 10.0  # on SIGTERM: not-ready while still serving, before the graceful stop
    http_keepalive_s: int = 5
    log_level: str = "info"
    pidfile: str = ""  # the master's pid is written here when set (systemd's PIDFile=, monitoring)
    name: str = ""  # names the instance in process titles (``ps``); default: the config file's path
    metrics_bind: str = ""  # HOST:PORT serving /metrics alone (then /metrics on ``bind`` answers 404)
    body_grace_s: float = 10.0  # a request body may take this long, then must keep up body_min_rate_kbps
    body_min_rate_kbps: float = 64.0  # KiB/s: 32 MB take at most 10 s + 512 s
    forwarded_allow_ips: str = "127.0.0.1"  # proxies whose X-Forwarded-For names the client (gunicorn's list)
    access_log: str = "-"  # the request log's file ("-": stderr); reopened on SIGUSR1 (logrotate)
    error_log: str = "-"  # the error log's file, ours and gunicorn's ("-": stderr); reopened on SIGUSR1
    public_url: str = ""  # the URL clients reach the gateway at (the console's snippets); "": from bind


LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class LoggingSettings:
    """``[logging]``: one line per record on stderr, ours and gunicorn's alike."""

    format: str = "json"  # json | text
    level: str = ""  # debug | info | warning | error; empty: ``[server] log_level``
    access_log: bool = True  # one line per request


@dataclass(frozen=True)
class ResponsesSettings:
    """``[responses]``: stored responses of the Responses API (docs/responses.md)."""

    store: bool = True  # false: nothing is stored, previous_response_id answers 400
    ttl_days: float = 30.0
    org_quota_mb: float = 1024.0  # per organisation: MiB of stored responses and thread turns (0: no limit)
    org_quota_count: int = 200_000  # per organisation: stored responses and thread turns (0: no limit)


@dataclass(frozen=True)
class SpendSettings:
    """``[spend]``: spend limits by period (store/spend.py)."""

    time_zone: str = "UTC"  # the periods' zone (IANA): days start at its midnight, weeks on Monday, months on the 1st


@dataclass(frozen=True)
class AlertsSettings:
    """``[alerts]``: the spend limits' threshold alerts (ezat_compat/alerts.py)."""

    webhook_url: str = ""  # where each threshold crossing is POSTed ("": no webhook; the gauges stay)
    webhook_secret_env: str = "EZAT_ALERTS_WEBHOOK_SECRET"  # the variable holding the HMAC-SHA256 secret
    webhook_secret: str = field(default="", repr=False)  # its value, read when the file is loaded
    thresholds: tuple[int, ...] = (80, 100)  # percent of a limit's amount, for limits that name none
    every_s: float = 5.0  # how often each worker looks for crossings and refreshes the gauges


@dataclass(frozen=True)
class AdminSettings:
    """``[admin]``: where the admin API (``/v1/organizations/…``) is served (docs/admin-api.md)."""

    bind: str = "127.0.0.1:8081"  # its own listener; "" = none (EZAT_ADMIN_BIND overrides it)
    on_main_listener: bool = False  # true: served on ``[server] bind`` too


ROLES = ("admin", "org_admin", "viewer")  # the console's roles, widest first


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """``[identity.groups."<IdP group>"]``: what the members of an IdP group get. ``org``: the
    organisation that pays for their requests ("" = this group names none); ``models``: glob
    patterns (empty: every model); the per-person caps each member gets at sign-in, in
    micro-USD (None: none)."""

    name: str
    org: str = ""
    models: tuple[str, ...] = ()
    daily_micros: int | None = None
    weekly_micros: int | None = None
    monthly_micros: int | None = None
    rpm: int | None = None  # each member's requests per minute at most, all their keys together
    tpm: int | None = None  # and tokens per minute


@dataclass(frozen=True)
class IdentitySettings:
    """``[identity]``: the company's OpenID Connect provider, for the console's sign-in
    (docs/console.md). ``issuer`` "" = none configured: break-glass links only."""

    issuer: str = ""  # discovery at <issuer>/.well-known/openid-configuration
    client_id: str = ""
    client_secret_env: str = "EZAT_OIDC_CLIENT_SECRET"  # the variable holding the client's secret
    client_secret: str = field(default="", repr=False)  # its value, read when the file is loaded
    groups_claim: str = "groups"  # the ID token's claim listing the person's groups
    admins: tuple[str, ...] = ()  # groups whose members are gateway admins
    viewers: tuple[str, ...] = ()  # groups whose members see everything and change nothing
    org_admins: tuple[tuple[str, str], ...] = ()  # (group, organisation name): who administers which
    scopes: str = "openid email profile"
    # People (docs/people.md): JWT bearers, command-line sign-in, groups.
    audience: str = ""  # the ``aud`` a JWT bearer must name ("" = client_id)
    jwt_bearers: bool = False  # accept the IdP's JWTs as bearers on the inference routes
    clock_skew_s: int = 60  # leeway on a JWT's exp, nbf and iat
    key_hours: float = 8.0  # the life of a key minted by a command-line sign-in
    session_days: int = 30  # a command-line sign-in, refreshable this long after its last use
    default_org: str = ""  # pays for people in no mapped group ("" = they get no key)
    groups: tuple[GroupSettings, ...] = ()  # [identity.groups."<IdP group>"]

    @property
    def enabled(self) -> bool:
        """Whether people sign in with the IdP (else only break-glass links open the console)."""
        return bool(self.issuer)

    @property
    def bearer_audience(self) -> str:
        """The audience a JWT bearer must name."""
        return self.audience or self.client_id


@dataclass(frozen=True)
class ConsoleSettings:
    """``[console]``: the web console's sessions and sign-in limits."""

    idle_timeout_s: int = 1800  # a session unused this long is over
    absolute_timeout_s: int = 43200  # and any session this long after sign-in
    secure_cookies: bool = True  # the session cookie's Secure flag (false only for plain-HTTP tests)
    sign_in_attempts_per_minute: int = 10  # per client address


OTLP_PROTOCOLS = ("http/protobuf",)  # how spans reach the collector (the telemetry extra's exporter)


@dataclass(frozen=True)
class TelemetrySettings:
    """``[telemetry]``: OpenTelemetry traces of each request with the GenAI semantic conventions,
    exported over OTLP to the operator's collector (docs/config.md). Off unless ``endpoint``."""

    otlp_endpoint: str = ""  # the collector's OTLP/HTTP address ("": off, unless from_environment finds one)
    from_environment: bool = False  # true: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT when otlp_endpoint is ""
    protocol: str = "http/protobuf"  # one of OTLP_PROTOCOLS
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # sent with each export (a token)
    service_name: str = "ezat-compat"
    sample_ratio: float = 1.0  # of the traces this gateway starts (a caller's sampled flag is followed)
    record_person: bool = False  # true: the key's (and person's) id on each span
    timeout_s: float = 10.0  # one export's bound
    endpoint: str = ""  # the traces URL spans are sent to, resolved when the file is loaded ("": off)

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)


@dataclass(frozen=True)
class Config:
    gateway: GatewaySettings
    server: ServerSettings
    models: tuple[Model, ...]
    path: str = ""
    responses: ResponsesSettings = field(default_factory=ResponsesSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    spend: SpendSettings = field(default_factory=SpendSettings)
    alerts: AlertsSettings = field(default_factory=AlertsSettings)
    identity: IdentitySettings = field(default_factory=IdentitySettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)

    @property
    def max_body_bytes(self) -> int:
        return int(self.gateway.max_body_mb * 1024 * 1024)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request, in Anthropic's terms (what billing needs)."""

    input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    web_searches: int = 0  # server-side web searches, billed per search

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
