"""``ezat-compat users …`` and ``ezat-compat groups …``: people and the IdP groups the gateway maps,
from the gateway's machine (docs/admin-api.md, "People and groups").

    ezat-compat users list [--group G] [--json]
    ezat-compat users disable REF [--revoke-keys] | users enable REF | users revoke-keys REF
    ezat-compat users set-rate-limits REF [--rpm N|none] [--tpm N|none]
    ezat-compat groups list [--json]
    ezat-compat groups set NAME [--org ORG] [--models P,...] [--daily-usd X] [--weekly-usd X] [--monthly-usd X]
                               [--rpm N|none] [--tpm N|none]
    ezat-compat groups delete NAME

A person (REF: their ``user_…`` id, email or IdP subject) exists once they signed in; they can't be
made here. Every change goes through the admin API's service (admin/users.py, admin/groups.py)
and leaves its audit row naming ``cli:<unix user>``. A group of the configuration file
(``[identity.groups]``) is changed there, not here. ``--json`` prints one JSON array.

Errors are the service's (``AdminError``, a ``GatewayError``) or ``StoreError``: the command's
``_run`` prints either on one line (exit status 1). Classes of ``cli.py`` aren't raised here: run
as ``python -m ezat_compat.cli`` that module is ``__main__``, and its classes aren't these.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ezat_compat.cli import table
from ezat_compat.config import resolve_config_path

if TYPE_CHECKING:
    from ezat_compat.store.people import PersonInfo
    from ezat_compat.store.store import Store

NONE = "none"  # --daily-usd none: no cap for that period


def add_parsers(sub: Any) -> None:
    """Add ``users`` and ``groups`` to the command's subparsers ``sub``."""
    users = sub.add_parser("users", help="people who signed in with the IdP: list, disable, enable, revoke keys")
    users_sub = users.add_subparsers(dest="users_command", title="actions", metavar="ACTION", required=True)
    ul = users_sub.add_parser("list", help="every person: email, groups, organization, last sign-in, status")
    ul.add_argument("--group", metavar="G", help="only the members of this IdP group")
    ul.add_argument("--json", action="store_true")
    ud = users_sub.add_parser("disable", help="refuse a person (401) at their next request, everywhere")
    ud.add_argument("ref", metavar="REF", help="user_… id, email or IdP subject")
    ud.add_argument("--revoke-keys", action="store_true", help="revoke every live key of theirs too")
    users_sub.add_parser("enable", help="let a disabled person in again").add_argument("ref", metavar="REF")
    users_sub.add_parser("revoke-keys", help="revoke every live key of a person at once").add_argument(
        "ref", metavar="REF"
    )
    ur = users_sub.add_parser("set-rate-limits", help="a person's requests and tokens per minute, all their keys")
    ur.add_argument("ref", metavar="REF")
    for rate in ("rpm", "tpm"):
        ur.add_argument(f"--{rate}", metavar="N|none", help=f"their {rate} (none: no cap of their own)")

    groups = sub.add_parser("groups", help="IdP groups: their organization, models and per-person caps")
    groups_sub = groups.add_subparsers(dest="groups_command", title="actions", metavar="ACTION", required=True)
    gl = groups_sub.add_parser("list", help="every mapped group")
    gl.add_argument("--json", action="store_true")
    gs = groups_sub.add_parser("set", help="map an IdP group, or change its mapping (what isn't given stays)")
    gs.add_argument("name", metavar="NAME", help="the group as the IdP's groups claim writes it")
    gs.add_argument("--org", metavar="ORG", help="the organization that pays for its members ('' for none)")
    gs.add_argument("--models", metavar="P,...", help="model patterns its members may use ('' for every model)")
    for period in ("daily", "weekly", "monthly"):
        gs.add_argument(f"--{period}-usd", metavar="X|none", help=f"each member's {period} cap (none: no cap)")
    for rate in ("rpm", "tpm"):
        gs.add_argument(f"--{rate}", metavar="N|none", help=f"each member's {rate}, all their keys (none: no cap)")
    groups_sub.add_parser("delete", help="forget a group (its members lose what it gave them)").add_argument(
        "name", metavar="NAME"
    )


def _person_row(person: PersonInfo, store: Store) -> dict[str, Any]:
    from ezat_compat.admin.users import snapshot

    return snapshot(store, person)


