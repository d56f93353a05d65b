"""The servers a benchmark run starts, each its own process group, all stopped on the way out.

``Fleet`` is a context manager: every process it starts (simulator, gateway under gunicorn, the
stack floor under gunicorn, LiteLLM's proxy, the slow image server, load generators) is stopped
when the block ends, whether it ends normally, by an exception or by Ctrl-C/SIGTERM (SIGTERM to
the group, then SIGKILL after a grace period). Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import litellm_env
import procstats

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
MODEL = "claude-sonnet-5-5"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 10.0
) -> tuple[int, bytes]:
    """One plain HTTP call (no proxies); returns (status, body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with _NO_PROXY.open(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Fleet:
    """Starts and always stops the run's processes; ``workdir`` holds their logs and files."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []
        self._old_term: Any = None

    def __enter__(self) -> Fleet:
        self._old_term = signal.signal(signal.SIGTERM, _raise_exit)
        return self

    def __exit__(self, *exc: object) -> None:
        # A second Ctrl-C or SIGTERM must not cut the clean-up short: hold them until it is done.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self.stop_all()
        finally:
            signal.signal(signal.SIGTERM, self._old_term)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> Proc:
        """Start ``argv`` in its own session, output to ``workdir/<name>.log``."""
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def track(self, name: str, popen: subprocess.Popen[Any]) -> Proc:
        """Also stop ``popen`` (started elsewhere in its own session) at the end."""
        proc = Proc(name, popen, self.workdir / f"{name}.log")
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc, grace_s: float = 10.0) -> None:
        if proc.alive():
            _signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=grace_s)
        _signal_group(proc.pid, signal.SIGKILL)  # stragglers of the group (workers, children)
        if proc.alive():
            proc.popen.wait(timeout=5)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            try:
                self.stop(proc)
            except BaseException as exc:  # keep stopping the others
                print(f"bench: could not stop {proc.name} (pid {proc.pid}): {exc}", file=sys.stderr)

    # ------------------------------------------------------------ the servers

    def start_sim(self) -> tuple[Proc, str]:
        """The simulator in its fast mode (no delay, no stall unless a request asks)."""
        proc = self.spawn(
            "sim", [sys.executable, "-m", "ezat_compat.sim", "--bind", "127.0.0.1:0", "--name", "bench-sim"], cwd=REPO
        )
        url = _announced(proc, "ezat-sim listening on ")
        wait_healthy(url + "/healthz", proc)
        return proc, url

    def start_images(self, delay_s: float) -> tuple[Proc, str]:
        proc = self.spawn(
            "images", [sys.executable, str(BENCH / "slow_images.py"), "--bind", "127.0.0.1:0", "--delay", str(delay_s)]
        )
        url = _announced(proc, "slow-images listening on ")
        wait_healthy(url + "/stats", proc)
        return proc, url

    def start_gateway(self, name: str, sim_url: str, *, workers: int, keepalive_s: float) -> Gateway:
        """Our gateway under gunicorn (gevent workers), SQLite ledger, an org and a key with
        rpm/tpm set (so the limiter runs on every request)."""
        root = self.workdir / name
        root.mkdir(parents=True, exist_ok=True)
        config = root / "ezat.toml"
        config.write_text(gateway_toml(root / "ezat.db", sim_url, workers=workers, keepalive_s=keepalive_s))
        port = free_port()
        env = {
            **os.environ,
            "EZAT_CONFIG": str(config),
            "EZAT_BIND": f"127.0.0.1:{port}",
            "EZAT_ADMIN_BIND": "",  # no admin listener: many gateways run at once
            "EZAT_WORKERS": str(workers),
            "ANTHROPIC_API_KEY": litellm_env.UPSTREAM_KEY,
        }
        for var in ("PROMETHEUS_MULTIPROC_DIR", "EZAT_DATABASE_URL", "EZAT_REDIS_URL", "EZAT_ACCESS_LOG"):
            env.pop(var, None)
        proc = self.spawn(
            name,
            [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py"), "wsgi:app"],
            env=env,
            cwd=REPO,
        )
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url + "/healthz", proc, timeout_s=60)
        gateway = Gateway(proc=proc, url=url, config=config, workers=workers, keepalive_s=keepalive_s)
        gateway.wait_workers()
        gateway.key = gateway.new_key()
        return gateway

    def start_floor(
        self,
        gateway: Gateway,
        sim_url: str,
        bodies: Path,
        *,
        app: str = "floor_app:app",
        env: dict[str, str] | None = None,
    ) -> tuple[Proc, str]:
        """The stack floor (``floor_app.py``; or ``app``, a floor with more work, with ``env``
        added) under gunicorn with ``gateway``'s config, so its worker settings and worker count
        are the gateway's; ``bodies`` is its body table."""
        port = free_port()
        environment = {
            **os.environ,
            "EZAT_CONFIG": str(gateway.config),
            "FLOOR_BIND": f"127.0.0.1:{port}",
            "FLOOR_WORKERS": str(gateway.workers),
            "FLOOR_UPSTREAM": sim_url,
            "FLOOR_BODIES": str(bodies),
            "FLOOR_API_KEY": litellm_env.UPSTREAM_KEY,
            **(env or {}),
        }
        proc = self.spawn(
            app.split(":")[0].removesuffix("_app"),
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                str(BENCH / "floor_gunicorn.py"),
                "--pythonpath",
                str(BENCH),
                app,
            ],
            env=environment,
            cwd=REPO,
        )
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url + "/healthz", proc, timeout_s=60)
        deadline = time.monotonic() + 30
        while len(procstats.children(proc.pid)) != gateway.workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the floor's gunicorn did not start {gateway.workers} worker(s)")
            time.sleep(0.05)
        return proc, url

    def start_litellm(self, sim_url: str, *, workers: int, image_hosts: tuple[str, ...] = ()) -> tuple[Proc, str]:
        """LiteLLM's proxy from its cached venv, routing ``anthropic/MODEL`` to the simulator."""
        cache = REPO / ".bench-cache"
        config = self.workdir / "litellm.yaml"
        config.write_text(litellm_env.config_yaml(MODEL, sim_url, image_hosts))
        port = free_port()
        argv = [
            str(litellm_env.executable(cache)),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            str(workers),
        ]
        proc = self.spawn("litellm", argv, env=litellm_env.environment(), cwd=self.workdir)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url + "/health/liveliness", proc, timeout_s=180)
        return proc, url


