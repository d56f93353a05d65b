"""The admin listener at start-up under gunicorn: its address is checked like the main one (taken:
one line, exit 1), it may not share the main listener's port, and it is bound besides the main
one (``EZAT_ADMIN_BIND`` overriding ``[admin] bind``, "" for none)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port
from tests.integration.conftest import standard_models
from tests.integration.harness import ADMIN_BIND_ENV, REPO, Gateway, Sim, listening_ports

pytestmark = pytest.mark.integration


def _start(gateway: Gateway, main: str, admin: str) -> subprocess.CompletedProcess[str]:
    gateway.root.mkdir(parents=True, exist_ok=True)
    gateway.write_config()
    env = {**os.environ, "EZAT_CONFIG": str(gateway.config_path), "EZAT_BIND": main, ADMIN_BIND_ENV: admin}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py"), "wsgi:app"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def _lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("ezat-compat:")]


def test_an_admin_address_in_use_stops_the_start_in_one_line(tmp_path: Path, sim: Sim) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        done = _start(Gateway(root=tmp_path / "gw", models=standard_models(sim.url)), f"127.0.0.1:{free_port()}", taken)
    assert done.returncode == 1
    in_use = "the address is already in use (another server, or another ezat-compat?)"
    assert _lines(done) == [f"ezat-compat: cannot listen on {taken}: {in_use}"]


def test_the_admin_listener_may_not_share_the_main_port(tmp_path: Path, sim: Sim) -> None:
    port = free_port()
    done = _start(
        Gateway(root=tmp_path / "gw", models=standard_models(sim.url)), f"127.0.0.1:{port}", f"0.0.0.0:{port}"
    )
    assert done.returncode != 0
    (line,) = _lines(done)
    assert line.startswith(f"ezat-compat: cannot start: cannot listen on 0.0.0.0:{port} for the admin API")


def test_the_admin_listener_is_bound_besides_the_main_one(tmp_path: Path, sim: Sim) -> None:
    gateway = Gateway(root=tmp_path / "gw", models=standard_models(sim.url), admin=True).start()
    try:
        assert gateway.proc is not None
        admin_port = int(gateway.admin_url.rsplit(":", 1)[1])
        main_port = int(gateway.url.rsplit(":", 1)[1])
        assert {main_port, admin_port} <= listening_ports(gateway.proc.pid)
        assert requests.get(gateway.admin_url + "/healthz", timeout=10).status_code == 200
        assert requests.get(gateway.admin_url + "/readyz", timeout=10).status_code == 404
        assert requests.get(gateway.url + "/v1/organizations/me", timeout=10).status_code == 404
        assert requests.get(gateway.admin_url + "/v1/organizations/me", timeout=10).status_code == 401
    finally:
        gateway.stop()
    plain = Gateway(root=tmp_path / "plain", models=standard_models(sim.url)).start()  # EZAT_ADMIN_BIND=""
    try:
        assert plain.proc is not None and len(listening_ports(plain.proc.pid)) == 1
    finally:
        plain.stop()
