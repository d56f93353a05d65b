"""The console's pages: thin views over the admin service layer and the console's read queries.

    GET  /console/                                   overview: spend and requests, errors, failovers, latency
    GET  /console/organisations                      organisations (POST: create one; gateway admins)
    GET  /console/organisations/<workspace id>       one organisation, its keys and limits
    POST /console/organisations/<id>/top-up          [amount_usd]
    POST /console/organisations/<id>/suspend, /resume
    POST /console/organisations/<id>/limits          [rpm, tpm, models]
    GET  /console/keys                               keys (?org=<workspace id>); POST: create one
    GET  /console/keys/<key id>                      one key: its limits, last use, recent requests
    POST /console/keys/<key id>/rotate               [grace_seconds]
    POST /console/keys/<key id>/block, /unblock, /revoke
    POST /console/keys/<key id>/limits               [name, rpm, tpm, models]
    GET  /console/limits                             spend limits and how close each is to its cap
    POST /console/limits                             [scope, scope_id, amount_usd, period, thresholds]
    POST /console/limits/<id>/delete
    GET  /console/usage                              filters org, key, person, group, model, status, from, to
    GET  /console/usage.csv                          the same rows as CSV, streamed
    GET  /console/people                             people who signed in, and the IdP groups' mappings
    POST /console/people/<user id>/disable           [revoke_keys]; /enable, /revoke-keys
    GET  /console/audit                              the audit trail
    GET  /console/deployments                        health, cooldowns and failovers now

Who may do what is asked of ``console/access.py`` before anything is read or changed:
``require_view(org_id)`` for a page of one organisation, ``require_change(org_id)`` for a change
(its ``AdminContext`` names the signed-in person, so each change's audit row is theirs); lists
are cut to the organisations the person sees. Every change is a call of ``admin/service.py`` or
``admin/spend.py``; reads are ``console/queries.py``'s and the store's repositories'. A refused
value comes back to its page as a message (303 to the page, which shows it), never as a
half-done change. A new or rotated key's secret is rendered once, in the answer to the POST
that made it (no redirect: it is stored nowhere to show again), with ``Cache-Control: no-store``
(the guard's).
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import hmac
import io
import os
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from flask import Blueprint, Response, abort, current_app, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from ezat_compat.admin import service
from ezat_compat.admin import spend as spend_service
from ezat_compat.admin.errors import AdminError
from ezat_compat.admin.money import cents_to_micros
from ezat_compat.console import charts, queries
from ezat_compat.console.access import Person, person, require_change, require_view
from ezat_compat.periods import PERIODS
from ezat_compat.pricing import micros_to_usd, usd_to_micros
from ezat_compat.store.accounts import KeyInfo, OrgInfo, StoreError, api_key_id, key_public_id
from ezat_compat.store.spend import DEFAULT_THRESHOLDS, SCOPE_GATEWAY, SCOPE_KEY, SCOPE_ORG, SCOPE_TYPES

if TYPE_CHECKING:
    from ezat_compat.domain import Config
    from ezat_compat.pipeline import Gateway
    from ezat_compat.store.store import Store

NAME = "console_pages"
EXAMPLE_MODEL = "anthropic/claude-sonnet-5-5"  # the snippets' model when the configuration has none
MAX_GRACE_S = 7 * 24 * 3600  # store/accounts.py MAX_GRACE
_NOTICE = "ezat_console.notice"  # request.environ: the message of this request's change


# ---------------------------------------------------------------- the blueprint


def blueprint() -> Blueprint:
    """A new blueprint of the pages (``console_pages``, under ``/console``); the console's
    ``register`` installs the guard on it."""
    bp = Blueprint(NAME, __name__, url_prefix="/console", template_folder="templates")
    routes: Sequence[tuple[str, str, Any, tuple[str, ...]]] = (
        ("/", "overview", overview, ("GET",)),
        ("/organisations", "organisations", organisations, ("GET",)),
        ("/organisations", "create_organisation", create_organisation, ("POST",)),
        ("/organisations/<public_id>", "organisation", organisation, ("GET",)),
        ("/organisations/<public_id>/top-up", "top_up", top_up, ("POST",)),
        ("/organisations/<public_id>/suspend", "suspend", suspend, ("POST",)),
        ("/organisations/<public_id>/resume", "resume", resume, ("POST",)),
        ("/organisations/<public_id>/limits", "organisation_limits", organisation_limits, ("POST",)),
        ("/keys", "keys", keys, ("GET",)),
        ("/keys", "create_key", create_key, ("POST",)),
        ("/keys/<key_id>", "key", key, ("GET",)),
        ("/keys/<key_id>/rotate", "rotate_key", rotate_key, ("POST",)),
        ("/keys/<key_id>/block", "block_key", block_key, ("POST",)),
        ("/keys/<key_id>/unblock", "unblock_key", unblock_key, ("POST",)),
        ("/keys/<key_id>/revoke", "revoke_key", revoke_key, ("POST",)),
        ("/keys/<key_id>/limits", "key_limits", key_limits, ("POST",)),
        ("/limits", "limits", limits, ("GET",)),
        ("/limits", "set_limit", set_limit, ("POST",)),
        ("/limits/<limit_id>/delete", "delete_limit", delete_limit, ("POST",)),
        ("/usage", "usage", usage, ("GET",)),
        ("/usage.csv", "usage_csv", usage_csv, ("GET",)),
        ("/people", "people", people, ("GET",)),
        ("/people/<user_id>/disable", "disable_person", disable_person, ("POST",)),
        ("/people/<user_id>/enable", "enable_person", enable_person, ("POST",)),
        ("/people/<user_id>/revoke-keys", "revoke_person_keys", revoke_person_keys, ("POST",)),
        ("/audit", "audit", audit, ("GET",)),
        ("/deployments", "deployments", deployments, ("GET",)),
    )
    for rule, endpoint, view, methods in routes:
        bp.add_url_rule(rule, endpoint, view, methods=list(methods))
    bp.context_processor(_helpers)
    return bp


def _helpers() -> dict[str, Any]:
    """What every page's template may call."""
    return {
        "usd": charts.format_usd,
        "usd_exact": lambda micros: "$" + micros_to_usd(micros),
        "count": charts.format_count,
        "when": _when,
        "ago": _ago,
        "svg": charts.render_svg,
        "chart_table": charts.table_of,
        "api_key_id": api_key_id,
        "notices": _notices,
    }


