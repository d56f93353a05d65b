"""``ezat-compat demo``: the newcomer's command. No configuration, no network needed.

It makes a data folder with a SQLite database and a config file, starts the simulator as the
upstream (or uses Anthropic itself when ``ANTHROPIC_API_KEY`` is set, unless ``--simulator``
says otherwise: it says which before it starts), creates a demo organisation and key, serves
the gateway under gunicorn and prints a curl line that works as pasted. The admin API is served
on the same address (``[admin] on_main_listener``: one loopback port, nothing more to free) with
an admin key made for the demo, both printed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from ezat_compat.config import load_config
from ezat_compat.server.serving import gunicorn_argv, serving_environment

DEMO_MODEL = "anthropic/claude-sonnet-5-5"
DEMO_ORG = "demo"
DEMO_BALANCE_MICROS = 100_000_000  # $100 of simulated credit
SIM_KEY_ENV = "EZAT_DEMO_UPSTREAM_KEY"  # the simulator accepts any non-empty key

CATALOG = """\
# Written by `ezat-compat demo`: a small configuration file. Every key, with its default and what
# it does, is in deploy/ezat.example.toml and docs/config.md.
[gateway]
database_url = "sqlite:///{db}"
keepalive_s = 15

[server]
bind = "{bind}"
workers = 1
drain_s = 0  # no load balancer in front of the demo: Ctrl-C stops it at once

[admin]
bind = ""                # no listener of its own: the demo's admin API is on its one loopback address
on_main_listener = true

[[models]]
id = "anthropic/claude-sonnet-5-5"
aliases = ["claude-sonnet-5-5", "claude-sonnet-5.5", "claude-sonnet-*"]
context_window = 200000
max_output_tokens = 64000
sampling = false
efforts = ["low", "medium", "high", "xhigh", "max"]
thinking = "adaptive"
prefill = false
price = {{ input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }}

[[models.deployments]]
name = "{deployment}"
base_url = "{base_url}"
api_key_env = "{key_env}"{egress}
upstream_model = "claude-sonnet-5-5"

[[models]]
id = "anthropic/claude-opus-5-5"
aliases = ["claude-opus-5-5", "claude-opus-5.5", "claude-opus-*"]
context_window = 200000
max_output_tokens = 128000
efforts = ["low", "medium", "high", "xhigh", "max"]
price = {{ input = 5.0, output = 25.0, cache_write = 6.25, cache_read = 0.50 }}

[[models.deployments]]
name = "{deployment}"
base_url = "{base_url}"
api_key_env = "{key_env}"{egress}
upstream_model = "claude-opus-5-5"

[[models]]
id = "anthropic/claude-haiku-4-5"
aliases = ["claude-haiku-4-5", "claude-haiku-4.5", "claude-haiku-*"]
context_window = 200000
max_output_tokens = 64000
sampling = true
efforts = ["low", "medium", "high"]
thinking = "budget"
prefill = true
price = {{ input = 1.0, output = 5.0, cache_write = 1.25, cache_read = 0.10 }}

[[models.deployments]]
name = "{deployment}"
base_url = "{base_url}"
api_key_env = "{key_env}"{egress}
upstream_model = "claude-haiku-4-5"
"""


CLOUDS_MODEL = "anthropic/claude-clouds"
CLOUDS_CATALOG = """
# `demo --clouds`: one model on two clouds, both spoken by simulators. Bedrock (tier 0) is
# throttled (every answer 503), so each request fails over to Vertex AI (tier 1).
[[models]]
id = "{model}"
aliases = ["claude-clouds"]
context_window = 200000
max_output_tokens = 64000
efforts = ["low", "medium", "high", "xhigh", "max"]
thinking = "adaptive"
price = {{ input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }}

[[models.deployments]]
name = "bedrock-us-east-1"
provider = "bedrock"
region = "us-east-1"
base_url = "{bedrock_url}"  # the simulator speaking Bedrock (SigV4 checked); default: Bedrock's regional endpoint
upstream_model = "anthropic.claude-sonnet-5-5-v1:0"
priority = 0
proxy = ""

