"""The web console's state (``console/``): sessions, break-glass links and sign-ins under way.

A session lives here, not in the cookie: the cookie holds a random secret (256 bits from
``secrets``) and the row its SHA-256 alone, so a copy of the database opens no session. The row
keeps the person as signed in (subject, name, e-mail, role, the organisations an organisation's
admin administers), the session's CSRF token, when it began and was last used, and when it ended
(signed out). Whether a session is still alive (idle and absolute timeouts) is the caller's
decision (``console/security.py``), made from ``created_at`` and ``last_seen_at``.

A break-glass link (``ezat-compat console-link``) is a random token kept as its SHA-256, good
once before it expires: ``use_link`` marks it used in the same statement that checks it, so two
browsers following one link open one session. A sign-in under way at the IdP (``begin_login``)
is kept by the hash of its ``state`` with the nonce and PKCE verifier the callback needs, bound to
the browser that started it; ``take_login`` deletes it as it reads it, so a callback replayed
finds nothing.

Times are passed in (``now``), never read here but as a default.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Row, delete, insert, select, update

from ezat_compat.domain import ROLES
from ezat_compat.store.accounts import StoreError
from ezat_compat.store.db import write_engine
from ezat_compat.store.tables import console_links, console_logins, console_sessions

SESSION_ID_PREFIX = "cs_"
LINK_ID_PREFIX = "bgl_"
LINK_TTL = timedelta(minutes=15)  # a break-glass link is good this long after it is printed
LOGIN_TTL = timedelta(minutes=10)  # a sign-in must come back from the IdP within this
TOUCH_EVERY = timedelta(seconds=30)  # ``last_seen_at`` is written at most this often per session
KEEP_ENDED = timedelta(days=1)  # ended sessions and used or expired links are deleted after this
LONGEST_SESSION = timedelta(days=30)  # [console] timeouts' upper bound: older sessions are deleted


def secret_hash(secret: str) -> str:
    """SHA-256 hex of a cookie's secret or a link's token, as stored."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A console session as stored (never its cookie's secret)."""

    public_id: str
    subject: str
    name: str
    email: str
    role: str
    org_ids: frozenset[int]
    csrf_token: str
    address: str
    created_at: datetime
    last_seen_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class PendingLogin:
    """What the IdP's callback needs of the sign-in it answers."""

    nonce: str
    code_verifier: str


def _org_ids_text(org_ids: Iterable[int]) -> str:
    return ",".join(str(int(i)) for i in sorted(set(org_ids)))


def _session(row: Row[Any]) -> ConsoleSession:
    return ConsoleSession(
        public_id=row.public_id,
        subject=row.subject,
        name=row.name,
        email=row.email,
        role=row.role,
        org_ids=frozenset(int(i) for i in row.org_ids.split(",") if i),
        csrf_token=row.csrf_token,
        address=row.address,
        created_at=row.created_at,
        last_seen_at=row.last_seen_at,
        ended_at=row.ended_at,
    )


