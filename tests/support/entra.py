"""A Microsoft Entra ID token endpoint on loopback, for azure-identity's ``ClientSecretCredential``.

azure-identity takes only an https authority, so the endpoint serves TLS with a self-signed
certificate made here (``cryptography``); a deployment trusts it through its ``ca_file``. It
answers what MSAL asks of an authority for the client-credentials grant: the tenant's OpenID
configuration (``GET /{tenant}/v2.0/.well-known/openid-configuration``) and the token endpoint
(``POST /{tenant}/oauth2/v2.0/token``, RFC 6749's client credentials, Entra's v2.0 form), which
issues ``token`` for the known client's secret and answers ``invalid_client`` (401) otherwise.
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from tests.support.tls import self_signed

TENANT = "00000000-0000-0000-0000-00000000e2a1"
CLIENT_ID = "11111111-1111-1111-1111-11111111c11e"
CLIENT_SECRET = "entra-test-secret"


@dataclass
class EntraEndpoint:
    """The endpoint's state: what it issues and what it was asked (``grants``: the token forms)."""

    folder: Path
    token: str = "entra-token-1"
    expires_in: int = 3600
    grants: list[dict[str, list[str]]] = field(default_factory=list)
    url: str = ""
    ca_file: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> EntraEndpoint:
        cert, key = self_signed(self.folder, "entra-")
        self.ca_file = str(cert)
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                tenant = self.path.split("/")[1]
                base = f"{endpoint.url}/{tenant}"
                self._send(
                    200,
                    {
                        "token_endpoint": base + "/oauth2/v2.0/token",
                        "authorization_endpoint": base + "/oauth2/v2.0/authorize",
                        "issuer": base + "/v2.0",
                    },
                )

            def do_POST(self) -> None:
                form = parse_qs(self.rfile.read(int(self.headers.get("content-length", "0"))).decode())
                endpoint.grants.append(form)
                known = form.get("client_id") == [CLIENT_ID] and form.get("client_secret") == [CLIENT_SECRET]
                if not self.path.startswith(f"/{TENANT}/") or not known:
                    self._send(
                        401, {"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret"}
                    )
                    return
                self._send(
                    200, {"token_type": "Bearer", "expires_in": endpoint.expires_in, "access_token": endpoint.token}
                )

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self.url = f"https://127.0.0.1:{server.server_port}"
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