[[models.deployments]]
name = "vertex-us-east5"
provider = "vertex"
project = "ezat-demo"
region = "us-east5"
base_url = "{vertex_url}"  # the simulator speaking Vertex AI (OAuth tokens from its /token)
upstream_model = "claude-sonnet-5-5@20260101"
priority = 1
proxy = ""
"""


class DemoError(Exception):
    """The demo could not start; the message says why and what to do."""


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def start_simulator(*extra: str, bind: str = "127.0.0.1:0") -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m ezat_compat.sim`` on ``bind`` (default: a free loopback port); returns
    (process, base URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ezat_compat.sim", "--bind", bind, *extra], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if "listening on " not in line:
        proc.kill()
        raise DemoError(f"the simulator did not start: {line or 'no output'}")
    return proc, line.rsplit("listening on ", 1)[1]


# The gateway is on loopback: its health is asked directly, whatever HTTP_PROXY says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_healthy(url: str, proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoError("the gateway exited during start-up (see the messages above)")
        try:
            with _DIRECT.open(url + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise DemoError(f"the gateway did not answer on {url} within {timeout_s:g} s")


def curl_line(base: str, key: str, *, model: str = DEMO_MODEL) -> str:
    body = json.dumps(
        {
            "model": model,
            "max_completion_tokens": 64,
            "messages": [{"role": "user", "content": "What is a prompt cache?"}],
        }
    )
    return (
        f"curl {base}/openai/v1/chat/completions -H 'Authorization: Bearer {key}' "
        f"-H 'content-type: application/json' -d '{body}'"
    )


def clouds_notice(base: str, key: str, config_path: Path) -> str:
    """What ``--clouds`` adds to the demo's greeting: the model on two clouds and how to see the failover."""
    return (
        f"\nOn the clouds: model {CLOUDS_MODEL} is on Amazon Bedrock (throttled: every answer 503) and on\n"
        "Google Vertex AI; each request fails over from Bedrock to Vertex. Try it, then see its ledger row\n"
        f'say "deployment": "vertex-us-east5" in `{command_name()} --config {config_path} usage --json`:\n\n'
        f"  {curl_line(base, key, model=CLOUDS_MODEL)}\n\n"
    )


class _Stop(Exception):
    """SIGTERM (or SIGHUP) reached the demo: stop what it started, as Ctrl-C does."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _check_bind(flag: str, bind: str, *, any_port: bool = False) -> None:
    host, _, port_text = bind.rpartition(":")
    if not host or not port_text.isdigit():
        raise DemoError(f"{flag} {bind!r}: use HOST:PORT, e.g. 127.0.0.1:8080")
    if (int(port_text) or not any_port) and not _port_free(host, int(port_text)):
        raise DemoError(f"{bind} is already in use; pass {flag} 127.0.0.1:PORT with a free port")


def stop_process(proc: subprocess.Popen[str] | subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """Stop a child: SIGTERM (gunicorn: graceful), then after ``grace_s`` SIGINT (gunicorn: quick),
    then SIGKILL; every wait bounded."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGINT, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def uses_anthropic(simulator: bool, environ: Mapping[str, str]) -> bool:
    """Whether the demo's upstream is Anthropic's API: ``ANTHROPIC_API_KEY`` is set and
    ``--simulator`` wasn't given."""
    return bool(environ.get("ANTHROPIC_API_KEY")) and not simulator


def upstream_notice(simulator: bool, environ: Mapping[str, str]) -> str:
    """The line the demo prints first: which upstream it uses, and how to choose the other."""
    if uses_anthropic(simulator, environ):
        return (
            "ezat-compat demo: ANTHROPIC_API_KEY is set, so the upstream is Anthropic's API "
            "(https://api.anthropic.com; needs the network); pass --simulator to use the bundled simulator."
        )
    why = "--simulator" if simulator and environ.get("ANTHROPIC_API_KEY") else "no ANTHROPIC_API_KEY"
    return f"ezat-compat demo: the upstream is the bundled simulator ({why}; no network needed)."


def command_name() -> str:
    """How to run ``ezat-compat`` as pasted: the script beside this interpreter (a venv's
    ``bin/``, which needn't be on PATH), else the bare name."""
    script = Path(sys.executable).with_name("ezat-compat")
    return str(script) if script.exists() else "ezat-compat"


def clouds_setup(root: Path) -> dict[str, str]:
    """``--clouds``: the credentials the simulator accepts — a Google service account made here
    (its key written 0600 in the demo's folder, its token endpoint the simulator's) and the
    simulator's AWS test keys — as the gateway's environment; botocore and google-auth must be
    installed (the ``bedrock`` and ``vertex`` extras)."""
    missing = [name for name in ("botocore", "google.auth") if _missing(name)]
    if missing:
        raise DemoError(
            f"--clouds needs {' and '.join(missing)}: pip install -e '.[bedrock,vertex]' (the cloud providers' extras)"
        )
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from ezat_compat.datafiles import private_file
    from ezat_compat.sim.clouds import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY

    folder = root / "clouds"
    folder.mkdir(mode=0o700, exist_ok=True)
    account = folder / "service-account.json"
    if not account.exists():
        pem = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
            .decode()
        )
        private_file(str(account))
        account.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": "ezat-demo",
                    "private_key_id": "demo-key-1",
                    "private_key": pem,
                    "client_email": "gateway@ezat-demo.iam.gserviceaccount.com",
                    "client_id": "1",
                    "token_uri": "",  # set to the simulator's /token when it is up
                }
            )
        )
    empty = folder / "aws-config"
    empty.touch()
    return {
        "AWS_ACCESS_KEY_ID": SIM_AWS_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SIM_AWS_SECRET_ACCESS_KEY,
        "AWS_CONFIG_FILE": str(empty),  # never the user's own AWS profiles
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
        "AWS_EC2_METADATA_DISABLED": "true",
        "GOOGLE_APPLICATION_CREDENTIALS": str(account),
    }


