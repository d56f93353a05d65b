"""Where an idle stream's memory goes: our gateway under gunicorn (one gevent
worker, as ``bench/relay.py`` runs it), ``--streams`` idle streams opened at once by the load
generator against a stalling simulator, then the worker's Python allocations with every stream
open compared with before (``tracemalloc`` in the worker, ``bench/relay_memory_conf.py``; by the
line that allocated: a greenlet's saved stack is allocated by the switch that saved it), beside
the worker's RSS per stream (higher than ``bench/relay.py``'s: tracemalloc's own records).

    python bench/relay_memory.py [--streams N] [--top N] [--frames N] [--app ours|floor]

The figures find the parts; ``bench/relay.py`` measures the target without tracemalloc.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import litellm_env
import procstats
from run import LOADGEN, PROMPT, anthropic_body, openai_body, write_json
from servers import BENCH, REPO, Fleet, Gateway, free_port, gateway_toml, wait_healthy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--frames", type=int, default=1)
    parser.add_argument("--app", choices=("ours", "floor"), default="ours", help="ours, or the stack floor's app")
    parser.add_argument(
        "--head-wait", action="store_true", help="the streams waiting for the upstream's head (a delay), not idle"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ezat-relay-mem-") as tmp, Fleet(Path(tmp)) as fleet:
        _, sim_url = fleet.start_sim()
        root = fleet.workdir / "gw"
        root.mkdir()
        config = root / "ezat.toml"
        config.write_text(gateway_toml(root / "ezat.db", sim_url, workers=1, keepalive_s=1.0))
        port = free_port()
        trace = root / "trace"
        env = {
            **os.environ,
            "EZAT_CONFIG": str(config),
            "EZAT_BIND": f"127.0.0.1:{port}",
            "EZAT_ADMIN_BIND": "",
            "EZAT_WORKERS": "1",
            "ANTHROPIC_API_KEY": litellm_env.UPSTREAM_KEY,
            "RELAY_TRACE_OUT": str(trace),
            "RELAY_TRACE_FRAMES": str(args.frames),
            "PYTHONPATH": str(BENCH),
        }
        for var in ("PROMETHEUS_MULTIPROC_DIR", "EZAT_DATABASE_URL", "EZAT_REDIS_URL", "EZAT_ACCESS_LOG"):
            env.pop(var, None)
        idle = "delay=8" if args.head_wait else "stall=8"
        texts = {"warm": f"{PROMPT} [[sim:words=12,stall=0.3]]", "idle": f"{PROMPT} [[sim:words=12,{idle}]]"}
        wd = fleet.workdir
        bodies = {k: write_json(wd / f"{k}.json", openai_body(t, stream=True)) for k, t in texts.items()}
        gw = Gateway(proc=None, url="", config=config, workers=1, keepalive_s=1.0)  # type: ignore[arg-type]
        app, expect = "wsgi:app", "[DONE]"
        if args.app == "floor":  # the floor's app, settings and body table (``floor_app.py``)
            upstream = {k: write_json(wd / f"{k}-up.json", anthropic_body(t, stream=True)) for k, t in texts.items()}
            table = write_json(wd / "bodies.json", [[bodies[k].read_text(), upstream[k].read_text()] for k in texts])
            env.update(
                RELAY_BASE_CONF="floor_gunicorn", FLOOR_BIND=f"127.0.0.1:{port}", FLOOR_WORKERS="1",
                FLOOR_UPSTREAM=sim_url, FLOOR_BODIES=str(table), FLOOR_API_KEY=litellm_env.UPSTREAM_KEY,
            )  # fmt: skip
            app, expect = "floor_app:app", "message_stop"
        proc = fleet.spawn(
            args.app, [sys.executable, "-m", "gunicorn", "-c", str(BENCH / "relay_memory_conf.py"), app],
            env=env, cwd=REPO,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url + "/healthz", proc, timeout_s=60)
        gw.proc, gw.url = proc, url
        (worker,) = gw.wait_workers()
        key = gw.new_key() if args.app == "ours" else ""
        route = url + "/openai/v1/chat/completions"
        warm, body = bodies["warm"], bodies["idle"]

        def snapshot(n: int) -> tuple[tracemalloc.Snapshot, int]:
            os.kill(worker, signal.SIGRTMIN + 1)
            path = Path(f"{trace}.{n}")
            while not path.exists():
                time.sleep(0.05)
            time.sleep(0.5)  # written whole
            return tracemalloc.Snapshot.load(str(path)), procstats.rss_bytes(worker)

        def idle(body_file: Path, streams: int, snap: int = 0) -> tuple[tracemalloc.Snapshot, int] | None:
            cmd = [sys.executable, str(LOADGEN), "--url", route, "--body-file", str(body_file), "--mode", "idle"]
            cmd += ["--concurrency", str(streams), "--timeout", "60", "--expect", expect]
            cmd += ["--header", f"authorization: Bearer {key}"] if key else []
            popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
            assert popen.stdout is not None
            got = None
            if snap and args.head_wait:  # every request sent and waiting for its head by then
                time.sleep(4)
                got = snapshot(snap)
            for line in popen.stdout:
                if line.startswith("# all-open") and snap:
                    time.sleep(0.3)
                    got = snapshot(snap)
                elif line.startswith("RESULT ") and '"errors": 0' not in line:
                    print(line[:400], file=sys.stderr)
            popen.wait()
            return got

        idle(warm, 20)
        time.sleep(0.5)
        before, rss_before = snapshot(1)
        taken = idle(body, args.streams, 2)
        assert taken is not None
        after, rss_after = taken
        stats = after.compare_to(before, "lineno")
        total = sum(s.size_diff for s in stats)
        n = args.streams
        print(f"{n} idle streams: worker RSS {(rss_after - rss_before) / n / 1024:.1f} KB each (tracemalloc on), "
              f"Python allocations {total / n / 1024:.1f} KB each")  # fmt: skip
        for stat in stats[: args.top]:
            frame = stat.traceback[0]
            where = f"{frame.filename.removeprefix(str(REPO) + '/')}:{frame.lineno}"
            print(f"  {stat.size_diff / n:9.0f} B  {stat.count_diff / n:6.1f} blocks  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
