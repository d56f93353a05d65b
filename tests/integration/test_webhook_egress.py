"""The spend alerts' webhooks go out as the gateway's other calls do: through the environment's
proxies, with ``[gateway] ca_file`` trusted besides the CA bundle (``egress.trusting_session``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from ezat_compat.upstream.egress import trusting_session
from tests.integration.egress_rig import PKI, RecordingServer

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[PKI, RecordingServer]]:
    pki = PKI(tmp_path / "pki").make()
    server = RecordingServer(204, "text/plain", b"", context=pki.server_context())
    try:
        yield pki, server
    finally:
        server.close()


def test_a_webhook_behind_the_operators_private_ca_is_reached(receiver: tuple[PKI, RecordingServer]) -> None:
    pki, server = receiver
    with pytest.raises(requests.exceptions.SSLError):  # requests alone doesn't trust the private CA
        requests.post(server.url + "/alerts", data=b"{}", timeout=5)
    session = trusting_session((str(pki.ca),))
    try:
        assert session.post(server.url + "/alerts", data=b"{}", timeout=5).status_code == 204
    finally:
        session.close()
    assert server.seen("/alerts") == ["/alerts"]


def test_without_a_ca_file_the_session_is_requests_own() -> None:
    session = trusting_session()
    try:
        assert session.trust_env  # HTTPS_PROXY / NO_PROXY and REQUESTS_CA_BUNDLE honoured
        assert type(session.get_adapter("https://example.invalid")) is requests.adapters.HTTPAdapter
    finally:
        session.close()
