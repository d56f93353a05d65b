"""``ezat-compat serve``: gunicorn with gevent workers and the gateway's gunicorn settings, and
what the gunicorn master does for the operator (see ``gunicorn_conf.py``, which calls these):

- start-up that speaks plainly: ``check_bind`` and ``prepare_database`` raise ``StartupError``
  with one line (a bad bind, an unreachable database, an unsupported URL);
  ``deployment_warnings`` names each deployment whose upstream key variable is unset;
  ``unusable_models`` each model none of whose deployments has its key (``check-config`` fails);
- reload safety: the master holds the configuration its workers are built from
  (``served_config``); on SIGHUP ``reload_config`` validates the file first and, when it is bad,
  keeps the held one, so workers started by the reload serve the previous configuration and the
  master never exits on a typo. ``worker_app`` (``ezat_compat.server.wsgi``) builds each worker's app
  from the held configuration;
- ``process_title``: the name gunicorn shows in ``ps`` (``master [ezat-compat: …]``);
- ``tune_collector``: the cyclic garbage collector of a worker that has loaded its app.
"""

from __future__ import annotations

import errno
import gc
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ezat_compat.config import ConfigError, load_config, resolve_config_path
from ezat_compat.domain import Config, Deployment

if TYPE_CHECKING:
    pass


class StartupError(Exception):
    """The gateway can't start; the message is one line saying why."""


def one_line(message: str) -> str:
    """A message that may hold several problems (one per line), on one line."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


# ---------------------------------------------------------------- gunicorn command line


def gunicorn_argv(config: Config) -> list[str]:
    conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gunicorn_conf.py")
    return [sys.executable, "-m", "gunicorn", "-c", conf, "ezat_compat.server.wsgi:app"]


def serving_environment(config: Config, *, bind: str | None = None, workers: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["EZAT_CONFIG"] = os.path.abspath(config.path)
    if bind:
        env["EZAT_BIND"] = bind
    if workers:
        env["EZAT_WORKERS"] = str(workers)
    return env


def serve(config: Config, *, bind: str | None = None, workers: int | None = None) -> int:
    """Replace this process with the gunicorn master (signals then reach gunicorn directly, and
    its pid stays the one systemd started). The master checks the bind address and migrates the
    database before it listens and forks the workers."""
    check_bind(bind or config.server.bind)
    admin = admin_bind(config, bind or config.server.bind)
    if admin:
        check_bind(admin)
    argv = gunicorn_argv(config)
    os.execve(sys.executable, argv, serving_environment(config, bind=bind, workers=workers))
    return 0  # pragma: no cover - execve does not return


# ---------------------------------------------------------------- start-up checks


def parse_bind(bind: str) -> tuple[str, int] | None:
    """(host, port) of a TCP bind address as gunicorn reads it; None for ``unix:`` and ``fd://``."""
    if bind.startswith(("unix:", "fd://")):
        return None
    host, sep, port_text = bind.rpartition(":")
    if not sep:
        host, port_text = bind, "8000"  # gunicorn's default port
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise StartupError(f"cannot listen on {bind}: use HOST:PORT, e.g. 127.0.0.1:8080")
    return host or "0.0.0.0", int(port_text)


def check_bind(bind: str) -> None:
    """Raise ``StartupError`` (one line) unless a listener can be bound on ``bind`` now."""
    address = parse_bind(bind)
    if address is None:
        return
    host, port = address
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {bind}: unknown host {host!r} ({exc.strerror})") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            reason = {
                errno.EADDRINUSE: "the address is already in use (another server, or another ezat-compat?)",
                errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
                errno.EACCES: "permission denied (ports below 1024 need privileges)",
            }.get(exc.errno or 0, exc.strerror or str(exc))
            raise StartupError(f"cannot listen on {bind}: {reason}") from None


def admin_bind(config: Config, main_bind: str) -> str:
    """The admin listener's address, bound besides ``main_bind`` ("" when there is none):
    ``[admin] bind``, ``EZAT_ADMIN_BIND`` already applied by the loader. ``StartupError`` when it
    would share the main listener's port: the app tells the two apart by the port a request came
    in on, so the main listener would serve the admin API alone."""
    bind = config.admin.bind
    if not bind:
        return ""
    mine, main = parse_bind(bind), parse_bind(main_bind)
    if bind == main_bind or (mine is not None and main is not None and mine[1] == main[1]):
        raise StartupError(
            f"cannot listen on {bind} for the admin API: the main listener ({main_bind}) has that port; give "
            '[admin] bind (or EZAT_ADMIN_BIND) a port of its own, or "" for no admin listener'
        )
    return bind


def check_sealing_key(config: Config) -> None:
    """The sealing key loads (``EZAT_SEALING_KEY``, or the data folder's key file, made here once
    for every worker), when the prompt-cache scopes are keyed by it (``isolate_prompt_cache``):
    else a one-line ``StartupError`` saying what to fix."""
    if not config.gateway.isolate_prompt_cache:
        return
    from ezat_compat.datafiles import data_folder
    from ezat_compat.sealing import load_sealer

    try:
        load_sealer(data_folder(config))
    except (OSError, ValueError) as exc:
        raise StartupError(
            f"cannot load the sealing key, which keys each organisation's prompt-cache scope: {exc}; set "
            "EZAT_SEALING_KEY, make [gateway] data_dir writable, or set isolate_prompt_cache = false"
        ) from None


