"""Reservations and the ledger: billing that never overshoots, one transaction per step.

Every billed request goes through two short transactions:

1. ``reserve(ctx, request_id, worst_case)`` before the request is sent upstream. It moves the
   request's worst-case cost (``pricing.worst_case_micros``) into the org's and the key's
   ``reserved_micros``, and into the current period of every spend limit by period that applies
   (store/spend.py: the gateway's, the org's, the key's), only if the org's available balance
   (balance − reserved), the key's spend limit (spent + reserved) and each period's cap (spent +
   reserved) all still cover it; otherwise nothing changes and it raises
   ``InsufficientQuotaError`` (402). Every check is a conditional UPDATE (or upsert), so
   concurrent requests — threads, gunicorn workers, nodes on one PostgreSQL — can never overshoot.
2. ``settle(request_id, entry)`` when the request ends, however it ends (``finally``): writes
   the ledger row, releases the reservation and debits the real cost, all in one transaction,
   so the sum of the ledger's costs always equals what was debited. A second settle of the
   same request is a no-op. Failed requests are settled with cost 0 (Chat Completions reference,
   "Errors": failed requests aren't billed); a client that closed a stream early pays for what
   was produced (status 499, ``estimated=True``).

Each reservation names the worker that holds it (``store/workers.py``). When a worker dies,
``release_worker`` (gunicorn's master, ``child_exit``) or ``maintain`` (its siblings, every few
seconds) settles its reservations as gateway failures: status ``WORKER_DIED`` (500), cost 0 —
the stream was cut by the gateway, and a failure after the start isn't billed (Chat
Completions reference, "Streaming"). ``sweep_stale`` (six hours) remains the last resort.

When the database can't take a settlement, ``settle_durably`` writes it to the usage journal
(``store/journal.py``) instead, and ``replay`` / ``maintain`` apply it once the database answers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Select, bindparam, func, select
from sqlalchemy.engine import make_url

from ezat_compat.domain import Usage
from ezat_compat.errors import GatewayError, InsufficientQuotaError
from ezat_compat.pricing import micros_to_usd
from ezat_compat.procid import pid
from ezat_compat.store.accounts import AuthContext, StoreError, iso
from ezat_compat.store.hotpath import (
    REFUSED_BY_ORG,
    RESERVING_WORKERS_SQL,
    DatabaseUnavailableError,
    Execute,
    HotPath,
    Rider,
    SpendHold,
    Work,
    encode_holds,
    is_unavailable,
    release_if_held_tx,
    release_worker_tx,
    reserve_tx,
    settle_tx,
    sweep_tx,
)
from ezat_compat.store.journal import Journal, RejectedRowError, ReplayReport
from ezat_compat.store.responses import RIDE as RESPONSE_RIDE
from ezat_compat.store.responses import put_tx as put_response_tx
from ezat_compat.store.spend import SpendLimits
from ezat_compat.store.tables import MODEL_MAX, api_keys, ledger, orgs, to_epoch_micros
from ezat_compat.store.threads import RIDE as THREAD_RIDE
from ezat_compat.store.threads import put_tx as put_thread_tx
from ezat_compat.store.workers import BOOT, HOST, is_dead, live_tag, parse_tag, start_ticks, tag_prefix, worker_tag

log = logging.getLogger("ezat_compat")

ENDPOINTS = ("chat.completions", "completions", "messages", "responses")
CLIENT_CLOSED = 499  # the status of a request whose client left early (still billed)
# Reservations of workers that died are released after this long: streams can run for hours,
# and a swept reservation is still debited when its request settles.
STALE_RESERVATION = timedelta(hours=6)
WORKER_DIED = 500  # the ledger status of a request whose worker died (a gateway failure: not billed)
IF_HELD = "if_held"  # a journal row that settles its request only if it still holds a reservation
MAINTAIN_EVERY_S = 5.0  # how often a worker replays the journal and releases dead siblings' holds
REPLAY_EVERY_S = 1.0  # how often a worker's replayer looks for journaled settlements it may apply
RIDE = "ride"  # a journal row's rider (``Rider.kind`` and ``params``), written with its settlement
RIDES: dict[str, Work[Any, Any]] = {
    RESPONSE_RIDE: put_response_tx,
    THREAD_RIDE: put_thread_tx,
}  # what each kind of rider runs
JOURNAL_DIR_ENV = "EZAT_JOURNAL_DIR"


def default_journal_dir(database_url: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the usage journal of ``database_url`` lives: ``$EZAT_JOURNAL_DIR`` when set, else
    ``<data_dir>/usage-journal-<digest of the URL>`` (one folder per database, so two gateways
    sharing a data folder never mix their settlements). Without ``data_dir`` (library use,
    tests): the first of ``legacy_journal_dirs``."""
    if os.environ.get(JOURNAL_DIR_ENV):
        return Path(os.environ[JOURNAL_DIR_ENV])
    if data_dir is not None:
        return Path(os.path.abspath(data_dir)) / f"usage-journal-{_url_digest(database_url)}"
    return legacy_journal_dirs(database_url)[0]


