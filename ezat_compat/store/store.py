"""The process's store: every database handle of the process, opened in one place.

``open_store`` is the one function that opens them: the SQLAlchemy engine, the hot path on it
(``hotpath.make_hot_path``: one SQLite connection per process, or the engine's pool), the
rate-limit counters (``counters.Counters``: Redis, or their SQLite file) and every repository
built on them — accounts, the ledger and its usage journal, the stored responses, the message
threads, the thinking stash, the console's sessions. The composition root (``app.create_app``), the CLI, the demo and
the gunicorn hooks each open one and ``close()`` it; nothing else opens a connection, so two
handles on one SQLite file (the lost-rows class of defect) can't be made by accident.

Three kinds, by what the caller needs:

- ``open_store(url, config=config)``: the gateway's (a worker's): everything.
- ``open_store(url)``: the operator's commands: accounts and the ledger on a schema that must be
  this release's (one line saying what to run otherwise; they never migrate).
- ``open_store(url, config=config, pool_size=1)``: the gunicorn master's short visits (sweeps
  and releases of dead workers' holds): accounts and the ledger with the data folder's journal.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from sqlalchemy import Engine

from ezat_compat.datafiles import data_folder
from ezat_compat.domain import Config
from ezat_compat.periods import time_zone
from ezat_compat.store.accounts import Accounts
from ezat_compat.store.admin import AdminStore
from ezat_compat.store.console import ConsoleStore
from ezat_compat.store.counters import Counters
from ezat_compat.store.db import make_engine, open_engine, probe_url, require_current_schema
from ezat_compat.store.device import DeviceStore
from ezat_compat.store.hotpath import HotPath, make_hot_path
from ezat_compat.store.ledger import Ledger
from ezat_compat.store.people import People
from ezat_compat.store.quota import quota_of
from ezat_compat.store.responses import DAY_S, ResponseStore
from ezat_compat.store.rollup import Rollup
from ezat_compat.store.spend import SpendLimits
from ezat_compat.store.thinking import ThinkingStash, make_thinking_stash
from ezat_compat.store.threads import ThreadStore


def embedded_limits_path(database_url: str, data_dir: str) -> str:
    """Where the embedded (no Redis) rate-limit counters live: in the data folder, one file per
    database (never beside a database elsewhere, nor at a predictable name in a shared /tmp)."""
    digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
    return os.path.join(os.path.abspath(data_dir), f"limits-{digest}.db")


@dataclass(slots=True)
class Store:
    """Every database handle of the process (module docstring). The gateway's parts
    (``counters``, ``thinking``, ``responses``, ``threads``) are None in the other kinds;
    ``responses`` and ``threads`` are None too when ``[responses] store = false``."""

    engine: Engine
    hot: HotPath
    accounts: Accounts
    ledger: Ledger
    admin: AdminStore | None = None  # admin keys and the audit trail (every kind of store has it)
    spend: SpendLimits | None = None  # spend limits by period, the ledger's (every kind of store has it)
    rollup: Rollup | None = None  # the usage reports' rollup (every kind; its fold loop runs in workers)
    console: ConsoleStore | None = None  # the web console's sessions and break-glass links (every kind)
    people: People | None = None  # people and the IdP's groups (every kind)
    device: DeviceStore | None = None  # command-line sign-ins: device grants and their sessions (every kind)
    counters: Counters | None = None
    thinking: ThinkingStash | None = None
    responses: ResponseStore | None = None
    threads: ThreadStore | None = None
    _probe: Engine | None = field(default=None, repr=False)

    def probe_engine(self) -> Engine:
        """An engine of its own for the readiness probe (PostgreSQL): one connection whose waits
        are the probe's, never queued behind the requests' pool."""
        if self._probe is None:
            url = self.engine.url.render_as_string(hide_password=False)
            self._probe = make_engine(probe_url(url), pool_size=1, max_overflow=0)
        return self._probe

    def close(self) -> None:
        """Close every handle (idempotent): the hot path's connection, the counters, the engines."""
        self.hot.close()
        if self.counters is not None:
            self.counters.close()
        if self._probe is not None:
            self._probe.dispose()
            self._probe = None
        self.engine.dispose()


def open_store(database_url: str, *, config: Config | None = None, pool_size: int | None = None) -> Store:
    """Open the process's store on ``database_url`` (module docstring: which kind is which).

    Raises ``db.DatabaseUnavailable`` or ``db.SchemaError`` (one line each) for the operator's
    kind (no ``config``), whose schema must be this release's."""
    if config is None:
        engine = open_engine(database_url)
        try:
            require_current_schema(engine)
        except BaseException:
            engine.dispose()
            raise
    elif pool_size is not None:
        engine = make_engine(database_url, pool_size=pool_size, max_overflow=0)
    else:
        engine = make_engine(database_url)
    hot = make_hot_path(engine)
    folder = data_folder(config) if config is not None else None
    # Periods in the configured zone (the operator's kind, without a config: UTC; it only reads
    # the periods' spend, whose bounds are stored, and sets limits).
    spend = SpendLimits(engine, zone=time_zone(config.spend.time_zone)) if config is not None else SpendLimits(engine)
    store = Store(engine, hot, Accounts(engine, hot), Ledger(engine, hot, data_dir=folder, spend=spend))
    store.spend = spend
    store.admin = AdminStore(engine, hot)
    store.console = ConsoleStore(engine)
    default_org = config.identity.default_org if config is not None else ""
    store.people = People(engine, store.accounts, spend, default_org=default_org)
    store.device = DeviceStore(engine)
    if config is not None and pool_size is None:  # a worker: keys' last use written in the background
        store.accounts.last_used.background = True
    store.rollup = Rollup(engine)
    if config is None or pool_size is not None:
        return store
    gw = config.gateway
    assert folder is not None
    store.counters = Counters(gw.redis_url or None, embedded_limits_path(gw.database_url, folder))
    store.thinking = make_thinking_stash(engine, gw.redis_url, gw.thinking_ttl_s)
    settings = config.responses
    if settings.store:
        # Puts ride with the ledger's rows on the hot path; a continue reads back at most twice
        # what one request may carry.
        ttl_s = settings.ttl_days * DAY_S
        chain = 2 * config.max_body_bytes
        store.responses = ResponseStore(engine, ttl_s, hot=hot, quota=quota_of(settings), max_chain_bytes=chain)
        store.threads = ThreadStore(engine, ttl_s, hot=hot, quota=quota_of(settings), max_chain_bytes=chain)
    return store
