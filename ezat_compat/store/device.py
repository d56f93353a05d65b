"""Command-line sign-ins: device authorizations under way (RFC 8628) and the sessions they open.

A device authorization (``device_grants``) is what ``POST /oauth/device/code`` starts: a
``device_code`` (the command-line client's secret, 256 random bits, kept as its SHA-256 alone) and
a ``user_code`` the person types in a browser (8 letters of ``USER_CODE_ALPHABET``, shown
``XXXX-XXXX``: no vowels, so no word is spelled, and no letter mistaken for a digit; read in any
letter case, with or without the dash or spaces, RFC 8628 section 6.1). It lives ``GRANT_TTL``
(600 s) and may be polled every ``POLL_INTERVAL_S`` (5 s); a client polling faster is told
``slow_down`` and its interval grows by ``SLOW_DOWN_S`` (section 3.5). Approved (the person signed
in at the IdP) or denied once; its tokens are issued once (``poll`` marks it used in the same
statement that finds it approved: two polls at once get one answer of tokens).

A session (``user_sessions``) is what an approved authorization opens: a refresh token (256
random bits, kept as its SHA-256 alone) rotated at each use — ``claim`` swaps it for a new one in
one conditional UPDATE, so the previous one is refused afterwards, and two refreshes with one token
get one new token — the IdP's own refresh token (sealed by the caller; this module never sees it
in clear), and the short-lived key last minted from it. A session expires ``session_days`` after
its last refresh, or ends at once (``end``: the IdP refused, the person was disabled).

Times are passed in (``now``), never read here but as a default. ``purge`` deletes what is over
(expired grants and sessions over, a day later): each new session runs it, and each new grant
drops the grants expired.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Row, delete, insert, or_, select, update

from ezat_compat.store.accounts import hash_key
from ezat_compat.store.db import write_engine
from ezat_compat.store.tables import api_keys, device_grants, user_sessions

USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # RFC 8628 section 6.1: no vowels, nothing like a digit
USER_CODE_LENGTH = 8  # 20^8 (about 34 bits): ample for 600 s under a per-address attempt limit
GRANT_TTL = timedelta(seconds=600)  # ``expires_in`` of a device authorization
POLL_INTERVAL_S = 5  # ``interval``: the least wait between two polls
SLOW_DOWN_S = 5  # added to the interval at each ``slow_down`` (RFC 8628 section 3.5)
KEEP_OVER = timedelta(days=1)  # expired grants and ended sessions are deleted after this
SESSION_ID_PREFIX = "dss_"
SECRET_BYTES = 32  # device codes and refresh tokens: 256 random bits

# ``device_grants.state``
PENDING, APPROVED, DENIED, USED = "pending", "approved", "denied", "used"

# ``poll`` outcomes: RFC 8628 section 3.5's error codes, and "approved" (issue the tokens).
AUTHORIZATION_PENDING = "authorization_pending"
SLOW_DOWN = "slow_down"
ACCESS_DENIED = "access_denied"
EXPIRED_TOKEN = "expired_token"
INVALID_GRANT = "invalid_grant"  # unknown, or its tokens already issued (RFC 6749 section 5.2)
GRANTED = "approved"


secret_hash = hash_key  # a device code's or a refresh token's SHA-256 hex, as a key's is stored


def normal_user_code(text: str) -> str | None:
    """The user code ``text`` names, as stored (8 letters, no dash), or None when it can't be one:
    letter case, dashes and spaces are ignored (RFC 8628 section 6.1)."""
    letters = "".join(c for c in text.upper() if c not in "- \t")
    if len(letters) != USER_CODE_LENGTH or any(c not in USER_CODE_ALPHABET for c in letters):
        return None
    return letters


def shown_user_code(code: str) -> str:
    """``code`` as people read it: ``XXXX-XXXX``."""
    half = len(code) // 2
    return f"{code[:half]}-{code[half:]}"


def _new_user_code() -> str:
    return "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """A device authorization as stored (never its device code)."""

    user_code: str  # as stored: 8 letters
    client_id: str
    state: str
    user_id: int | None
    created_at: datetime
    expires_at: datetime
    interval_s: int

    @property
    def shown_code(self) -> str:
        return shown_user_code(self.user_code)


@dataclass(frozen=True, slots=True)
class Poll:
    """What a poll of the token endpoint gets: ``outcome`` (one of the constants above) and, for
    ``GRANTED``, the person, the client and the sealed IdP refresh token of the approval."""

    outcome: str
    interval_s: int = POLL_INTERVAL_S
    user_id: int | None = None
    client_id: str = ""
    idp_refresh: str | None = None


@dataclass(frozen=True, slots=True)
class UserSession:
    """A command-line sign-in as stored (never its refresh token)."""

    id: int
    public_id: str
    user_id: int
    client_id: str
    idp_refresh: str | None  # sealed
    key_id: int | None  # api_keys.id of the key last minted
    created_at: datetime
    refreshed_at: datetime
    expires_at: datetime
    ended_at: datetime | None


def _grant(row: Row[Any]) -> DeviceGrant:
    return DeviceGrant(
        user_code=row.user_code,
        client_id=row.client_id,
        state=row.state,
        user_id=row.user_id,
        created_at=row.created_at,
        expires_at=row.expires_at,
        interval_s=row.interval_s,
    )


def _session(row: Row[Any]) -> UserSession:
    return UserSession(
        id=row.id,
        public_id=row.public_id,
        user_id=row.user_id,
        client_id=row.client_id,
        idp_refresh=row.idp_refresh,
        key_id=row.key_id,
        created_at=row.created_at,
        refreshed_at=row.refreshed_at,
        expires_at=row.expires_at,
        ended_at=row.ended_at,
    )


def _waiting(code: str, now: datetime | None) -> tuple[Any, ...]:
    """The authorization of user code ``code`` while it waits for the person (not decided, not
    expired at ``now``)."""
    return (
        device_grants.c.user_code == code,
        device_grants.c.state == PENDING,
        device_grants.c.expires_at > (now or datetime.now(UTC)),
    )


class DeviceStore:
    """Device authorizations and command-line sessions in the database behind ``engine``.
    Thread-safe; one per process (``store.Store.device``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = write_engine(engine)

    # ------------------------------------------------------------ device authorizations

    def start(
        self, client_id: str, *, now: datetime | None = None, ttl: timedelta = GRANT_TTL
    ) -> tuple[str, DeviceGrant]:
        """A new device authorization for ``client_id``: ``(device code, grant)``. The device
        code goes to the client once and can't be recovered; the user code is unique among the
        authorizations still pending."""
        now = now or datetime.now(UTC)
        device_code = secrets.token_urlsafe(SECRET_BYTES)
        with self._writer.begin() as conn:
            conn.execute(delete(device_grants).where(device_grants.c.expires_at < now - KEEP_OVER))
            while True:  # unique among the pending ones: 20^8 codes, a handful pending
                user_code = _new_user_code()
                taken = conn.execute(
                    select(device_grants.c.code_hash).where(
                        device_grants.c.user_code == user_code,
                        device_grants.c.state == PENDING,
                        device_grants.c.expires_at > now,
                    )
                ).first()
                if taken is None:
                    break
            conn.execute(
                insert(device_grants).values(
                    code_hash=secret_hash(device_code),
                    user_code=user_code,
                    client_id=client_id[:128],
                    state=PENDING,
                    user_id=None,
                    idp_refresh=None,
                    created_at=now,
                    expires_at=now + ttl,
                    interval_s=POLL_INTERVAL_S,
                    polled_at=None,
                )
            )
            row = conn.execute(select(device_grants).where(device_grants.c.code_hash == secret_hash(device_code))).one()
        return device_code, _grant(row)

    def pending(self, user_code: str, *, now: datetime | None = None) -> DeviceGrant | None:
        """The authorization ``user_code`` names (as typed: ``normal_user_code``) while it waits
        for the person, else None (unknown, decided already, or expired)."""
        code = normal_user_code(user_code)
        if code is None:
            return None
        with self._engine.connect() as conn:
            row = conn.execute(
                select(device_grants).where(*_waiting(code, now)).order_by(device_grants.c.created_at.desc())
            ).first()
        return None if row is None else _grant(row)

    def _decide(self, user_code: str, now: datetime | None, **values: Any) -> bool:
        code = normal_user_code(user_code)
        if code is None:
            return False
        with self._writer.begin() as conn:
            result = conn.execute(update(device_grants).where(*_waiting(code, now)).values(**values))
        return bool(result.rowcount)

    def approve(self, user_code: str, *, user_id: int, idp_refresh: str | None, now: datetime | None = None) -> bool:
        """Approve the pending authorization ``user_code`` for the person ``user_id`` with the
        IdP's refresh token (sealed; None when the IdP gave none). False when it is no longer
        pending (decided meanwhile, or expired)."""
        return self._decide(user_code, now, state=APPROVED, user_id=user_id, idp_refresh=idp_refresh)

    def deny(self, user_code: str, *, user_id: int | None = None, now: datetime | None = None) -> bool:
        """Deny the pending authorization ``user_code`` (the client is told ``access_denied``).
        False when it is no longer pending."""
        return self._decide(user_code, now, state=DENIED, user_id=user_id)

    def poll(self, device_code: str, *, client_id: str, now: datetime | None = None) -> Poll:
        """One poll of the token endpoint by ``client_id`` with ``device_code`` (RFC 8628
        section 3.5), noted: ``SLOW_DOWN`` (the interval grows) when the previous poll was less
        than the interval ago, ``AUTHORIZATION_PENDING``, ``ACCESS_DENIED``, ``EXPIRED_TOKEN``,
        ``INVALID_GRANT`` (unknown, issued to another client, or its tokens issued already) or
        ``GRANTED``: the tokens are the caller's to issue, now and never again."""
        if not device_code or len(device_code) > 256:
            return Poll(INVALID_GRANT)
        now = now or datetime.now(UTC)
        digest = secret_hash(device_code)
        with self._writer.begin() as conn:
            row = conn.execute(select(device_grants).where(device_grants.c.code_hash == digest)).first()
            if (
                row is None
                or row.state == USED
                or not hmac.compare_digest(row.client_id.encode(), client_id[:128].encode())
            ):
                return Poll(INVALID_GRANT)
            if row.expires_at <= now:
                return Poll(EXPIRED_TOKEN)
            if row.state == DENIED:
                return Poll(ACCESS_DENIED)
            if row.state == APPROVED:
                taken = conn.execute(
                    update(device_grants)
                    .where(device_grants.c.code_hash == digest, device_grants.c.state == APPROVED)
                    .values(state=USED, idp_refresh=None, polled_at=now)
                ).rowcount
                if taken != 1:
                    return Poll(INVALID_GRANT)
                return Poll(GRANTED, row.interval_s, row.user_id, row.client_id, row.idp_refresh)
            interval = int(row.interval_s)
            too_soon = row.polled_at is not None and now - row.polled_at < timedelta(seconds=interval)
            if too_soon:
                interval += SLOW_DOWN_S
            conn.execute(
                update(device_grants)
                .where(device_grants.c.code_hash == digest)
                .values(polled_at=now, interval_s=interval)
            )
        return Poll(SLOW_DOWN if too_soon else AUTHORIZATION_PENDING, interval)

    # ------------------------------------------------------------ sessions

    def open_session(
        self,
        *,
        user_id: int,
        client_id: str,
        idp_refresh: str | None,
        key_public_id: str | None,
        days: int,
        now: datetime | None = None,
    ) -> tuple[str, UserSession]:
        """A session for the person ``user_id`` who has just signed in: ``(refresh token,
        session)``. The token goes to the client once and can't be recovered. What is over is
        purged on the way (``purge``)."""
        now = now or datetime.now(UTC)
        self.purge(now=now)
        token = secrets.token_urlsafe(SECRET_BYTES)
        public_id = SESSION_ID_PREFIX + secrets.token_hex(10)
        with self._writer.begin() as conn:
            conn.execute(
                insert(user_sessions).values(
                    public_id=public_id,
                    token_hash=secret_hash(token),
                    user_id=user_id,
                    client_id=client_id[:128],
                    idp_refresh=idp_refresh,
                    key_id=self._key_row_id(conn, key_public_id),
                    created_at=now,
                    refreshed_at=now,
                    expires_at=now + timedelta(days=days),
                    ended_at=None,
                )
            )
            row = conn.execute(select(user_sessions).where(user_sessions.c.public_id == public_id)).one()
        return token, _session(row)

    @staticmethod
    def _key_row_id(conn: Any, key_public_id: str | None) -> int | None:
        if not key_public_id:
            return None
        found = conn.execute(select(api_keys.c.id).where(api_keys.c.public_id == key_public_id)).scalar()
        return None if found is None else int(found)

    def claim(self, refresh_token: str, *, now: datetime | None = None) -> tuple[str, UserSession] | None:
        """Use ``refresh_token``: when it names a live session, swap it for a new one (returned
        with the session as it was) in one conditional UPDATE: from now on the old token is
        refused, and of two claims with one token only one succeeds. None for an unknown,
        rotated, ended or expired token. The caller then checks the person at the IdP and
        ``complete``s the refresh, or ``end``s the session."""
        if not refresh_token or len(refresh_token) > 256:
            return None
        now = now or datetime.now(UTC)
        digest = secret_hash(refresh_token)
        token = secrets.token_urlsafe(SECRET_BYTES)
        with self._writer.begin() as conn:
            row = conn.execute(
                select(user_sessions).where(
                    user_sessions.c.token_hash == digest,
                    user_sessions.c.ended_at.is_(None),
                    user_sessions.c.expires_at > now,
                )
            ).first()
            if row is None:
                return None
            swapped = conn.execute(
                update(user_sessions)
                .where(user_sessions.c.id == row.id, user_sessions.c.token_hash == digest)
                .values(token_hash=secret_hash(token))
            ).rowcount
        if swapped != 1:
            return None
        return token, _session(row)

    def unclaim(self, session: UserSession, new_token: str, old_token: str) -> bool:
        """Undo a ``claim`` whose refresh could not be checked (the IdP was unreachable): the old
        token works again, the new one never will. False if the session moved on meanwhile."""
        with self._writer.begin() as conn:
            result = conn.execute(
                update(user_sessions)
                .where(user_sessions.c.id == session.id, user_sessions.c.token_hash == secret_hash(new_token))
                .values(token_hash=secret_hash(old_token))
            )
        return bool(result.rowcount)

    def complete(
        self,
        session: UserSession,
        *,
        idp_refresh: str | None,
        key_public_id: str | None,
        days: int,
        now: datetime | None = None,
    ) -> None:
        """Record a refresh that passed: the IdP's (possibly rotated) refresh token, sealed, the
        key just minted, and the session's new end, ``days`` from ``now``."""
        now = now or datetime.now(UTC)
        with self._writer.begin() as conn:
            conn.execute(
                update(user_sessions)
                .where(user_sessions.c.id == session.id, user_sessions.c.ended_at.is_(None))
                .values(
                    idp_refresh=idp_refresh,
                    key_id=self._key_row_id(conn, key_public_id),
                    refreshed_at=now,
                    expires_at=now + timedelta(days=days),
                )
            )

    def end(self, session_id: int, *, now: datetime | None = None) -> str | None:
        """End the session ``session_id`` at once (its refresh token is refused from now on, the
        sealed IdP token forgotten); returns the public id of the key last minted from it (for
        the caller to revoke), or None."""
        now = now or datetime.now(UTC)
        with self._writer.begin() as conn:
            conn.execute(
                update(user_sessions)
                .where(user_sessions.c.id == session_id, user_sessions.c.ended_at.is_(None))
                .values(ended_at=now, idp_refresh=None)
            )
            found = conn.execute(
                select(api_keys.c.public_id)
                .select_from(user_sessions.join(api_keys, api_keys.c.id == user_sessions.c.key_id))
                .where(user_sessions.c.id == session_id)
            ).scalar()
        return None if found is None else str(found)

    def sessions_of(self, user_id: int) -> list[UserSession]:
        """The person's sessions (ended ones too, until purged), newest first."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(user_sessions).where(user_sessions.c.user_id == user_id).order_by(user_sessions.c.id.desc())
            ).all()
        return [_session(r) for r in rows]

    def purge(self, *, now: datetime | None = None) -> int:
        """Delete device authorizations expired for a day and sessions over (ended or expired)
        for a day; returns how many rows went."""
        now = now or datetime.now(UTC)
        cutoff = now - KEEP_OVER
        with self._writer.begin() as conn:
            grants = conn.execute(delete(device_grants).where(device_grants.c.expires_at < cutoff)).rowcount
            sessions = conn.execute(
                delete(user_sessions).where(or_(user_sessions.c.ended_at < cutoff, user_sessions.c.expires_at < cutoff))
            ).rowcount
        return int(grants) + int(sessions)
