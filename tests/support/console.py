"""Signing in to the console in tests without an identity provider: a session made in the store
(``store.console.open_session``, as the sign-in makes it) and its cookie set on a Flask test
client.

    session = signed_in(client, store, role="org_admin", org_ids=[org.id])
    page = client.get("/console/keys")
    client.post("/console/keys", data={"csrf_token": session.csrf_token, ...})

The CSRF token is also in every form of the console's pages (``<input name="csrf_token">``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from flask.testing import FlaskClient

from ezat_compat.console.security import COOKIE_NAME
from ezat_compat.store.console import ConsoleSession
from ezat_compat.store.store import Store


def signed_in(
    client: FlaskClient,
    store: Store,
    role: str = "admin",
    org_ids: Iterable[int] = (),
    *,
    subject: str = "",
    name: str = "",
    email: str = "",
    now: datetime | None = None,
) -> ConsoleSession:
    """Open a console session for a person of ``role`` (an ``org_admin`` of ``org_ids``) and set
    its cookie on ``client``; returns the session (its ``csrf_token``, ``public_id``)."""
    assert store.console is not None
    subject = subject or f"test-{role}"
    cookie, public_id = store.console.open_session(
        subject=subject,
        name=name or f"Test {role}",
        email=email or f"{subject}@example.com",
        role=role,
        org_ids=tuple(org_ids),
        now=now,
    )
    client.set_cookie(COOKIE_NAME, cookie, path="/")
    session = store.console.get_session(public_id)
    assert session is not None
    return session
