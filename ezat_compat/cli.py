"""``ezat-compat``: the operator interface (docs/operations.md; a contract: keep the names).

    ezat-compat [--config PATH] demo | serve | sim | orgs … | keys … | usage … | spend-limits … |
                                users … | groups … | admin-keys … | audit list | console-link |
                                check-config | db …

Every change (``orgs``, ``keys``, ``admin-keys``) goes through the admin API's service layer
(``admin/service.py``) and leaves an audit row naming ``cli:<unix user>`` (``audit list``).

Tables for people by default; ``--json`` for scripts. Money is US dollars as decimal strings.
Errors print one line on stderr and exit with status 1 (2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ezat_compat import __version__
from ezat_compat.config import ConfigError, load_config, resolve_config_path
from ezat_compat.domain import Config

if TYPE_CHECKING:
    from ezat_compat.store.accounts import Accounts
    from ezat_compat.store.store import Store


class CLIError(Exception):
    """A problem to report on one line (exit status 1)."""


# ---------------------------------------------------------------- helpers


def _config(args: argparse.Namespace) -> Config:
    return load_config(resolve_config_path(args.config))


def _admin_config(args: argparse.Namespace) -> Config | None:
    """The admin commands' configuration; None when there is no file and ``EZAT_DATABASE_URL``
    names the database alone."""
    path = resolve_config_path(args.config)
    if not os.path.exists(path) and os.environ.get("EZAT_DATABASE_URL") and not args.config:
        return None
    return load_config(path)


def _database_url(args: argparse.Namespace) -> str:
    """The database of the admin commands: the config's, or ``EZAT_DATABASE_URL`` alone."""
    config = _admin_config(args)
    return os.environ["EZAT_DATABASE_URL"] if config is None else config.gateway.database_url


@contextlib.contextmanager
def _store(args: argparse.Namespace) -> Iterator[Store]:
    """The admin commands' store (``open_store``'s operator kind), closed after the command.
    They never migrate: a schema other than this release's is refused in one line (``db
    upgrade`` migrates; ``serve`` does on start). Each change's audit line goes where the
    gateway's own lines go (``log_audit_trail``)."""
    from ezat_compat.domain import LoggingSettings
    from ezat_compat.server.logs import log_audit_trail
    from ezat_compat.store.store import open_store

    config = _admin_config(args)
    url = os.environ["EZAT_DATABASE_URL"] if config is None else config.gateway.database_url
    settings = LoggingSettings() if config is None else config.logging
    handler = log_audit_trail(settings, "-" if config is None else config.server.error_log)
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()
        logging.getLogger("ezat_compat.audit").removeHandler(handler)
        handler.close()


def _usd(text: str) -> int:
    from ezat_compat.pricing import usd_to_micros

    try:
        return usd_to_micros(text)
    except ValueError as exc:
        raise CLIError(f"invalid amount {text!r}: {exc}") from None


def _money(micros: int | None) -> str | None:
    from ezat_compat.pricing import micros_to_usd

    return None if micros is None else micros_to_usd(micros)


