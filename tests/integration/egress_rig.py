"""Real egress programs on loopback for ``test_egress.py``: a forward proxy (tinyproxy), a
private CA and its certificates, the simulator served over TLS and mTLS (gunicorn's own TLS),
a small image server, and a gateway whose deployments carry the egress keys.

Everything listens on 127.0.0.1 only; every wait is bounded; every process is stopped by the
object that started it.
"""

from __future__ import annotations

import datetime
import io
import ipaddress
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import certifi
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from PIL import Image

from tests.conftest import IN_CI, free_port
from tests.integration.harness import Gateway, ModelSpec, listening_ports

# What every requests program reads from its environment: scrubbed from the gateway's
# environment unless a test sets it (this machine's own REQUESTS_CA_BUNDLE included).
EGRESS_VARS = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)
START_TIMEOUT_S = 20.0


def require_program(name: str, package: str) -> str:
    """The program's path; outside CI a missing program skips the test, under CI=true it fails
    (``.ci/run`` installs it)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin:/usr/local/bin:/sbin")
    if path:
        return path
    reason = f"{name} is not installed (Debian package {package})"
    if IN_CI:
        pytest.fail(f"{reason}, and CI=true requires it (.ci/run installs it)")
    pytest.skip(f"{reason}; these tests run the real {name} in CI")


def _stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = 10) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


def _wait_listening(proc: subprocess.Popen[Any], port: int, what: str, timeout_s: float = START_TIMEOUT_S) -> bool:
    """True once ``proc`` itself listens on ``port``; False if it exited (the port was taken)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if port in listening_ports(proc.pid):
            return True
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s} s")


# ---------------------------------------------------------------- tinyproxy

TINYPROXY_CONF = """\
Listen 127.0.0.1
Port {port}
Timeout 120
MaxClients 200
LogFile "{log}"
LogLevel Info
PidFile "{pid}"
Allow 127.0.0.1
{auth}"""
# No ConnectPort line: tinyproxy 1.11 then allows CONNECT to every port ("If no ConnectPort
# line is found, all ports are allowed", its tinyproxy.conf); no User line: it keeps the user
# that started it. It adds "Via: 1.1 tinyproxy (tinyproxy/1.11.1)" to what it forwards.

# "CONNECT   Dec 03 13:20:21.294 [8537]: Request (file descriptor 5): GET http://127.0.0.1:18999/ HTTP/1.1"
_REQUEST_LINE = re.compile(r"Request \(file descriptor \d+\): (\S+) (\S+) HTTP/1\.[01]")


