"""Reads and one change about people and groups that the admin API, the CLI and the console need
beside ``store/people.py``: renaming a group, whose keys belong to whom, and what each person spent.

A key belongs to at most one person for life (``api_keys.user_id``), so anything keyed by key —
the usage rollup, the ledger, the keys' spend limits — is a person's through their keys. A person's
groups are their current mapped groups (``users.group_ids``): a report "by group" counts a person's
requests in the groups they are in now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, select

from ezat_compat.store.tables import api_keys, idp_groups, ledger, usage_1d, users


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """The person a key belongs to: their row id, public id (``user_…``), email, name and mapped
    groups (row ids), as they are now."""

    user_id: int
    public_id: str
    email: str
    group_ids: tuple[int, ...]
    name: str = ""


def _group_ids(text: str) -> tuple[int, ...]:
    return tuple(int(g) for g in text.split(",") if g)


def key_owners(engine: Engine, key_ids: Sequence[int] | None = None) -> dict[int, KeyOwner]:
    """Key row id -> its person, for every key that belongs to one (of ``key_ids`` when given)."""
    query = select(
        api_keys.c.id.label("key_id"), users.c.id, users.c.public_id, users.c.email, users.c.group_ids, users.c.name
    ).select_from(api_keys.join(users, users.c.id == api_keys.c.user_id))
    if key_ids is not None:
        if not key_ids:
            return {}
        query = query.where(api_keys.c.id.in_(list(key_ids)))
    with engine.connect() as conn:
        return {
            row.key_id: KeyOwner(row.id, row.public_id, row.email, _group_ids(row.group_ids), row.name)
            for row in conn.execute(query)
        }


def people_keys(engine: Engine, user_ids: Sequence[int]) -> list[int]:
    """The row ids of every key of these people (revoked ones too: they spent)."""
    if not user_ids:
        return []
    with engine.connect() as conn:
        return [int(k) for k in conn.execute(select(api_keys.c.id).where(api_keys.c.user_id.in_(list(user_ids))))]


def group_key_ids(engine: Engine, group_ids: Sequence[int]) -> list[int]:
    """The row ids of every key of the people now in any of these groups."""
    wanted = set(group_ids)
    if not wanted:
        return []
    with engine.connect() as conn:
        rows = conn.execute(select(users.c.id, users.c.group_ids)).all()
    members = [row.id for row in rows if wanted.intersection(_group_ids(row.group_ids))]
    return people_keys(engine, members)


def spend_since(engine: Engine, since: datetime) -> dict[int, int]:
    """Person row id -> what their keys spent (micro-USD) from the UTC day that holds ``since`` on,
    read from the daily usage rollup (a few seconds behind the ledger)."""
    day = since.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    query = (
        select(api_keys.c.user_id, func.coalesce(func.sum(usage_1d.c.cost_micros), 0))
        .select_from(usage_1d.join(api_keys, api_keys.c.id == usage_1d.c.key_id))
        .where(api_keys.c.user_id.is_not(None), usage_1d.c.bucket >= day)
        .group_by(api_keys.c.user_id)
    )
    with engine.connect() as conn:
        return {int(user_id): int(total) for user_id, total in conn.execute(query)}


def live_key_count(engine: Engine, user_id: int) -> int:
    """How many keys of the person are not revoked."""
    query = select(func.count()).where(api_keys.c.user_id == user_id, api_keys.c.revoked_at.is_(None))
    with engine.connect() as conn:
        return int(conn.execute(query).scalar() or 0)


def person_rows(engine: Engine, user_ids: Sequence[int]) -> dict[int, Any]:
    """Person row id -> (public_id, email) of these people."""
    if not user_ids:
        return {}
    query = select(users.c.id, users.c.public_id, users.c.email).where(users.c.id.in_(list(user_ids)))
    with engine.connect() as conn:
        return {row.id: (row.public_id, row.email) for row in conn.execute(query)}


def keys_spend(engine: Engine, key_ids: Sequence[int], start: datetime, end: datetime) -> int:
    """What these keys spent from ``start`` to ``end`` (settled requests, the ledger)."""
    if not key_ids:
        return 0
    query = select(func.coalesce(func.sum(ledger.c.cost_micros), 0)).where(
        ledger.c.key_id.in_(list(key_ids)), ledger.c.created_at >= start, ledger.c.created_at < end
    )
    with engine.connect() as conn:
        return int(conn.execute(query).scalar() or 0)


def group_public_ids(engine: Engine) -> dict[int, str]:
    """Group row id -> its public id (``group_…``), for every group."""
    with engine.connect() as conn:
        return {row.id: row.public_id for row in conn.execute(select(idp_groups.c.id, idp_groups.c.public_id))}


def all_key_ids(engine: Engine) -> set[int]:
    """The row id of every key."""
    with engine.connect() as conn:
        return {int(k) for k in conn.execute(select(api_keys.c.id)).scalars()}


def find_group_ids(engine: Engine, refs: Sequence[str]) -> set[int]:
    """The row ids of the groups named (public id ``group_…`` or name) in ``refs``."""
    if not refs:
        return set()
    query = select(idp_groups.c.id).where(idp_groups.c.public_id.in_(list(refs)) | idp_groups.c.name.in_(list(refs)))
    with engine.connect() as conn:
        return {int(g) for g in conn.execute(query).scalars()}