# ---------------------------------------------------------------- small parts


def _store() -> Store:
    store: Store = current_app.extensions["ezat_store"]
    return store


def _gateway() -> Gateway | None:
    found: Gateway | None = current_app.extensions.get("ezat")
    return found


def _config() -> Config | None:
    gateway = _gateway()
    return None if gateway is None else gateway.config


def _now() -> datetime:
    clock = current_app.extensions.get("ezat_console_clock")  # a test's clock (console/security.py CLOCK)
    if callable(clock):
        moment: datetime = clock()
        return moment
    return datetime.now(UTC)


def _when(moment: datetime | None) -> str:
    """``2026-12-07 14:03 UTC``; "—" for none."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _ago(moment: datetime | None) -> str:
    """How long ago, in words: "never", "just now", "5 min ago", "3 h ago", "2 days ago"."""
    if moment is None:
        return "never"
    seconds = (_now() - moment).total_seconds()
    if seconds < 0:
        return "in " + _span(-seconds)
    if seconds < 60:
        return "just now"
    return _span(seconds) + " ago"


def _span(seconds: float) -> str:
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} days"


def _visible(who: Person) -> tuple[int, ...] | None:
    """The organisations ``who`` sees: None for every one (gateway admins and viewers)."""
    return None if who.sees(None) else tuple(sorted(who.org_ids))


def _orgs_seen(who: Person) -> list[OrgInfo]:
    visible = _visible(who)
    return [org for org in _store().accounts.list_orgs() if visible is None or org.id in visible]


def _orgs_changed(who: Person) -> list[OrgInfo]:
    return [org for org in _orgs_seen(who) if who.changes(org.id)]


def _keys_seen(shown: Sequence[OrgInfo]) -> list[KeyInfo]:
    """The keys of the organisations ``shown`` (one read of every key, not one per organisation)."""
    names = {org.name for org in shown}
    return [k for k in _store().accounts.list_keys() if k.org in names]


def _org_or_404(ref: str) -> OrgInfo:
    found = _store().accounts.find_org(ref)
    if found is None:
        abort(404, f"There is no organisation {ref!r}.")
    return found


def _key_or_404(ref: str) -> tuple[KeyInfo, OrgInfo]:
    try:
        found = _store().accounts.get_key(key_public_id(ref))
    except StoreError:
        abort(404, f"There is no key {ref!r}.")
    return found, _org_or_404(found.org_public_id or found.org)


def _tell(message: str, category: str = "success") -> None:
    """A message for the page the change redirects to (``_back``): ``success`` or ``error``."""
    request.environ[_NOTICE] = (category, message[:400])


def _signature(text: str) -> str:
    """``text`` signed with the session's CSRF token: a notice in a link can only come from this
    session's own redirect, never from a link someone else crafted."""
    token = str(g.get("console_csrf") or "")
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()[:32]


def _notices() -> list[tuple[str, str]]:
    """The message a change left for this page ((category, text)), if its signature holds."""
    notice, sig = request.args.get("notice", ""), request.args.get("sig", "")
    if not notice or not sig or not g.get("console_csrf"):
        return []
    if not hmac.compare_digest(sig, _signature(notice)):
        return []
    category, _, text = notice.partition(":")
    return [(category if category in ("success", "error") else "success", text)]


