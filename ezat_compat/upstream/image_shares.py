"""A request's budget and the pool's fair shares: what the image downloads (and fits) of one
request share, and how the process's pool is shared between requests and organizations.

- ``Batch``: one request's downloads share one wall-clock deadline, one byte budget
  (``max_total_bytes``) and one stop switch; at the deadline, or when any download fails, the
  request's sockets are shut down from the waiting thread so no worker reads on for nobody.
- ``Shares``: the pool is shared fairly: one request runs at most ``request_threads`` of its
  downloads at once and one organization at most ``org_threads``, so no tenant can fill the pool.
  Work goes to the pool only once it holds a place: a request over its organization's share
  waits in its own thread for that organization's places (never in the pool's queue, in front
  of another organization's work), until its deadline.
- ``Lanes``: one request's jobs run on the places it holds; the first failure stops the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from ezat_compat.upstream.image_limits import ORG_BUSY, POOL_BUSY, Cancelled, ImageLimits, Refused, timed_out
from ezat_compat.upstream.pinning import Watch

T = TypeVar("T")


# ---------------------------------------------------------------- one request's batch


class Batch:
    """What a request's downloads share: the deadline, the byte budget and the stop switch."""

    def __init__(self, limits: ImageLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout_s
        self._lock = threading.Lock()
        self._total = 0
        self._stopped = False
        self._watches: set[Watch] = set()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise when the download should end now: stopped, or past the deadline."""
        if self._stopped:
            raise Cancelled
        if self.remaining() <= 0:
            raise Refused(timed_out(self.limits))

    def fits(self, size: int) -> bool:
        with self._lock:
            return self._total + size <= self.limits.max_total_bytes

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes; False once the request's total is over its cap."""
        with self._lock:
            self._total += size
            return self._total <= self.limits.max_total_bytes

    @contextmanager
    def watch(self) -> Iterator[Watch]:
        watch = Watch()
        with self._lock:
            if self._stopped:
                raise Cancelled
            self._watches.add(watch)
        try:
            yield watch
        finally:
            with self._lock:
                self._watches.discard(watch)
            watch.release()

    def stop(self) -> None:
        """End every download of the batch now: later checks raise, open sockets are cut."""
        with self._lock:
            self._stopped = True
            watches = list(self._watches)
        for watch in watches:
            watch.abort()


# ---------------------------------------------------------------- fair places on the pool


GRANTED = "granted"
GAVE_UP = "gave up"  # the request needs no more places (all its work started, or it stopped)


@dataclass(eq=False)
class _Waiter:
    org: str
    held: int  # places its request holds already
    seq: int


class Shares:
    """The pool's places (one per thread), handed out fairly between organizations.

    A waiter gets a place when the pool has one free, its organization holds fewer than
    ``per_org`` and no other waiter that could take that place goes first: the one whose
    organization holds fewer places, then whose request holds fewer, then the earlier one. A
    waiter whose organization is at its share isn't in the running, so it holds up nobody; it
    waits for one of its own organization's places to be released. One per process (its lock
    doesn't survive a fork); under gevent the condition is a greenlet's.
    """

    def __init__(self, total: int, per_org: int) -> None:
        self.total = total
        self.per_org = max(1, min(per_org, total))
        self._cond = threading.Condition()
        self._used = 0
        self._by_org: dict[str, int] = {}
        self._waiters: list[_Waiter] = []
        self._seq = 0

    def held_by(self, org: str) -> int:
        with self._cond:
            return self._by_org.get(org, 0)

    def acquire(self, org: str, held: int, deadline: float, give_up: Callable[[], bool]) -> str:
        """Wait for one place for ``org`` (whose request holds ``held``) until ``deadline``
        (``time.monotonic``). Returns ``GRANTED``; ``GAVE_UP`` once ``give_up()`` (checked
        under the lock; call ``poke`` after changing what it reads); or, at the deadline, why
        there was no place: ``ORG_BUSY`` or ``POOL_BUSY``."""
        with self._cond:
            self._seq += 1
            waiter = _Waiter(org=org, held=held, seq=self._seq)
            self._waiters.append(waiter)
            try:
                while True:
                    if give_up():
                        return GAVE_UP
                    if self._next_in_line() is waiter:
                        self._used += 1
                        self._by_org[org] = self._by_org.get(org, 0) + 1
                        return GRANTED
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return ORG_BUSY if self._by_org.get(org, 0) >= self.per_org else POOL_BUSY
                    self._cond.wait(remaining)
            finally:
                self._waiters.remove(waiter)
                self._cond.notify_all()  # the next in line may be another waiter now

    def _next_in_line(self) -> _Waiter | None:
        """The waiter the next free place goes to, or None (no place free, or nobody may take it)."""
        if self._used >= self.total:
            return None
        eligible = [w for w in self._waiters if self._by_org.get(w.org, 0) < self.per_org]
        if not eligible:
            return None
        return min(eligible, key=lambda w: (self._by_org.get(w.org, 0), w.held, w.seq))

    def release(self, org: str) -> None:
        with self._cond:
            self._used -= 1
            left = self._by_org.get(org, 0) - 1
            if left > 0:
                self._by_org[org] = left
            else:
                self._by_org.pop(org, None)
            self._cond.notify_all()

    def poke(self) -> None:
        """Wake the waiters so that they check ``give_up`` again."""
        with self._cond:
            self._cond.notify_all()


class Lanes(Generic[T]):
    """One request's jobs on the pool, taken in order by its lanes (each lane holds one place
    and runs jobs until none is left). The first failure stops the others: no lane takes a new
    job, and ``on_failure`` runs (it cuts the request's sockets)."""

    def __init__(self, jobs: Sequence[Callable[[], T]], shares: Shares, on_failure: Callable[[], None]) -> None:
        self._jobs = list(jobs)
        self._shares = shares
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._next = 0
        self._finished: set[int] = set()
        self.results: list[T | None] = [None] * len(self._jobs)
        self.errors: dict[int, BaseException] = {}
        self.stopped = False
        self.abandoned = False  # a lane was cancelled before it ran (the pool was shut down)
        self.denied = ""  # why the last wait for a place ended without one, if it did

    def nothing_to_start(self) -> bool:
        return self.stopped or self._next >= len(self._jobs)

    def started(self, index: int) -> bool:
        return index < self._next

    def unfinished(self) -> int:
        """The lowest index without a result or an error."""
        with self._cond:
            return next((i for i in range(len(self._jobs)) if i not in self._finished), 0)

    def lane(self) -> None:
        """Runs on the pool."""
        while True:
            with self._cond:
                if self.nothing_to_start():
                    return
                index = self._next
                self._next += 1
            self._shares.poke()  # the request may be waiting for a place it no longer needs
            try:
                result = self._jobs[index]()
            except BaseException as err:
                self._finish(index, None, err)
                return
            self._finish(index, result, None)

    def _finish(self, index: int, result: T | None, err: BaseException | None) -> None:
        with self._cond:
            self._finished.add(index)
            if err is None:
                self.results[index] = result
            else:
                self.errors[index] = err
                self.stopped = True
            self._cond.notify_all()
        if err is not None:
            self._on_failure()
            self._shares.poke()

    def abandon(self) -> None:
        with self._cond:
            self.abandoned = self.stopped = True
            self._cond.notify_all()
        self._shares.poke()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
        self._shares.poke()

    def wait(self, deadline: float) -> bool:
        """Until every job is done, one failed, or ``deadline``; True unless the deadline came first."""
        with self._cond:
            while not (self.stopped or len(self._finished) == len(self._jobs)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True
