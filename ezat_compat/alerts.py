"""Spend limits' thresholds: a webhook per crossing and a Prometheus gauge of spend against each cap.

Each gunicorn worker runs one loop (``start_alerts``, from ``post_worker_init``: never on a
request's path). Every ``[alerts] every_s`` it reads every limit and its current period (two
statements), publishes the gauges (``ezat_spend_limit_ratio`` and ``ezat_spend_limit_usd``,
``server/metrics.py``), and, when a webhook is configured, looks for the thresholds the period
has reached and has not alerted for yet:

- a threshold ``t`` (percent; the limit's own, else ``[alerts] thresholds``) is reached when the
  period's spend is at least ``t`` % of the amount; 100 % (and below) also when the limit refused a
  request because what the period spent left no room for it (a reservation never lets the spend
  itself pass the cap, so it usually stops just short of it);
- its alert is claimed by inserting its mark (``spend_alerts``, keyed by limit, period and
  threshold): one worker of one node wins, the others see the mark, so each threshold fires at
  most once per period;
- the winner POSTs the JSON below to ``[alerts] webhook_url`` on a thread of its own, retried with
  exponential backoff (1 s, 2 s, 4 s … up to ``ATTEMPTS`` tries) until a 2xx; what became of it is
  written on the mark (``attempts``, ``delivered_at``).

The request is signed with HMAC-SHA256 under the secret in ``[alerts] webhook_secret_env``:
``X-Ezat-Timestamp`` is the Unix time of the attempt, ``X-Ezat-Signature`` is ``sha256=`` and the
hex digest of ``<timestamp>.<body>`` (``verify`` checks one). Without a secret nothing is sent
(logged once): an unsigned alert could be forged by anyone who can reach the receiver.

The payload (``payload``)::

    {"type": "spend_limit.threshold_reached", "id": "spl_…:2026-02-01T00:00:00Z:80",
     "threshold": 80, "reason": "spent" | "refused",
     "spend_limit": {"id": "spl_…", "scope": "org:acme", "scope_type": "org", "scope_name": "acme",
                     "workspace_id": "wrkspc_…", "period": "monthly", "amount_usd": "200.000000"},
     "period_start": "…", "resets_at": "…", "spent_usd": "…", "reserved_usd": "…", "ratio": 0.8123,
     "sent_at": "…"}

``id`` is the same on every retry: a receiver can drop repeats.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import requests

from ezat_compat.pricing import micros_to_usd
from ezat_compat.procid import pid

if TYPE_CHECKING:
    from ezat_compat.domain import AlertsSettings
    from ezat_compat.store.spend import PeriodSpend, SpendLimitInfo, SpendLimits

log = logging.getLogger("ezat_compat.alerts")

SIGNATURE_HEADER = "X-Ezat-Signature"
TIMESTAMP_HEADER = "X-Ezat-Timestamp"
ATTEMPTS = 8  # 1 + 2 + 4 + … + 64 s of waits: about two minutes before an alert is given up
FIRST_BACKOFF_S = 1.0
POST_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class SpendGauge:
    """One limit's gauges: its scope (``gateway``, ``org``, ``key``), the scope's name (an
    organisation's name, a key's ``key_…``; "" for the gateway), its period, its cap and what
    its current period spent (micro-USD)."""

    scope: str
    scope_id: str
    period: str
    cap_micros: int
    spent_micros: int

    @property
    def ratio(self) -> float:
        return self.spent_micros / self.cap_micros if self.cap_micros else 0.0


@dataclass(frozen=True, slots=True)
class Crossing:
    """A threshold a limit's current period reached (``reason``: ``spent`` or ``refused``)."""

    limit: SpendLimitInfo
    period: PeriodSpend
    threshold: int
    reason: str


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``X-Ezat-Signature`` of ``body`` sent at ``timestamp``: ``sha256=<hex>`` of the HMAC-SHA256
    of ``<timestamp>.<body>`` under ``secret``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(secret: str, headers: Mapping[str, str], body: bytes, *, now: float, tolerance_s: float = 300) -> bool:
    """Whether a webhook's ``headers`` sign ``body`` under ``secret``, sent within
    ``tolerance_s`` of ``now`` (a receiver's check; compare in constant time)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        timestamp = int(lowered.get(TIMESTAMP_HEADER.lower(), ""))
    except ValueError:
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(lowered.get(SIGNATURE_HEADER.lower(), ""), sign(secret, timestamp, body))


def gauges(limits: Sequence[SpendLimitInfo], periods: Mapping[int, PeriodSpend]) -> list[SpendGauge]:
    """The gauges of the limits that have an amount (a "no limit" has nothing to measure against)."""
    return [
        SpendGauge(
            limit.scope_type, limit.scope_name, limit.period, limit.amount_micros, periods[limit.id].spent_micros
        )
        for limit in limits
        if limit.amount_micros is not None
    ]


def crossings(
    limits: Sequence[SpendLimitInfo],
    periods: Mapping[int, PeriodSpend],
    claimed: set[tuple[int, int]],
    default_thresholds: Sequence[int],
) -> list[Crossing]:
    """The thresholds reached and not claimed yet (module docstring), lowest first per limit.
    A limit of 0 (a block, not a budget) and a "no limit" have none."""
    found = []
    for limit in limits:
        amount = limit.amount_micros
        if not amount:
            continue
        period = periods[limit.id]
        for threshold in limit.thresholds or default_thresholds:
            if (limit.id, threshold) in claimed:
                continue
            if period.spent_micros * 100 >= threshold * amount:
                found.append(Crossing(limit, period, threshold, "spent"))
            elif threshold <= 100 and period.exhausted:
                found.append(Crossing(limit, period, threshold, "refused"))
    return found


def payload(crossing: Crossing, now: datetime) -> dict[str, Any]:
    """The webhook's JSON for ``crossing`` (module docstring)."""
    limit, period = crossing.limit, crossing.period
    assert limit.amount_micros is not None
    return {
        "type": "spend_limit.threshold_reached",
        "id": f"{limit.public_id}:{rfc3339(period.start)}:{crossing.threshold}",
        "threshold": crossing.threshold,
        "reason": crossing.reason,
        "spend_limit": {
            "id": limit.public_id,
            "scope": limit.scope_label,
            "scope_type": limit.scope_type,
            "scope_name": limit.scope_name,
            "workspace_id": limit.workspace_id or None,
            "period": limit.period,
            "amount_usd": micros_to_usd(limit.amount_micros),
        },
        "period_start": rfc3339(period.start),
        "resets_at": rfc3339(period.end),
        "spent_usd": micros_to_usd(period.spent_micros),
        "reserved_usd": micros_to_usd(period.reserved_micros),
        "ratio": round(period.spent_micros / limit.amount_micros, 6),
        "sent_at": rfc3339(now),
    }


