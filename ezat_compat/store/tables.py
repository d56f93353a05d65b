"""The schema: organisations, API keys, open reservations, the ledger and kept thinking blocks
(SQLAlchemy Core).

Money columns are integer micro-USD (``BigInteger``). Times are stored as integer epoch
microseconds (UTC) through ``UtcMicros``, so every backend compares and indexes them the
same way and ledger rows stay narrow; Python code sees aware UTC ``datetime`` objects.

The migrations in ``store/migrations/versions`` create exactly these tables: when you change a
table here, add a migration script too (a test compares the two).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICRO = timedelta(microseconds=1)

# An INTEGER PRIMARY KEY is SQLite's autoincrementing rowid; a BIGINT one is not.
BigId = BigInteger().with_variant(Integer(), "sqlite")

MODEL_MAX = 200  # the model name as sent by the client is cut to this many characters


def to_epoch_micros(moment: datetime) -> int:
    """An aware ``datetime`` as integer microseconds since the epoch. Naive values are refused:
    pass ``datetime.now(UTC)`` or another aware value."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{moment!r} has no time zone; pass an aware datetime such as datetime.now(UTC)")
    return (moment - _EPOCH) // _ONE_MICRO


def from_epoch_micros(micros: int) -> datetime:
    """Integer epoch microseconds as an aware UTC ``datetime``."""
    return _EPOCH + timedelta(microseconds=micros)


class UtcMicros(TypeDecorator[datetime]):
    """An aware ``datetime`` stored as a BIGINT of epoch microseconds (UTC)."""

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> int | None:
        return None if value is None else to_epoch_micros(value)

    def process_result_value(self, value: int | None, dialect: Dialect) -> datetime | None:
        return None if value is None else from_epoch_micros(value)


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
    }
)

orgs = Table(
    "orgs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("balance_micros", BigInteger, nullable=False, default=0),
    Column("reserved_micros", BigInteger, nullable=False, default=0),
    Column("suspended", Boolean, nullable=False, default=False),
    Column("created_at", UtcMicros, nullable=False),
    # The admin API (0008): the workspace id ("wrkspc_…", set for every org: 0008 gave the older
    # ones theirs), when it was suspended ("archived"), and what each of its keys may use at most:
    # model patterns ("" = every model) and requests/tokens per minute (NULL = no cap).
    Column("public_id", String(40), nullable=True),
    Column("suspended_at", UtcMicros, nullable=True),
    Column("models", String(2048), nullable=False, server_default=""),
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Index("ux_orgs_public_id", "public_id", unique=True),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(32), nullable=False, unique=True),
    Column("org_id", Integer, ForeignKey("orgs.id"), nullable=False, index=True),
    Column("name", String(128), nullable=False, default=""),
    Column("prefix", String(16), nullable=False),
    Column("key_hash", String(64), nullable=False),
    Column("models", String(2048), nullable=False, default=""),
    Column("spend_limit_micros", BigInteger, nullable=True),
    Column("spent_micros", BigInteger, nullable=False, default=0),
    Column("reserved_micros", BigInteger, nullable=False, default=0),
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("created_at", UtcMicros, nullable=False),
    Column("expires_at", UtcMicros, nullable=True),
    Column("revoked_at", UtcMicros, nullable=True),
    # The admin API (0008): blocked ("inactive": refused until unblocked), last used (written at
    # most once a minute per key and worker), and who created it (an admin key's id, "cli:<user>").
    Column("blocked_at", UtcMicros, nullable=True),
    Column("last_used_at", UtcMicros, nullable=True),
    Column("created_by", String(160), nullable=True),
    # People (0013): the person a key belongs to (minted by their sign-in, or their IdP tokens' key);
    # NULL for a key an operator made for a service or a team. Never changes once set. (No foreign
    # key: SQLite can't add one to an existing table without copying it.)
    Column("user_id", Integer, nullable=True, index=True),
    Index("ix_api_keys_key_hash", "key_hash", unique=True),
)

