"""Image downloads through the environment's proxy, in process (``responses``): the public-address
guard runs before anything is sent, and the proxy the environment names reaches the call."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import responses

from ezat_compat.upstream.images import NOT_PUBLIC, NOT_RESOLVED, ImageFetcher, ImageFetchError
from tests.support.environment import without_proxy_variables

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PROXY = "http://proxy.internal:3128"


def _resolver(names: dict[str, str]) -> Any:
    def resolve(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, "not known here")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[host], port))]

    return resolve


@pytest.fixture()
def proxied(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    without_proxy_variables(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", PROXY)
    monkeypatch.setenv("HTTPS_PROXY", PROXY)
    yield


def fetcher(names: dict[str, str]) -> ImageFetcher:
    return ImageFetcher(threads=4, allow_private=False, resolver=_resolver(names))


@responses.activate
def test_a_download_goes_through_the_proxy(proxied: None) -> None:
    responses.get("https://images.example.com/a.png", body=PNG, content_type="image/png")
    images = fetcher({"images.example.com": "93.184.216.34"})
    try:
        assert images.fetch_all(["https://images.example.com/a.png"])[0].data_b64 == base64.b64encode(PNG).decode()
    finally:
        images.close()
    sent = responses.calls[0].request.req_kwargs  # type: ignore[attr-defined]
    assert sent["proxies"] == {"https": PROXY} and sent["verify"] is True


@pytest.mark.parametrize(
    ("url", "names", "reason"),
    [
        pytest.param("http://10.0.0.7/a.png", {}, NOT_PUBLIC, id="private-literal"),
        pytest.param("http://169.254.169.254/latest/meta-data", {}, NOT_PUBLIC, id="metadata-literal"),
        pytest.param("http://intranet.corp/a.png", {"intranet.corp": "10.1.2.3"}, NOT_PUBLIC, id="private-name"),
        pytest.param("http://[::1]/a.png", {}, NOT_PUBLIC, id="loopback-v6"),
    ],
)
@responses.activate
def test_a_private_target_is_refused_before_the_proxy_is_asked(
    proxied: None, url: str, names: dict[str, str], reason: str
) -> None:
    images = fetcher(names)
    try:
        with pytest.raises(ImageFetchError) as info:
            images.fetch_all([url])
    finally:
        images.close()
    assert info.value.reason == reason and len(responses.calls) == 0


@responses.activate
def test_a_name_only_the_proxy_resolves_is_left_to_it(proxied: None) -> None:
    responses.get("http://cdn.outside.test/a.png", body=PNG, content_type="image/png")
    images = fetcher({})
    try:
        assert images.fetch_all(["http://cdn.outside.test/a.png"])[0].data_b64 == base64.b64encode(PNG).decode()
    finally:
        images.close()
    assert responses.calls[0].request.req_kwargs["proxies"] == {"http": PROXY}  # type: ignore[attr-defined]


@responses.activate
def test_without_a_proxy_an_unresolved_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    images = fetcher({})
    try:
        with pytest.raises(ImageFetchError) as info:
            images.fetch_all(["http://cdn.outside.test/a.png"])
    finally:
        images.close()
    assert info.value.reason == NOT_RESOLVED and len(responses.calls) == 0


@responses.activate
def test_no_proxy_sends_the_download_direct(proxied: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "images.example.com")
    responses.get("https://images.example.com/a.png", body=PNG, content_type="image/png")
    images = fetcher({"images.example.com": "93.184.216.34"})
    try:
        images.fetch_all(["https://images.example.com/a.png"])
    finally:
        images.close()
    assert not responses.calls[0].request.req_kwargs.get("proxies")  # type: ignore[attr-defined]
