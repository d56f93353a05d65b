"""Real servers on loopback for integration tests: simulators and the gateway under gunicorn.

Everything runs as separate processes on free 127.0.0.1 ports, as in production: the
gateway with gevent workers and its SQLite ledger, the simulator as the upstream.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import requests

from ezat_compat.translate.cache_scope import SCOPE_PREFIX
from tests.conftest import free_port
from tests.support.cli import run_in_process

REPO = Path(__file__).resolve().parents[2]
ADMIN_BIND_ENV = "EZAT_ADMIN_BIND"
# Every gateway a test starts, whichever way, binds no admin listener unless it asks for one: the
# default [admin] bind (127.0.0.1:8081) would be taken by the first gateway of the run, and each
# other one would refuse to start. A ``Gateway(admin=True)`` gets a free port of its own.
os.environ.setdefault(ADMIN_BIND_ENV, "")


def _wait(url: str, proc: subprocess.Popen[Any], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with status {proc.returncode}")
        try:
            if requests.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not become healthy in {timeout_s} s")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports that process ``pid`` listens on (Linux ``/proc``)."""
    inodes = set()
    with suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def only_worker(gateway: Gateway) -> int:
    """The pid of a one-worker gateway's worker (gunicorn's master's only child)."""
    assert gateway.proc is not None
    out = subprocess.run(["pgrep", "-P", str(gateway.proc.pid)], capture_output=True, text=True, timeout=10).stdout
    (pid,) = [int(p) for p in out.split()]
    return pid


def rss_mb(pid: int) -> float:
    """A process's resident memory (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def unscoped(body: dict[str, Any]) -> dict[str, Any]:
    """An upstream body as translated: without the organisation's ``cache scope`` block, which
    the gateway puts first in every prompt the upstream can cache (``isolate_prompt_cache``, on
    by default; the harness's models cache from 16 tokens). A string system prompt is a list of
    one text block once scoped. Asserts that the scope was there."""
    system = body.get("system")
    assert isinstance(system, list) and system[0]["text"].startswith(SCOPE_PREFIX), system
    rest = {k: v for k, v in body.items() if k != "system"}
    return {**rest, "system": system[1:]} if system[1:] else rest


def _stop(proc: subprocess.Popen[Any], timeout_s: float = 10) -> None:
    """Quick shutdown (SIGINT): gunicorn's graceful SIGTERM would wait for the tests' idle
    keep-alive connections."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Sim:
    """One simulator process (``python -m ezat_compat.sim``)."""

    name: str = "sim"
    flags: Sequence[str] = ()
    url: str = ""
    proc: subprocess.Popen[str] | None = None

    def start(self) -> Sim:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ezat_compat.sim", "--bind", "127.0.0.1:0", "--name", self.name, *self.flags],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the simulator did not start: {line!r}")
        self.url = line.strip().rsplit("listening on ", 1)[1]
        _wait(self.url, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            if self.proc.stdout:
                self.proc.stdout.close()

    def requests(self) -> list[dict[str, Any]]:
        return requests.get(self.url + "/_sim/requests", timeout=5).json()["requests"]

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests() if r["path"] == "/v1/messages"]

    def clear(self) -> None:
        requests.delete(self.url + "/_sim/requests", timeout=5)
        requests.delete(self.url + "/_sim/stats", timeout=5)

    def stats(self) -> dict[str, int]:
        return requests.get(self.url + "/_sim/stats", timeout=5).json()


MODEL_TOML = """
[[models]]
id = "{id}"
aliases = {aliases}
context_window = 200000
max_output_tokens = {max_output_tokens}
sampling = {sampling}
thinking = "{thinking}"
efforts = {efforts}
forced_tool_choice = {forced_tool_choice}
prefill = {prefill}
min_cache_tokens = 16
price = {{ input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }}
"""

_DEPLOYMENT_KEYS = ("name", "base_url", "upstream_model", "priority", "weight")
DEPLOYMENT_TOML = """
[[models.deployments]]
name = "{name}"
base_url = "{base_url}"
upstream_model = "{upstream_model}"
priority = {priority}
weight = {weight}
"""