def legacy_journal_dirs(database_url: str) -> list[Path]:
    """Where releases before the data folder kept the journal: next to a SQLite database
    (``<file>-usage-journal``), else ``./ezat-usage-journal-<digest>`` of the working directory.
    ``Journal.adopt`` moves what waits there into the journal's folder."""
    url = make_url(database_url)
    db = url.database
    found = []
    if url.get_backend_name() == "sqlite" and db and db != ":memory:" and not db.startswith("file:"):
        found.append(Path(os.path.abspath(db + "-usage-journal")))
    found.append(Path.cwd() / f"ezat-usage-journal-{_url_digest(database_url)}")
    return found


def _url_digest(database_url: str) -> str:
    return hashlib.sha256(database_url.encode()).hexdigest()[:16]


def _unbilled(created_at_micros: int, status: int) -> dict[str, Any]:
    """The ledger columns of a gateway failure at no cost, but for its request, org, key,
    endpoint and models: no deployment, no tokens, ``status``."""
    return {
        "created_at": created_at_micros,
        "deployment": "",
        "input_tokens": 0,
        "cache_write_tokens": 0,
        "cache_read_tokens": 0,
        "output_tokens": 0,
        "reasoning_tokens": 0,
        "cost_micros": 0,
        "status": status,
        "estimated": False,
    }


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """What ``settle`` records for one request.

    ``model`` is the name the client sent, ``canonical_model`` and ``deployment`` what served it
    (empty strings when the request failed before routing). ``status`` is the HTTP status the
    client got: 200, 499 for an early close, or the error's status. ``cost_micros`` must be 0
    for a failed request (status ≥ 400 other than 499). ``estimated`` is True when the output
    tokens were estimated because the stream was closed early.
    """

    created_at: datetime
    org_id: int
    key_id: int
    endpoint: str
    model: str
    canonical_model: str
    deployment: str
    usage: Usage = field(default_factory=Usage)
    cost_micros: int = 0
    status: int = 200
    estimated: bool = False

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {self.endpoint!r}")
        if self.cost_micros < 0:
            raise ValueError(f"cost_micros must not be negative, got {self.cost_micros}")
        if not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status, got {self.status}")
        if self.status >= 400 and self.status != CLIENT_CLOSED and self.cost_micros:
            raise ValueError(f"a failed request (status {self.status}) is not billed: settle it with cost 0")


# ------------------------------------------------------------ the reports' statements, built once
# (reserve, settle and the sweep run the hot path's: store/hotpath.py)

_ORG_FUNDS = select(orgs.c.name, orgs.c.balance_micros, orgs.c.reserved_micros).where(orgs.c.id == bindparam("b_org"))
_KEY_FUNDS = select(
    api_keys.c.public_id, api_keys.c.spend_limit_micros, api_keys.c.spent_micros, api_keys.c.reserved_micros
).where(api_keys.c.id == bindparam("b_key"))