reservations = Table(
    "reservations",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("org_id", Integer, ForeignKey("orgs.id"), nullable=False),
    Column("key_id", Integer, ForeignKey("api_keys.id"), nullable=False),
    Column("amount_micros", BigInteger, nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    # Who holds it and what for (store/hotpath.py ``worker_tag``): when that worker dies, its
    # reservations are released at once with a ledger row naming the endpoint and model.
    Column("worker", String(160), nullable=True),
    Column("endpoint", String(32), nullable=True),
    Column("model", String(MODEL_MAX), nullable=True),
    Column("canonical_model", String(128), nullable=True),
    # The spend limits' period counters it holds ``amount_micros`` on (store/spend.py
    # ``encode_holds``: "limit_id:period_start,…"); NULL when no limit applied to it.
    Column("spend_holds", String(512), nullable=True),
    # Only the requests in flight, inserted and deleted once each: no secondary index (the sweep
    # and a dead worker's release scan it), and on SQLite the rows live in the key's B-tree.
    sqlite_with_rowid=False,
)

ledger = Table(
    "ledger",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("request_id", String(64), nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    Column("org_id", Integer, ForeignKey("orgs.id"), nullable=False),
    Column("key_id", Integer, ForeignKey("api_keys.id"), nullable=False),
    Column("endpoint", String(32), nullable=False),
    Column("model", String(MODEL_MAX), nullable=False),
    Column("canonical_model", String(128), nullable=False),
    Column("deployment", String(128), nullable=False),
    Column("input_tokens", Integer, nullable=False),
    Column("cache_write_tokens", Integer, nullable=False),
    Column("cache_read_tokens", Integer, nullable=False),
    Column("output_tokens", Integer, nullable=False),
    Column("reasoning_tokens", Integer, nullable=False),
    Column("cost_micros", BigInteger, nullable=False),
    Column("status", SmallInteger, nullable=False),
    Column("estimated", Boolean, nullable=False),
    # The person who made the request (0013): their key's ``user_id``, copied by the INSERT itself
    # (store/hotpath.py ``INSERT_LEDGER_SQL``), so every way a row is written names them.
    Column("user_id", Integer, nullable=True),
    Index("ux_ledger_request_id", "request_id", unique=True),
    Index("ix_ledger_org_created", "org_id", "created_at"),
    Index("ix_ledger_key_created", "key_id", "created_at"),
    # The console's usage rows newest first, and its count of failed requests, when no organisation
    # or key narrows them (0012).
    Index("ix_ledger_created", "created_at", "status"),
)

# Thinking blocks of a reply that called tools, kept for the client's next round (store/thinking.py):
# one row per tool call id the client sees (its SHA-256, so any id length indexes), the blocks as
# the JSON text received. A cache: no foreign key, rows past ``expires_at`` are ignored and purged.
thinking_stash = Table(
    "thinking_stash",
    metadata,
    Column("org_id", Integer, primary_key=True, autoincrement=False),
    Column("tool_key", String(64), primary_key=True),
    Column("blocks", Text, nullable=False),
    Column("expires_at", UtcMicros, nullable=False),
    Index("ix_thinking_stash_expires_at", "expires_at"),
)

# Stored responses of the Responses API (store/responses.py): one row per response the client let
# be stored, per organisation, until ``expires_at``. ``context`` holds the response's own input
# (``input_start`` 0) and ``previous_id`` the response it continued, whose row holds the rest of the
# conversation (a chain, read back in one statement); a row stored before 0007 holds the whole
# conversation instead (the earlier items, then its own input from ``input_start``), with no
# ``previous_id``. A long input is kept in ``response_parts`` instead (``context`` empty).
# ``response`` is the response object as JSON with its sealed reasoning.
# ``input_count``, ``input_chunks`` (where each chunk of items starts in ``context``) and
# ``input_ids`` (each own input item's own id, a line each) let ``input_items`` read one page
# (store/input_index.py; NULL on rows stored before 0007). ``stored_bytes`` counts against the organisation's quota.
responses = Table(
    "responses",
    metadata,
    Column("org_id", Integer, primary_key=True, autoincrement=False),
    Column("response_id", String(96), primary_key=True),
    Column("created_at", UtcMicros, nullable=False),
    Column("expires_at", UtcMicros, nullable=False),
    Column("context", Text, nullable=False),
    Column("input_start", Integer, nullable=False),
    Column("response", Text, nullable=False),
    Column("encrypted", Boolean, nullable=False),
    Column("previous_id", String(96), nullable=True),
    Column("input_count", Integer, nullable=True),
    Column("input_chunks", Text, nullable=True),
    Column("input_ids", Text, nullable=True),
    Column("stored_bytes", BigInteger, nullable=False, server_default="0"),
    Index("ix_responses_expires_at", "expires_at"),
)

# The parts of a long stored input (store/input_index.py): a response whose input's JSON is over
# 256 KB keeps it here, cut at chunk starts into rows of about 256 KB (its ``context`` empty), so a
# page of ``input_items`` reads a row or two. They go with their response (deleted, purged).
response_parts = Table(
    "response_parts",
    metadata,
    Column("org_id", Integer, primary_key=True, autoincrement=False),
    Column("response_id", String(96), primary_key=True),
    Column("part", Integer, primary_key=True, autoincrement=False),
    Column("text", Text, nullable=False),
)

# Message threads of native /v1/messages (store/threads.py): one row per turn, per organisation,
# keyed by the turn's reply id, until ``expires_at``. ``messages`` is what the turn added (its new
# messages, then the reply), ``previous_id`` the turn it continued (NULL for the first, whose
# ``fields`` hold the thread's ``system`` and ``tools``), ``root_id`` the first turn's id;
# ``stored_bytes`` counts against the organisation's storage quota.
message_threads = Table(
    "message_threads",
    metadata,
    Column("org_id", Integer, primary_key=True, autoincrement=False),
    Column("message_id", String(96), primary_key=True),
    Column("previous_id", String(96), nullable=True),
    Column("root_id", String(96), nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    Column("expires_at", UtcMicros, nullable=False),
    Column("fields", Text, nullable=True),
    Column("messages", Text, nullable=False),
    Column("stored_bytes", BigInteger, nullable=False, server_default="0"),
    Index("ix_message_threads_expires_at", "expires_at"),
)

# What each organisation's stored responses and threads' turns hold (store/quota.py): the sums of
# their ``stored_bytes`` and how many rows, kept by the writes that add and delete them, read by
# key before a request that would be stored (``[responses] org_quota_mb`` / ``org_quota_count``).
storage_usage = Table(
    "storage_usage",
    metadata,
    Column("org_id", Integer, primary_key=True, autoincrement=False),
    Column("stored_bytes", BigInteger, nullable=False),
    Column("stored_count", BigInteger, nullable=False),
)


# ---------------------------------------------------------------- the admin API (store/admin.py)
# Admin keys: ``ezat_admin_`` + 32 base62 characters, kept as their SHA-256 (the secret is shown
# once); ``public_id`` "adminkey_…" is what the audit trail names and ``admin-keys revoke`` takes.
admin_keys = Table(
    "admin_keys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column("name", String(128), nullable=False),
    Column("prefix", String(24), nullable=False),
    Column("key_hash", String(64), nullable=False),
    Column("read_only", Boolean, nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    Column("created_by", String(160), nullable=False),
    Column("expires_at", UtcMicros, nullable=True),
    Column("revoked_at", UtcMicros, nullable=True),
    Column("last_used_at", UtcMicros, nullable=True),
    Index("ix_admin_keys_key_hash", "key_hash", unique=True),
)

# The audit trail: one row per change made through the admin API or the CLI, never updated nor
# deleted (0008 adds triggers that refuse both). ``before``/``after``: the target's JSON without
# secrets (NULL: it didn't exist / doesn't any more).
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("at", UtcMicros, nullable=False),
    Column("actor", String(160), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target_type", String(32), nullable=False),
    Column("target_id", String(64), nullable=False),
    Column("before", Text, nullable=True),
    Column("after", Text, nullable=True),
    Column("address", String(64), nullable=False),
    Column("request_id", String(64), nullable=False),
    Index("ix_audit_log_at", "at"),
    Index("ix_audit_log_target", "target_type", "target_id"),
)

# A rotated key's previous secret (its SHA-256), accepted for the key until ``expires_at``: read
# only when a secret matches no key (store/hotpath.py ``AUTH_GRACE_SQL``).
api_key_grace = Table(
    "api_key_grace",
    metadata,
    Column("key_hash", String(64), primary_key=True),
    Column("key_id", Integer, ForeignKey("api_keys.id"), nullable=False, index=True),
    Column("expires_at", UtcMicros, nullable=False),
)


# ---------------------------------------------------------------- spend limits by period (store/spend.py)
# A cap on what one scope may spend per calendar period: the gateway as a whole (``scope_type``
# "gateway", ``scope_id`` 0), an organisation ("org", its id) or a key ("key", its id); one per
# (scope, period). ``amount_micros`` NULL is an explicit "no limit" (spend is still counted).
# ``thresholds``: alert percentages "80,100" (NULL: ``[alerts] thresholds``).
spend_limits = Table(
    "spend_limits",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column("scope_type", String(16), nullable=False),
    Column("scope_id", Integer, nullable=False),
    Column("period", String(8), nullable=False),
    Column("amount_micros", BigInteger, nullable=True),
    Column("thresholds", String(64), nullable=True),
    Column("created_at", UtcMicros, nullable=False),
    Column("updated_at", UtcMicros, nullable=False),
    Index("ux_spend_limits_scope", "scope_type", "scope_id", "period", unique=True),
)

# One row per (limit, period): what was spent in it and what requests in flight hold on it, kept
# by reserve/settle (store/hotpath.py). ``exhausted_at``: when a request was first refused because
# the period's spend left no room for it (the 100 % alert). No foreign key: a limit deleted while
# requests hold on it leaves their settles nothing to update.
spend_counters = Table(
    "spend_counters",
    metadata,
    Column("limit_id", Integer, primary_key=True, autoincrement=False),
    Column("period_start", UtcMicros, primary_key=True),
    Column("period_end", UtcMicros, nullable=False),
    Column("spent_micros", BigInteger, nullable=False),
    Column("reserved_micros", BigInteger, nullable=False),
    Column("exhausted_at", UtcMicros, nullable=True),
)

# The threshold alerts claimed (ezat_compat/alerts.py): the primary key makes each (limit, period,
# threshold) fire at most once across workers and nodes.
spend_alerts = Table(
    "spend_alerts",
    metadata,
    Column("limit_id", Integer, primary_key=True, autoincrement=False),
    Column("period_start", UtcMicros, primary_key=True),
    Column("threshold", SmallInteger, primary_key=True, autoincrement=False),
    Column("claimed_at", UtcMicros, nullable=False),
    Column("delivered_at", UtcMicros, nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
)

# ------------------------------------------------------------ the usage rollup (store/rollup.py)
# The ledger summed per (bucket start, organisation, key, canonical model) at three widths, for the
# admin API's usage and cost reports: kept by a background job that folds new ledger rows in by
# their id (never on a request's path), so a report reads a few thousand rows instead of millions.
# ``model`` is the ledger's ``canonical_model`` ("" for a request that failed before routing);
# ``requests`` counts every ledger row (failed ones too, at no cost: ``ezat-compat usage``'s count).


def _usage_rollup(name: str) -> Table:
    return Table(
        name,
        metadata,
        Column("bucket", UtcMicros, primary_key=True, autoincrement=False),
        Column("org_id", Integer, primary_key=True, autoincrement=False),
        Column("key_id", Integer, primary_key=True, autoincrement=False),
        Column("model", String(128), primary_key=True),
        Column("requests", BigInteger, nullable=False),
        Column("input_tokens", BigInteger, nullable=False),
        Column("cache_write_tokens", BigInteger, nullable=False),
        Column("cache_read_tokens", BigInteger, nullable=False),
        Column("output_tokens", BigInteger, nullable=False),
        Column("cost_micros", BigInteger, nullable=False),
        # Read by bucket ranges: on SQLite the rows live in the key's B-tree, in bucket order.
        sqlite_with_rowid=False,
    )


usage_1m = _usage_rollup("usage_1m")
usage_1h = _usage_rollup("usage_1h")
usage_1d = _usage_rollup("usage_1d")

# Where the fold stands (one row, ``id`` 1): every ledger row with ``id <= folded_id`` is in the
# rollup but those listed in ``usage_rollup_holes``; ``refreshed_at`` is when it last caught up.
usage_rollup = Table(
    "usage_rollup",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("folded_id", BigInteger, nullable=False),
    Column("refreshed_at", UtcMicros, nullable=True),
)

# Ledger ids at or below ``folded_id`` that no fold has seen yet (PostgreSQL hands out ids before
# the transactions that use them commit, so a later id can be visible first): folded when they
# appear, forgotten ``HOLE_TTL`` after ``seen_at`` (an id whose transaction rolled back never does).
usage_rollup_holes = Table(
    "usage_rollup_holes",
    metadata,
    Column("ledger_id", BigInteger, primary_key=True, autoincrement=False),
    Column("seen_at", UtcMicros, nullable=False),
)


# ---------------------------------------------------------------- the web console (store/console.py)
# A signed-in person's session: the cookie holds a random secret, the row its SHA-256
# (``secret_hash``) alone. ``public_id`` "cs_…" names it elsewhere (the audit trail). The person as
# signed in: ``subject`` (the IdP's ``sub``, or "breakglass:<link id>"), ``role`` and, for an
# organisation's admin, ``org_ids`` ("3,7"). ``ended_at``: signed out (or replaced).
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column("secret_hash", String(64), nullable=False),
    Column("subject", String(255), nullable=False),
    Column("name", String(255), nullable=False),
    Column("email", String(320), nullable=False),
    Column("role", String(16), nullable=False),
    Column("org_ids", String(1024), nullable=False),
    Column("csrf_token", String(64), nullable=False),
    Column("address", String(64), nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    Column("last_seen_at", UtcMicros, nullable=False),
    Column("ended_at", UtcMicros, nullable=True),
    Index("ix_console_sessions_secret_hash", "secret_hash", unique=True),
    Index("ix_console_sessions_last_seen_at", "last_seen_at"),
)

# A break-glass link (``ezat-compat console-link``): the SHA-256 of its token, used once before
# ``expires_at``. ``public_id`` "bgl_…" is the subject of the session it opens ("breakglass:bgl_…").
console_links = Table(
    "console_links",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column("token_hash", String(64), nullable=False),
    Column("created_by", String(160), nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    Column("expires_at", UtcMicros, nullable=False),
    Column("used_at", UtcMicros, nullable=True),
    Index("ix_console_links_token_hash", "token_hash", unique=True),
)

# A sign-in under way at the IdP: keyed by the SHA-256 of its ``state``, bound to the browser that
# started it (``binding_hash``: the SHA-256 of a cookie of its own), with the nonce and the PKCE
# verifier the callback needs; taken (deleted) by the first callback that names it.
console_logins = Table(
    "console_logins",
    metadata,
    Column("state_hash", String(64), primary_key=True),
    Column("binding_hash", String(64), nullable=False),
    Column("nonce", String(128), nullable=False),
    Column("code_verifier", String(128), nullable=False),
    Column("expires_at", UtcMicros, nullable=False),
    Index("ix_console_logins_expires_at", "expires_at"),
)


# ---------------------------------------------------------------- people (store/people.py)
# A person of the company's IdP, created at their first sign-in (the console, the device grant, or
# a JWT bearer) from the ID token's claims and brought up to date at each later one. ``subject``
# is the IdP's ``sub``; ``public_id`` "user_…" is the admin API's id. ``idp_groups``: the groups the
# IdP last said (a line each); ``group_ids`` ("3,7") the mapped ones among them (``idp_groups``
# table), read by authentication with the key; ``org_id`` the organisation that pays for the
# person's requests (the first mapped group's that names one, or ``[identity] default_org``);
# ``models`` what their groups let them use (patterns, "," between; "" every model; "-" none).
# ``disabled_at``: refused at once, everywhere (their keys' authentication reads it).
users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column("subject", String(255), nullable=False, unique=True),
    Column("email", String(320), nullable=False),
    Column("name", String(255), nullable=False),
    Column("idp_groups", Text, nullable=False),
    Column("group_ids", String(1024), nullable=False),
    Column("org_id", Integer, ForeignKey("orgs.id"), nullable=True),
    Column("models", String(2048), nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    Column("last_sign_in_at", UtcMicros, nullable=True),
    Column("disabled_at", UtcMicros, nullable=True),
    # Requests and tokens per minute across all the person's keys: their own caps (set by an
    # admin; NULL none) and the lowest of their mapped groups' (kept with ``group_ids``).
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("group_rpm", Integer, nullable=True),
    Column("group_tpm", Integer, nullable=True),
)

# A group of the IdP the gateway knows (``[identity.groups]`` or the admin API's rbac_groups):
# ``name`` as the IdP's groups claim writes it; its members' requests are paid by ``org_id``, may use
# ``models`` (patterns, "," between; "" every model) and each member gets the per-person caps
# ``daily_micros``/``weekly_micros``/``monthly_micros`` (spend limits of scope "user") at sign-in
# unless they have one for that period. ``source``: "config" (rewritten from the file at start)
# or "api".
idp_groups = Table(
    "idp_groups",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("org_id", Integer, ForeignKey("orgs.id"), nullable=True),
    Column("models", String(2048), nullable=False),
    Column("daily_micros", BigInteger, nullable=True),
    Column("weekly_micros", BigInteger, nullable=True),
    Column("monthly_micros", BigInteger, nullable=True),
    Column("rpm", Integer, nullable=True),  # each member's requests per minute at most (NULL: no cap)
    Column("tpm", Integer, nullable=True),  # and tokens per minute
    Column("source", String(16), nullable=False),
    Column("created_at", UtcMicros, nullable=False),
    Column("updated_at", UtcMicros, nullable=False),
)

# A device authorization (RFC 8628) under way: the SHA-256 of its ``device_code`` (the CLI's
# secret), the ``user_code`` the person types (unique while pending), when it ends, how often the
# CLI may poll and when it last did (``slow_down``). ``state``: "pending", "approved" (``user_id``
# and the sealed IdP refresh token ``idp_refresh`` set), "denied", or "used" (tokens issued once).
device_grants = Table(
    "device_grants",
    metadata,
    Column("code_hash", String(64), primary_key=True),
    Column("user_code", String(16), nullable=False),
    Column("client_id", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=True),
    Column("idp_refresh", Text, nullable=True),
    Column("created_at", UtcMicros, nullable=False),
    Column("expires_at", UtcMicros, nullable=False),
    Column("interval_s", Integer, nullable=False),
    Column("polled_at", UtcMicros, nullable=True),
    Index("ix_device_grants_user_code", "user_code"),
    Index("ix_device_grants_expires_at", "expires_at"),
)

# A person's sign-in from a command-line client: the SHA-256 of its refresh token (rotated at each
# use: the previous one is refused after), the IdP's own refresh token sealed (checked again at the
# IdP on each refresh), and the short-lived key last minted from it. ``ended_at``: revoked.
user_sessions = Table(
    "user_sessions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column("token_hash", String(64), nullable=False),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False, index=True),
    Column("client_id", String(128), nullable=False),
    Column("idp_refresh", Text, nullable=True),
    Column("key_id", Integer, ForeignKey("api_keys.id"), nullable=True),
    Column("created_at", UtcMicros, nullable=False),
    Column("refreshed_at", UtcMicros, nullable=False),
    Column("expires_at", UtcMicros, nullable=False),
    Column("ended_at", UtcMicros, nullable=True),
    Index("ix_user_sessions_token_hash", "token_hash", unique=True),
)
