"""Serving the simulator: gevent's WSGI server and the command line (``main``).

``main`` monkey-patches gevent before it imports anything that opens sockets, binds, prints
exactly one line ``ezat-sim listening on http://HOST:PORT`` (flushed; with ``--bind HOST:0``
read the port from it) and serves until SIGTERM or SIGINT. One process holds thousands of
concurrent slow streams: each connection is a greenlet, not a thread.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ezat_compat.sim.app import SimConfig
from ezat_compat.sim.shape import EFFORTS
from ezat_compat.sim.validate import ModelCaps

DEFAULT_BIND = "127.0.0.1:8090"
LISTEN_BACKLOG = 4096


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0: any free port) -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port_text)


def _bind(text: str) -> tuple[str, int]:
    try:
        return parse_bind(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def _non_negative(kind: type[int] | type[float]) -> Callable[[str], float]:
    def convert(text: str) -> float:
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
        return value

    convert.__name__ = kind.__name__
    return convert


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _efforts(text: str) -> tuple[str, ...]:
    levels = tuple(level.strip() for level in text.split(",") if level.strip())
    unknown = [level for level in levels if level not in EFFORTS]
    if not levels or unknown:
        raise argparse.ArgumentTypeError(f"expected levels among {','.join(EFFORTS)}, not {text!r}")
    return levels


def build_parser(prog: str = "ezat-sim") -> argparse.ArgumentParser:
    """The simulator's command-line options (reused by ``ezat-compat sim``)."""
    parser = argparse.ArgumentParser(prog=prog, description="Anthropic-compatible Messages API simulator")
    add = parser.add_argument
    add(
        "--bind",
        type=_bind,
        default=parse_bind(DEFAULT_BIND),
        metavar="HOST:PORT",
        help=f"address to listen on (default {DEFAULT_BIND}; port 0 picks a free port)",
    )
    add("--name", default="sim", help="instance name: x-sim-name header and recorded requests (default sim)")
    add("--fail-status", type=int, metavar="N", help="answer /v1/messages with this error status")
    add("--fail-rate", type=_rate, metavar="F", help="share of requests that fail (0..1, default 1.0)")
    add("--seed", type=int, default=0, help="seed of the --fail-rate draw (default 0)")
    add("--retry-after", type=_non_negative(float), metavar="S", help="retry-after seconds on 429/503/529")
    add("--latency-ms", type=_non_negative(int), default=0, metavar="N", help="wait before answering")
    add("--cut-after", type=_non_negative(int), metavar="N", help="streams: drop the connection after N events")
    add(
        "--stall-s",
        type=_non_negative(float),
        default=0.0,
        metavar="S",
        help="streams: silence after message_start and the ping",
    )
    add("--token-delay-ms", type=_non_negative(int), default=0, metavar="N", help="streams: wait between deltas")
    add(
        "--min-cache-tokens",
        type=_non_negative(int),
        default=1024,
        metavar="N",
        help="shortest prompt prefix written to the prompt cache (default 1024)",
    )
    add("--api-key", metavar="KEY", help="accept only this x-api-key (default: any non-empty key)")
    add("--no-prefill", action="store_true", help="refuse a trailing assistant message (400)")
    add(
        "--temperature-with-top-p",
        action="store_true",
        help="accept temperature and top_p together (older models; the default refuses both, as the newest do)",
    )
    add(
        "--efforts",
        type=_efforts,
        default=EFFORTS,
        metavar="LIST",
        help=f"comma-separated output_config.effort levels the model offers (default {','.join(EFFORTS)})",
    )
    add(
        "--max-output-tokens",
        type=_positive,
        default=ModelCaps.max_output_tokens,
        metavar="N",
        help=f"the highest max_tokens the model takes; above it: 400 (default {ModelCaps.max_output_tokens})",
    )
    add(
        "--rpm-limit",
        type=_positive,
        metavar="N",
        help="the organisation's requests a minute (a token bucket, as Anthropic's API keeps it): "
        "anthropic-ratelimit-requests-* on every answer, 429 rate_limit_error past it",
    )
    add(
        "--google-service-account",
        metavar="FILE",
        help="a service-account JSON: /token issues tokens for it, and Vertex AI's paths take only those",
    )
    add(
        "--foundry-bearer",
        metavar="TOKEN",
        help="Foundry's paths take only 'Authorization: Bearer TOKEN' (an Entra ID token), no key",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` an argparse namespace of ``build_parser()`` describes."""
    if args.fail_rate is not None and args.fail_status is None:
        raise ValueError("--fail-rate needs --fail-status")
    return SimConfig(
        name=args.name,
        fail_status=args.fail_status,
        fail_rate=1.0 if args.fail_rate is None else args.fail_rate,
        seed=args.seed,
        retry_after=args.retry_after,
        latency_ms=args.latency_ms,
        cut_after=args.cut_after,
        stall_s=args.stall_s,
        token_delay_ms=args.token_delay_ms,
        min_cache_tokens=args.min_cache_tokens,
        api_key=args.api_key,
        prefill=not args.no_prefill,
        temperature_with_top_p=args.temperature_with_top_p,
        efforts=args.efforts,
        max_output_tokens=args.max_output_tokens,
        google_service_account=args.google_service_account or "",
        rpm_limit=args.rpm_limit,
        foundry_bearer=args.foundry_bearer or "",
    )


def _raise_open_file_limit() -> None:
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # the soft limit stays as it was
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def serve(config: SimConfig, host: str, port: int, *, out: TextIO | None = None) -> None:
    """Bind, announce the address on ``out`` (stdout), serve until SIGTERM/SIGINT.

    Call it in a gevent-monkey-patched process (``main`` patches); it blocks.
    """
    import signal
    import socket

    import gevent
    from gevent.pywsgi import WSGIHandler, WSGIServer

    from ezat_compat.sim.app import make_app

    class NoDelayHandler(WSGIHandler):
        """gevent writes headers and body with two sends; without TCP_NODELAY, Nagle's
        algorithm and the client's delayed ACK add 40 ms to every answer on a kept-alive
        connection (real upstreams don't)."""

        def __init__(self, sock: Any, address: Any, server: Any, rfile: Any = None) -> None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            super().__init__(sock, address, server, rfile)  # type: ignore[call-arg]  # types-gevent omits rfile

    _raise_open_file_limit()
    server = WSGIServer((host, port), make_app(config), log=None, backlog=LISTEN_BACKLOG, handler_class=NoDelayHandler)
    server.start()
    bound_port = server.address[1]
    shown_host = f"[{host}]" if ":" in host else host
    print(f"ezat-sim listening on http://{shown_host}:{bound_port}", file=out or sys.stdout, flush=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, server.stop, 2)
    server.serve_forever()


def main(argv: Sequence[str] | None = None, *, prog: str = "ezat-sim") -> int:
    """Run the simulator from command-line arguments; returns the exit status."""
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    host, port = args.bind
    serve(config, host, port)
    return 0