_TOKENS = ("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens", "reasoning_tokens")
_ROWS = (
    select(
        ledger.c.request_id,
        ledger.c.created_at,
        orgs.c.name.label("org"),
        api_keys.c.public_id.label("key_id"),
        ledger.c.endpoint,
        ledger.c.model,
        ledger.c.canonical_model,
        ledger.c.deployment,
        *(ledger.c[name] for name in _TOKENS),
        ledger.c.cost_micros,
        ledger.c.status,
        ledger.c.estimated,
    )
    .select_from(ledger.join(orgs, ledger.c.org_id == orgs.c.id).join(api_keys, ledger.c.key_id == api_keys.c.id))
    .order_by(ledger.c.created_at, ledger.c.id)
)
_SUMMARY = (
    select(
        orgs.c.name.label("org"),
        api_keys.c.public_id.label("key_id"),
        ledger.c.canonical_model.label("model"),
        func.count().label("requests"),
        *(func.sum(ledger.c[name]).label(name) for name in _TOKENS),
        func.sum(ledger.c.cost_micros).label("cost_micros"),
    )
    .select_from(ledger.join(orgs, ledger.c.org_id == orgs.c.id).join(api_keys, ledger.c.key_id == api_keys.c.id))
    .group_by(orgs.c.name, api_keys.c.public_id, ledger.c.canonical_model)
    .order_by(orgs.c.name, api_keys.c.public_id, ledger.c.canonical_model)
)


def _outage(exc: BaseException) -> bool:
    """The database can't be reached or used now (as opposed to refusing a row)."""
    return isinstance(exc, DatabaseUnavailableError) or is_unavailable(exc)


def _usd(micros: int) -> str:
    return "$" + micros_to_usd(micros)


