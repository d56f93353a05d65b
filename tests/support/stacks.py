"""The database stacks of the gateway tests that run on SQLite and on PostgreSQL with Redis: a
PostgreSQL schema of the test's own and a Redis database flushed before and after, each undone by
the caller's ``ExitStack``.

    with ExitStack() as cleanup:
        database_url = postgres_schema(cleanup, request.getfixturevalue("postgres_url"), "ezat_people")
        redis_url = flushed_redis(cleanup, request.getfixturevalue("redis_url"), 12)
"""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from urllib.parse import urlsplit

import redis
from sqlalchemy import create_engine, make_url, text


def schema_url(base_url: str, schema: str) -> str:
    """``base_url`` whose connections use ``schema`` (``search_path``)."""
    return (
        make_url(base_url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )


def postgres_schema(cleanup: ExitStack, base_url: str, prefix: str) -> str:
    """A new schema ``<prefix>_<random>`` on the server of ``base_url``, dropped (with all it
    holds) when ``cleanup`` closes; returns the URL whose connections use it."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    cleanup.callback(admin.dispose)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop_schema() -> None:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))

    cleanup.callback(drop_schema)
    return schema_url(base_url, schema)


def flushed_redis(cleanup: ExitStack, base_url: str, db: int) -> str:
    """The URL of database ``db`` of the Redis server of ``base_url``, flushed now and again when
    ``cleanup`` closes (a number no other suite uses)."""
    url = urlsplit(base_url)._replace(path=f"/{db}").geturl()
    client = redis.Redis.from_url(url)
    cleanup.callback(client.close)
    cleanup.callback(client.flushdb)
    client.flushdb()
    return url