def _back(endpoint: str, **values: Any) -> BaseResponse:
    """303 to a page after a change, with the change's message (``_tell``), signed."""
    told = request.environ.get(_NOTICE)
    if told is not None:
        values["notice"] = f"{told[0]}:{told[1]}"
        values["sig"] = _signature(values["notice"])
    return redirect(url_for(f"{NAME}.{endpoint}", **values), 303)


def _failure(exc: Exception) -> str:
    if isinstance(exc, AdminError):
        return exc.message
    return str(exc)


def _int_or_none(text: str | None, name: str) -> int | None:
    text = (text or "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}: {text!r} is not a whole number (leave it empty for no cap)")
    return int(text)


def _patterns(text: str | None) -> list[str]:
    """Model patterns from a form field: separated by commas, spaces or lines (empty: every model)."""
    return [p for p in (text or "").replace(",", " ").split() if p]


def _status_of(key_info: KeyInfo) -> str:
    return key_info.status(_now())


# ---------------------------------------------------------------- overview


def overview() -> str:
    """Spend and requests today and this month, by organisation and by model, as charts; today's
    failed requests; the gateway's failovers and latency (gateway-wide viewers only)."""
    who = person()
    store = _store()
    assert store.rollup is not None
    data = queries.overview(store.engine, store.rollup, _now(), _visible(who))
    signals = queries.read_signals(getattr(_gateway(), "metrics", None)) if who.sees(None) else None
    cooling = _cooling_count() if who.sees(None) else None
    return render_template("console/overview.html", who=who, data=data, signals=signals, cooling=cooling)


def _cooling_count() -> int:
    gateway = _gateway()
    if gateway is None:
        return 0
    return len(gateway.cooldowns.cooling(time.time()))


# ---------------------------------------------------------------- organisations


def organisations() -> str:
    """The organisations the person sees: balance, status, their caps, this month's spend."""
    who = person()
    store = _store()
    shown = _orgs_seen(who)
    assert store.rollup is not None
    spend = queries.month_spend_by_org(store.rollup, _now(), tuple(org.id for org in shown))
    return render_template("console/organisations.html", who=who, orgs=shown, spend=spend)


