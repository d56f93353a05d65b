"""The proxy recipes of docs/operations.md (deploy/nginx.conf, deploy/haproxy.cfg) run for real in
front of a gateway: ``start_proxy`` starts nginx or HAProxy on a free loopback port with its
recipe word for word (only its listen port and upstream replaced, wrapped in the settings
Debian's own main files have). Outside CI a test skips when the program is not installed; under
CI=true it fails (``.ci/run`` installs both)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from tests.conftest import IN_CI, free_port
from tests.integration.harness import REPO, listening_ports

RECIPE_UPSTREAM = "127.0.0.1:8080"  # the gateway's address in both recipes

# What Debian's /etc/nginx/nginx.conf puts around conf.d/*.conf (paths moved to the test's folder).
NGINX_MAIN = """
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
events {{ worker_connections 768; }}
http {{
    sendfile on;
    tcp_nopush on;
    types_hash_max_size 2048;
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log {dir}/access.log;
    gzip on;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{recipe}
}}
"""

# Debian's /etc/haproxy/haproxy.cfg global and defaults (its 50 s timeouts included: the recipe
# must override them), without the chroot, socket and errorfile lines a test can't use.
HAPROXY_MAIN = """
global
    maxconn 4096

defaults
    log global
    mode http
    option httplog
    option dontlognull
    timeout connect 5000
    timeout client 50000
    timeout server 50000

{recipe}
"""


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the recipe should contain {old!r} once"
    return text.replace(old, new)


def nginx_config(directory: Path, port: int, upstream: str, health_path: str) -> str:
    recipe = (REPO / "deploy" / "nginx.conf").read_text()
    recipe = _replace_once(recipe, "listen 80;", f"listen 127.0.0.1:{port};")
    recipe = _replace_once(recipe, f"server {RECIPE_UPSTREAM} ", f"server {upstream} ")
    return NGINX_MAIN.format(dir=directory, recipe=recipe)


def haproxy_config(port: int, upstream: str, health_path: str) -> str:
    recipe = (REPO / "deploy" / "haproxy.cfg").read_text()
    recipe = _replace_once(recipe, "bind :80", f"bind 127.0.0.1:{port}")
    recipe = _replace_once(recipe, f"server ezat1 {RECIPE_UPSTREAM}", f"server ezat1 {upstream}")
    recipe = _replace_once(recipe, "option httpchk GET /readyz", f"option httpchk GET {health_path}")
    return HAPROXY_MAIN.format(recipe=recipe)


def require_program(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")
    if path:
        return path
    reason = f"{name} is not installed (Debian: apt-get install {name})"
    if IN_CI:
        pytest.fail(f"{reason}, and CI=true requires it (.ci/run installs it)")
    pytest.skip(f"{reason}; these tests run the real {name} in CI")


@dataclass
class Proxy:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    directory: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown for both programs
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_proxy(name: str, root: Path, gateway_url: str, health_path: str) -> Proxy:
    """The proxy on a free loopback port, with its recipe; retried on another port if the one
    chosen was taken meanwhile."""
    program = require_program(name)
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    upstream = urlparse(gateway_url).netloc
    for _attempt in range(3):
        port = free_port()
        config = directory / ("nginx.conf" if name == "nginx" else "haproxy.cfg")
        if name == "nginx":
            config.write_text(nginx_config(directory, port, upstream, health_path))
            command = [program, "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(config)]
        else:
            config.write_text(haproxy_config(port, upstream, health_path))
            command = [program, "-db", "-f", str(config)]
        check = subprocess.run(
            [*command, "-t"] if name == "nginx" else [program, "-c", "-f", str(config)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert check.returncode == 0, f"{name} refuses the recipe: {check.stderr}{check.stdout}"
        log = (directory / "stderr.log").open("ab")
        proc = subprocess.Popen(command, stdout=log, stderr=log)
        log.close()
        proxy = Proxy(name, f"http://127.0.0.1:{port}", proc, directory)
        if wait_proxied(proxy) and port in listening_ports(proc.pid):
            return proxy
        proxy.stop()
    raise RuntimeError(f"{name} did not start; see {directory / 'stderr.log'}")


def wait_proxied(proxy: Proxy, timeout_s: float = 20) -> bool:
    """Whether the gateway answers ``/healthz`` through ``proxy`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proxy.proc.poll() is None:
        try:
            if requests.get(proxy.url + "/healthz", timeout=2).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.1)
    return False
