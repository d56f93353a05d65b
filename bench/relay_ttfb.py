"""Where a stream's time to first byte goes, phase by phase.

The app built as ``create_app`` builds it (SQLite in a temporary folder), in this process under
gevent, in front of the real simulator (a subprocess, fast mode); streamed chat completions sent
one at a time through the WSGI interface, each timed from the call to its first chunk, with the
moments its phases end (the pipeline's steps, the upstream call's head and first event, the
session) noted by wrappers set here. Prints the median moment of each phase, in µs.

    .venv/bin/python bench/relay_ttfb.py [--requests N]
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from servers import Fleet  # noqa: E402

CONFIG = """
[gateway]
database_url = "sqlite:///{db}"
[[models]]
id = "anthropic/claude-sonnet-5-5"
aliases = ["claude-sonnet-5-5"]
price = {{ input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }}
[[models.deployments]]
name = "sim"
base_url = "{sim}"
upstream_model = "claude-sonnet-5-5"
proxy = ""
"""

marks: dict[str, float] = {}


def noted(owner: Any, name: str, label: str, at_entry: bool = False) -> None:
    """Wrap ``owner.name`` to note when it ends (or starts) as ``label``."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if at_entry:
            marks.setdefault(label, time.perf_counter())
        out = inner(*args, **kwargs)
        if not at_entry:
            marks.setdefault(label, time.perf_counter())
        return out

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args(argv)
    from ezat_compat import pipeline
    from ezat_compat.app import create_app
    from ezat_compat.config import load_config
    from ezat_compat.server.serving import prepare_database
    from ezat_compat.session import StreamSession
    from ezat_compat.upstream import client

    noted(pipeline.Gateway, "handle", "handle", at_entry=True)
    noted(pipeline.Gateway, "admit", "admitted")
    noted(pipeline.Gateway, "open_stream", "open_stream", at_entry=True)
    noted(client.UpstreamClient, "_send", "upstream head")
    noted(client.UpstreamStream, "first", "first event")
    noted(StreamSession, "__init__", "session")
    noted(pipeline.Gateway, "handle", "handled")
    from ezat_compat.api import common, sse

    noted(common, "stream_response", "response made")
    noted(sse.StreamBody, "__iter__", "body iterated", at_entry=True)
    with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp)) as fleet:
        _, sim_url = fleet.start_sim()
        root = Path(tmp)
        path = root / "ezat.toml"
        path.write_text(CONFIG.format(db=(root / "ezat.db").as_posix(), sim=sim_url))
        os.environ["ANTHROPIC_API_KEY"] = "sk-ant-bench"
        config = load_config(path)
        prepare_database(config)
        app = create_app(config)
        gw = app.extensions["ezat"]
        gw.accounts.create_org("ttfb", 100_000_000)
        secret = next(x for x in gw.accounts.create_key("ttfb") if isinstance(x, str) and x.startswith("ezat_sk_"))
        client_ = app.test_client()
        body = {
            "model": "claude-sonnet-5-5",
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}],
            "max_tokens": 64,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {secret}"}
        rows: list[dict[str, float]] = []
        for i in range(args.requests + 50):
            marks.clear()
            started = time.perf_counter()
            resp = client_.post("/openai/v1/chat/completions", json=body, headers=headers, buffered=False)
            chunks = iter(resp.response)
            next(chunks)
            first_byte = time.perf_counter()
            for _ in chunks:
                pass
            resp.close()
            if i >= 50:  # warm
                row = {k: (v - started) * 1e6 for k, v in marks.items()}
                row["first byte"] = (first_byte - started) * 1e6
                rows.append(row)
    order = [
        "handle", "admitted", "open_stream", "upstream head", "first event", "session", "handled",
        "response made", "body iterated", "first byte",
    ]  # fmt: skip
    print(f"{len(rows)} streamed requests, c=1: median moment each phase ends (µs from the call)")
    last = 0.0
    for label in order:
        values = [r[label] for r in rows if label in r]
        if not values:
            continue
        at = statistics.median(values)
        print(f"  {label:14} {at:8.0f}   (+{at - last:6.0f})")
        last = at
    return 0


if __name__ == "__main__":
    sys.exit(main())