class SpendAlerts:
    """One worker's threshold loop (module docstring). ``publish`` takes each round's gauges
    (``Metrics.publish_spend_limits``); ``post``, ``sleep`` and ``clock`` are the HTTP call, the
    wait and the time (tests pass fakes)."""

    def __init__(
        self,
        spend: SpendLimits,
        settings: AlertsSettings,
        publish: Callable[[list[SpendGauge]], None] | None = None,
        *,
        post: Callable[..., Any] = requests.post,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        first_backoff_s: float = FIRST_BACKOFF_S,
    ) -> None:
        self.spend = spend
        self.settings = settings
        self.publish = publish
        self._post = post
        self._sleep = sleep
        self._clock = clock
        self._first_backoff_s = first_backoff_s
        self._owner = 0  # the process whose loop runs (``start``)
        self._warned = False
        self.deliveries: list[threading.Thread] = []

    # ------------------------------------------------------------ one round

    def round(self) -> list[Crossing]:
        """Publish the gauges and claim the thresholds reached; returns the claimed ones (their
        deliveries started). Raises what the database raises (the loop logs it)."""
        now = self._clock()
        limits = self.spend.list_limits()
        periods = self.spend.current(limits, now)
        if self.publish is not None:
            self.publish(gauges(limits, periods))
        if not self.settings.webhook_url:
            return []
        if not self.settings.webhook_secret:
            if not self._warned:
                log.error(
                    "[alerts] webhook_url is set but $%s is empty: spend limit alerts are not sent (unsigned)",
                    self.settings.webhook_secret_env,
                )
                self._warned = True
            return []
        capped = [limit for limit in limits if limit.amount_micros]
        claimed = self.spend.claimed_alerts([s.id for s in capped], [periods[s.id].start for s in capped])
        won = []
        for crossing in crossings(capped, periods, claimed, self.settings.thresholds):
            if self.spend.claim_alert(crossing.limit.id, crossing.period.start, crossing.threshold, now):
                won.append(crossing)
                thread = threading.Thread(target=self.deliver, args=(crossing,), name="ezat-spend-alert", daemon=True)
                self.deliveries.append(thread)
                thread.start()
        self.deliveries = [t for t in self.deliveries if t.is_alive()]
        return won

    def deliver(self, crossing: Crossing) -> bool:
        """POST ``crossing``'s alert until a 2xx, at most ``ATTEMPTS`` times, waiting twice as
        long after each failure; records the outcome on its mark. True when delivered."""
        body = json.dumps(payload(crossing, self._clock()), separators=(",", ":")).encode()
        wait = self._first_backoff_s
        delivered_at = None
        attempt = 0
        for attempt in range(1, ATTEMPTS + 1):
            timestamp = int(time.time())
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "ezat-compat-alerts",
                TIMESTAMP_HEADER: str(timestamp),
                SIGNATURE_HEADER: sign(self.settings.webhook_secret, timestamp, body),
            }
            try:
                response = self._post(self.settings.webhook_url, data=body, headers=headers, timeout=POST_TIMEOUT_S)
                status = response.status_code
                response.close()
            except requests.RequestException as exc:
                status, problem = 0, str(exc)
            else:
                problem = f"HTTP {status}"
            if 200 <= status < 300:
                delivered_at = self._clock()
                break
            log.warning(
                "spend limit alert %s (%d %%) not taken by the webhook (%s); attempt %d of %d",
                crossing.limit.public_id,
                crossing.threshold,
                problem,
                attempt,
                ATTEMPTS,
            )
            if attempt < ATTEMPTS:
                self._sleep(wait)
                wait *= 2
        try:
            self.spend.alert_attempted(
                crossing.limit.id, crossing.period.start, crossing.threshold, attempt, delivered_at
            )
        except Exception as exc:
            log.warning("could not record spend limit alert %s: %s", crossing.limit.public_id, exc)
        if delivered_at is None:
            log.error(
                "spend limit alert %s (%d %%) given up after %d attempts",
                crossing.limit.public_id,
                crossing.threshold,
                ATTEMPTS,
            )
        return delivered_at is not None

    # ------------------------------------------------------------ the loop

    def start(self) -> None:
        """Run ``round`` every ``every_s`` on a background thread (a greenlet in a gevent worker),
        once per process."""
        if self._owner == pid():
            return
        self._owner = pid()
        threading.Thread(target=self._loop, name="ezat-spend-alerts", daemon=True).start()

    def stop(self) -> None:
        """Stop the loop after its current round (tests; a worker's ends with the process)."""
        self._owner = 0

    def _loop(self) -> None:
        owner = pid()
        failing = False
        while self._owner == owner == pid():
            try:
                self.round()
                failing = False
            except Exception as exc:
                if not failing:  # once per incident
                    log.warning("spend limit alerts: %s (retried every %g s)", exc, self.settings.every_s)
                failing = True
            time.sleep(self.settings.every_s)


def start_alerts(
    spend: SpendLimits,
    settings: AlertsSettings,
    publish: Callable[[list[SpendGauge]], None] | None,
    post: Callable[..., Any] = requests.post,
) -> SpendAlerts:
    """Start this worker's loop (gunicorn's ``post_worker_init``); returns it. ``post``: how a
    webhook is sent (the composition's session: the operator's proxies and CAs)."""
    alerts = SpendAlerts(spend, settings, publish, post=post)
    alerts.start()
    return alerts