class ConsoleStore:
    """Console sessions, break-glass links and pending sign-ins in the database behind
    ``engine``. Thread-safe; one per process (``store.Store.console``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = write_engine(engine)

    # ------------------------------------------------------------ sessions

    def open_session(
        self,
        *,
        subject: str,
        name: str = "",
        email: str = "",
        role: str,
        org_ids: Iterable[int] = (),
        address: str = "",
        now: datetime | None = None,
    ) -> tuple[str, str]:
        """A new session for a person who has just signed in; returns ``(cookie value, public
        id)``: set the first as the cookie (it can't be recovered), name the session by the
        second. ``StoreError`` for an unknown role."""
        if role not in ROLES:
            raise StoreError(f"role: one of {', '.join(ROLES)}, got {role!r}")
        now = now or datetime.now(UTC)
        secret = secrets.token_urlsafe(32)
        public_id = SESSION_ID_PREFIX + secrets.token_hex(10)
        with self._writer.begin() as conn:
            conn.execute(
                delete(console_sessions).where(console_sessions.c.last_seen_at < now - KEEP_ENDED - LONGEST_SESSION)
            )
            conn.execute(
                insert(console_sessions).values(
                    public_id=public_id,
                    secret_hash=secret_hash(secret),
                    subject=subject[:255],
                    name=name[:255],
                    email=email[:320],
                    role=role,
                    org_ids=_org_ids_text(org_ids),
                    csrf_token=secrets.token_urlsafe(32),
                    address=address[:64],
                    created_at=now,
                    last_seen_at=now,
                    ended_at=None,
                )
            )
        return secret, public_id

    def find_session(self, cookie_value: str) -> ConsoleSession | None:
        """The session whose cookie holds ``cookie_value`` (an ended one too: the caller refuses
        it), or None. One indexed SELECT."""
        if not cookie_value or len(cookie_value) > 128:
            return None
        with self._engine.connect() as conn:
            row = conn.execute(
                select(console_sessions).where(console_sessions.c.secret_hash == secret_hash(cookie_value))
            ).first()
        return None if row is None else _session(row)

    def get_session(self, public_id: str) -> ConsoleSession | None:
        """The session ``public_id``, or None."""
        with self._engine.connect() as conn:
            row = conn.execute(select(console_sessions).where(console_sessions.c.public_id == public_id)).first()
        return None if row is None else _session(row)

    def touch(self, session: ConsoleSession, now: datetime) -> None:
        """Note that ``session`` was used at ``now`` (written at most every ``TOUCH_EVERY``)."""
        if now - session.last_seen_at < TOUCH_EVERY:
            return
        with self._writer.begin() as conn:
            conn.execute(
                update(console_sessions)
                .where(console_sessions.c.public_id == session.public_id, console_sessions.c.ended_at.is_(None))
                .values(last_seen_at=now)
            )

    def end_session(self, public_id: str, now: datetime | None = None) -> bool:
        """End a session (sign-out, or a timeout noticed): its cookie opens nothing from now on.
        True if it was alive."""
        with self._writer.begin() as conn:
            result = conn.execute(
                update(console_sessions)
                .where(console_sessions.c.public_id == public_id, console_sessions.c.ended_at.is_(None))
                .values(ended_at=now or datetime.now(UTC))
            )
        return bool(result.rowcount)

    # ------------------------------------------------------------ break-glass links

    def create_link(
        self, *, created_by: str, now: datetime | None = None, ttl: timedelta = LINK_TTL
    ) -> tuple[str, str, datetime]:
        """A new break-glass link: returns ``(token, public id, expiry)``; the token goes in the
        printed URL and can't be recovered."""
        now = now or datetime.now(UTC)
        token = secrets.token_urlsafe(32)
        public_id = LINK_ID_PREFIX + secrets.token_hex(8)
        expires_at = now + ttl
        with self._writer.begin() as conn:
            conn.execute(
                delete(console_links).where(console_links.c.expires_at < now - KEEP_ENDED),
            )
            conn.execute(
                insert(console_links).values(
                    public_id=public_id,
                    token_hash=secret_hash(token),
                    created_by=created_by[:160],
                    created_at=now,
                    expires_at=expires_at,
                    used_at=None,
                )
            )
        return token, public_id, expires_at

    def use_link(self, token: str, now: datetime | None = None) -> str | None:
        """Use the link whose token is ``token``: its public id if it was unused and unexpired
        (it is used from now on), else None. One UPDATE decides, whoever else follows it."""
        if not token or len(token) > 128:
            return None
        now = now or datetime.now(UTC)
        digest = secret_hash(token)
        with self._writer.begin() as conn:
            result = conn.execute(
                update(console_links)
                .where(
                    console_links.c.token_hash == digest,
                    console_links.c.used_at.is_(None),
                    console_links.c.expires_at > now,
                )
                .values(used_at=now)
            )
            if result.rowcount != 1:
                return None
            return str(
                conn.execute(select(console_links.c.public_id).where(console_links.c.token_hash == digest)).scalar_one()
            )

    # ------------------------------------------------------------ sign-ins under way at the IdP

    def begin_login(
        self,
        *,
        state: str,
        binding: str,
        nonce: str,
        code_verifier: str,
        now: datetime | None = None,
        ttl: timedelta = LOGIN_TTL,
    ) -> None:
        """Keep a sign-in sent to the IdP: its ``state`` (by hash), the browser's ``binding``
        secret (by hash), the ``nonce`` and PKCE ``code_verifier``, until ``ttl`` from ``now``.
        Expired ones are dropped on the way."""
        now = now or datetime.now(UTC)
        with self._writer.begin() as conn:
            conn.execute(delete(console_logins).where(console_logins.c.expires_at <= now))
            conn.execute(
                insert(console_logins).values(
                    state_hash=secret_hash(state),
                    binding_hash=secret_hash(binding),
                    nonce=nonce,
                    code_verifier=code_verifier,
                    expires_at=now + ttl,
                )
            )

    def take_login(self, *, state: str, binding: str, now: datetime | None = None) -> PendingLogin | None:
        """The sign-in ``state`` names, taken (deleted) whatever follows: None when there is none
        (a wrong or replayed state), it has expired, or ``binding`` is not the browser's that
        started it."""
        if not state or len(state) > 256:
            return None
        now = now or datetime.now(UTC)
        digest = secret_hash(state)
        with self._writer.begin() as conn:
            row = conn.execute(select(console_logins).where(console_logins.c.state_hash == digest)).first()
            if row is None:
                return None
            taken = conn.execute(delete(console_logins).where(console_logins.c.state_hash == digest)).rowcount
        if taken != 1 or row.expires_at <= now:
            return None
        if not hmac.compare_digest(row.binding_hash, secret_hash(binding or "")):
            return None
        return PendingLogin(nonce=row.nonce, code_verifier=row.code_verifier)
