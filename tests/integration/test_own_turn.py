"""``cooperative.tools().own_turn()`` under gevent, as a worker runs: forty heavy steps woken
together (forty requests that arrived in one turn of the loop) leave another greenlet's timer on
time when each runs in a turn of its own, and hold it for the whole burst when they don't (the
case that shows the test can fail). Each case runs in a child process with gevent's patches
(the test process has none); the steps are busy for a wall-clock time, so the figures don't
depend on the machine's speed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
from gevent import monkey; monkey.patch_all()
import contextlib, time, gevent
from ezat_compat.cooperative import tools

STEP_S, STEPS, TICK_S = 0.02, 40, 0.05
turn = tools().own_turn if {own} else contextlib.nullcontext
ticks = []

def ticker():
    while True:
        ticks.append(time.monotonic())
        gevent.sleep(TICK_S)

def heavy():
    with turn():
        until = time.monotonic() + STEP_S
        while time.monotonic() < until:
            pass

gevent.spawn(ticker)
gevent.sleep(0.2)
started = time.monotonic()
gevent.joinall([gevent.spawn(heavy) for _ in range(STEPS)])
took = time.monotonic() - started
stamps = [started] + [t for t in ticks if t >= started] + [time.monotonic()]
print(max(b - a for a, b in zip(stamps, stamps[1:])), took)
"""


def largest_gap(own: bool) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.replace("{own}", str(own)))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    gap, took = done.stdout.split()
    return float(gap), float(took)


@pytest.mark.parametrize("own", [True, False], ids=["own-turns", "together"])
def test_a_burst_of_heavy_steps_leaves_a_timer_on_time_only_in_turns_of_their_own(own: bool) -> None:
    gap, took = largest_gap(own)
    assert took >= 0.8  # forty steps of 20 ms, one at a time either way
    if own:
        assert gap < 0.4, f"the timer waited {gap:.2f} s during a {took:.2f} s burst"  # a tick, a step or two
    else:
        assert gap > took * 0.9, (gap, took)  # woken together, they ran before the loop's timers