def prepare_database(config: Config) -> None:
    """Create or migrate the configured database, sweeping reservations left by a crash; one-line
    ``StartupError`` when it can't be reached, its URL is not supported or its schema is newer
    than this release knows."""
    from datetime import UTC, datetime

    from ezat_compat.datafiles import data_folder, private_dir
    from ezat_compat.store import db

    # The data folder is made 0700 when missing (the config reference says so; check-config judges
    # it by the nearest folder that exists). A SQLite database elsewhere needs its folder: a typo
    # in its path is one line, not a new tree.
    folder = data_folder(config)
    try:
        private_dir(folder)
    except OSError as exc:
        raise StartupError(f"cannot create the data folder {folder}: {exc.strerror or exc}") from None
    try:
        db.prepare_database(config.gateway.database_url)
    except (db.DatabaseUnavailable, db.SchemaError) as exc:
        raise StartupError(str(exc)) from None
    from ezat_compat.store.accounts import StoreError
    from ezat_compat.store.ledger import STALE_RESERVATION
    from ezat_compat.store.store import open_store

    store = open_store(config.gateway.database_url, config=config, pool_size=1)
    try:
        store.ledger.sweep_stale(STALE_RESERVATION, datetime.now(UTC))
        if store.people is not None:  # [identity.groups] as the file says now
            try:
                store.people.sync_config_groups(config.identity.groups)
            except StoreError as exc:
                raise StartupError(f"[identity.groups]: {exc}") from None
    finally:
        store.close()


def _unset_keys(deployments: Sequence[Deployment]) -> dict[str, list[str]]:
    """Each key variable that is unset or empty, with the deployments that read it, in the file's order."""
    unset: dict[str, list[str]] = {}
    for d in deployments:
        if d.needs_key and not d.api_key:  # a cloud's own credentials need no key variable
            unset.setdefault(d.api_key_env, []).append(d.name)
    return unset


def _either(names: Sequence[str]) -> str:
    """``A``, ``A or B``, ``A, B or C``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def deployment_warnings(config: Config) -> list[str]:
    """One line per deployment whose upstream key variable is unset or empty (routing skips it),
    saying so for the model when none of its deployments has its key (``unusable_models``)."""
    out = []
    for model in config.models:
        missing = [d for d in model.deployments if d.needs_key and not d.api_key]
        for d in missing:
            line = f"deployment {d.name} of model {model.id}: {d.api_key_env} is not set, so routing skips it"
            if len(missing) == len(model.deployments):
                variables = _either(list(_unset_keys(missing)))
                if len(model.deployments) == 1:
                    line += f"; {model.id} has no other deployment: its requests fail until {variables} is set"
                else:
                    line += (
                        f"; none of the {len(model.deployments)} deployments of {model.id} has its key: "
                        f"its requests fail until {variables} is set"
                    )
            out.append(line)
    return out


def unusable_models(config: Config) -> list[str]:
    """One line per model that no deployment can serve, because the key variable of each is unset
    or empty, naming the variables (``check-config`` fails with them: such a model answers every
    request 500)."""
    out = []
    for model in config.models:
        unset = _unset_keys(model.deployments)
        if model.deployments and sum(len(names) for names in unset.values()) == len(model.deployments):
            missing = ", ".join(
                f"{variable} (deployment{'s' if len(names) > 1 else ''} {', '.join(names)})"
                for variable, names in unset.items()
            )
            verb = "is" if len(unset) == 1 else "are"
            out.append(f"model {model.id} has no usable deployment: {missing} {verb} not set in the environment")
    return out


def process_title(config: Config, bind: str) -> str:
    """What names this instance in ``ps``: ``[server] name``, else the config file, else the bind."""
    return "ezat-compat: " + (config.server.name or (os.path.abspath(config.path) if config.path else bind))


# ---------------------------------------------------------------- the configuration the master holds

_served: Config | None = None


def served_config() -> Config | None:
    """The configuration the master holds (inherited by each forked worker); None outside gunicorn."""
    return _served


def hold(config: Config) -> None:
    global _served
    _served = config


def master_config() -> Config:
    """For ``gunicorn_conf.py``'s module level, which the master executes on start and again on
    every SIGHUP: the file's configuration, or on a reload with a bad file the held one (the
    error is logged by ``reload_config`` from the ``on_reload`` hook). A bad file at start
    prints one line and exits 1."""
    try:
        config = load_config(resolve_config_path(None))
    except ConfigError as exc:
        if _served is None:
            print(f"ezat-compat: {one_line(str(exc))}", file=sys.stderr)
            raise SystemExit(1) from None
        return _served
    if _served is None:
        hold(config)
    return config


def reload_config(log_error: Callable[[str], None], log_warning: Callable[[str], None]) -> bool:
    """On SIGHUP, before gunicorn starts new workers: load and validate the file again. Valid:
    hold it (the new workers serve it) and warn about its deployments; invalid: log one line
    and keep the held configuration (the workers keep serving the previous one). Returns
    whether the new file was taken."""
    path = resolve_config_path(None)
    try:
        config = load_config(path)
    except ConfigError as exc:
        log_error(
            f"configuration not reloaded: {one_line(str(exc))}; the workers keep serving the previous configuration"
        )
        return False
    hold(config)
    for line in deployment_warnings(config):
        log_warning(line)
    return True


# A worker's first generation, in objects (CPython's default is 700).
YOUNG_GENERATION = 10_000


def tune_collector() -> None:
    """The cyclic collector of a worker whose app is loaded (gunicorn's ``post_worker_init``).

    ``gc.freeze()``: the objects of the loaded app (modules, Flask, SQLAlchemy, the catalog:
    ~117,000) are set aside for good, so a full collection scans only what was made since; each
    scanned them all, 10-100 ms, several times a minute under load. A first generation of
    ``YOUNG_GENERATION`` objects: no request leaves a reference cycle
    (tests/unit/test_no_cycles.py), so what a young collection finds is the objects of the
    requests in flight, which it can only move to an older generation: ~14 times fewer of them.
    Measured in bench/RESULTS.md ("The cyclic collector; …")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])
