"""The admin listener's recipes (deploy/nginx-admin.conf, deploy/haproxy-admin.cfg) run for real in
front of a gateway's admin listener, word for word but for their listen address, upstream and
allowed network: the admin API answers through them, and the audit trail records the caller's
address from X-Forwarded-For; the listener serves nothing else. Outside CI a test skips when the
program is not installed."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port
from tests.integration.conftest import standard_models
from tests.integration.harness import REPO, Gateway, Sim, listening_ports
from tests.support.proxies import HAPROXY_MAIN, NGINX_MAIN, Proxy, require_program

pytestmark = pytest.mark.integration

CALLER = "203.0.113.9"  # the platform team's machine, as X-Forwarded-For names it


@pytest.fixture(scope="module")
def served(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = Gateway(root=tmp_path_factory.mktemp("admin-proxied"), models=standard_models(sim.url), admin=True)
    gateway.start()
    yield gateway
    gateway.stop()


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the recipe should contain {old!r} once"
    return text.replace(old, new)


def _admin_recipe(name: str, port: int, upstream: str) -> str:
    if name == "nginx":
        recipe = (REPO / "deploy" / "nginx-admin.conf").read_text()
        recipe = _replace_once(recipe, "listen 10.0.0.5:8081;", f"listen 127.0.0.1:{port};")
        recipe = _replace_once(recipe, "server 127.0.0.1:8081 ", f"server {upstream} ")
        return _replace_once(recipe, "allow 10.0.0.0/8;", "allow 127.0.0.1;")
    recipe = (REPO / "deploy" / "haproxy-admin.cfg").read_text()
    recipe = _replace_once(recipe, "bind 10.0.0.5:8081", f"bind 127.0.0.1:{port}")
    recipe = _replace_once(recipe, "server ezat1-admin 127.0.0.1:8081", f"server ezat1-admin {upstream}")
    return _replace_once(recipe, "src 10.0.0.0/8", "src 127.0.0.1")


def _start_admin_proxy(name: str, root: Path, upstream: str) -> Proxy:
    program = require_program(name)
    directory = root / f"{name}-admin"
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    recipe = _admin_recipe(name, port, upstream)
    if name == "nginx":
        config = directory / "nginx.conf"
        config.write_text(NGINX_MAIN.format(dir=directory, recipe=recipe))
        command = [program, "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(config)]
        check = [*command, "-t"]
    else:
        config = directory / "haproxy.cfg"
        config.write_text(HAPROXY_MAIN.format(recipe=recipe))
        command, check = [program, "-db", "-f", str(config)], [program, "-c", "-f", str(config)]
    checked = subprocess.run(check, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, f"{name} refuses the recipe: {checked.stderr}{checked.stdout}"
    log = (directory / "stderr.log").open("ab")
    proc = subprocess.Popen(command, stdout=log, stderr=log)
    log.close()
    proxy = Proxy(name, f"http://127.0.0.1:{port}", proc, directory)
    for _ in range(100):
        try:
            if requests.get(proxy.url + "/healthz", timeout=2).status_code == 200 and port in listening_ports(proc.pid):
                return proxy
        except requests.RequestException:
            pass
        time.sleep(0.1)
    proxy.stop()
    raise AssertionError(f"{name} did not start; see {directory / 'stderr.log'}")


@pytest.mark.parametrize("name", ["nginx", "haproxy"])
def test_the_admin_recipe_serves_the_admin_api_and_names_the_caller(served: Gateway, tmp_path: Path, name: str) -> None:
    admin_key = served.new_admin_key()
    proxy = _start_admin_proxy(name, tmp_path, served.admin_url.removeprefix("http://"))
    try:
        headers = {"x-api-key": admin_key, "X-Forwarded-For": CALLER}
        me = requests.get(proxy.url + "/v1/organizations/me", headers=headers, timeout=10)
        assert me.status_code == 200 and me.json()["type"] == "organization"
        made = requests.post(
            proxy.url + "/v1/organizations/workspaces", json={"name": f"via-{name}"}, headers=headers, timeout=10
        )
        assert made.status_code == 200, made.text
        trail = json.loads(served.cli("audit", "list", "--json").stdout)
        (entry,) = [e for e in trail if e["target"]["id"] == made.json()["id"]]
        assert entry["address"] == CALLER and entry["request_id"] == made.headers["request-id"]
        refused = requests.get(proxy.url + "/v1/messages", timeout=10)  # the admin listener serves nothing else
        assert refused.status_code == 404
    finally:
        proxy.stop()
