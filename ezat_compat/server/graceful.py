"""Reload and shutdown that keep streams: the gunicorn hooks' logic (``gunicorn_conf.py`` calls it).

- **SIGTERM to the master** (systemd stop, a deploy): the node first reports not-ready for
  ``[server] drain_s`` while it still serves (``/readyz`` answers 503 from the first second, so
  a load balancer stops sending), then stops accepting and lets open requests finish within
  ``[server] graceful_timeout_s``.
- **SIGHUP** (reload): new workers start with the new configuration while the old ones finish
  their requests within the same grace.
- **The grace runs out**: a worker ends each stream still open a few seconds before it is
  killed, with the dialect's error event (``data: {"error": …}`` then ``data: [DONE]`` for
  OpenAI clients) and settles it as a gateway failure — not billed, never recorded as the
  client's close — so no reservation is left and every request has its ledger row.

The drain is the flag of ``drain.py``: set in the master, every worker's ``/readyz`` sees it.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ezat_compat.errors import OverloadedError
from ezat_compat.server.drain import draining, start_draining

log = logging.getLogger("ezat_compat")
CUT_MARGIN_S = 3.0  # streams are ended this long before the grace runs out
SHUTTING_DOWN = "The gateway is restarting and ended this stream before its reply was complete; retry the request."


def _in_reload_wait(frame: FrameType | None) -> bool:
    """Whether the master was interrupted inside ``Arbiter.reload``'s wait for the old workers
    (gunicorn 27: after spawning the new workers, up to ``graceful_timeout``, while every
    signal that comes is only queued for the main loop). Read from the interrupted frames:
    the reload's own frame, past the point where it set its ``deadline``."""
    arbiter: Any = importlib.import_module("gunicorn.arbiter")  # untyped
    reload_code = arbiter.Arbiter.reload.__code__
    while frame is not None:
        if frame.f_code is reload_code:
            return "deadline" in frame.f_locals
        frame = frame.f_back
    return False


def _stop_now_if_reloading(frame: FrameType | None) -> None:
    """After gunicorn's handler queued a SIGTERM: when the master is in a reload's wait, the
    queue would be read only once the old workers are gone (their streams may last the whole
    grace, while the listeners stay open and new streams come). Leave the wait the way
    gunicorn's own ``handle_term`` leaves its loop — ``StopIteration``, which the main loop
    turns into its graceful stop (listeners closed, every worker told to finish within the
    grace) — so the worst-case stop is the drain plus one grace (``TimeoutStopSec``)."""
    if _in_reload_wait(frame):
        log.warning("SIGTERM during a reload: stopping now, not when the reload's old workers are done")
        raise StopIteration


def drain_then_stop(drain_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """For gunicorn's ``when_ready`` hook (gunicorn's own signal handlers are set by then): the
    master's first SIGTERM makes the node not-ready for ``drain_s`` while it still serves, then
    goes to gunicorn's own SIGTERM handler (its graceful stop: listeners closed, workers told
    to finish). The master's loop runs on meanwhile (the drain waits on a thread of its own);
    a SIGTERM during the drain, or once draining, stops at once — also while a reload waits for
    its old workers (``_stop_now_if_reloading``)."""
    gunicorns = signal.getsignal(signal.SIGTERM)
    if not callable(gunicorns):
        return
    if drain_s <= 0:

        def on_term_now(sig: int, frame: Any) -> None:
            start_draining()
            gunicorns(sig, frame)
            _stop_now_if_reloading(frame)

        signal.signal(signal.SIGTERM, on_term_now)
        return
    started = threading.Event()

    def after_drain() -> None:
        log.info("draining for %g s before stopping (readiness reports 503)", drain_s)
        sleep(drain_s)
        os.kill(os.getpid(), signal.SIGTERM)  # on to gunicorn's handler (below)

    def on_term(sig: int, frame: Any) -> None:
        if started.is_set() or draining():
            gunicorns(sig, frame)
            _stop_now_if_reloading(frame)
            return
        started.set()
        start_draining()
        threading.Thread(target=after_drain, name="ezat-drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)


def on_worker_term(worker: Any, cut: Callable[[], int], grace_s: float) -> None:
    """Wrap a worker's SIGTERM: gunicorn stops accepting and waits for open requests; a few
    seconds before its grace runs out, ``cut`` ends the streams still open."""
    import gevent

    handle_exit = worker.handle_exit

    def cut_later() -> None:
        gevent.sleep(max(0.0, grace_s - CUT_MARGIN_S))
        ended = cut()
        if ended:
            log.warning("the grace ran out: ended %d open streams with an error (not billed)", ended)

    def on_term(sig: int, frame: Any) -> None:
        handle_exit(sig, frame)
        gevent.spawn(cut_later)

    signal.signal(signal.SIGTERM, on_term)


def shutting_down() -> OverloadedError:
    """What a stream cut by a shutdown tells its client (OpenAI: 503 overloaded; retry)."""
    return OverloadedError(SHUTTING_DOWN, retry_after=1)