def _parse_time(text: str | None, flag: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CLIError(
            f"{flag}: {text!r} is not an ISO 8601 date or time (e.g. 2027-01-31 or 2027-01-31T12:00:00Z)"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain text table for people."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip(), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(out)


# ---------------------------------------------------------------- orgs and keys


def org_rows(accounts: Accounts, now: datetime) -> list[dict[str, Any]]:
    """The objects of ``orgs list --json`` (a contract of the operator interface): ``name``,
    ``balance_usd`` and ``reserved_usd`` (decimal strings), ``suspended``, ``keys`` (the keys that
    authenticate now: neither revoked nor expired) and ``created_at``."""
    from ezat_compat.store.accounts import iso

    active: dict[str, int] = {}
    for key in accounts.list_keys():
        if key.revoked_at is None and (key.expires_at is None or key.expires_at > now):
            active[key.org] = active.get(key.org, 0) + 1
    return [
        {
            "name": org.name,
            "balance_usd": _money(org.balance_micros),
            "reserved_usd": _money(org.reserved_micros),
            "suspended": org.suspended,
            "keys": active.get(org.name, 0),
            "created_at": iso(org.created_at),
        }
        for org in accounts.list_orgs()
    ]


def _list_orgs(accounts: Accounts, as_json: bool) -> None:
    orgs = org_rows(accounts, datetime.now(UTC))
    if as_json:
        print(json.dumps(orgs, indent=2))
        return
    rows = [
        [
            o["name"],
            o["balance_usd"],
            o["reserved_usd"],
            "suspended" if o["suspended"] else "active",
            o["keys"],
            o["created_at"],
        ]
        for o in orgs
    ]
    print(table(rows, ["NAME", "BALANCE_USD", "RESERVED_USD", "STATUS", "KEYS", "CREATED"]))


def cmd_orgs(args: argparse.Namespace, store: Store) -> int:
    from ezat_compat.admin import service

    accounts, ctx = store.accounts, service.cli_context()
    if args.orgs_command == "list":
        _list_orgs(accounts, args.json)
    elif args.orgs_command == "create":
        org = service.create_org(store, ctx, args.name, _usd(args.balance) if args.balance is not None else 0)
        print(f"created organization {args.name} with a balance of ${_money(org.balance_micros)}")
    elif args.orgs_command == "top-up":
        org = service.top_up(store, ctx, args.name, _usd(args.usd))
        print(f"organization {args.name}: balance ${_money(org.balance_micros)}")
    elif args.orgs_command in ("suspend", "resume"):
        service.set_suspended(store, ctx, args.name, args.orgs_command == "suspend")
        print(f"organization {args.name} {'suspended' if args.orgs_command == 'suspend' else 'resumed'}")
    return 0


def cmd_keys(args: argparse.Namespace, store: Store) -> int:
    from ezat_compat.admin import service

    accounts, ctx = store.accounts, service.cli_context()
    if args.keys_command == "create":
        models = [p.strip() for p in (args.models or "").split(",") if p.strip()]
        expires = _parse_time(args.expires, "--expires")
        info, secret = service.create_key(
            store,
            ctx,
            args.org,
            name=args.name or "",
            models=models,
            spend_limit_micros=_usd(args.spend_limit) if args.spend_limit is not None else None,
            rpm=args.rpm,
            tpm=args.tpm,
            expires_at=expires,
        )
        print(f"created key {info.id} for organization {args.org} (shown once; store it now):", file=sys.stderr)
        print(secret)
    elif args.keys_command == "list":
        keys = [k.to_json() for k in accounts.list_keys(args.org)]
        if args.json:
            print(json.dumps(keys, indent=2))
        else:
            rows = [
                [
                    k["id"],
                    k["prefix"] + "…",
                    k["org"],
                    k["name"],
                    ",".join(k["models"]) or "*",
                    k["spent_usd"],
                    k["spend_limit_usd"] or "-",
                    k["rpm"] or "-",
                    k["tpm"] or "-",
                    k["expires_at"] or "-",
                    "revoked" if k["revoked_at"] else "active",
                ]
                for k in keys
            ]
            print(
                table(
                    rows,
                    [
                        "ID",
                        "PREFIX",
                        "ORG",
                        "NAME",
                        "MODELS",
                        "SPENT_USD",
                        "LIMIT_USD",
                        "RPM",
                        "TPM",
                        "EXPIRES",
                        "STATUS",
                    ],
                )
            )
    elif args.keys_command == "update":
        changes: dict[str, int | None] = {}
        if args.spend_limit is not None:
            changes["spend_limit_micros"] = None if args.spend_limit == "none" else _usd(args.spend_limit)
        for name in ("rpm", "tpm"):
            value = getattr(args, name)
            if value is not None:
                try:
                    changes[name] = None if value == "none" else _positive_int(value)
                except argparse.ArgumentTypeError as exc:
                    raise CLIError(f"keys update --{name}: {exc}") from None
        if not changes:
            raise CLIError("keys update: say what to change (--spend-limit, --rpm, --tpm)")
        updated = service.update_key(store, ctx, args.key_id, **changes).to_json()
        limits = ", ".join(
            f"{label} {updated[field] if updated[field] is not None else 'none'}"
            for label, field in (("spend limit (USD)", "spend_limit_usd"), ("rpm", "rpm"), ("tpm", "tpm"))
        )
        print(f"updated key {args.key_id}: {limits}")
    elif args.keys_command == "revoke":
        service.revoke_key(store, ctx, args.key_id)
        print(f"revoked key {args.key_id}")
    elif args.keys_command == "rotate":
        info, secret = service.rotate_key(store, ctx, args.key_id, args.grace_seconds)
        grace = (
            f"the old one works for {args.grace_seconds} s more"
            if args.grace_seconds
            else "the old one no longer works"
        )
        print(f"rotated key {info.id}: its new secret (shown once; store it now; {grace}):", file=sys.stderr)
        print(secret)
    elif args.keys_command in ("block", "unblock"):
        service.set_key_status(store, ctx, args.key_id, "inactive" if args.keys_command == "block" else "active")
        print(f"{args.keys_command}ed key {args.key_id}")
    return 0


def cmd_admin_keys(args: argparse.Namespace, store: Store) -> int:
    from ezat_compat.admin import service

    ctx = service.cli_context()
    if args.admin_keys_command == "create":
        info, secret = service.create_admin_key(
            store,
            ctx,
            name=args.name or "",
            read_only=args.read_only,
            expires_at=_parse_time(args.expires, "--expires"),
        )
        access = "read-only" if info.read_only else "read-write"
        print(f"created {access} admin key {info.id} (shown once; store it now):", file=sys.stderr)
        print(secret)
    elif args.admin_keys_command == "list":
        now = datetime.now(UTC)
        keys = [{**k.to_json(), "status": k.status(now)} for k in service.admin_store(store).list_keys()]
        if args.json:
            print(json.dumps(keys, indent=2))
        else:
            rows = [
                [
                    k["id"],
                    k["prefix"] + "…",
                    k["name"],
                    "read-only" if k["read_only"] else "read-write",
                    k["status"],
                    k["created_at"],
                    k["expires_at"] or "-",
                    k["last_used_at"] or "-",
                ]
                for k in keys
            ]
            print(table(rows, ["ID", "PREFIX", "NAME", "ACCESS", "STATUS", "CREATED", "EXPIRES", "LAST_USED"]))
    elif args.admin_keys_command == "revoke":
        service.revoke_admin_key(store, ctx, args.id)
        print(f"revoked admin key {args.id}")
    return 0


def cmd_audit(args: argparse.Namespace, store: Store) -> int:
    from ezat_compat.admin import service

    since = _parse_time(args.since, "--since")
    trail = service.admin_store(store)
    entries: list[dict[str, Any]] = []
    before_id = None
    while True:  # newest first: every entry since --since, a batch at a time
        batch = trail.entries(since=since, actor=args.actor, before_id=before_id)
        entries += [entry.to_json() for entry in batch]
        if not batch:
            break
        before_id = batch[-1].id
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    rows = [
        [e["at"], e["actor"], e["action"], f"{e['target']['type']} {e['target']['id']}", e["address"] or "-"]
        for e in entries
    ]
    print(table(rows, ["AT", "ACTOR", "ACTION", "TARGET", "ADDRESS"]))
    return 0


def console_base_url(config: Config | None) -> str:
    """Where the console is reached on this host: ``http://<[admin] bind>``, or the main listener's
    when the admin API is served there alone; a wildcard address as loopback."""
    if config is None:
        bind = "127.0.0.1:8081"
    else:
        bind = config.admin.bind or os.environ.get("EZAT_BIND") or config.server.bind
    if bind.startswith("unix:"):
        raise CLIError(f"the console listens on {bind}: give the URL it is reached at with --base-url")
    host, _, port = bind.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def cmd_console_link(args: argparse.Namespace, store: Store) -> int:
    from ezat_compat.admin import service
    from ezat_compat.store.accounts import iso

    base = (args.base_url or console_base_url(_admin_config(args))).rstrip("/")
    assert store.console is not None, "open_store makes the console's repository"
    ctx = service.cli_context()
    token, link_id, expires_at = store.console.create_link(created_by=ctx.actor)
    service.record_change(
        store, ctx, "console_link.create", "console_link", link_id, None, {"id": link_id, "expires_at": iso(expires_at)}
    )
    print(
        f"one-time sign-in link {link_id} for the console, as a gateway admin; good once, until "
        f"{iso(expires_at)} (open it in a browser on a host that reaches {base}):",
        file=sys.stderr,
    )
    print(f"{base}/console/auth/link/{token}")
    return 0


def cmd_usage(args: argparse.Namespace, store: Store) -> int:
    ledger = store.ledger
    since = _parse_time(args.since, "--since")
    if args.json:
        print(json.dumps(ledger.usage_rows(org=args.org, key_public_id=args.key, since=since), indent=2))
        return 0
    summary = ledger.usage_summary(org=args.org, key_public_id=args.key, since=since)
    rows = [
        [
            s["org"],
            s["key_id"],
            s["model"],
            s["requests"],
            s["input_tokens"],
            s["cache_write_tokens"],
            s["cache_read_tokens"],
            s["output_tokens"],
            s["reasoning_tokens"],
            s["cost_usd"],
        ]
        for s in summary
    ]
    print(
        table(
            rows,
            [
                "ORG",
                "KEY",
                "MODEL",
                "REQUESTS",
                "INPUT",
                "CACHE_WRITE",
                "CACHE_READ",
                "OUTPUT",
                "REASONING",
                "COST_USD",
            ],
        )
    )
    return 0


# ---------------------------------------------------------------- spend limits by period


def cmd_spend_limits(args: argparse.Namespace, store: Store) -> int:
    """``spend-limits set|list|delete``: the admin API's spend limits (admin/spend.py, the same
    service), audited as ``cli:<user>``."""
    from ezat_compat.admin.errors import AdminError
    from ezat_compat.admin.service import cli_context
    from ezat_compat.admin.spend import cli_rows, delete_limit, parse_cli_scope, set_limit, spend_limits
    from ezat_compat.periods import time_zone

    path = resolve_config_path(args.config)
    if os.path.exists(path):  # the periods of the configured zone (else UTC: EZAT_DATABASE_URL alone)
        spend_limits(store).zone = time_zone(load_config(path).spend.time_zone)
    try:
        if args.spend_command == "set":
            amount = None if args.usd == "none" else _usd(args.usd)
            thresholds = _thresholds(args.thresholds) if args.thresholds is not None else None
            limit = set_limit(
                store, cli_context(), parse_cli_scope(args.scope), args.period, amount, thresholds=thresholds
            )
            shown = "no limit" if limit.amount_micros is None else f"{_money(limit.amount_micros)} USD"
            print(f"spend limit {limit.public_id}: {limit.scope_label} {limit.period} {shown}")
        elif args.spend_command == "list":
            rows = cli_rows(store, datetime.now(UTC))
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                cells = [
                    [
                        r["id"],
                        r["scope"],
                        r["period"],
                        r["amount_usd"] or "none",
                        r["spent_usd"],
                        r["reserved_usd"],
                        r["resets_at"],
                        ",".join(map(str, r["thresholds"])) if r["thresholds"] else "-",
                    ]
                    for r in rows
                ]
                headers = ["ID", "SCOPE", "PERIOD", "LIMIT_USD", "SPENT_USD", "HELD_USD", "RESETS_AT", "ALERTS_%"]
                print(table(cells, headers))
        elif args.spend_command == "delete":
            limit = delete_limit(store, cli_context(), args.id)
            print(f"deleted spend limit {limit.public_id} ({limit.scope_label} {limit.period})")
    except AdminError as exc:
        raise CLIError(str(exc)) from None
    return 0


def _thresholds(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CLIError(f"--thresholds: {text!r} is not a list of whole percentages like 80,100") from None


# ---------------------------------------------------------------- check-config and db


def _egress_lines(config: Config) -> list[str]:
    """Each deployment's way out (proxy, password masked; CA bundle; client certificate);
    ``CLIError`` naming the first file that is missing or unreadable."""
    from ezat_compat.translate.responses_tools import ANTHROPIC_WEB_SEARCH as WEB_SEARCH_TOOL
    from ezat_compat.upstream.egress import check_files, describe, egress_of
    from ezat_compat.upstream.providers import ProviderSetupError, make_provider
    from ezat_compat.upstream.providers.features import tool_refused

    lines = []
    for model in config.models:
        for deployment in model.deployments:
            egress = egress_of(deployment, config.gateway.ca_file)
            problem = check_files(egress)
            if problem is not None:
                raise CLIError(f"deployment {deployment.name}: {problem}")
            try:  # the provider, its region and where its credentials come from (never the secret)
                provider = make_provider(deployment, egress).describe()
            except ProviderSetupError as exc:
                raise CLIError(str(exc)) from None
            if model.web_search and tool_refused(deployment.provider, WEB_SEARCH_TOOL["type"]):
                provider.append(f"web search: not on {deployment.provider}, web-search requests skip it")
            lines.append(
                f"deployment {deployment.name} ({deployment.base_url}): "
                + "; ".join(provider + describe(egress, deployment.base_url))
            )
    return lines


def _write_problems(config: Config) -> list[str]:
    """Why the gateway could not write what it writes, one phrase per place: the data folder
    (usage journal, rate-limit counters, sealing key), a SQLite database's folder, the pidfile's
    folder; and whether a sealing key can be read or made. Nothing is created."""
    from sqlalchemy import make_url

    from ezat_compat.datafiles import data_folder, writable_problem
    from ezat_compat.sealing import sealing_key_problem
    from ezat_compat.server.logs import log_file_problems
    from ezat_compat.store.ledger import JOURNAL_DIR_ENV

    folder = data_folder(config)
    places = {"data_dir": folder}
    if os.environ.get(JOURNAL_DIR_ENV):
        places[JOURNAL_DIR_ENV] = os.environ[JOURNAL_DIR_ENV]
    url = make_url(config.gateway.database_url)
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and database not in ("", ":memory:") and not database.startswith("file:"):
        places["database_url"] = os.path.dirname(os.path.abspath(database))
    if config.server.pidfile:
        places["pidfile"] = os.path.dirname(os.path.abspath(config.server.pidfile))
    problems = []
    for name, place in places.items():
        problem = writable_problem(place)
        if problem is not None:
            problems.append(f"{name}: {problem}")
    problems += log_file_problems({"access_log": config.server.access_log, "error_log": config.server.error_log})
    if not any(p.startswith("data_dir:") for p in problems):
        problem = sealing_key_problem(folder)
        if problem is not None:
            problems.append(problem)
    return problems


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate the file and what it needs from the environment, as ``nginx -t`` does: no
    connection is made. Warnings (a deployment without its key) go to stderr; exit 0. A model that
    no deployment can serve (none has its key) fails, naming the variables to set."""
    from ezat_compat.server.serving import admin_bind, deployment_warnings, parse_bind, unusable_models
    from ezat_compat.store.db import check_url, describe_url

    path = resolve_config_path(args.config)
    config = load_config(path)
    main_bind = os.environ.get("EZAT_BIND") or config.server.bind
    parse_bind(main_bind)  # the bind's form (not whether it is free)
    if admin_bind(config, main_bind):  # the admin listener's: its own port
        parse_bind(config.admin.bind)
    check_url(config.gateway.database_url)  # a supported URL whose driver is installed; nothing is created
    unusable = unusable_models(config)
    if unusable:
        raise CLIError("; ".join(unusable))
    problems = _write_problems(config)
    if problems:
        raise CLIError("the gateway could not write its files: " + "; ".join(problems))
    for line in deployment_warnings(config):
        print(f"ezat-compat: warning: {line}", file=sys.stderr)
    for line in _egress_lines(config):
        print(line)
    deployments = sum(len(m.deployments) for m in config.models)
    print(
        f"{path}: the configuration is valid ({len(config.models)} models, {deployments} deployments, "
        f"database {describe_url(config.gateway.database_url)})"
    )
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from ezat_compat.store import db

    url = _database_url(args)
    if args.db_command == "upgrade" and args.sql:
        start = args.from_revision
        if start is None:  # say what the script does to the database it is for (stderr: stdout is the SQL)
            start, note = db.upgrade_sql_start(url)
            print(f"ezat-compat db upgrade --sql: {note}", file=sys.stderr)
        sys.stdout.write(db.upgrade_sql(url, from_revision=start))
        return 0
    if args.db_command == "backup":
        size = db.backup_sqlite(url, args.path)
        print(f"backed up {db.describe_url(url)} to {args.path} ({size} bytes)")
        return 0
    engine = db.open_engine(url)
    try:
        before = db.schema_state(engine)
        if args.db_command == "upgrade":
            db.prepare_database(url)
            after = db.schema_state(engine)
            if before.current == after.current:
                print(after.describe())
            else:
                print(f"upgraded the database from revision {','.join(before.current) or 'none'} to {after.head}")
        elif args.db_command == "current":
            revision = ",".join(before.current) or "none"
            print(f"{revision} (head)" if before.up_to_date else revision)
        elif args.db_command == "check":
            if not before.up_to_date:
                raise db.SchemaError(before.describe())
            print(before.describe())
    finally:
        engine.dispose()
    return 0


# ---------------------------------------------------------------- serving


def cmd_serve(args: argparse.Namespace) -> int:
    from ezat_compat.server.serving import serve

    config = _config(args)
    return serve(config, bind=args.bind, workers=args.workers)


def cmd_sim(args: argparse.Namespace, extra: list[str]) -> int:
    from ezat_compat.sim.server import main as sim_main

    argv = ["--bind", args.bind] if args.bind else []
    return int(sim_main(argv + extra, prog="ezat-compat sim") or 0)


def cmd_login(args: argparse.Namespace) -> int:
    from ezat_compat.login import login

    return login(args.gateway, no_browser=args.no_browser)


def cmd_token(args: argparse.Namespace) -> int:
    from ezat_compat.login import token

    return token(args.gateway)


def cmd_demo(args: argparse.Namespace) -> int:
    from ezat_compat.demo import run_demo

    return run_demo(
        bind=args.bind, directory=args.dir, sim_bind=args.sim_bind, simulator=args.simulator, clouds=args.clouds
    )


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ezat-compat",
        description="On-prem gateway: OpenAI Chat Completions and Anthropic Messages in front of Claude deployments.",
    )
    parser.add_argument(
        "--config", metavar="PATH", help="the TOML configuration (default: $EZAT_CONFIG, then ./ezat.toml)"
    )
    parser.add_argument("--version", action="version", version=f"ezat-compat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser("demo", help="run the gateway with the simulator, no configuration needed")
    demo.add_argument("--bind", default="127.0.0.1:8080", metavar="HOST:PORT")
    demo.add_argument("--dir", default="ezat-demo", metavar="PATH", help="the demo's data folder")
    demo.add_argument(
        "--sim-bind", default="127.0.0.1:0", metavar="HOST:PORT", help="the simulator's address (default: a free port)"
    )
    demo.add_argument(
        "--simulator",
        action="store_true",
        help="use the bundled simulator even when ANTHROPIC_API_KEY is set (default: Anthropic's API when it is)",
    )
    demo.add_argument(
        "--clouds",
        action="store_true",
        help="add a model on Amazon Bedrock (throttled) failing over to Google Vertex AI, both simulated "
        "(needs the bedrock and vertex extras)",
    )

    serve = sub.add_parser("serve", help="run the gateway under gunicorn (gevent workers)")
    serve.add_argument("--bind", metavar="HOST:PORT")
    serve.add_argument("--workers", type=_positive_int, metavar="N")

    sim = sub.add_parser("sim", help="run the Anthropic-compatible simulator (other flags: sim --help)", add_help=False)
    sim.add_argument("--bind", metavar="HOST:PORT")

    orgs = sub.add_parser("orgs", help="organizations: list, create, top-up, suspend, resume")
    orgs_sub = orgs.add_subparsers(dest="orgs_command", title="actions", metavar="ACTION", required=True)
    ol = orgs_sub.add_parser("list", help="every organization: balance, reserved, status, active keys")
    ol.add_argument("--json", action="store_true", help="one JSON array of objects, for scripts")
    create = orgs_sub.add_parser("create", help="a new organization (with a starting balance: --balance USD)")
    create.add_argument("name")
    create.add_argument("--balance", metavar="USD")
    top_up = orgs_sub.add_parser("top-up", help="add USD to an organization's balance")
    top_up.add_argument("name")
    top_up.add_argument("usd", metavar="USD")
    orgs_sub.add_parser("suspend", help="refuse every key of the organization (403) until resumed").add_argument("name")
    orgs_sub.add_parser("resume", help="let a suspended organization's keys work again").add_argument("name")

    keys = sub.add_parser("keys", help="API keys: create, list, update, revoke, rotate, block, unblock")
    keys_sub = keys.add_subparsers(dest="keys_command", title="actions", metavar="ACTION", required=True)
    kc = keys_sub.add_parser("create", help="a new key for an organization (the secret is printed once)")
    kc.add_argument("--org", required=True, metavar="NAME")
    kc.add_argument("--name", metavar="LABEL")
    kc.add_argument("--models", metavar="PATTERN,...", help="glob patterns of allowed models (default: all)")
    kc.add_argument("--spend-limit", metavar="USD")
    kc.add_argument("--rpm", type=_positive_int, metavar="N")
    kc.add_argument("--tpm", type=_positive_int, metavar="N")
    kc.add_argument("--expires", metavar="ISO8601")
    kl = keys_sub.add_parser("list", help="every key (of one organization: --org NAME), never its secret")
    kl.add_argument("--org", metavar="NAME")
    kl.add_argument("--json", action="store_true")
    ku = keys_sub.add_parser(
        "update", help="change a key's spend limit, rpm or tpm (none: no limit), from its next request on"
    )
    ku.add_argument("key_id", metavar="KEY_ID")
    ku.add_argument("--spend-limit", metavar="USD|none")
    ku.add_argument("--rpm", metavar="N|none")
    ku.add_argument("--tpm", metavar="N|none")
    kr = keys_sub.add_parser("revoke", help="revoke a key by its id (KEY_ID from keys list): 401 from then on")
    kr.add_argument("key_id", metavar="KEY_ID")
    krot = keys_sub.add_parser(
        "rotate", help="a new secret for a key (printed once); the old one works for --grace-seconds more"
    )
    krot.add_argument("key_id", metavar="KEY_ID")
    krot.add_argument("--grace-seconds", type=_seconds, default=0, metavar="N", help="default 0: refused at once")
    keys_sub.add_parser("block", help="refuse a key (401) at once, until unblocked").add_argument(
        "key_id", metavar="KEY_ID"
    )
    keys_sub.add_parser("unblock", help="let a blocked key work again").add_argument("key_id", metavar="KEY_ID")

    admin_keys = sub.add_parser("admin-keys", help="keys of the admin API: create, list, revoke")
    ak_sub = admin_keys.add_subparsers(dest="admin_keys_command", title="actions", metavar="ACTION", required=True)
    akc = ak_sub.add_parser("create", help="a new admin key (ezat_admin_…, printed once)")
    akc.add_argument("--name", metavar="LABEL")
    akc.add_argument("--read-only", action="store_true", help="it may read but change nothing")
    akc.add_argument("--expires", metavar="ISO8601")
    akl = ak_sub.add_parser("list", help="every admin key, never its secret")
    akl.add_argument("--json", action="store_true")
    ak_sub.add_parser("revoke", help="revoke an admin key by its id (adminkey_…)").add_argument("id", metavar="ID")

    audit = sub.add_parser("audit", help="the audit trail: every change, who made it, before and after")
    audit_sub = audit.add_subparsers(dest="audit_command", title="actions", metavar="ACTION", required=True)
    al = audit_sub.add_parser("list", help="the changes, newest first")
    al.add_argument("--since", metavar="ISO8601")
    al.add_argument("--actor", metavar="ACTOR", help="only this actor's changes (adminkey_…, cli:USER)")
    al.add_argument("--json", action="store_true")

    spend = sub.add_parser("spend-limits", help="spend limits by period (daily, weekly, monthly): set, list, delete")
    spend_sub = spend.add_subparsers(dest="spend_command", required=True, metavar="COMMAND")
    ss = spend_sub.add_parser("set", help="set the limit of a scope and period (made, or changed in place)")
    ss.add_argument("--scope", required=True, metavar="gateway|org:NAME|key:KEY_ID|user:EMAIL|group:NAME")
    ss.add_argument("--period", required=True, choices=("daily", "weekly", "monthly"))
    ss.add_argument("--usd", required=True, metavar="AMOUNT|none", help="whole cents; none: explicitly no limit")
    ss.add_argument("--thresholds", metavar="PCT,...", help="alert percentages (default: [alerts] thresholds)")
    sl = spend_sub.add_parser("list", help="every limit with its current period's spend and reset time")
    sl.add_argument("--json", action="store_true")
    spend_sub.add_parser("delete", help="remove a limit by its id (spl_… from spend-limits list)").add_argument(
        "id", metavar="ID"
    )

    from ezat_compat.people_cli import add_parsers as add_people_parsers

    add_people_parsers(sub)  # users …, groups … (people_cli.py)

    usage = sub.add_parser("usage", help="requests, tokens and cost per org, key and model")
    usage.add_argument("--org", metavar="NAME")
    usage.add_argument("--key", metavar="KEY_ID")
    usage.add_argument("--since", metavar="ISO8601")
    usage.add_argument("--json", action="store_true")

    link = sub.add_parser(
        "console-link", help="a one-time break-glass sign-in link for the console (as a gateway admin; 15 minutes)"
    )
    link.add_argument("--base-url", metavar="URL", help="where the console is reached (default: http://<[admin] bind>)")

    login = sub.add_parser("login", help="sign in from this laptop with the company's IdP (device grant; no config)")
    login.add_argument(
        "--gateway", required=True, metavar="URL", help="the gateway's address (https://llm.example.com)"
    )
    login.add_argument("--no-browser", action="store_true", help="print the address and code only; open no browser")
    token = sub.add_parser("token", help="print a valid key of your sign-in (refreshed when due), for apiKeyHelper")
    token.add_argument("--gateway", metavar="URL", help="which gateway (optional when signed in to one)")

    sub.add_parser(
        "check-config",
        help="validate the configuration file and that its files can be written (exit 0, or 1 with the error)",
    )

    dbp = sub.add_parser("db", help="the database: upgrade [--sql], current, check, backup PATH")
    db_sub = dbp.add_subparsers(dest="db_command", title="actions", metavar="ACTION", required=True)
    up = db_sub.add_parser("upgrade", help="migrate the schema to this release's (or print the SQL: --sql)")
    up.add_argument("--sql", action="store_true", help="print the SQL for a DBA to apply instead of running it")
    up.add_argument(
        "--from",
        dest="from_revision",
        metavar="REVISION",
        help="with --sql: the revision to start from; default: the database's own (`db current`), or none",
    )
    db_sub.add_parser("current", help="the schema revision of the database")
    db_sub.add_parser("check", help="exit 0 when the schema is this release's, else 1 saying what to run")
    backup = db_sub.add_parser("backup", help="a consistent copy of a live SQLite database")
    backup.add_argument("path", metavar="PATH")
    return parser


def _stdout_gone() -> int:
    """The reader of stdout has gone: end quietly, as Unix tools do (the Python documentation's
    recipe in "Note on SIGPIPE"). stdout is pointed at devnull, so the interpreter's own flush at
    exit has nowhere to fail; the status is 1."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """The ``ezat-compat`` command: its exit status. Output is flushed here, so that a reader that
    has gone (``usage --json | head``, also after ``--help``) is noticed as a ``BrokenPipeError``
    and ends the command quietly, not in a traceback at interpreter exit."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()


def _run(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "sim":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "from_revision", None) and not args.sql:
        parser.error("db upgrade --from needs --sql")
    from ezat_compat.demo import DemoError
    from ezat_compat.errors import GatewayError
    from ezat_compat.server.serving import StartupError, one_line
    from ezat_compat.store.accounts import StoreError
    from ezat_compat.store.db import DatabaseUnavailable, SchemaError

    try:
        if args.command == "sim":
            return cmd_sim(args, extra)
        from ezat_compat.people_cli import cmd_groups, cmd_users

        with_store = {
            "users": cmd_users,
            "groups": cmd_groups,
            "orgs": cmd_orgs,
            "keys": cmd_keys,
            "usage": cmd_usage,
            "spend-limits": cmd_spend_limits,
            "admin-keys": cmd_admin_keys,
            "audit": cmd_audit,
            "console-link": cmd_console_link,
        }.get(args.command)
        if with_store is not None:
            with _store(args) as store:
                return with_store(args, store)
        handler = {
            "demo": cmd_demo,
            "serve": cmd_serve,
            "check-config": cmd_check_config,
            "db": cmd_db,
            "login": cmd_login,
            "token": cmd_token,
        }[args.command]
        return handler(args)
    except (
        CLIError,
        ConfigError,
        StoreError,
        DemoError,
        StartupError,
        DatabaseUnavailable,
        SchemaError,
        GatewayError,  # the admin service's: an unknown organization or key, a conflict
    ) as exc:
        print(f"ezat-compat: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
