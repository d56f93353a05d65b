"""Who is signed in to the console and what they may see and change: what every page asks.

The guard (``security.guard``) puts the signed-in ``Person`` on the request; a page view asks::

    who = require_view(org.id)            # 403 page unless this person sees the organisation
    ctx = require_change(org.id)          # 403 page unless they may change it; the AdminContext
    service.top_up(store, ctx, ...)       # to pass to admin/service.py (the audit trail's author)

``None`` as ``org_id`` stands for gateway-wide things (every organisation, the gateway's limits,
the deployments, the audit trail). The roles, widest first:

- ``admin``: sees and changes everything;
- ``org_admin``: sees and changes its organisations (``org_ids``) alone, nothing gateway-wide;
- ``viewer``: sees everything, changes nothing.

Every form of the console carries ``{{ csrf_field() }}`` (a Jinja global too).
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import g, request
from markupsafe import Markup, escape
from werkzeug.exceptions import Forbidden

from ezat_compat.admin.auth import AdminContext
from ezat_compat.domain import ROLES

__all__ = [
    "BREAK_GLASS_PREFIX",
    "PERSON_KEY",
    "ROLES",
    "Person",
    "csrf_field",
    "person",
    "require_change",
    "require_view",
]

PERSON_KEY = "console_person"  # flask.g: the signed-in ``Person`` (set by the guard)
BREAK_GLASS_PREFIX = "breakglass:"


@dataclass(frozen=True, slots=True)
class Person:
    """A person signed in to the console (never the session's cookie secret)."""

    subject: str  # the IdP's "sub", or "breakglass:<link id>"
    name: str
    email: str
    role: str  # "admin" | "org_admin" | "viewer"
    org_ids: frozenset[int]  # org_admin: the ids (OrgInfo.id) of the organisations administered
    session_id: str  # the session's public id (cs_…)

    def sees(self, org_id: int | None) -> bool:
        """Whether this person may see the organisation ``org_id`` (None: gateway-wide things)."""
        if self.role in ("admin", "viewer"):
            return True
        return self.role == "org_admin" and org_id is not None and org_id in self.org_ids

    def changes(self, org_id: int | None) -> bool:
        """Whether this person may change the organisation ``org_id`` (None: gateway-wide things)."""
        if self.role == "admin":
            return True
        return self.role == "org_admin" and org_id is not None and org_id in self.org_ids

    @property
    def actor(self) -> str:
        """The audit trail's author: ``sso:<subject>``, or ``breakglass:<link id>``."""
        if self.subject.startswith(BREAK_GLASS_PREFIX):
            return self.subject
        return f"sso:{self.subject}"

    @property
    def display_name(self) -> str:
        """What the page header shows: the name, else the e-mail, else the subject."""
        return self.name or self.email or self.subject


def person() -> Person:
    """The signed-in person of this request (the guard has checked the session); 403 outside a
    guarded view."""
    found: Person | None = g.get(PERSON_KEY)
    if found is None:
        raise Forbidden("Sign in to the console first.")
    return found


def require_view(org_id: int | None) -> Person:
    """The signed-in person, if they may see ``org_id``; else 403 (the "Not allowed" page)."""
    who = person()
    if not who.sees(org_id):
        raise Forbidden("You are not allowed to see this.")
    return who


def require_change(org_id: int | None) -> AdminContext:
    """The ``AdminContext`` of the signed-in person for a change to ``org_id`` (its ``actor`` is
    ``Person.actor``), if they may make it; else 403."""
    who = person()
    if not who.changes(org_id):
        raise Forbidden("You are not allowed to change this.")
    return AdminContext(
        actor=who.actor,
        read_only=False,
        address=request.remote_addr or "",
        request_id=str(g.get("request_id") or ""),
    )


def csrf_field() -> Markup:
    """The hidden field every POST form of the console carries: its session's CSRF token."""
    token = str(g.get("console_csrf") or "")
    return Markup('<input type="hidden" name="csrf_token" value="{}">').format(escape(token))