def cmd_users(args: argparse.Namespace, store: Store) -> int:
    """``users list|disable|enable|revoke-keys``."""
    from ezat_compat.admin.service import cli_context
    from ezat_compat.admin.users import people, revoke_keys, set_disabled, status_of

    if args.users_command == "list":
        found = people(store).list_people(group=args.group)
        if args.json:
            print(json.dumps([_person_row(p, store) for p in found], indent=2))
            return 0
        cells = [
            [
                p.public_id,
                p.email or "-",
                ",".join(p.idp_groups) or "-",
                p.org or "-",
                p.last_sign_in_at.isoformat(timespec="seconds") if p.last_sign_in_at else "-",
                status_of(p),
            ]
            for p in found
        ]
        print(table(cells, ["ID", "EMAIL", "GROUPS", "ORG", "LAST_SIGN_IN", "STATUS"]))
    elif args.users_command in ("disable", "enable"):
        disabled = args.users_command == "disable"
        revoke = bool(getattr(args, "revoke_keys", False))
        person = set_disabled(store, cli_context(), args.ref, disabled, revoke_keys=revoke)
        what = "disabled" if disabled else "enabled"
        print(f"{what} {person.public_id} ({person.email or person.subject})" + (", keys revoked" if revoke else ""))
    elif args.users_command == "revoke-keys":
        person, revoked = revoke_keys(store, cli_context(), args.ref)
        print(f"revoked {revoked} key{'s' if revoked != 1 else ''} of {person.public_id} ({person.email})")
    elif args.users_command == "set-rate-limits":
        from ezat_compat.admin.users import set_rate_limits

        person = set_rate_limits(store, cli_context(), args.ref, _rates(args))
        print(f"{person.public_id} ({person.email}): rpm {person.rpm or '-'}, tpm {person.tpm or '-'}")
    return 0


def _rates(args: argparse.Namespace) -> dict[str, int | None]:
    """The ``--rpm``/``--tpm`` given (``none``: no cap), as the services take them."""
    from ezat_compat.store.accounts import StoreError  # the parser alone imports no database code

    rates: dict[str, int | None] = {}
    for rate in ("rpm", "tpm"):
        text = getattr(args, rate)
        if text is None:
            continue
        if text.strip().lower() == NONE:
            rates[rate] = None
            continue
        value = int(text) if text.strip().isdigit() else 0
        if value < 1:
            raise StoreError(f"--{rate}: a whole number of at least 1, or none; got {text!r}")
        rates[rate] = value
    return rates


def _cap(text: str | None) -> tuple[bool, int | None]:
    """(given, micro-USD or None) of a ``--<period>-usd`` value."""
    from ezat_compat.pricing import usd_to_micros
    from ezat_compat.store.accounts import StoreError

    if text is None:
        return False, None
    if text.strip().lower() == NONE:
        return True, None
    try:
        return True, usd_to_micros(text)
    except ValueError as exc:
        raise StoreError(f"invalid amount {text!r}: {exc}") from None


def cmd_groups(args: argparse.Namespace, store: Store) -> int:
    """``groups list|set|delete``."""
    from ezat_compat.admin.groups import delete_group, people, put_group, snapshot
    from ezat_compat.admin.service import cli_context

    config_path = resolve_config_path(args.config)
    if args.groups_command == "list":
        rows = [snapshot(g) for g in people(store).list_groups()]
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        cells = [
            [
                r["name"],
                r["org"] or "-",
                ",".join(r["models"]) or "*",
                r["daily_usd"] or "-",
                r["weekly_usd"] or "-",
                r["monthly_usd"] or "-",
                r["source"],
                r["id"],
            ]
            for r in rows
        ]
        print(table(cells, ["NAME", "ORG", "MODELS", "DAILY_USD", "WEEKLY_USD", "MONTHLY_USD", "SOURCE", "ID"]))
    elif args.groups_command == "set":
        caps: dict[str, int | None] = {}
        for period in ("daily", "weekly", "monthly"):
            given, value = _cap(getattr(args, f"{period}_usd"))
            if given:
                caps[period] = value
        models = None if args.models is None else [p.strip() for p in args.models.split(",") if p.strip()]
        group = put_group(
            store,
            cli_context(),
            args.name,
            org=args.org,
            models=models,
            caps=caps,
            rates=_rates(args),
            config_path=config_path,
        )
        shown = snapshot(group)
        print(
            f"group {group.name} ({group.public_id}): org {shown['org'] or '-'}, "
            f"models {','.join(shown['models']) or '*'}, daily {shown['daily_usd'] or '-'}, "
            f"weekly {shown['weekly_usd'] or '-'}, monthly {shown['monthly_usd'] or '-'} USD"
        )
    elif args.groups_command == "delete":
        group = delete_group(store, cli_context(), args.name, config_path=config_path)
        print(f"deleted group {group.name} ({group.public_id})")
    return 0
