"""Log files as operators keep them: logrotate's ``create`` and ``postrotate kill -USR1``
(gunicorn's convention, deploy/logrotate.conf) under load, through real gunicorn with 2
workers. No request's line is lost, none is written twice, and once the signal is handled
(the master's, then the workers') every new line goes to the new file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from tests.conftest import IN_CI
from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration

RATE_PER_S = 50
REOPEN_TIMEOUT_S = 15.0  # a generous bound on the signal's trip (master, then workers) on a busy machine


def _logrotate() -> str:
    found = shutil.which("logrotate", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        if IN_CI:
            pytest.fail("logrotate is missing: .ci/run installs the Debian package logrotate")
        pytest.skip("logrotate is not installed (Debian package logrotate; .ci/run installs it under CI=true)")
    return found


def _holders(master: int, path: Path) -> list[int]:
    """The processes of the gunicorn tree (the master and its children) with ``path`` open."""
    pids = [master]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rpartition(")")[2].split()[1] == str(master):
                    pids.append(int(entry.name))
            except OSError:
                continue
    holding = []
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        if str(path) in links:
            holding.append(pid)
    return holding


def _ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line)["request_id"])
    return out


class Load:
    """GET /api/models at ``RATE_PER_S`` from 4 threads: each request's id and when it was sent."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[tuple[float, str]] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(4)]

    def run(self, n: int) -> None:
        session = requests.Session()
        period = 4 / RATE_PER_S
        next_at = time.monotonic() + n * period / 4
        while not self.stop.is_set():
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
            at = time.monotonic()
            try:
                resp = session.get(self.url + "/api/models", timeout=10)
            except requests.RequestException as exc:
                self.failures.append(repr(exc))
                continue
            if resp.status_code != 200:
                self.failures.append(str(resp.status_code))
            with self.lock:
                self.sent.append((at, resp.headers["request-id"]))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=20)


def test_logrotate_create_and_usr1_under_load_lose_and_misplace_no_line(tmp_path: Path) -> None:
    logrotate = _logrotate()
    sim = Sim(name="rot").start()
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    access, errors, pidfile = logs / "access.log", logs / "error.log", tmp_path / "gunicorn.pid"
    gw = Gateway(
        root=tmp_path / "gw",
        models=[ModelSpec(deployments=[{"name": "sim-a", "base_url": sim.url}])],
        workers=2,
        server_settings={
            "access_log": str(access),
            "error_log": str(errors),
            "pidfile": str(pidfile),
            "log_level": "info",
        },
    )
    conf = tmp_path / "logrotate.conf"
    # deploy/logrotate.conf's rules, with this test's paths and the current user (create's owner).
    conf.write_text(
        f"{access} {errors} {{\n    rotate 5\n    missingok\n    create 0640\n    sharedscripts\n"
        f'    postrotate\n        kill -USR1 "$(cat {pidfile})"\n    endscript\n}}\n'
    )
    try:
        gw.start()
        with Load(gw.url) as load:
            time.sleep(2.0)
            done = subprocess.run(
                [logrotate, "--force", "--state", str(tmp_path / "state"), str(conf)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert gw.proc is not None
            rotated = [logs / "access.log.1", logs / "error.log.1"]
            # Rotation is complete when no process of the tree holds a rotated file any more.
            deadline = time.monotonic() + REOPEN_TIMEOUT_S
            while any(_holders(gw.proc.pid, path) for path in rotated):
                assert time.monotonic() < deadline, "the rotated files are still open after the signal"
                time.sleep(0.02)
            reopened_at = time.monotonic()
            assert _holders(gw.proc.pid, access)  # … and the new one is open
            time.sleep(2.5)
        gw.proc.send_signal(signal.SIGTTOU)  # one worker less: a line of the master and one of a worker
        time.sleep(2.0)
    finally:
        gw.stop()
        sim.stop()
    assert not load.failures, load.failures[:5]
    old, new = _ids(logs / "access.log.1"), _ids(access)
    sent = [rid for _, rid in load.sent]
    assert len(sent) >= RATE_PER_S * 3  # the load really ran (~50 requests/s for 4.5 s and more)
    seen = Counter(old + new)
    assert not [rid for rid in sent if seen[rid] != 1], "lost or doubled lines"
    assert old and new, "both files hold lines"
    late = {rid for at, rid in load.sent if at > reopened_at}
    assert late and not late & set(old), "lines written to the rotated file after the rotation"
    assert oct(access.stat().st_mode & 0o777) == "0o640"  # logrotate's create: the new file is used, not replaced
    # The error log: the master's and the workers' lines after the rotation are in the new file.
    new_errors = errors.read_text()
    assert "Handling signal: ttou" in new_errors  # the master's
    assert "Worker exiting" in new_errors  # a worker's
    assert "Handling signal: ttou" not in (logs / "error.log.1").read_text()
    assert not gw.log_text().strip()  # stderr: nothing, every line went to a file
