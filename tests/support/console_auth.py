"""The console signed in to against a real OpenID Connect provider on loopback
(oidc-provider-mock, tests/support/oidc.py), for test_console_auth.py and test_console_people.py:
the gateway's app served by werkzeug in this process with the provider's people (alice a platform
admin, bob team-a's lead and finance, carol finance, dave in no mapped group), so a test can move
the console's clock (``security.CLOCK``) and read its store; and a ``Browser`` that follows the
sign-in's redirects one at a time with ``requests``, as a browser would.

The ``console`` fixture (one per test module) and the autouse ``wall_clock`` fixture (the clock
put back before each test) are taken by importing them::

    from tests.support.console_auth import console as console
    from tests.support.console_auth import wall_clock as wall_clock
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import requests
import werkzeug.serving
from sqlalchemy import select

from ezat_compat.app import create_app
from ezat_compat.config import load_config
from ezat_compat.console.security import CLOCK, COOKIE_NAME
from ezat_compat.store.console import ConsoleSession
from ezat_compat.store.db import make_engine, migrate
from ezat_compat.store.store import Store
from ezat_compat.store.tables import console_sessions
from tests.support.oidc import LoopbackIdP, loopback_idp

IDLE_S = 600
ABSOLUTE_S = 1800
ATTEMPTS = 10
SECRET_VARIABLE = "EZAT_TEST_OIDC_SECRET"


@dataclass
class Clock:
    """The console's clock: the wall clock moved by ``offset``."""

    offset: timedelta = field(default_factory=timedelta)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class Console:
    url: str  # the gateway's root, without the final slash
    store: Store
    clock: Clock
    idp: LoopbackIdP
    config_path: Path
    _next: int = 0

    def address(self) -> dict[str, str]:
        """Headers of a client at an address of its own (X-Forwarded-For from a trusted peer):
        each test's sign-in attempts count apart."""
        self._next += 1
        return {"X-Forwarded-For": f"10.44.{self._next // 250}.{self._next % 250 + 1}"}

    def sessions_of(self, subject: str) -> list[ConsoleSession]:
        with self.store.engine.connect() as conn:
            ids = conn.execute(
                select(console_sessions.c.public_id).where(console_sessions.c.subject == subject)
            ).scalars()
            found = [self.store.console.get_session(i) for i in ids]  # type: ignore[union-attr]
        return [s for s in found if s is not None]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    root = tmp_path_factory.mktemp("console")
    with loopback_idp() as idp:
        idp.add_user("alice", name="Alice Admin", email="alice@example.com", groups=["platform-admins"])
        idp.add_user("bob", name="Bob Lead", groups=["team-a-leads", "finance"])
        idp.add_user("carol", name="Carol Finance", groups=["finance"])
        idp.add_user("dave", name="Dave Nobody", groups=["interns"])
        config_path = root / "ezat.toml"
        config_path.write_text(
            f"""
[gateway]
database_url = "sqlite:///{(root / "ezat.db").as_posix()}"

[admin]
bind = ""
on_main_listener = true

[console]
idle_timeout_s = {IDLE_S}
absolute_timeout_s = {ABSOLUTE_S}
secure_cookies = false
sign_in_attempts_per_minute = {ATTEMPTS}

{
                idp.identity_toml(
                    admins=["platform-admins"],
                    viewers=["finance"],
                    org_admins={"team-a-leads": "team-a"},
                    client_secret_env=SECRET_VARIABLE,
                )
            }

[[models]]
id = "anthropic/claude-sonnet-5-5"
aliases = []
price = {{ input = 3, output = 15 }}
[[models.deployments]]
name = "nowhere"
base_url = "http://127.0.0.1:9"
upstream_model = "claude-sonnet-5-5"
"""
        )
        config = load_config(config_path, environ={SECRET_VARIABLE: idp.client_secret})
        assert config.identity.client_secret == idp.client_secret
        engine = make_engine(config.gateway.database_url)
        migrate(engine)
        engine.dispose()
        app = create_app(config)
        clock = Clock()
        app.extensions[CLOCK] = clock
        store: Store = app.extensions["ezat_store"]
        store.accounts.create_org("team-a", 0)
        store.accounts.create_org("team-b", 0)
        server = werkzeug.serving.make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        thread.start()
        try:
            yield Console(f"http://127.0.0.1:{server.server_port}", store, clock, idp, config_path)
        finally:
            server.shutdown()
            thread.join(5)
            server.server_close()
            store.close()


@pytest.fixture(autouse=True)
def wall_clock(console: Console) -> None:
    console.clock.offset = timedelta()


@dataclass
class Browser:
    """A browser: its cookies (``requests.Session``) and its own client address."""

    console: Console
    session: requests.Session = field(default_factory=requests.Session)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.headers = self.console.address()

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        url = path if path.startswith("http") else self.console.url + path
        return self.session.get(url, headers=self.headers, allow_redirects=False, timeout=10, **kwargs)

    def post(self, path: str, data: dict[str, str] | None = None) -> requests.Response:
        return self.session.post(
            self.console.url + path, data=data or {}, headers=self.headers, allow_redirects=False, timeout=10
        )

    def begin(self) -> str:
        """GET the sign-in's start: the IdP's authorization URL it redirects to."""
        response = self.get("/console/auth/login")
        assert response.status_code == 303, (response.status_code, response.text[:300])
        location = response.headers["Location"]
        assert location.startswith(self.console.idp.issuer + "/"), location
        return location

    def callback_url(self, authorize_url: str, sub: str) -> str:
        """The person signs in at the IdP (its form, as ``sub``): where it sends the browser back."""
        back = requests.post(authorize_url, data={"sub": sub}, allow_redirects=False, timeout=10)
        assert back.status_code == 302, (back.status_code, back.text[:300])
        return urljoin(authorize_url, back.headers["Location"])

    def sign_in(self, sub: str) -> requests.Response:
        return self.get(self.callback_url(self.begin(), sub))

    def csrf(self) -> str:
        """The CSRF token of this browser's session (as the pages' forms carry it)."""
        found = self.console.store.console.find_session(self.session.cookies.get(COOKIE_NAME, ""))  # type: ignore[union-attr]
        assert found is not None
        return found.csrf_token

    def signed_in(self) -> bool:
        """Whether the session cookie still opens the console (the sign-in page sends a signed-in
        person on to the overview)."""
        return self.get("/console/sign-in").status_code == 303