@dataclass
class Tinyproxy:
    """tinyproxy in the foreground (``-d``) on a free 127.0.0.1 port with its own config and
    access log (``LogLevel Info`` records every request line). ``auth``: ``BasicAuth`` user and
    password: requests without them get tinyproxy's 407."""

    root: Path
    auth: tuple[str, str] | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.root / "tinyproxy.log"

    @property
    def url(self) -> str:
        """The proxy's URL without credentials."""
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def start(self) -> Tinyproxy:
        binary = require_program("tinyproxy", "tinyproxy")
        self.root.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):
            self.port = free_port()
            conf = self.root / "tinyproxy.conf"
            auth = f"BasicAuth {self.auth[0]} {self.auth[1]}\n" if self.auth else ""
            conf.write_text(
                TINYPROXY_CONF.format(port=self.port, log=self.log_path, pid=self.root / "tinyproxy.pid", auth=auth)
            )
            self._out = (self.root / "tinyproxy.out").open("ab")
            self.proc = subprocess.Popen(
                [binary, "-d", "-c", str(conf)], stdout=self._out, stderr=subprocess.STDOUT, cwd=self.root
            )
            if _wait_listening(self.proc, self.port, "tinyproxy"):
                return self
            self.stop()
        raise RuntimeError(f"tinyproxy did not start; see {self.root}/tinyproxy.out and {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
        if self._out is not None:
            self._out.close()
            self._out = None

    def mark(self) -> int:
        """Where the log ends now: ``requests_since(mark)`` reads what came after."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def requests_since(self, mark: int) -> list[tuple[str, str]]:
        """(method, target) of every request line logged after ``mark``: ``POST
        http://127.0.0.1:PORT/v1/messages`` for plain HTTP, ``CONNECT 127.0.0.1:PORT`` for a tunnel."""
        with self.log_path.open("rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        return [(m.group(1), m.group(2)) for m in _REQUEST_LINE.finditer(text)]


# ---------------------------------------------------------------- a private CA


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


@dataclass
class PKI:
    """A CA made for the test and what it signs, as PEM files in ``root``: ``ca`` (the CA's
    certificate), ``server_cert``/``server_key`` (127.0.0.1 and localhost), ``client_cert``/
    ``client_key`` (client authentication), ``bundle`` (certifi's bundle plus the CA)."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "server-key.pem"

    @property
    def client_cert(self) -> Path:
        return self.root / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.root / "client-key.pem"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle.pem"

    def make(self) -> PKI:
        self.root.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("ezat egress test CA"))
            .issuer_name(_name("ezat egress test CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        self.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        self.bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + self.ca.read_bytes())

        def leaf(common_name: str, usage: x509.ObjectIdentifier, san: Sequence[x509.GeneralName]) -> tuple[bytes, Any]:
            key = ec.generate_private_key(ec.SECP256R1())
            builder = (
                x509.CertificateBuilder()
                .subject_name(_name(common_name))
                .issuer_name(ca_cert.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            )
            if san:
                builder = builder.add_extension(x509.SubjectAlternativeName(list(san)), critical=False)
            return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM), key

        server_pem, server_key = leaf(
            "127.0.0.1",
            ExtendedKeyUsageOID.SERVER_AUTH,
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
        )
        self.server_cert.write_bytes(server_pem)
        _write_key(server_key, self.server_key)
        client_pem, client_key = leaf("ezat-gateway", ExtendedKeyUsageOID.CLIENT_AUTH, [])
        self.client_cert.write_bytes(client_pem)
        _write_key(client_key, self.client_key)
        return self

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """A server's TLS context with the 127.0.0.1 certificate; ``require_client_cert``: a
        client certificate the CA signed is required (mTLS)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca)
        return context


# ---------------------------------------------------------------- the simulator over TLS

EMPTY_GUNICORN_CONF = "# no settings: everything is on the command line\n"


@dataclass
class TlsSim:
    """The simulator's WSGI app (``ezat_compat.sim.app:make_app()``, default settings) under
    gunicorn with a gevent worker and gunicorn's own TLS (``--certfile``/``--keyfile``); with
    ``mtls`` it also requires a client certificate signed by the CA (``--ca-certs``,
    ``--cert-reqs 2``: ``ssl.CERT_REQUIRED``)."""

    root: Path
    pki: PKI
    mtls: bool = False
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "gunicorn-sim.log"

    def session(self) -> requests.Session:
        """A requests session that trusts the CA (and shows the client certificate for mTLS)."""
        s = requests.Session()
        s.trust_env = False
        s.verify = str(self.pki.ca)
        if self.mtls:
            s.cert = (str(self.pki.client_cert), str(self.pki.client_key))
        return s

    def start(self) -> TlsSim:
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "gunicorn.conf.py"
        conf.write_text(EMPTY_GUNICORN_CONF)
        tls = ["--certfile", str(self.pki.server_cert), "--keyfile", str(self.pki.server_key)]
        if self.mtls:
            tls += ["--ca-certs", str(self.pki.ca), "--cert-reqs", "2"]
        env = {k: v for k, v in os.environ.items() if k not in EGRESS_VARS}
        for _attempt in range(3):
            self.port = free_port()
            self._log = self.log_path.open("ab")
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "-c",
                    str(conf),
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    "1",
                    "--worker-class",
                    "gevent",
                    "--log-level",
                    "warning",
                    *tls,
                    "ezat_compat.sim.app:make_app()",
                ],
                cwd=self.root,
                env=env,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            if _wait_listening(self.proc, self.port, "the TLS simulator") and self._healthy():
                return self
            self.stop()
        raise RuntimeError(f"the TLS simulator did not start; see {self.log_path}")

    def _healthy(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.session() as s:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    return False
                with suppress(requests.RequestException):
                    if s.get(self.url + "/healthz", timeout=2).status_code == 200:
                        return True
                time.sleep(0.05)
        raise RuntimeError(f"{self.url} did not become healthy in {timeout_s} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, signal.SIGINT)
        if self._log is not None:
            self._log.close()
            self._log = None

    def bodies(self) -> list[dict[str, Any]]:
        with self.session() as s:
            records = s.get(self.url + "/_sim/requests", timeout=5).json()["requests"]
        return [r["body"] for r in records if r["path"] == "/v1/messages"]


# ---------------------------------------------------------------- small HTTP servers


def small_png(size: int = 16) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), (200, 40, 90)).save(out, format="PNG")
    return out.getvalue()


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return