def _missing(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


def _point_tokens_at(account: Path, token_uri: str) -> None:
    data = json.loads(account.read_text())
    data["token_uri"] = token_uri
    account.write_text(json.dumps(data))


def run_demo(
    *, bind: str, directory: str, sim_bind: str = "127.0.0.1:0", simulator: bool = False, clouds: bool = False
) -> int:
    """Serve the demo until Ctrl-C, SIGTERM or SIGHUP; then stop the gateway and the simulators
    it started, whichever way it ends (also when start-up fails). ``simulator``: the simulator
    even when ``ANTHROPIC_API_KEY`` is set. ``clouds``: also a model on Bedrock (throttled)
    failing over to Vertex AI, both spoken by simulators."""
    _check_bind("--bind", bind)
    _check_bind("--sim-bind", sim_bind, any_port=True)
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)

    # SIGINT too: a demo started with SIGINT ignored (nohup, a background job) still stops on Ctrl-C
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    sim: subprocess.Popen[str] | None = None
    throttled: subprocess.Popen[str] | None = None
    gateway: subprocess.Popen[bytes] | None = None
    try:
        env: dict[str, str] = {}
        egress = ""  # Anthropic's API: the environment's proxy, as every requests program
        if clouds and uses_anthropic(simulator, os.environ):
            raise DemoError("--clouds runs on the simulators: add --simulator (ANTHROPIC_API_KEY is set)")
        if clouds:
            env.update(clouds_setup(root))
        print(upstream_notice(simulator, os.environ), flush=True)
        if uses_anthropic(simulator, os.environ):
            base_url, deployment, key_env = "https://api.anthropic.com", "anthropic", "ANTHROPIC_API_KEY"
        else:
            egress = '\nproxy = ""  # the simulator is on loopback: never through a company proxy'
            google = ("--google-service-account", env["GOOGLE_APPLICATION_CREDENTIALS"]) if clouds else ()
            sim, base_url = start_simulator("--name", "demo-sim", "--token-delay-ms", "15", *google, bind=sim_bind)
            deployment, key_env = "simulator", SIM_KEY_ENV
            env[SIM_KEY_ENV] = "demo-upstream-key"
        catalog = CATALOG.format(
            db=(root / "ezat.db").as_posix(),
            bind=bind,
            base_url=base_url,
            deployment=deployment,
            key_env=key_env,
            egress=egress,
        )
        if clouds:
            _point_tokens_at(Path(env["GOOGLE_APPLICATION_CREDENTIALS"]), base_url + "/token")
            throttled, bedrock_url = start_simulator("--name", "demo-bedrock", "--fail-status", "503")
            catalog += CLOUDS_CATALOG.format(model=CLOUDS_MODEL, bedrock_url=bedrock_url, vertex_url=base_url)
        config_path = root / "ezat.toml"
        config_path.write_text(catalog)
        config = load_config(config_path, environ={**os.environ, **env})
        key, admin_key = _demo_keys(config.gateway.database_url)
        gateway = subprocess.Popen(gunicorn_argv(config), env={**serving_environment(config, bind=bind), **env})
        base = f"http://{bind}"
        wait_healthy(base, gateway)
        upstream = "Anthropic's API" if sim is None else f"the simulator at {base_url}"
        print(
            f"""
ezat-compat demo: the gateway is serving on {base}, with {upstream} as its upstream.

  API key (organization "{DEMO_ORG}"):  {key}

Try it:

  {curl_line(base, key)}

Or with the OpenAI SDK: OpenAI(base_url="{base}/openai/v1", api_key="{key}")
Or as an Anthropic base URL (the anthropic SDK, Claude Code):  ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY={key}
Admin commands use this demo's config:  {command_name()} --config {config_path} usage
The admin API (Anthropic's Admin API shapes: the anthropic SDK's client.organization…) is at
{base}/v1/organizations with the admin key  {admin_key}
  e.g.  curl {base}/v1/organizations/workspaces -H 'x-api-key: {admin_key}'
{clouds_notice(base, key, config_path) if clouds else ""}Press Ctrl-C to stop.
""",
            flush=True,
        )
        return gateway.wait()
    except (KeyboardInterrupt, _Stop):
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in (gateway, sim, throttled):
            if proc is not None:
                stop_process(proc)
        for started in (sim, throttled):
            if started is not None and started.stdout is not None:
                started.stdout.close()


def _demo_keys(database_url: str) -> tuple[str, str]:
    """The demo organisation's new key and a new admin key (the organisation made on first use)."""
    from ezat_compat.admin.service import cli_context, create_admin_key
    from ezat_compat.store.accounts import StoreError
    from ezat_compat.store.db import DatabaseUnavailable, SchemaError, prepare_database
    from ezat_compat.store.store import open_store

    try:
        prepare_database(database_url)  # the demo creates or migrates its database, as serve does
        store = open_store(database_url)
    except (DatabaseUnavailable, SchemaError) as exc:
        raise DemoError(str(exc)) from None
    try:
        accounts = store.accounts
        try:
            accounts.get_org(DEMO_ORG)
        except StoreError:
            accounts.create_org(DEMO_ORG, DEMO_BALANCE_MICROS)
        _, secret = accounts.create_key(DEMO_ORG, name="demo")
        _, admin_secret = create_admin_key(store, cli_context(), name="demo")
        return secret, admin_secret
    finally:
        store.close()