class Ledger:
    """Reservations, settlement and usage reports on the database behind ``engine``.

    ``hot_path`` runs reserve, settle and the sweep: the one ``make_hot_path(engine)`` of the
    process, shared with ``Accounts``. Thread-safe; create one per process and share it.
    """

    def __init__(
        self,
        engine: Engine,
        hot_path: HotPath,
        *,
        journal: Journal | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        spend: SpendLimits | None = None,
    ) -> None:
        """``journal``: the usage journal (default: ``default_journal_dir`` of the database in
        ``data_dir``). ``spend``: the spend limits by period (default: theirs on ``engine``, UTC
        periods)."""
        self._engine = engine
        self.spend = spend if spend is not None else SpendLimits(engine)
        self.hot = hot_path  # shared with the other stores of the database (one connection a process)
        self._write = hot_path.write
        url = engine.url.render_as_string(hide_password=False)
        self.journal = journal or Journal(default_journal_dir(url, data_dir))
        self._next_maintain = 0.0
        self._maintaining = threading.Lock()
        self._replayer_pid = 0  # the process whose replayer runs (``start_replayer``)

    @property
    def engine(self) -> Engine:
        """The process's engine on the database: the other stores of the gateway use this one
        (a second engine on a SQLite file is a second owner of its locks)."""
        return self._engine

    # ------------------------------------------------------------ the hot path

    def reserve(
        self,
        ctx: AuthContext,
        request_id: str,
        amount_micros: int,
        *,
        now: datetime | None = None,
        endpoint: str = "",
        model: str = "",
        canonical_model: str = "",
        worker: str | None = None,
        status_of: Callable[[GatewayError], int] | None = None,
    ) -> None:
        """Hold ``amount_micros`` (the request's worst case) against the org's balance and the
        key's spend limit, in one short transaction.

        Raises ``InsufficientQuotaError`` (402) when either, or a spend limit by period that
        applies (store/spend.py), can't cover it; nothing is held then. Call
        ``settle(request_id, …)`` exactly once afterwards, whatever happens.
        ``request_id`` must be new (a duplicate raises the database's IntegrityError). The
        reservation names ``worker`` (default: this process's tag) and the request's
        ``endpoint`` and models, for the ledger row ``release_worker`` gives it if that worker dies.
        When the database fails the reserve, its release is journaled (``_forget_if_held``) with
        the status the client gets: ``status_of(error)`` (the dialect's), else the error's own.
        """
        if isinstance(amount_micros, bool) or not isinstance(amount_micros, int) or amount_micros < 0:
            raise ValueError(f"amount_micros must be a non-negative int, got {amount_micros!r}")
        now = now or datetime.now(UTC)
        # () without a statement when none apply
        holds = self.spend.holds(ctx.org_id, ctx.key_id, now, ctx.user_id, ctx.group_ids)
        params = {
            "org": ctx.org_id,
            "key": ctx.key_id,
            "amount": amount_micros,
            "holds": holds,
            "spend_holds": encode_holds(holds),
            "request_id": request_id,
            "created_at": to_epoch_micros(now),
            "worker": worker or worker_tag(),
            "endpoint": endpoint or None,
            "model": model[:MODEL_MAX] or None,
            "canonical_model": canonical_model or None,
        }
        try:
            refused = self._write(reserve_tx, params)
        except DatabaseUnavailableError as exc:
            self._forget_if_held(params, status_of(exc) if status_of is not None else exc.status)
            raise
        if refused is not None:
            if isinstance(refused, SpendHold):
                raise self.spend.refusal(refused, amount_micros, now)
            with self._engine.connect() as conn:
                if refused == REFUSED_BY_ORG:
                    raise self._org_refusal(conn, ctx, amount_micros)
                raise self._key_refusal(conn, ctx, amount_micros)

    def check_funds(self, ctx: AuthContext, amount_micros: int) -> None:
        """Refuse (402, the words of ``reserve``) a request whose organisation, key or a spend
        limit by period could not pay ``amount_micros`` now; hold nothing. For work done before,
        or without, a reservation: an unbilled request (``count_tokens``) and the load of a
        stored conversation, so that a key that can't pay for a completion can't make the
        gateway do a completion's work."""
        with self._engine.connect() as conn:
            org = conn.execute(_ORG_FUNDS, {"b_org": ctx.org_id}).first()
            if org is None or org.balance_micros - org.reserved_micros < amount_micros:
                raise self._org_refusal(conn, ctx, amount_micros)
            if ctx.spend_limit_micros is not None:
                key = conn.execute(_KEY_FUNDS, {"b_key": ctx.key_id}).first()
                if key is None or key.spend_limit_micros - key.spent_micros - key.reserved_micros < amount_micros:
                    raise self._key_refusal(conn, ctx, amount_micros)
        self.spend.check(ctx.org_id, ctx.key_id, amount_micros, datetime.now(UTC), ctx.user_id, ctx.group_ids)

    def _forget_if_held(self, params: dict[str, Any], status: int) -> None:
        """A reserve failed with the database gone: it may still have committed (PostgreSQL took
        the COMMIT, its answer was lost), and nothing would settle that hold but the 6-hour
        sweep. Journal its release (``IF_HELD``): the next replay, once the database answers,
        settles the request as a failure at no cost if, and only if, it holds a reservation."""
        row = {
            **_unbilled(params["created_at"], status),
            "request_id": params["request_id"],
            "org_id": params["org"],
            "key_id": params["key"],
            "endpoint": params["endpoint"] or "chat.completions",
            "model": params["model"] or "",
            "canonical_model": params["canonical_model"] or "",
            IF_HELD: True,
        }
        try:
            self.journal.append(row)
        except OSError as exc:
            log.error("could not journal the release of request %s's reservation: %s", params["request_id"], exc)

    def _apply(self, row: Mapping[str, Any]) -> bool:
        """One journaled row: a settlement (with its rider, a stored response, if it has one), or
        (``IF_HELD``) the release of a hold that may exist. The database gone raises
        ``DatabaseUnavailableError`` (the replay stops; the row is applied again later, as a
        duplicate if it was in); refused for a reason of its own, ``RejectedRowError``."""
        settlement = {k: v for k, v in row.items() if k not in (IF_HELD, RIDE)}
        lost: list[BaseException] = []
        rider = self._journaled_rider(row.get(RIDE), lost)
        try:
            if row.get(IF_HELD):
                done = self._write(release_if_held_tx, settlement)
            else:
                done = self._write(settle_tx, settlement, rider)
        except Exception as exc:
            if _outage(exc):
                raise
            raise RejectedRowError(str(exc)) from exc
        if lost:
            if _outage(lost[0]):
                raise DatabaseUnavailableError() from lost[0]  # again later: the settle is a duplicate then
            log.error("could not store response %s from the usage journal: %s", row.get("request_id"), lost[0])
        return bool(done)

    @staticmethod
    def _journaled_rider(ride: Any, lost: list[BaseException]) -> Rider | None:
        if not isinstance(ride, dict):
            return None
        work = RIDES.get(str(ride.get("kind")))
        if work is None:
            log.error("usage journal: a record of unknown kind %r skipped", ride.get("kind"))
            return None
        return Rider(work, ride.get("params"), lost.append, str(ride["kind"]))

    def settle(self, request_id: str, entry: LedgerEntry) -> bool:
        """Record the request and debit its real cost, in one transaction; returns True.

        Releases the reservation (if ``sweep_stale`` hasn't already) and debits
        ``entry.cost_micros`` from the org's balance and onto the key's spend, even when the
        reservation is gone. Returns False and changes nothing when ``request_id`` is already
        in the ledger, so retrying a settle never debits twice.
        """
        return self._write(settle_tx, self._row(request_id, entry))

    def settle_durably(self, request_id: str, entry: LedgerEntry, rider: Rider | None = None) -> bool:
        """``settle``, or when the database fails, the settlement appended (fsynced) to the usage
        journal for ``replay``: True when it is in the database, False when in the journal.
        Raises only when the journal can't be written either (``OSError``). ``rider``: a record
        kept with the row, in its transaction (``HotPath.write``); when the database can't take
        it and it has a ``kind``, it waits in the journal with the settlement and is written
        with it on replay (else ``rider.failed`` is told)."""
        row = self._row(request_id, entry)
        lost: list[BaseException] = []
        kept = None if rider is None else Rider(rider.work, rider.params, lost.append, rider.kind)
        failure: Exception | None = None
        try:
            self._write(settle_tx, row, kept)
        except Exception as exc:
            failure = exc
        waits = rider is not None and bool(rider.kind) and bool(lost) and (failure is not None or _outage(lost[0]))
        if failure is None and not waits:
            if rider is not None and lost:
                rider.failed(lost[0])
            return True
        record = {**row, RIDE: {"kind": rider.kind, "params": rider.params}} if rider is not None and waits else row
        try:
            self.journal.append(record)
        except OSError:
            if rider is not None and lost:
                rider.failed(lost[0])
            if failure is None:
                return True
            raise
        if rider is not None and lost and not waits:
            rider.failed(lost[0])
        what = "usage" if failure is not None else "the stored response"
        log.warning(
            "%s of request %s journaled (%s); it is recorded when the database answers",
            what,
            request_id,
            failure or lost[0],
        )
        return failure is None

    def replay(self) -> ReplayReport:
        """Apply the journaled settlements this process may take (its own, dead processes',
        orphans'), each exactly once (a settled request's row is not settled again)."""
        return self.journal.replay(self._apply)

    def release_worker(self, prefix: str, *, keep: str = "", now: datetime | None = None) -> list[str]:
        """Settle the reservations held by the workers whose tags start with ``prefix`` (all but
        the tag ``keep``) as gateway failures (``WORKER_DIED``, cost 0); returns their request ids.
        Replay the journal first: a settlement journaled by the dead worker wins over this."""
        row = _unbilled(to_epoch_micros(now or datetime.now(UTC)), WORKER_DIED)
        released: list[str] = self._write(release_worker_tx, {"prefix": prefix, "keep": keep, "row": row})
        if released:
            log.warning("released %d reservation(s) of dead worker(s) %s*", len(released), prefix)
        return released

    def release_dead_siblings(self, parent: int | None = None) -> list[str]:
        """``release_worker`` for every dead worker of master ``parent`` (default: this process's
        parent) on this host."""
        prefix = tag_prefix(HOST, BOOT, os.getppid() if parent is None else parent)

        def dead_tags(execute: Execute, _params: None) -> tuple[list[str], bool]:
            rows = execute(RESERVING_WORKERS_SQL, {"length": len(prefix), "prefix": prefix}).fetchall()
            return [w for (w,) in rows if (tag := parse_tag(w)) is not None and is_dead(tag)], False

        released: list[str] = []
        for tag in self._write(dead_tags, None):
            parsed = parse_tag(tag)
            assert parsed is not None
            # ``tag`` as a prefix also matches a longer start time of the same pid: keep that one if it runs.
            released += self.release_worker(tag, keep=live_tag(parsed.parent, parsed.pid))
        return released

    def release_orphaned(self) -> list[str]:
        """``release_worker`` for every dead worker on this host whose master is dead too (a
        whole gateway that crashed; a live master releases its own workers'): run on start,
        after ``replay``."""
        prefix = f"{HOST}:"

        def orphaned(execute: Execute, _params: None) -> tuple[list[str], bool]:
            rows = execute(RESERVING_WORKERS_SQL, {"length": len(prefix), "prefix": prefix}).fetchall()
            found = []
            for (worker,) in rows:
                tag = parse_tag(worker)
                if tag is not None and is_dead(tag) and (tag.boot != BOOT or start_ticks(tag.parent) is None):
                    found.append(worker)
            return found, False

        released: list[str] = []
        for tag in self._write(orphaned, None):
            parsed = parse_tag(tag)
            assert parsed is not None
            released += self.release_worker(tag, keep=live_tag(parsed.parent, parsed.pid))
        return released

    def maintain(self) -> None:
        """Every ``MAINTAIN_EVERY_S`` (and on the first call): in the background, replay the
        journal, then release the reservations of dead sibling workers. Never raises. Nothing
        to do where the replayer runs (``start_replayer``): it does both on its own."""
        if self._replayer_pid == pid():
            return
        now = time.monotonic()
        if now < self._next_maintain or not self._maintaining.acquire(blocking=False):
            return
        self._next_maintain = now + MAINTAIN_EVERY_S

        def run() -> None:
            try:
                if not self.replay().failed:
                    self.release_dead_siblings()
            except Exception as exc:
                log.warning("usage journal / dead workers' reservations: %s (retried later)", exc)
            finally:
                self._maintaining.release()

        threading.Thread(target=run, name="ezat-ledger-maintain", daemon=True).start()

    def start_replayer(self, every_s: float = REPLAY_EVERY_S) -> None:
        """Start this process's replayer (once per process: gunicorn's ``post_worker_init``): a
        background thread (a greenlet in a gevent worker) that looks at the journal's folder
        every ``every_s`` and, as soon as the database answers, applies every settlement this
        process may take (``replay``), releasing its reservation — whether or not traffic comes.
        It also releases dead siblings' holds every ``MAINTAIN_EVERY_S``, after a complete
        replay. A look at the folder costs no statement; the database is asked only when a
        file waits or siblings' holds are due."""
        if self._replayer_pid == pid():
            return
        self._replayer_pid = pid()
        threading.Thread(target=self._replay_loop, args=(every_s,), name="ezat-journal-replayer", daemon=True).start()

    def _replay_loop(self, every_s: float) -> None:
        owner = pid()
        next_siblings = time.monotonic() + MAINTAIN_EVERY_S
        failing = False
        while self._replayer_pid == owner == pid():
            try:
                complete = not self.journal.claimable() or not self.replay().failed
                if complete and time.monotonic() >= next_siblings:
                    next_siblings = time.monotonic() + MAINTAIN_EVERY_S
                    self.release_dead_siblings()
                failing = False
            except Exception as exc:
                if not failing:  # once per incident, not every second
                    log.warning("usage journal / dead workers' reservations: %s (retried every %g s)", exc, every_s)
                failing = True
            time.sleep(every_s)

    def stop_replayer(self) -> None:
        """Stop the replayer after its current round (tests; a worker's ends with the process)."""
        self._replayer_pid = 0

    def pending(self) -> int:
        """How many journal files wait to be replayed (any process's: the node's backlog)."""
        return len(self.journal.files())

    @staticmethod
    def _row(request_id: str, entry: LedgerEntry) -> dict[str, Any]:
        u = entry.usage
        return {
            "request_id": request_id,
            "created_at": to_epoch_micros(entry.created_at),
            "org_id": entry.org_id,
            "key_id": entry.key_id,
            "endpoint": entry.endpoint,
            "model": entry.model[:MODEL_MAX],
            "canonical_model": entry.canonical_model,
            "deployment": entry.deployment,
            "input_tokens": u.input_tokens,
            "cache_write_tokens": u.cache_write_tokens,
            "cache_read_tokens": u.cache_read_tokens,
            "output_tokens": u.output_tokens,
            "reasoning_tokens": u.reasoning_tokens,
            "cost_micros": entry.cost_micros,
            "status": entry.status,
            "estimated": entry.estimated,
        }

    def sweep_stale(self, older_than: timedelta, now: datetime) -> int:
        """Release reservations made before ``now - older_than`` (their worker crashed);
        returns how many. A late ``settle`` of a swept request still debits its cost."""
        return self._write(sweep_tx, to_epoch_micros(now - older_than))

    # ------------------------------------------------------------ refusals (402)

    @staticmethod
    def _org_refusal(conn: Connection, ctx: AuthContext, amount: int) -> InsufficientQuotaError:
        row = conn.execute(_ORG_FUNDS, {"b_org": ctx.org_id}).first()
        if row is None:
            return InsufficientQuotaError(f"The organization '{ctx.org_name}' has no balance.")
        available = row.balance_micros - row.reserved_micros
        return InsufficientQuotaError(
            f"Insufficient balance: this request may cost up to {_usd(amount)} (its input plus max_tokens "
            f"of output), but the organization '{row.name}' has {_usd(max(available, 0))} available "
            f"({_usd(row.balance_micros)} balance, {_usd(row.reserved_micros)} held by requests in flight). "
            "Ask your administrator to top up the balance, or lower max_tokens."
        )

    @staticmethod
    def _key_refusal(conn: Connection, ctx: AuthContext, amount: int) -> InsufficientQuotaError:
        row = conn.execute(_KEY_FUNDS, {"b_key": ctx.key_id}).first()
        if row is None or row.spend_limit_micros is None:
            return InsufficientQuotaError("This API key can't be charged.")
        left = row.spend_limit_micros - row.spent_micros - row.reserved_micros
        return InsufficientQuotaError(
            f"This API key has reached its spend limit: this request may cost up to {_usd(amount)} (its input "
            f"plus max_tokens of output), but key {row.public_id} has {_usd(max(left, 0))} left of its "
            f"{_usd(row.spend_limit_micros)} limit ({_usd(row.spent_micros)} spent, "
            f"{_usd(row.reserved_micros)} held by requests in flight). "
            "Ask your administrator to raise the key's spend limit (ezat-compat keys update), or lower max_tokens."
        )

    # ------------------------------------------------------------ reports (`ezat-compat usage`)

    def usage_rows(
        self, org: str | None = None, key_public_id: str | None = None, since: datetime | None = None
    ) -> list[dict[str, Any]]:
        """One dict per request, oldest first, with the fields of ``usage --json`` (an operator interface contract).

        Filters by organisation name, key public id (``key_…``) and/or a start time (aware
        datetime, inclusive). ``StoreError`` names an unknown org or key.
        """
        with self._engine.connect() as conn:
            query = self._filtered(conn, _ROWS, org, key_public_id, since)
            return [
                {
                    "request_id": r.request_id,
                    "created_at": iso(r.created_at),
                    "org": r.org,
                    "key_id": r.key_id,
                    "endpoint": r.endpoint,
                    "model": r.model,
                    "canonical_model": r.canonical_model,
                    "deployment": r.deployment,
                    **{name: r._mapping[name] for name in _TOKENS},
                    "cost_usd": micros_to_usd(r.cost_micros),
                    "status": r.status,
                    "estimated": bool(r.estimated),
                }
                for r in conn.execute(query)
            ]

    def usage_summary(
        self, org: str | None = None, key_public_id: str | None = None, since: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Totals per (org, key, canonical model): ``org``, ``key_id``, ``model``, ``requests``,
        the five token sums and ``cost_usd``; the same filters as ``usage_rows``."""
        with self._engine.connect() as conn:
            query = self._filtered(conn, _SUMMARY, org, key_public_id, since)
            return [
                {
                    "org": r.org,
                    "key_id": r.key_id,
                    "model": r.model,
                    "requests": int(r.requests),
                    **{name: int(r._mapping[name] or 0) for name in _TOKENS},
                    "cost_usd": micros_to_usd(int(r.cost_micros or 0)),
                }
                for r in conn.execute(query)
            ]

    @staticmethod
    def _filtered(
        conn: Connection, query: Select[Any], org: str | None, key_public_id: str | None, since: datetime | None
    ) -> Select[Any]:
        if org is not None:
            org_id = conn.execute(select(orgs.c.id).where(orgs.c.name == org)).scalar()
            if org_id is None:
                raise StoreError(f"There is no organization named {org!r}.")
            query = query.where(ledger.c.org_id == org_id)
        if key_public_id is not None:
            key_id = conn.execute(select(api_keys.c.id).where(api_keys.c.public_id == key_public_id)).scalar()
            if key_id is None:
                raise StoreError(f"There is no key {key_public_id!r}; `keys list` shows the ids (key_…).")
            query = query.where(ledger.c.key_id == key_id)
        if since is not None:
            query = query.where(ledger.c.created_at >= since)
        return query
