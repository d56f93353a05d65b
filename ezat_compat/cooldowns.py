"""Deployment health: consecutive failures and upstream ``retry-after`` put a deployment in a
cooldown; after it, a single probe request decides whether it is healthy again.

One state machine per deployment name, kept per process (``LocalCooldowns``) or shared by
every worker and gateway node through Redis (``RedisCooldowns``, chosen when ``redis_url`` is
set; see ``make_cooldowns``). Both implement the same rules and run the same tests:

=================  =========================================================================
healthy            ``acquire`` -> True. A failure counts; ``failures`` in a row (no success in
                   between, none more than ``forget_s`` apart) start a cooldown of ``cooldown_s``.
                   A failure with ``retry_after`` > 0 starts one at once of
                   ``min(retry_after, max_cooldown_s)`` seconds. ``success`` resets the count.
cooling            ``now < until``: ``acquire`` -> False. A late failure of a request that
                   started before the cooldown only extends it (a longer ``retry_after``); a late
                   success is ignored.
probation          ``now >= until``: the first ``acquire`` -> True and becomes the probe; every
                   other caller gets False until the probe reports back, or until
                   ``probe_timeout_s`` has passed (a crashed worker can't wedge a deployment:
                   the next caller becomes a new probe).
probe success      -> healthy (the failure count and the backoff are reset).
probe failure      -> cooling again for ``cooldown_s * 2**k`` (k: cooldowns in a row), at most
                   ``max_cooldown_s``; or for ``min(retry_after, max_cooldown_s)`` when given.
=================  =========================================================================

A state untouched for ``forget_s`` (after its cooldown and probe lease) is forgotten: healthy.

Callers pass ``now``; with ``RedisCooldowns`` it must be wall-clock time (``time.time()``),
since nodes compare each other's timestamps (``LocalCooldowns`` takes any clock). Call
``acquire`` before each attempt on a deployment, then at most one of ``success`` (any answer
that isn't the upstream's fault, 4xx included) or ``failure`` (a failover status, a refused
connection, a timeout). An attempt that ends with neither (the client left) reports nothing;
if it was the probe, the probe is released after ``probe_timeout_s``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ezat_compat.redis_pool import bounded_client

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

_MAX_DOUBLINGS = 30  # keeps cooldown_s * 2**k finite; max_cooldown_s caps it long before
_WARN_EVERY_S = 10.0


class Cooldowns(Protocol):
    def acquire(self, name: str, now: float) -> bool:
        """May this request use the deployment now? False while cooling down or while another
        request is the probe; True for exactly one caller (the probe) once a cooldown is over."""
        ...

    def success(self, name: str) -> None:
        """The deployment answered: reset its failure count and end its probe."""
        ...

    def failure(self, name: str, now: float, retry_after: float | None = None) -> float | None:
        """The deployment failed (``retry_after``: the upstream's header, seconds). Returns the
        cooldown end when this failure started (or extended) a cooldown, else None."""
        ...

    def cooling(self, now: float) -> list[str]:
        """Names that ``acquire`` would refuse now (in cooldown or probe out), for a gauge."""
        ...

    def wait_s(self, name: str, now: float) -> float:
        """Seconds until ``acquire`` may accept ``name`` again, as far as this node knows
        (0 when it may now): the ``retry-after`` of "no deployment available"."""
        ...


@dataclass(frozen=True)
class Policy:
    failures: int = 3
    cooldown_s: float = 30.0
    max_cooldown_s: float = 300.0
    probe_timeout_s: float = 30.0
    forget_s: float = 600.0

    @classmethod
    def make(
        cls,
        *,
        failures: int,
        cooldown_s: float,
        max_cooldown_s: float,
        probe_timeout_s: float | None = None,
        forget_s: float = 600.0,
    ) -> Policy:
        """``probe_timeout_s`` defaults to ``cooldown_s`` (at least one second)."""
        probe = max(cooldown_s, 1.0) if probe_timeout_s is None else probe_timeout_s
        return cls(max(failures, 1), max(cooldown_s, 0.0), max(max_cooldown_s, 0.0), probe, forget_s)

    def retry_after_s(self, retry_after: float | None) -> float | None:
        """The cooldown an upstream ``retry-after`` asks for, capped; None when it asks none."""
        if retry_after is None or not retry_after > 0:  # also refuses NaN
            return None
        return min(retry_after, self.max_cooldown_s)

    def backoff_s(self, strikes: int) -> float:
        """The cooldown after ``strikes`` cooldowns in a row that ended in a failed probe."""
        return min(self.cooldown_s * 2.0 ** min(strikes, _MAX_DOUBLINGS), self.max_cooldown_s)


# ---------------------------------------------------------------- in process


class _State:
    __slots__ = ("expires", "fails", "probe", "strikes", "until")

    def __init__(self) -> None:
        self.fails = 0
        self.until: float | None = None  # None: healthy (counting failures)
        self.probe: float | None = None  # the probe lease's end, while a probe is out
        self.strikes = 0
        self.expires = 0.0


class LocalCooldowns:
    """Per-process cooldowns; safe across threads and greenlets (one lock, never held on I/O).

    ``acquire`` on a deployment with no recorded failure is one dict lookup.
    """

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    def acquire(self, name: str, now: float) -> bool:
        st = self._states.get(name)
        if st is None:
            return True
        if now < st.expires and (st.until is None or now < st.until):  # lock-free: a stale read is benign
            return st.until is None
        with self._lock:
            st = self._live(name, now)
            if st is None or st.until is None:
                return True
            if now < st.until or (st.probe is not None and now < st.probe):
                return False
            st.probe = now + self._policy.probe_timeout_s
            st.expires = max(st.expires, st.probe + self._policy.forget_s)
            return True

    def success(self, name: str) -> None:
        if name not in self._states:
            return
        with self._lock:
            st = self._states.get(name)
            if st is not None and (st.until is None or st.probe is not None):
                del self._states[name]

    def failure(self, name: str, now: float, retry_after: float | None = None) -> float | None:
        p = self._policy
        asked = p.retry_after_s(retry_after)
        with self._lock:
            st = self._live(name, now) or self._states.setdefault(name, _State())
            if st.until is not None and now < st.until:  # a late failure during the cooldown
                if asked is None or now + asked <= st.until:
                    return None
                return self._cool(st, now, asked)
            if st.until is not None:  # probation: the probe (or a late request) failed
                return self._cool(st, now, p.backoff_s(st.strikes) if asked is None else asked)
            st.fails += 1
            if asked is not None:
                return self._cool(st, now, asked)
            if st.fails >= p.failures:
                return self._cool(st, now, p.backoff_s(st.strikes))
            st.expires = now + p.forget_s
            return None

    def cooling(self, now: float) -> list[str]:
        with self._lock:
            return sorted(
                name
                for name in list(self._states)
                if (st := self._live(name, now)) is not None
                and st.until is not None
                and (now < st.until or (st.probe is not None and now < st.probe))
            )

    def wait_s(self, name: str, now: float) -> float:
        with self._lock:
            st = self._live(name, now)
            if st is None or st.until is None:
                return 0.0
            end = st.until if now < st.until else (st.probe or now)
            return max(0.0, end - now)

    def _live(self, name: str, now: float) -> _State | None:
        st = self._states.get(name)
        if st is not None and now >= st.expires:
            del self._states[name]
            return None
        return st

    def _cool(self, st: _State, now: float, duration: float) -> float:
        st.until = now + duration
        st.probe = None
        st.fails = 0
        st.strikes += 1
        st.expires = st.until + self._policy.probe_timeout_s + self._policy.forget_s
        return st.until


# ---------------------------------------------------------------- shared through Redis

# One hash per deployment: f (failures in a row), u (cooldown end), p (probe lease end),
# s (cooldowns in a row), x (forget after). Each script is one round trip and atomic; the state
# is dropped once ``now >= x`` (the key's TTL only collects garbage). Floats travel as strings.
_PRELUDE = """
local k = KEYS[1]
local now = tonumber(ARGV[1])
local v = redis.call('HMGET', k, 'f', 'u', 'p', 's', 'x')
local f, u, p, s, x = tonumber(v[1]) or 0, tonumber(v[2]), tonumber(v[3]), tonumber(v[4]) or 0, tonumber(v[5])
if x and now >= x then
  redis.call('DEL', k)
  f, u, p, s, x = 0, nil, nil, 0, nil
end
local function keep(until_x)
  redis.call('HSET', k, 'x', string.format('%.17g', until_x))
  redis.call('PEXPIRE', k, math.max(1000, math.ceil((until_x - now) * 1000) + 60000))
  redis.call('SADD', KEYS[2], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], 86400000)