def _toml_value(value: Any) -> str:
    """A TOML value: JSON's form for scalars and lists, an inline table for a dict (a ``price``)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


@dataclass
class ModelSpec:
    id: str = "anthropic/claude-sonnet-5-5"
    aliases: Sequence[str] = ("claude-sonnet-5-5", "claude-sonnet-5.5")
    deployments: Sequence[dict[str, Any]] = ()
    max_output_tokens: int = 64000
    sampling: bool = False
    thinking: str = "adaptive"
    efforts: Sequence[str] = ("low", "medium", "high", "xhigh", "max")
    forced_tool_choice: bool = True
    prefill: bool = False

    def toml(self) -> str:
        text = MODEL_TOML.format(
            id=self.id,
            aliases=json.dumps(list(self.aliases)),
            max_output_tokens=self.max_output_tokens,
            sampling=str(self.sampling).lower(),
            thinking=self.thinking,
            efforts=json.dumps(list(self.efforts)),
            forced_tool_choice=str(self.forced_tool_choice).lower(),
            prefill=str(self.prefill).lower(),
        )
        for d in self.deployments:
            text += DEPLOYMENT_TOML.format(
                name=d["name"],
                base_url=d["base_url"],
                upstream_model=d.get("upstream_model", "claude-sonnet-5-5"),
                priority=d.get("priority", 0),
                weight=d.get("weight", 1),
            )
            extra = {k: v for k, v in d.items() if k not in _DEPLOYMENT_KEYS}  # proxy, ca_file, … as given
            text += "".join(f"{k} = {_toml_value(v)}\n" for k, v in extra.items())
        return text


@dataclass
class Gateway:
    """The gateway under gunicorn with gevent workers, its own data folder and config."""

    root: Path
    models: Sequence[ModelSpec]
    workers: int = 1
    gateway_settings: dict[str, Any] = field(default_factory=dict)
    server_settings: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    admin: bool = False  # serve the admin API on a listener of its own (``admin_url``)
    # ``cli`` runs the command in the test's process (tests/support/cli.py, with ``env``) unless
    # this is set: then as a program of its own, as an operator beside the gateway runs it.
    cli_as_program: bool = False
    url: str = ""
    admin_url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.root / "ezat.toml"

    @property
    def log_path(self) -> Path:
        """gunicorn's stderr (the gateway's log)."""
        return self.root / "gunicorn.log"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def write_config(self) -> None:
        settings = {
            "database_url": f"sqlite:///{(self.root / 'ezat.db').as_posix()}",
            "keepalive_s": 15,
            "allow_private_image_hosts": True,
            "cooldown_s": 30,
            **self.gateway_settings,
        }
        lines = ["[gateway]"] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
        server = {"workers": self.workers, "log_level": "warning", "timeout_s": 60, **self.server_settings}
        lines += ["", "[server]"] + [f"{k} = {json.dumps(v)}" for k, v in server.items()]
        self.config_path.write_text("\n".join(lines) + "\n" + "".join(m.toml() for m in self.models))

    def start(self) -> Gateway:
        """Start gunicorn on a free port; again on another one if the port turned out to be
        taken (another server answered the health check: only trust a port gunicorn holds)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_config()
        for _attempt in range(3):
            port = free_port()
            admin_port = free_port() if self.admin else 0
            env = {
                **os.environ,
                "EZAT_CONFIG": str(self.config_path),
                "EZAT_BIND": f"127.0.0.1:{port}",
                "EZAT_WORKERS": str(self.workers),
                "ANTHROPIC_API_KEY": "sk-ant-test",
                ADMIN_BIND_ENV: f"127.0.0.1:{admin_port}" if self.admin else "",
                **self.env,
            }
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            self.log = self.log_path.open("ab")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py"), "wsgi:app"],
                cwd=REPO,
                env=env,
                stderr=self.log,
            )
            self.url = f"http://127.0.0.1:{port}"
            self.admin_url = f"http://127.0.0.1:{admin_port}" if self.admin else ""
            _wait(self.url, self.proc, timeout_s=60)
            if {port, admin_port} - {0} <= listening_ports(self.proc.pid):
                return self
            self.stop()
        raise RuntimeError(f"gunicorn could not bind a free port; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, timeout_s=20)
        if self.log is not None:
            self.log.close()
            self.log = None

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``ezat-compat --config <this config> ARGS`` and return the finished process."""
        argv = ["--config", str(self.config_path), *args]
        if self.cli_as_program:
            result = subprocess.run(
                [sys.executable, "-m", "ezat_compat.cli", *argv],
                capture_output=True,
                text=True,
                env={**os.environ, **self.env},
                timeout=60,
            )
        else:
            result = run_in_process(argv, self.env)
        if check and result.returncode != 0:
            raise AssertionError(f"ezat-compat {' '.join(args)} failed: {result.stderr}")
        return result

    def new_key(self, org: str = "acme", *key_args: str, balance: str = "100") -> str:
        """A fresh key (the org is created with ``balance`` on first use)."""
        if self.cli("orgs", "create", org, "--balance", balance, check=False).returncode not in (0, 1):
            raise AssertionError("orgs create failed")
        return self.cli("keys", "create", "--org", org, *key_args).stdout.strip().splitlines()[-1]

    def usage(self, *args: str) -> list[dict[str, Any]]:
        return json.loads(self.cli("usage", "--json", *args).stdout)

    def new_admin_key(self, *args: str) -> str:
        """A fresh admin key (``admin-keys create ARGS``: ``--read-only``, ``--name``…)."""
        return self.cli("admin-keys", "create", *args).stdout.strip().splitlines()[-1]
