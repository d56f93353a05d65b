"""A real OpenID Connect provider on loopback for the console's tests: oidc-provider-mock's Flask
app (discovery, authorization endpoint with a sign-in form, token endpoint, JWKS, userinfo)
served by werkzeug in a process of its own (``python -m tests.support.oidc``), on a free
127.0.0.1 port. A process, not a thread of the test's: the provider's library (Authlib) warns of
its own deprecations while it serves, which the suite's ``filterwarnings = error`` would turn into
failed requests.

    with loopback_idp() as idp:
        idp.add_user("alice", name="Alice Admin", email="alice@example.com", groups=["platform-admins"])
        identity = idp.identity_toml(admins=["platform-admins"])  # the gateway's [identity] table
        ...
        response = idp.sign_in(session, gateway.admin_url + "/console/auth/login", "alice")

- ``issuer`` is ``http://127.0.0.1:<port>``: the provider names itself after the host it is asked
  on, so the gateway and the browser both reach it by that address (never ``localhost``).
- It accepts any client id, client secret and redirect URI, and requires a ``nonce`` in the
  authorization request. It does not verify PKCE: ``authorizations()`` lists each authorization
  request's parameters (``code_challenge``, ``code_challenge_method``, ``state``, ``nonce``…)
  so a test can check what the gateway sent.
- The ID token carries every claim of the user (``groups`` included) and ``name``/``email`` when
  the scopes ``profile``/``email`` are asked.
- ``jwt_for(sub)`` runs the authorization code flow with plain ``requests`` (no gateway) and
  returns the provider's ID token: a JWT signed with its key, for services that hold one
  (``audience`` is the client id it is asked for; ``loopback_idp(token_max_age_s=...)`` makes
  short-lived ones). ``jwks()`` is the provider's key set as published.
- In a browser, the provider's sign-in page has one text input ``sub`` and a button
  "Authorize": fill in a subject added with ``add_user`` (tests/browser/conftest.py does).
  A subject never added signs in with the claims ``{"email": <subject>}`` only (no groups).
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import requests

REPO = Path(__file__).resolve().parents[2]
AUTHORIZE_PATH = "/oauth2/authorize"
AUTHORIZATIONS_PATH = "/_test/authorizations"  # this module's own: the authorization requests seen
TOKEN_PATH = "/oauth2/token"
JWKS_PATH = "/jwks"
JWT_REDIRECT_URI = "http://127.0.0.1:9/callback"  # never visited: the code is read from the redirect


@dataclass
class LoopbackIdP:
    """A running provider (see ``loopback_idp``)."""

    issuer: str
    client_id: str = "ezat-gateway"
    client_secret: str = "loopback-secret"  # any secret is accepted; the gateway reads it from its env

    def authorizations(self) -> list[dict[str, str]]:
        """The query parameters of each authorization request the provider was sent, oldest first."""
        return list(requests.get(self.issuer + AUTHORIZATIONS_PATH, timeout=5).json())

    def add_user(
        self,
        sub: str,
        *,
        name: str = "",
        email: str = "",
        groups: Sequence[str] = (),
        **claims: Any,
    ) -> None:
        """Add (or replace) the person whose subject is ``sub``, with these claims in the ID token."""
        body: dict[str, Any] = {"name": name or sub, "email": email or f"{sub}@example.com", "groups": list(groups)}
        body.update(claims)
        response = requests.put(f"{self.issuer}/users/{sub}", json=body, timeout=5)
        assert response.status_code == 204, response.text

    def identity_toml(
        self,
        *,
        admins: Iterable[str] = (),
        viewers: Iterable[str] = (),
        org_admins: dict[str, str] | None = None,
        client_secret_env: str = "EZAT_OIDC_CLIENT_SECRET",
    ) -> str:
        """The gateway's ``[identity]`` table for this provider (pass ``client_secret`` in the
        gateway's environment under ``client_secret_env``)."""

        def strings(values: Iterable[str]) -> str:
            return "[" + ", ".join(f'"{v}"' for v in values) + "]"

        mapping = ", ".join(f'"{group}" = "{org}"' for group, org in (org_admins or {}).items())
        return "\n".join(
            [
                "[identity]",
                f'issuer = "{self.issuer}"',
                f'client_id = "{self.client_id}"',
                f'client_secret_env = "{client_secret_env}"',
                'groups_claim = "groups"',
                f"admins = {strings(admins)}",
                f"viewers = {strings(viewers)}",
                f"org_admins = {{ {mapping} }}",
                'scopes = "openid email profile"',
                "",
            ]
        )

    def sign_in(self, session: requests.Session, login_url: str, sub: str) -> requests.Response:
        """Sign in without a browser: GET ``login_url`` (the gateway's redirect to this provider),
        submit the provider's form as ``sub``, then follow the redirect back to the gateway's
        callback with ``session`` (its cookies carry the gateway's session). Returns the last
        response (redirects followed)."""
        to_idp = session.get(login_url, allow_redirects=False, timeout=10)
        assert to_idp.status_code in (302, 303), (to_idp.status_code, to_idp.text[:500])
        authorize = urljoin(login_url, to_idp.headers["Location"])
        assert authorize.startswith(self.issuer + AUTHORIZE_PATH), authorize
        back = requests.post(authorize, data={"sub": sub}, allow_redirects=False, timeout=10)
        assert back.status_code == 302, (back.status_code, back.text[:500])
        return session.get(back.headers["Location"], timeout=10)

    def jwt_for(self, sub: str, *, audience: str = "", scope: str = "openid email profile") -> str:
        """The provider's ID token for ``sub`` (added with ``add_user``, or signed in with
        ``{"email": sub}`` only), issued to the client ``audience`` (default: ``client_id``), so
        its ``aud`` names it: the authorization code flow, driven with plain ``requests``."""
        client_id = audience or self.client_id
        query = urlencode(
            {
                "client_id": client_id,
                "redirect_uri": JWT_REDIRECT_URI,
                "response_type": "code",
                "scope": scope,
                "state": "jwt-for",
                "nonce": secrets.token_urlsafe(16),
            }
        )
        back = requests.post(
            f"{self.issuer}{AUTHORIZE_PATH}?{query}", data={"sub": sub}, allow_redirects=False, timeout=10
        )
        assert back.status_code == 302, (back.status_code, back.text[:500])
        code = parse_qs(urlsplit(back.headers["Location"]).query)["code"][0]
        token = requests.post(
            self.issuer + TOKEN_PATH,
            data={"grant_type": "authorization_code", "code": code, "redirect_uri": JWT_REDIRECT_URI},
            auth=(client_id, self.client_secret),
            timeout=10,
        )
        assert token.status_code == 200, (token.status_code, token.text[:500])
        id_token = token.json()["id_token"]
        assert isinstance(id_token, str)
        return id_token

    def jwks(self) -> dict[str, Any]:
        """The provider's JWKS, as its ``jwks_uri`` publishes it."""
        document = requests.get(self.issuer + JWKS_PATH, timeout=5).json()
        assert isinstance(document, dict)
        return document