def create_organisation() -> BaseResponse:
    """A new organisation (gateway admins): ``name``, ``balance_usd``."""
    ctx = require_change(None)
    name = request.form.get("name", "").strip()
    try:
        balance = usd_to_micros(request.form.get("balance_usd", "").strip() or "0")
        org = service.create_org(_store(), ctx, name, balance)
    except (ValueError, StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
        return _back("organisations")
    _tell(f"Organisation {org.name} created.")
    return _back("organisation", public_id=org.public_id)


def organisation(public_id: str) -> str:
    """One organisation: balance, status, caps, keys, spend limits, this month's spend."""
    org = _org_or_404(public_id)
    who = require_view(org.id)
    store = _store()
    assert store.spend is not None and store.rollup is not None
    org_keys = store.accounts.list_keys(org.name)
    limit_rows = queries.limit_rows(store.spend, _now(), (org.id,), _default_thresholds())
    month = queries.month_spend_by_org(store.rollup, _now(), (org.id,)).get(org.id, queries.Sums())
    return render_template(
        "console/organisation.html",
        who=who,
        org=org,
        keys=org_keys,
        key_status=_status_of,
        limit_rows=limit_rows,
        month=month,
        can_change=who.changes(None),  # its balance, status and caps: gateway admins alone
    )


def top_up(public_id: str) -> BaseResponse:
    """Add ``amount_usd`` to an organisation's balance."""
    org = _org_or_404(public_id)
    require_view(org.id)
    ctx = require_change(None)  # money: gateway admins alone, never the organisation's own admin
    try:
        micros = usd_to_micros(request.form.get("amount_usd", ""))
        if micros <= 0:
            raise ValueError("amount_usd: the top-up must be more than $0")
        after = service.top_up(_store(), ctx, org.public_id, micros)
    except (ValueError, StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    else:
        balance = charts.format_usd(after.balance_micros)
        _tell(f"Added {charts.format_usd(micros)} to {org.name}; its balance is {balance}.")
    return _back("organisation", public_id=org.public_id)


def _suspend(public_id: str, suspended: bool) -> BaseResponse:
    org = _org_or_404(public_id)
    require_view(org.id)
    ctx = require_change(None)  # an organisation's admin can't lift a suspension put on it
    try:
        service.set_suspended(_store(), ctx, org.public_id, suspended)
    except (StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    else:
        _tell(f"{org.name} is {'suspended: its keys are refused' if suspended else 'active again'}.")
    return _back("organisation", public_id=org.public_id)


def suspend(public_id: str) -> BaseResponse:
    """Suspend an organisation: every key of it is refused until it is resumed."""
    return _suspend(public_id, True)


def resume(public_id: str) -> BaseResponse:
    """Resume a suspended organisation."""
    return _suspend(public_id, False)


def organisation_limits(public_id: str) -> BaseResponse:
    """An organisation's caps on each of its keys: ``rpm``, ``tpm`` (empty: none), ``models``
    (patterns; empty: every model)."""
    org = _org_or_404(public_id)
    require_view(org.id)
    ctx = require_change(None)  # the caps put on an organisation: gateway admins alone
    try:
        changes = {
            "rpm": _int_or_none(request.form.get("rpm"), "rpm"),
            "tpm": _int_or_none(request.form.get("tpm"), "tpm"),
            "models": _patterns(request.form.get("models")),
        }
        service.update_org(_store(), ctx, org.public_id, **changes)
    except (ValueError, StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    else:
        _tell(f"The limits of {org.name} are saved.")
    return _back("organisation", public_id=org.public_id)


# ---------------------------------------------------------------- keys


def keys() -> str:
    """The keys of the organisations the person sees (``?org=``: of one), with the form that
    creates one."""
    who = person()
    store = _store()
    shown = _orgs_seen(who)
    wanted = request.args.get("org", "").strip()
    org = None
    if wanted:
        org = _org_or_404(wanted)
        require_view(org.id)
    listed = store.accounts.list_keys(org.name) if org is not None else _keys_seen(shown)
    listed.sort(key=lambda k: (k.org, k.revoked_at is not None, k.name.lower(), k.id))
    return render_template(
        "console/keys.html",
        who=who,
        keys=listed,
        key_status=_status_of,
        org=org,
        orgs=shown,
        creatable=_orgs_changed(who),
    )


def create_key() -> BaseResponse | str:
    """A new key of ``org`` (``name``, ``models``, ``expires_at``: a date, UTC midnight); the
    answer shows its secret, once."""
    ref = request.form.get("org", "").strip()
    org = _org_or_404(ref) if ref else None
    if org is None:
        _tell("org: choose the organisation the key belongs to.", "error")
        return _back("keys")
    ctx = require_change(org.id)
    try:
        expires = _expiry(request.form.get("expires_at", ""))
        created, secret = service.create_key(
            _store(),
            ctx,
            org.public_id,
            name=request.form.get("name", "").strip(),
            models=_patterns(request.form.get("models")),
            expires_at=expires,
        )
    except (ValueError, StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
        return _back("keys", org=org.public_id)
    return _secret_page(created, org, secret, rotated=False)


def _expiry(text: str) -> datetime | None:
    text = text.strip()
    if not text:
        return None
    try:
        day = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expires_at: {text!r} is not a date; write it like 2027-01-31") from None
    moment = day if day.tzinfo is not None else day.replace(tzinfo=UTC)
    if moment <= _now():
        raise ValueError("expires_at: must be in the future")
    return moment


def _secret_page(created: KeyInfo, org: OrgInfo, secret: str, *, rotated: bool, grace_s: int = 0) -> str:
    config = _config()
    base = public_base_url(
        config.server.public_url if config is not None else "",
        os.environ.get("EZAT_BIND") or (config.server.bind if config is not None else "127.0.0.1:8080"),
        request.host,
    )
    model = snippet_model(created.models, [m.id for m in config.models] if config is not None else [])
    return render_template(
        "console/key_created.html",
        who=person(),
        key=created,
        org=org,
        secret=secret,
        rotated=rotated,
        grace_s=grace_s,
        snippets=client_snippets(base, secret, model),
    )


def key(key_id: str) -> str:
    """One key: its status, caps, last use, the spend limits that bind it, its recent requests,
    and the forms that rotate, block, unblock, revoke it and change its caps."""
    found, org = _key_or_404(key_id)
    who = require_view(org.id)
    store = _store()
    assert store.spend is not None
    now = _now()
    members = store.spend.members([found.id])
    effective = [
        binding_limit(row, org)
        for row in (spend_service.effective_rows(store, members, list(PERIODS), now) if members else [])
    ]
    row = queries.key_row_id(store.engine, found.id)
    recent: list[queries.UsageRow] = []
    if row is not None:
        flt = queries.UsageFilter(start=now - timedelta(days=31), end=now + timedelta(minutes=1), key_id=row[0])
        recent, _next = queries.usage_page(store.engine, flt, None, limit=10)
    key_limits = [
        r
        for r in queries.limit_rows(store.spend, now, (org.id,), _default_thresholds())
        if r.limit.scope_type == SCOPE_KEY and r.limit.scope_name == found.id
    ]
    return render_template(
        "console/key.html",
        who=who,
        key=found,
        org=org,
        status=found.status(now),
        effective=effective,
        key_limits=key_limits,
        recent=recent,
        can_change=who.changes(org.id),
        max_grace_s=MAX_GRACE_S,
    )


def rotate_key(key_id: str) -> BaseResponse | str:
    """A new secret for the key (shown once); the old one keeps working ``grace_seconds``."""
    found, org = _key_or_404(key_id)
    ctx = require_change(org.id)
    try:
        grace = _int_or_none(request.form.get("grace_seconds"), "grace_seconds") or 0
        if grace > MAX_GRACE_S:
            raise ValueError(f"grace_seconds: at most {MAX_GRACE_S} (7 days)")
        rotated, secret = service.rotate_key(_store(), ctx, found.id, grace)
    except (ValueError, StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
        return _back("key", key_id=found.id)
    return _secret_page(rotated, org, secret, rotated=True, grace_s=grace)


def _key_status(key_id: str, status: str, done: str) -> BaseResponse:
    found, org = _key_or_404(key_id)
    ctx = require_change(org.id)
    try:
        service.set_key_status(_store(), ctx, found.id, status)
    except (StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    else:
        _tell(f"Key {found.name or found.id} {done}.")
    return _back("key", key_id=found.id)


def block_key(key_id: str) -> BaseResponse:
    """Block the key: refused at once, until unblocked."""
    return _key_status(key_id, "inactive", "is blocked: it is refused until you unblock it")


def unblock_key(key_id: str) -> BaseResponse:
    """Unblock a blocked key."""
    return _key_status(key_id, "active", "works again")


def revoke_key(key_id: str) -> BaseResponse:
    """Revoke the key, for good."""
    return _key_status(key_id, "archived", "is revoked")


def key_limits(key_id: str) -> BaseResponse:
    """A key's ``name`` and caps: ``rpm``, ``tpm`` (empty: none), ``models`` (empty: every model
    its organisation allows)."""
    found, org = _key_or_404(key_id)
    ctx = require_change(org.id)
    try:
        changes: dict[str, Any] = {
            "rpm": _int_or_none(request.form.get("rpm"), "rpm"),
            "tpm": _int_or_none(request.form.get("tpm"), "tpm"),
            "models": _patterns(request.form.get("models")),
        }
        if "name" in request.form:
            changes["name"] = request.form.get("name", "").strip()
        service.update_key(_store(), ctx, found.id, **changes)
    except (ValueError, StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    else:
        _tell(f"The limits of key {found.name or found.id} are saved.")
    return _back("key", key_id=found.id)


# ---------------------------------------------------------------- spend limits


def _default_thresholds() -> tuple[int, ...]:
    config = _config()
    return tuple(config.alerts.thresholds) if config is not None else DEFAULT_THRESHOLDS


def limits() -> str:
    """The spend limits the person sees, each with its period's spend and how close it is to its
    cap; the form that sets one."""
    who = person()
    store = _store()
    assert store.spend is not None
    rows = queries.limit_rows(store.spend, _now(), _visible(who), _default_thresholds())
    shown = _orgs_seen(who)
    scope_keys = [k for k in _keys_seen(shown) if k.revoked_at is None]
    return render_template(
        "console/limits.html",
        who=who,
        rows=rows,
        orgs=shown,
        scope_keys=scope_keys,
        periods=PERIODS,
        scopes=SCOPE_TYPES if who.changes(None) else (SCOPE_KEY,),
        can_change=any(who.changes(o.id) for o in shown) or who.changes(None),
        can_delete=lambda r: who.changes(_limit_owner(r.limit.scope_type, r.limit.org_id or None)),
        default_thresholds=_default_thresholds(),
    )


def _limit_owner(scope_type: str, org_id: int | None) -> int | None:
    """Whose change a limit of this scope is: a key's limit its organisation's admins' (the
    organisation's id), the gateway's and an organisation's own cap the gateway admins' (None):
    an organisation's admin hands out its budget to its keys, never raises it."""
    return org_id if scope_type == SCOPE_KEY else None


def _limit_scope(scope: str, ref: str) -> tuple[spend_service.Scope, int | None]:
    """The scope a form names and the organisation it belongs to (None: the gateway)."""
    if scope == SCOPE_GATEWAY:
        return spend_service.Scope(SCOPE_GATEWAY), None
    if scope == SCOPE_ORG:
        org = _org_or_404(ref)
        return spend_service.Scope(SCOPE_ORG, org.public_id), org.id
    if scope == SCOPE_KEY:
        found, org = _key_or_404(ref)
        return spend_service.Scope(SCOPE_KEY, found.id), org.id
    abort(400, "scope: must be gateway, org or key")


def set_limit() -> BaseResponse:
    """Set the spend limit of a scope and period: ``amount_usd`` (``none``: explicitly no
    limit), ``thresholds`` (percentages such as ``80, 100``; empty: the configured ones)."""
    scope, org_id = _limit_scope(request.form.get("scope", "").strip(), request.form.get("scope_id", "").strip())
    if org_id is not None:
        require_view(org_id)
    ctx = require_change(_limit_owner(scope.type, org_id))
    try:
        period = request.form.get("period", "monthly").strip()
        if period not in PERIODS:
            raise ValueError(f"period: must be one of {', '.join(PERIODS)}")
        amount_text = request.form.get("amount_usd", "").strip()
        if not amount_text:
            raise ValueError("amount_usd: required (write none for an explicit no-limit)")
        amount = None if amount_text.lower() == "none" else usd_to_micros(amount_text)
        thresholds = parse_thresholds(request.form.get("thresholds", ""))
        limit = spend_service.set_limit(_store(), ctx, scope, period, amount, thresholds=thresholds)
    except (ValueError, StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    else:
        _tell(f"Saved {limit.describe()}.")
    return _back("limits")


def parse_thresholds(text: str) -> list[int] | None:
    """``"80, 100"`` -> [80, 100]; "" -> None (the configured ones). ``ValueError`` otherwise."""
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        return None
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"thresholds: {text!r} is not a list of whole percentages like 80, 100")
    return [int(p) for p in parts]


def delete_limit(limit_id: str) -> BaseResponse:
    """Remove a spend limit."""
    store = _store()
    assert store.spend is not None
    try:
        found = store.spend.get(limit_id)
    except StoreError:
        abort(404, f"There is no spend limit {limit_id!r}.")
    org_id = found.org_id or None  # 0: the gateway's own
    if org_id is not None:
        require_view(org_id)
    ctx = require_change(_limit_owner(found.scope_type, org_id))
    try:
        spend_service.delete_limit(store, ctx, found.public_id)
    except (StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    else:
        _tell(f"Deleted {found.describe()}.")
    return _back("limits")


# ---------------------------------------------------------------- people and groups


def people() -> str:
    """People who signed in (email, groups, organisation, last sign-in, this month's spend,
    status) and the IdP groups' mappings: gateway admins and viewers (organisation admins see
    no one: people cross organisations)."""
    who = require_view(None)
    store = _store()
    if store.people is None or store.rollup is None:
        abort(404)
    everyone = store.people.list_people()
    groups = store.people.list_groups()
    now = _now()
    spend = queries.month_spend_by_person(store.rollup, store.engine, now)
    return render_template(
        "console/people.html",
        who=who,
        people=everyone,
        groups=groups,
        mapped_names={g.name for g in groups},
        spend=spend,
        group_spend=queries.month_spend_by_group([g.id for g in groups], {p.id: p.group_ids for p in everyone}, spend),
        month_from=queries.month_start(now).date().isoformat(),
        can_change=who.changes(None),
        config_path=getattr(_config(), "path", "") or "",
    )


def _person_change(user_id: str, change: str) -> BaseResponse:
    from ezat_compat.admin import users as user_service

    ctx = require_change(None)
    try:
        if change == "revoke-keys":
            found, revoked = user_service.revoke_keys(_store(), ctx, user_id)
            _tell(f"Revoked {revoked} key{'s' if revoked != 1 else ''} of {found.email or found.subject}.")
        else:
            revoke = change == "disable" and request.form.get("revoke_keys") == "on"
            found = user_service.set_disabled(_store(), ctx, user_id, change == "disable", revoke_keys=revoke)
            done = "disabled: refused at their next request" if change == "disable" else "enabled again"
            _tell(f"{found.email or found.subject} is {done}" + (", their keys revoked." if revoke else "."))
    except (StoreError, AdminError) as exc:
        _tell(_failure(exc), "error")
    return _back("people")


def disable_person(user_id: str) -> BaseResponse:
    """Disable a person (``revoke_keys`` on: their live keys are revoked too)."""
    return _person_change(user_id, "disable")


def enable_person(user_id: str) -> BaseResponse:
    """Enable a disabled person again."""
    return _person_change(user_id, "enable")


def revoke_person_keys(user_id: str) -> BaseResponse:
    """Revoke every live key of a person at once."""
    return _person_change(user_id, "revoke-keys")


# ---------------------------------------------------------------- usage


_USAGE_FIELDS = ("org", "key", "person", "group", "model", "status", "from", "to", "metric")


def _visible_keys(who: Person, key_orgs: dict[int, int], owner_org_id: int | None) -> tuple[int, ...]:
    """The keys of ``key_orgs`` (key row id -> organisation's) that ``who`` sees; 403 when they
    see none of them and not the organisation of their person or group either (as for a key
    outside their organisations)."""
    visible = _visible(who)
    if visible is None:
        return tuple(sorted(key_orgs))
    seen = tuple(sorted(k for k, org_id in key_orgs.items() if org_id in visible))
    if not seen:
        require_view(owner_org_id)
    return seen


def _unknown(who: Person, message: str) -> NoReturn:
    """A person or group that isn't there: 404 for whoever sees every organisation; for an
    organisation's admin the 403 of one outside their organisations, so that trying emails or
    group names tells them nothing of who exists elsewhere."""
    abort(404 if who.sees(None) else 403, message if who.sees(None) else None)


def _person_keys(who: Person, ref: str) -> tuple[int, ...]:
    """The keys of the person ``ref`` (``user_…`` id or email) that ``who`` sees; 404 if none."""
    people = _store().people
    try:
        if people is None:
            raise StoreError("no people")
        found = people.get(ref)
    except StoreError:
        _unknown(who, f"There is no person {ref!r}.")
    return _visible_keys(who, queries.people_key_orgs(_store().engine, [found.id]), found.org_id)


def _group_keys(who: Person, ref: str) -> tuple[int, ...]:
    """The keys of the current members of the mapped group ``ref`` (``group_…`` id or name) that
    ``who`` sees; 404 if there is no such group."""
    store = _store()
    try:
        if store.people is None:
            raise StoreError("no groups")
        found = store.people.get_group(ref)
    except StoreError:
        _unknown(who, f"There is no group {ref!r}.")
    members = queries.group_members(store.engine, found.id)
    return _visible_keys(who, queries.people_key_orgs(store.engine, members), found.org_id)


def _usage_filter(who: Person) -> tuple[queries.UsageFilter, dict[str, str]]:
    """The usage page's filter from the query (403 for an organisation, key, person or group the
    person doesn't see; ``FilterError`` for a value that can't be read), and the form's values as
    given."""
    args = request.args
    given = {name: args.get(name, "").strip() for name in _USAGE_FIELDS}
    start, end = queries.parse_range(given["from"], given["to"], _now())
    org_ids = _visible(who)
    if given["org"]:
        org = _org_or_404(given["org"])
        require_view(org.id)
        org_ids = (org.id,)
    key_id = None
    if given["key"]:
        found = queries.key_row_id(_store().engine, key_public_id(given["key"]))
        if found is None:
            abort(404, f"There is no key {given['key']!r}.")
        require_view(found[1])
        key_id = found[0]
    key_ids = _person_keys(who, given["person"]) if given["person"] else None
    if given["group"]:
        of_group = _group_keys(who, given["group"])
        in_group = set(of_group)
        key_ids = of_group if key_ids is None else tuple(k for k in key_ids if k in in_group)
    flt = queries.UsageFilter(
        start=start,
        end=end,
        org_ids=org_ids,
        key_id=key_id,
        key_ids=key_ids,
        model=given["model"] or None,
        status=queries.parse_status(given["status"]),
        metric=queries.parse_metric(given["metric"]),
    )
    return flt, given


def usage() -> tuple[str, int] | str:
    """The usage of the organisations the person sees, filtered: a chart and the totals (from
    the rollup), the ledger's rows a page at a time (newest first), a CSV link."""
    who = person()
    store = _store()
    assert store.rollup is not None
    try:
        flt, given = _usage_filter(who)
    except queries.FilterError as exc:
        return _usage_page(who, None, {}, error=str(exc)), 400
    summary = queries.usage_summary(store.rollup, flt)
    cursor = queries.parse_cursor(request.args.get("after", ""))
    rows, next_cursor = queries.usage_page(store.engine, flt, cursor)
    return _usage_page(who, flt, given, summary=summary, rows=rows, next_cursor=next_cursor, paged=cursor is not None)


def _usage_page(who: Person, flt: queries.UsageFilter | None, given: dict[str, str], **extra: Any) -> str:
    shown = _orgs_seen(who)
    config = _config()
    filter_keys = _keys_seen(shown)
    models = [m.id for m in config.models] if config is not None else []
    query = {k: v for k, v in given.items() if v}
    people = _store().people if who.sees(None) else None  # organisation admins type the person in
    return render_template(
        "console/usage.html",
        filter_people=people.list_people() if people is not None else None,
        filter_groups=people.list_groups() if people is not None else None,
        who=who,
        flt=flt,
        given=given,
        query=query,
        orgs=shown,
        filter_keys=filter_keys,
        models=models,
        statuses=queries.STATUSES,
        metrics=queries.METRICS,
        start_day=(flt.start.date().isoformat() if flt else ""),
        end_day=((flt.end - timedelta(days=1)).date().isoformat() if flt else ""),
        **extra,
    )


def usage_csv() -> Response:
    """The filtered rows as CSV (the columns of ``usage --json``, plus the key's name), newest
    first, streamed in batches."""
    who = person()
    try:
        flt, _given = _usage_filter(who)
    except queries.FilterError as exc:
        abort(400, str(exc))
    engine = _store().engine
    name = f"usage-{flt.start:%Y%m%d}-{(flt.end - timedelta(days=1)):%Y%m%d}.csv"

    def lines() -> Iterator[str]:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\r\n")
        writer.writerow(queries.CSV_COLUMNS)
        for batch in queries.usage_batches(engine, flt):
            for row in batch:
                writer.writerow(queries.csv_values(row))
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()

    return Response(
        lines(),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


# ---------------------------------------------------------------- audit


def audit() -> str:
    """The audit trail, newest first (an organisation's admin: the changes to their
    organisations, their keys and their limits)."""
    who = person()
    store = _store()
    assert store.spend is not None
    visible = _visible(who)
    targets = None if visible is None else queries.org_targets(store.engine, store.spend, visible)
    before = request.args.get("before", "")
    before_id = int(before) if before.isdigit() and len(before) < 20 else None
    entries, next_before = queries.audit_page(store.engine, targets, before_id)
    return render_template(
        "console/audit.html",
        who=who,
        entries=entries,
        next_before=next_before,
        paged=before_id is not None,
        changes=queries.changes,
    )


# ---------------------------------------------------------------- deployments


def deployments() -> str:
    """Each deployment as this gateway sees it now: healthy, cooling down (and for how long) or
    without its key; the readiness checks; answers, errors and failovers since the process began.
    Gateway-wide: gateway admins and viewers only."""
    who = require_view(None)
    gateway = _gateway()
    now = time.time()
    cooling: list[str] = []
    waits: dict[str, float] = {}
    models: Sequence[Any] = ()
    if gateway is not None:
        cooling = gateway.cooldowns.cooling(now)
        waits = {name: gateway.cooldowns.wait_s(name, now) for name in cooling}
        models = gateway.config.models
    signals = queries.read_signals(getattr(gateway, "metrics", None))
    states = queries.deployment_states(models, cooling, waits, signals)
    readiness = current_app.extensions.get("ezat_readiness")
    checks = readiness.checks() if readiness is not None else {}
    return render_template(
        "console/deployments.html", who=who, states=states, signals=signals, checks=checks, cooling=cooling
    )


# ---------------------------------------------------------------- pure parts


def binding_limit(row: dict[str, Any], org: OrgInfo) -> dict[str, Any]:
    """An ``effective_rows`` row (the Admin API's ``SpendSummary``) for the key's page: the
    period, whose limit binds ("the gateway", the organisation's name, "this key"), its cap and
    the key's spend in micro-USD, when it resets."""
    source = row["source"]
    whose = {"organization": "the gateway", "workspace": f"organisation {org.name}", "api_key": "this key"}
    return {
        "period": row["period"],
        "source": whose.get(source.get("type"), str(source.get("type"))),
        "amount_micros": None if row["amount"] is None else cents_to_micros(row["amount"]),
        "spent_micros": cents_to_micros(row["period_to_date_spend"]),
        "resets_at": datetime.fromisoformat(row["resets_at"].replace("Z", "+00:00")),
    }


# ---------------------------------------------------------------- the snippets (pure)


def public_base_url(public_url: str, bind: str, request_host: str) -> str:
    """The gateway's base URL for clients: ``public_url`` when configured, else
    ``http://<bind>`` (a wildcard address replaced by the host the console was reached at)."""
    if public_url:
        return public_url.rstrip("/")
    if bind.startswith("unix:"):
        return "http://127.0.0.1:8080"
    host, _, port = bind.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = request_host.rsplit(":", 1)[0] if request_host and not request_host.endswith("]") else request_host
        host = host or "127.0.0.1"
    return f"http://{host}:{port}" if port else f"http://{host}"


def snippet_model(patterns: Sequence[str], configured: Sequence[str]) -> str:
    """The model the snippets name: the first configured one the key may use (its patterns;
    none: any), else the first pattern, else an example."""
    for model_id in configured:
        if not patterns or any(fnmatch.fnmatch(model_id.lower(), p.lower()) for p in patterns):
            return model_id
    if patterns and not any(c in patterns[0] for c in "*?["):
        return patterns[0]
    return configured[0] if configured else EXAMPLE_MODEL


def client_snippets(base_url: str, secret: str, model: str) -> list[tuple[str, str, str]]:
    """(id, title, text) of the README's client snippets with the key and base URL filled in:
    curl, the OpenAI Python SDK, the Anthropic Python SDK."""
    curl = (
        f"curl {base_url}/openai/v1/chat/completions \\\n"
        f"  -H 'Authorization: Bearer {secret}' \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f'  -d \'{{"model": "{model}", "max_completion_tokens": 64, '
        '"messages": [{"role": "user", "content": "Hello"}]}\''
    )
    openai = (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base_url}/openai/v1", api_key="{secret}")\n'
        "completion = client.chat.completions.create(\n"
        f'    model="{model}",\n'
        "    max_completion_tokens=64,\n"
        '    messages=[{"role": "user", "content": "Hello"}],\n'
        ")\n"
        "print(completion.choices[0].message.content)"
    )
    anthropic = (
        "import anthropic\n\n"
        f'client = anthropic.Anthropic(base_url="{base_url}", api_key="{secret}")\n'
        "message = client.messages.create(\n"
        f'    model="{model}",\n'
        "    max_tokens=64,\n"
        '    messages=[{"role": "user", "content": "Hello"}],\n'
        ")\n"
        "print(message.content[0].text)"
    )
    return [
        ("snippet-curl", "curl", curl),
        ("snippet-openai", "OpenAI Python SDK", openai),
        ("snippet-anthropic", "Anthropic Python SDK", anthropic),
    ]


__all__ = ["blueprint", "client_snippets", "public_base_url", "snippet_model"]