@dataclass
class Gateway:
    proc: Proc
    url: str
    config: Path
    workers: int
    keepalive_s: float
    key: str = ""

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "ezat_compat.cli", "--config", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ezat-compat {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def new_key(self) -> str:
        self.cli("orgs", "create", "bench", "--balance", "1000000")
        return (
            self.cli(
                "keys", "create", "--org", "bench", "--name", "bench", "--rpm", "100000000", "--tpm", "100000000000"
            )
            .strip()
            .splitlines()[-1]
        )

    def unlimited_key(self) -> str:
        """Another key of the bench org (``new_key`` made it), without rpm and tpm: the work of
        the card's least work, which has no rate limits."""
        return self.cli("keys", "create", "--org", "bench", "--name", "bench-unlimited").strip().splitlines()[-1]

    def worker_pids(self) -> list[int]:
        return procstats.children(self.proc.pid)

    def wait_workers(self, timeout_s: float = 30) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.worker_pids()
            if len(pids) == self.workers:
                return pids
            time.sleep(0.05)
        raise RuntimeError(f"gunicorn did not start {self.workers} worker(s)")


def gateway_toml(db: Path, sim_url: str, *, workers: int, keepalive_s: float) -> str:
    return f"""[gateway]
database_url = "sqlite:///{db.as_posix()}"
keepalive_s = {keepalive_s}
allow_private_image_hosts = true

[server]
workers = {workers}
log_level = "warning"

[[models]]
id = "anthropic/{MODEL}"
aliases = ["{MODEL}"]
price = {{ input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }}

[[models.deployments]]
name = "bench-sim"
base_url = "{sim_url}"
upstream_model = "{MODEL}"
proxy = ""  # the simulator is on loopback: never through the machine's proxy
"""


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _announced(proc: Proc, prefix: str, timeout_s: float = 30) -> str:
    """The URL a server printed as ``<prefix>http://HOST:PORT`` in its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in proc.log_tail(50).splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with status {proc.popen.returncode}:\n{proc.log_tail()}")
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name} did not announce its address in {timeout_s} s")


def wait_healthy(url: str, proc: Proc, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with status {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            if http("GET", url, timeout_s=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} was not healthy at {url} within {timeout_s} s:\n{proc.log_tail()}")