class _TlsHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose connections are TLS (the handshake in the handler's thread);
    a client that gives up the handshake is not an error of the test's server."""

    context: ssl.SSLContext

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError)):
            super().handle_error(request, client_address)


class RecordingServer:
    """A threaded HTTP server on a free 127.0.0.1 port that answers every request with one
    fixed ``status``, ``content_type`` and ``body``, and records the paths it saw; with
    ``context`` (``PKI.server_context``) it speaks HTTPS."""

    def __init__(self, status: int, content_type: str, body: bytes, context: ssl.SSLContext | None = None) -> None:
        self.paths: list[str] = []
        self.scheme = "https" if context is not None else "http"
        self._lock = threading.Lock()
        server = self

        class Handler(_Quiet):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                with server._lock:
                    server.paths.append(self.path)
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = _answer
            do_POST = _answer

        if context is not None:
            tls = _TlsHTTPServer(("127.0.0.1", 0), Handler)
            tls.context = context
            self.httpd: ThreadingHTTPServer = tls
        else:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def seen(self, needle: str) -> list[str]:
        with self._lock:
            return [p for p in self.paths if needle in p]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


# ---------------------------------------------------------------- the gateway with egress keys


EgressModel = ModelSpec  # the harness writes a deployment's further keys (proxy, ca_file, …) as given


def egress_model(name: str, *deployments: dict[str, Any]) -> EgressModel:
    return EgressModel(id=f"egress/{name}", aliases=(f"egress-{name}",), deployments=deployments)


@contextmanager
def scrubbed_environ() -> Iterator[None]:
    """``os.environ`` without ``EGRESS_VARS`` for the duration (the harness copies it into the
    gateway's environment); the variables the test wants go in ``Gateway.env``."""
    saved = {k: os.environ.pop(k) for k in EGRESS_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@dataclass
class EgressGateway(Gateway):
    """The harness's gateway (gunicorn, gevent), started and run (its CLI too) with none of the
    egress variables but those of ``env``."""

    def start(self) -> EgressGateway:
        with scrubbed_environ():
            super().start()
        return self

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        with scrubbed_environ():
            return super().cli(*args, check=check)

    def lines_after(self, mark: int) -> list[str]:
        """The gateway's log lines written after byte ``mark`` of its log."""
        with self.log_path.open("rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace").splitlines()

    def log_mark(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0


def wait_for(check: Any, timeout_s: float = 5.0, interval_s: float = 0.05) -> Any:
    """Poll ``check()`` until it returns something truthy (returned) or ``timeout_s`` passes
    (then its last value is returned)."""
    deadline = time.monotonic() + timeout_s
    value = check()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = check()
    return value
