"""``ezat-compat`` run in the test's own process: ``ezat_compat.cli.main`` with its output
captured, as a ``subprocess.CompletedProcess``. For the commands tests run to set a gateway up
and to read what it recorded (an organisation, a key, ``usage --json``): the same code as the
program, without a Python start and its imports per command (about three quarters of a second
of CPU each, a thousand times a suite). The tests of the command itself (its exit statuses, its
output on a terminal, admin commands beside serving workers) run the program."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence

_ONE_AT_A_TIME = threading.Lock()  # sys.stdout, sys.stderr and the environment are the process's


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set in ``os.environ`` for the block, as the program would have inherited it."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_in_process(argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ezat-compat ARGV``'s exit status, standard output and standard error, as the program's
    (argparse's refusals included: its ``SystemExit``), with ``env`` added to the environment."""
    from ezat_compat.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _ONE_AT_A_TIME, _environment(env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["ezat-compat", *argv], status, out.getvalue(), err.getvalue())