def _recording(app: Callable[..., Any]) -> Callable[[dict[str, Any], Callable[..., Any]], Any]:
    """The provider's WSGI app, noting the query parameters of each authorization request and
    listing them at ``AUTHORIZATIONS_PATH``."""
    seen: list[dict[str, str]] = []

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path, method = environ.get("PATH_INFO"), environ.get("REQUEST_METHOD")
        if path == AUTHORIZATIONS_PATH:
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(seen).encode()]
        if path == AUTHORIZE_PATH and method == "GET":
            query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
            seen.append({k: v[-1] for k, v in query.items()})
        return app(environ, start_response)

    return wsgi


@contextmanager
def loopback_idp(*, require_nonce: bool = True, token_max_age_s: int | None = None) -> Iterator[LoopbackIdP]:
    """Start the provider on a free loopback port; stop it when the block ends. Its tokens
    expire ``token_max_age_s`` after they are issued (default: an hour)."""
    args = [sys.executable, "-m", "tests.support.oidc"] + (["--require-nonce"] if require_nonce else [])
    if token_max_age_s is not None:
        args += ["--token-max-age", str(token_max_age_s)]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the OpenID Connect provider did not start: {line!r}")
        yield LoopbackIdP(issuer=line.strip().rsplit("listening on ", 1)[1])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> None:
    """The provider's process: serve until terminated, first printing ``listening on <issuer>``.
    Options: ``--require-nonce``, ``--token-max-age SECONDS`` (the life of its tokens)."""
    warnings.simplefilter("ignore")  # Authlib's deprecation notices, at import and on every token it signs
    import argparse
    from datetime import timedelta

    import oidc_provider_mock
    import werkzeug.serving

    parser = argparse.ArgumentParser(prog="python -m tests.support.oidc")
    parser.add_argument("--require-nonce", action="store_true")
    parser.add_argument("--token-max-age", type=int, default=3600, metavar="SECONDS")
    options = parser.parse_args()
    app = oidc_provider_mock.app(
        require_nonce=options.require_nonce, access_token_max_age=timedelta(seconds=options.token_max_age)
    )
    server = werkzeug.serving.make_server("127.0.0.1", 0, _recording(app), threaded=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()