end
"""

# ARGV: now, name, probe_timeout_s, forget_s -> {verdict, refused until or ''}
_ACQUIRE = (
    _PRELUDE
    + """
if not x then return {1, ''} end
if not u then return {2, ''} end
if now < u then return {0, v[2]} end
if p and now < p then return {4, v[3]} end
local lease = now + tonumber(ARGV[3])
redis.call('HSET', k, 'p', string.format('%.17g', lease))
keep(math.max(x, lease + tonumber(ARGV[4])))
return {3, ''}
"""
)
_COOLING, _CLEAN, _COUNTING, _PROBE, _PROBE_OUT = 0, 1, 2, 3, 4

# ARGV: name -> 1 when the state was reset (not during a cooldown without a probe out)
_SUCCESS = """
local v = redis.call('HMGET', KEYS[1], 'u', 'p')
if v[1] and not v[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""

# ARGV: now, name, probe_timeout_s, forget_s, failures, asked ('' for none), cooldown_s,
# max_cooldown_s, max_doublings -> the cooldown end as a string, or false
_FAILURE = (
    _PRELUDE
    + """
local asked = tonumber(ARGV[6])
local function cool(duration)
  local untl = now + duration
  redis.call('HDEL', k, 'p')
  redis.call('HSET', k, 'f', 0, 'u', string.format('%.17g', untl), 's', s + 1)
  keep(untl + tonumber(ARGV[3]) + tonumber(ARGV[4]))
  return string.format('%.17g', untl)
end
local function backoff()
  return math.min(tonumber(ARGV[7]) * 2 ^ math.min(s, tonumber(ARGV[9])), tonumber(ARGV[8]))
end
if u and now < u then
  if not asked or now + asked <= u then return false end
  return cool(asked)
end
if u then return cool(asked or backoff()) end
if asked then return cool(asked) end
f = f + 1
if f >= tonumber(ARGV[5]) then return cool(backoff()) end
redis.call('HSET', k, 'f', f)
keep(now + tonumber(ARGV[4]))
return false
"""
)


class RedisCooldowns:
    """Cooldowns shared by every worker and node through Redis (one hash per deployment).

    Hot path: a deployment Redis called clean is trusted for ``healthy_cache_s`` (1 s by
    default) without a round trip, so a cooldown started by another node stops this node's
    traffic within that time; a cooldown this node sees (or starts) is refused locally until it
    ends. Otherwise ``acquire`` is one script call (one round trip). ``success`` costs a round
    trip only when the last state this node saw had failures or a probe (so a success right
    after a clean answer doesn't reset failures other nodes counted since: at worst a cooldown
    comes a little early). Redis errors fail open: the
    deployment counts as healthy for ``healthy_cache_s`` (a dead Redis costs one timed-out call
    per deployment per ``healthy_cache_s``), with a warning at most every 10 s. For Redis
    Cluster, put a hash tag in ``prefix`` (``"{ezat:cd}:"``): each script touches the
    deployment's key and the prefix's name index.
    """

    def __init__(
        self, client: redis.Redis, policy: Policy, *, prefix: str = "ezat:cd:", healthy_cache_s: float = 1.0
    ) -> None:
        from redis import RedisError  # here: a gateway without Redis never imports it

        self._errors = RedisError
        self._redis = client
        self._policy = policy
        self._prefix = prefix
        self._index = prefix + "names"
        self._cache_s = healthy_cache_s
        self._healthy_until: dict[str, float] = {}
        self._refused_until: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._warned_at = -math.inf
        self._acquire = client.register_script(_ACQUIRE)
        self._success = client.register_script(_SUCCESS)
        self._failure = client.register_script(_FAILURE)

    def key(self, name: str) -> str:
        """The Redis key of a deployment's state."""
        return f"{self._prefix}d:{name}"

    def acquire(self, name: str, now: float) -> bool:
        if now < self._healthy_until.get(name, -math.inf):
            return True
        if now < self._refused_until.get(name, -math.inf):
            return False
        p = self._policy
        try:
            verdict, refused_until = self._acquire(
                keys=[self.key(name), self._index], args=[repr(now), name, p.probe_timeout_s, p.forget_s]
            )
        except self._errors as exc:
            self._fail_open(name, now, exc)
            return True
        if verdict == _COOLING:  # nothing ends a cooldown early: refuse locally until it ends
            self._refused_until[name] = float(refused_until)
            return False
        if verdict == _PROBE_OUT:  # the probe may succeed any time: ask again soon
            self._refused_until[name] = min(float(refused_until), now + self._cache_s)
            return False
        self._refused_until.pop(name, None)
        if verdict == _CLEAN:
            self._dirty.discard(name)
        else:
            self._dirty.add(name)
        if verdict != _PROBE:  # the probe goes alone: later requests ask Redis again
            self._healthy_until[name] = now + self._cache_s
        return True

    def success(self, name: str) -> None:
        if name not in self._dirty:
            return
        try:
            self._success(keys=[self.key(name), self._index], args=[name])
        except self._errors as exc:
            self._warn("success of %s not recorded", name, exc)
            return
        self._dirty.discard(name)
        self._refused_until.pop(name, None)

    def failure(self, name: str, now: float, retry_after: float | None = None) -> float | None:
        p = self._policy
        asked = p.retry_after_s(retry_after)
        self._healthy_until.pop(name, None)
        self._dirty.add(name)
        try:
            until = self._failure(
                keys=[self.key(name), self._index],
                args=[
                    repr(now),
                    name,
                    p.probe_timeout_s,
                    p.forget_s,
                    p.failures,
                    "" if asked is None else repr(asked),
                    p.cooldown_s,
                    p.max_cooldown_s,
                    _MAX_DOUBLINGS,
                ],
            )
        except self._errors as exc:
            self._warn("failure of %s not recorded", name, exc)
            return None
        if until is None:
            return None
        end = float(until)
        self._refused_until[name] = end
        return end

    def cooling(self, now: float) -> list[str]:
        try:
            names = sorted(_text(n) for n in self._redis.smembers(self._index))
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.hmget(self.key(name), "u", "p", "x")
            states = pipe.execute()
        except self._errors as exc:
            self._warn("cooling deployments unknown%s", "", exc)
            return []
        out: list[str] = []
        for name, (u, p, x) in zip(names, states, strict=True):
            if x is None or now >= float(x):
                continue
            if u is not None and (now < float(u) or (p is not None and now < float(p))):
                out.append(name)
        return out

    def wait_s(self, name: str, now: float) -> float:
        """From the refusal this node last saw (``acquire`` refuses before anyone asks this)."""
        return max(0.0, self._refused_until.get(name, now) - now)

    def _fail_open(self, name: str, now: float, exc: Exception) -> None:
        self._healthy_until[name] = now + self._cache_s
        self._warn("treating %s as healthy", name, exc)

    def _warn(self, what: str, name: str, exc: Exception) -> None:
        """Log a Redis outage at most every ``_WARN_EVERY_S`` (real time) per instance."""
        at = time.monotonic()
        if not at < self._warned_at + _WARN_EVERY_S:
            self._warned_at = at
            log.warning("cooldowns: Redis unreachable, " + what + ": %s", name, exc)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def make_cooldowns(
    redis_url: str,
    *,
    failures: int,
    cooldown_s: float,
    max_cooldown_s: float,
    prefix: str = "ezat:cd:",
    probe_timeout_s: float | None = None,
    healthy_cache_s: float = 1.0,
) -> Cooldowns:
    """``RedisCooldowns`` when ``redis_url`` is set (shared by every worker and node), else
    ``LocalCooldowns``. Takes ``Gateway.cooldown_failures``, ``cooldown_s``, ``max_cooldown_s``.

    The Redis client is ``redis_pool.bounded_client``'s: lazy, every wait bounded.
    """
    policy = Policy.make(
        failures=failures, cooldown_s=cooldown_s, max_cooldown_s=max_cooldown_s, probe_timeout_s=probe_timeout_s
    )
    if not redis_url:
        return LocalCooldowns(policy)
    client = bounded_client(redis_url)
    return RedisCooldowns(client, policy, prefix=prefix, healthy_cache_s=healthy_cache_s)
