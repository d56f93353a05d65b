"""The order in which one request tries a model's deployments: a pure decision.

``plan(deployments, session=..., rand=...)`` returns every deployment exactly once, in the order
the caller should try them; the caller walks the list, skips deployments that its cooldowns
refuse (``Cooldowns.acquire``) and fails over to the next one (routing, failover and session
affinity). The rules:

- **Tiers.** Deployments are grouped by ``priority``; lower tiers come first, so failover walks
  the whole of a tier before it reaches the next one (``priority`` of ``[[models.deployments]]``).
- **Without a session**, a tier is put in a weighted random order without replacement: the
  first pick is proportional to ``weight``, the next one is picked the same way among the rest,
  and so on. Traffic shares by weight; failover stays inside the tier until it is exhausted.
- **With a session** (the ``x-ezat-session`` header, else ``prompt_cache_key``), a tier is put in
  weighted rendezvous (highest-random-weight) order: each deployment scores
  ``-weight / ln(u)`` where ``u`` in (0, 1) comes from a keyed BLAKE2b hash of the session and
  the deployment's ``name``. Every worker and every gateway node computes the same order with
  no shared state, sessions spread over a tier by weight, and when the first choice is skipped
  the request lands on the next in that same order, while sessions whose first choice is still
  available keep it (removing a deployment moves only its own sessions).

The hash is part of the contract between gateway nodes: changing it moves every session (their
prompt caches go cold once). Nothing here does I/O or reads a clock or the global RNG; ``rand``
is a ``random.Random().random``-like callable returning floats in [0, 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from hashlib import blake2b

from ezat_compat.domain import Deployment

_SCALE = 2.0**-53


def plan(deployments: Sequence[Deployment], *, session: str | None, rand: Callable[[], float]) -> list[Deployment]:
    """Every deployment once, in the order this request should try them (see the module doc).

    ``session`` is the conversation name (``x-ezat-session`` wins over ``prompt_cache_key``;
    pass ``None`` or ``""`` for none). ``rand`` is only called when a tier without a session has
    more than one deployment. Deployments the caller finds unavailable are simply skipped: the
    rest of the list is already the failover order.
    """
    if len(deployments) <= 1:
        return list(deployments)
    out: list[Deployment] = []
    for tier in tiers(deployments):
        if len(tier) == 1:
            out.append(tier[0])
        elif session:
            out.extend(rendezvous_order(tier, session))
        else:
            out.extend(weighted_order(tier, rand))
    return out


def tiers(deployments: Sequence[Deployment]) -> list[Sequence[Deployment]]:
    """The deployments grouped by ``priority``, lowest first; input order kept inside a tier."""
    first = deployments[0].priority if deployments else 0
    if all(d.priority == first for d in deployments):
        return [deployments]
    by_priority: dict[int, list[Deployment]] = {}
    for d in deployments:
        by_priority.setdefault(d.priority, []).append(d)
    return [by_priority[p] for p in sorted(by_priority)]


def weighted_order(tier: Sequence[Deployment], rand: Callable[[], float]) -> list[Deployment]:
    """A weighted random order without replacement: each pick proportional to ``weight``.

    Calls ``rand`` once per pick but the last. Deployments with a non-positive weight (the
    config refuses them) are never picked while a positive one remains and come last.
    """
    rest = list(tier)
    weights = [d.weight if d.weight > 0 else 0.0 for d in rest]
    out: list[Deployment] = []
    while len(rest) > 1:
        total = sum(weights)
        if total <= 0:
            break
        x = rand() * total
        last = len(rest) - 1
        i, acc = 0, weights[0]
        while x >= acc and i < last:
            i += 1
            acc += weights[i]
        while weights[i] <= 0:  # rounding at the very top of the range can land on a zero weight
            i -= 1
        out.append(rest.pop(i))
        weights.pop(i)
    out.extend(rest)
    return out


def rendezvous_order(tier: Sequence[Deployment], session: str) -> list[Deployment]:
    """The tier in weighted rendezvous order for ``session``: highest score first, ties by name.

    The same for any input order, any process and any node.
    """
    key = _session_key(session)
    scored = sorted(((-rendezvous_score(key, d), d.name, i) for i, d in enumerate(tier)))
    return [tier[i] for _, _, i in scored]


def rendezvous_score(key: bytes, deployment: Deployment) -> float:
    """``-weight / ln(u)``, ``u`` in (0, 1) from a BLAKE2b of the deployment name keyed by ``key``.

    ``key`` is ``_session_key(session)``; a larger score wins. Non-positive weights score <= 0.
    """
    digest = blake2b(_utf8(deployment.name), digest_size=8, key=key).digest()
    u = ((int.from_bytes(digest, "big") >> 11) + 0.5) * _SCALE  # 53 bits: never 0.0 nor 1.0
    return -deployment.weight / math.log(u)


def _session_key(session: str) -> bytes:
    return blake2b(_utf8(session), digest_size=32).digest()


def _utf8(text: str) -> bytes:
    # Header values and JSON strings may hold lone surrogates; they must hash, not raise.
    return text.encode("utf-8", "surrogatepass")
