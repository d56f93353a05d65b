"""Through the real gateway: images and PDFs in Chat Completions, end to end.

Chat Completions reference, "Images and PDFs" (data URLs of four types, http(s) URLs downloaded
under 10 MB per image, 20 URLs and 32 MB per request, 15 s per download and 3 redirects,
public hosts only, the type judged by the bytes, a failure is a 400 naming the part; PDFs as
``file_data``; ``file_id`` refused) and "Errors" (400 ``invalid_request_error``, 413
``request_too_large``, failed requests aren't billed).

Everything runs as in production: the gateway under gunicorn with gevent workers, the
simulator as the upstream, the official ``openai`` SDK as the client (raw ``requests`` where
the envelope or the body framing matters), and the image server of ``test_image_fetch`` on
loopback. Two gateways share the simulator: one with ``allow_private_image_hosts = true`` (the
image server is on 127.0.0.1) and one in the default configuration, for the public-address rule.
The default gateway's gevent workers resolve names with ``FakeResolver`` (``GEVENT_RESOLVER``),
so that a name resolving to 10.0.0.1, a public host that redirects to a private one and a
rebinding name are proven through the real gateway too; unknown names resolve for real.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import random
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import gevent.resolver.thread
import openai
import pytest
import requests
from PIL import Image
from werkzeug.serving import make_server

from ezat_compat.sim.app import SimConfig, make_app
from ezat_compat.store.accounts import Accounts
from ezat_compat.store.db import make_engine
from ezat_compat.store.hotpath import make_hot_path
from tests.conftest import free_port
from tests.integration.harness import Gateway, ModelSpec, Sim
from tests.support.anthropic_types import validate_anthropic_request
from tests.support.images import IMAGES, PNG, PNG_RANDOM_IDAT, ImageServer, noise_png

pytestmark = pytest.mark.integration

MODEL = "anthropic/claude-sonnet-5-5"
MB = 1024 * 1024
ALLOW_PRIVATE_WARNING = (
    "allow_private_image_hosts = true: image URLs may reach loopback and private addresses. Use this in tests only."
)
POOL = 10  # image_fetch_threads of the gateway that downloads from loopback
TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}


def could_not(why: str) -> str:
    return f"could not download the image ({why})"


NOT_PUBLIC = could_not("the host is not a public address")
NOT_AN_IMAGE = "the file is not a JPEG, PNG, GIF or WebP image"
TOO_LARGE = "the image is larger than 10 MB"
OVER_TOTAL = "the image downloads of this request exceed 32 MB in total"
TOO_MANY = "too many image URLs (at most 20 per request)"
FILE_ID = "send the PDF as file_data (a base64 data URL); file_id is not supported"
PDF = b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"


# ---------------------------------------------------------------- servers


@dataclass
class LoggedGateway(Gateway):
    """The harness's gateway; ``omit`` names ``[gateway]`` keys left out of the config file, so
    that they take the real defaults."""

    omit: tuple[str, ...] = ()

    def write_config(self) -> None:
        super().write_config()
        lines = self.config_path.read_text().splitlines(keepends=True)
        self.config_path.write_text("".join(line for line in lines if line.split(" = ")[0] not in self.omit))


def _start(
    root: Path, sim: Sim, omit: tuple[str, ...] = (), env: dict[str, str] | None = None, **settings: Any
) -> LoggedGateway:
    models = [ModelSpec(deployments=[{"name": "sim-a", "base_url": sim.url}])]
    return LoggedGateway(root=root, models=models, gateway_settings=settings, omit=omit, env=env or {}).start()


# ---------------------------------------------------------------- a fake DNS inside the gateway's process

PUBLIC_IP = "93.184.216.34"  # a public address; the fake DNS routes connections to it to the image server
CANARY_IP = "93.184.216.35"  # the same, to the canary server
FAKE_NAMES = {
    "public.test": [[PUBLIC_IP]],
    "private.test": [["10.0.0.1"]],
    "mixed.test": [[PUBLIC_IP, "10.0.0.1"]],
    "rebind.test": [[CANARY_IP], ["127.0.0.1"]],  # public when checked, loopback on any later lookup
}


class FakeResolver(gevent.resolver.thread.Resolver):
    """The gateway's gevent resolver in these tests (``GEVENT_RESOLVER`` names this class).

    ``EZAT_TEST_DNS`` holds ``{"names": {name: [answers, …]}, "routes": {ip: [host, port]}}``:
    a name's first lookup gets its first answer list and every later lookup its last (a
    rebinding name); a connection to a routed IP goes to the loopback stand-in instead, so a
    "public" host can be served by a test server. Other names go to the real resolver.
    """

    def __init__(self, hub: Any = None) -> None:
        super().__init__(hub)
        spec = json.loads(os.environ.get("EZAT_TEST_DNS", "{}"))
        self._names: dict[str, list[list[str]]] = spec.get("names", {})
        self._routes: dict[str, list[Any]] = spec.get("routes", {})
        self._lookups: dict[str, int] = {}

    def getaddrinfo(self, host: Any, port: Any, *args: Any) -> Any:
        if host in self._routes:
            return super().getaddrinfo(*self._routes[host], *args)
        if host not in self._names:
            return super().getaddrinfo(host, port, *args)
        self._lookups[host] = self._lookups.get(host, 0) + 1
        answers = self._names[host][0 if self._lookups[host] == 1 else -1]
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0))
            if ":" in ip
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
            for ip in answers
        ]


@pytest.fixture(scope="module")
def images() -> Iterator[ImageServer]:
    server = ImageServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def gw(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedGateway]:
    """``allow_private_image_hosts = true`` (the image server is on 127.0.0.1), 10 download threads."""
    server = _start(
        tmp_path_factory.mktemp("gw-private-ok"), sim, allow_private_image_hosts=True, image_fetch_threads=POOL
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def canary() -> Iterator[ImageServer]:
    """The stand-in for a public host that a rebinding name first points to."""
    server = ImageServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def default_gw(
    sim: Sim, images: ImageServer, canary: ImageServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoggedGateway]:
    """The default configuration: public image hosts only (the harness would allow private ones).
    Its process resolves names with ``FakeResolver``; unknown names still resolve for real."""
    dns = {
        "names": FAKE_NAMES,
        "routes": {PUBLIC_IP: ["127.0.0.1", images.port], CANARY_IP: ["127.0.0.1", canary.port]},
    }
    env = {"GEVENT_RESOLVER": f"{__name__}.FakeResolver", "EZAT_TEST_DNS": json.dumps(dns)}
    server = _start(tmp_path_factory.mktemp("gw-default"), sim, omit=("allow_private_image_hosts",), env=env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(gw: LoggedGateway) -> str:
    return gw.new_key("acme", balance="1000")


@pytest.fixture(scope="module")
def sdk(gw: LoggedGateway, key: str) -> Iterator[openai.OpenAI]:
    """The official client, without its own retries, closed at the end (no leaked sockets)."""
    with openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=key, max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def default_key(default_gw: LoggedGateway) -> str:
    return default_gw.new_key("acme")


SMALL_BODY_MODEL = "anthropic/claude-small-body"


def _in_process_sim(name: str, **config: Any) -> tuple[Sim, Any]:
    """The simulator app in this process (werkzeug, threaded), so that its recording limit can be
    raised: the gateway's fitted bodies reach 15 MB and more, past the 8 MB the CLI records."""
    server = make_server("127.0.0.1", 0, make_app(SimConfig(name=name, min_cache_tokens=16, **config)), threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return Sim(name=name, url=f"http://127.0.0.1:{server.server_port}"), server


@pytest.fixture(scope="module")
def big_sim() -> Iterator[Sim]:
    """The upstream of the fitting tests: Anthropic's 32 MB body limit, every body recorded."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    sim, server = _in_process_sim("sim-big", max_recorded_body_bytes=64 * MB)
    yield sim
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def small_sim() -> Iterator[Sim]:
    """An upstream with an 8 MB body limit: below what the catalog says of the model."""
    sim, server = _in_process_sim("sim-small", max_body_bytes=8 * MB)
    yield sim
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def fit_gw(big_sim: Sim, small_sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedGateway]:
    models = [
        ModelSpec(deployments=[{"name": "sim-big", "base_url": big_sim.url}]),
        ModelSpec(id=SMALL_BODY_MODEL, aliases=(), deployments=[{"name": "sim-small", "base_url": small_sim.url}]),
    ]
    server = LoggedGateway(
        root=tmp_path_factory.mktemp("gw-fit"),
        models=models,
        gateway_settings={"allow_private_image_hosts": True, "image_fetch_threads": POOL},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fit_key(fit_gw: LoggedGateway) -> str:
    return fit_gw.new_key("acme", balance="1000")


@pytest.fixture(scope="module")
def sdk_fit(fit_gw: LoggedGateway, fit_key: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fit_gw.url + "/openai/v1", api_key=fit_key, max_retries=0, timeout=60) as client:
        yield client


# ---------------------------------------------------------------- helpers


def post(gateway: Gateway, key: str, body: Any, *, timeout: float = 60) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return requests.post(
        gateway.url + "/openai/v1/chat/completions",
        data=data,
        timeout=timeout,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )


def chat(*parts: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_completion_tokens": 16,
        "messages": [{"role": "user", "content": list(parts)}],
    }
    if stream:
        body["stream"] = True
    return body


def text(value: str = "What is in this image?") -> dict[str, Any]:
    return {"type": "text", "text": value}


def image(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{b64(data)}"


def url_path(message: int, part: int) -> str:
    return f"messages[{message}].content[{part}].image_url.url"


def assert_refused(resp: requests.Response, path: str, reason: str) -> None:
    """A 400 ``invalid_request_error`` naming the part, in the spec's ``path: reason`` form."""
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json() == {
        "error": {"message": f"{path}: {reason}", "type": "invalid_request_error", "param": path, "code": None}
    }


def sdk_refusal(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    err = caught.value
    assert err.status_code == 400 and err.type == "invalid_request_error" and err.code is None
    return err


def only_body(sim: Sim) -> dict[str, Any]:
    (body,) = sim.bodies()
    return body


def content_blocks(body: dict[str, Any], message: int = 0) -> list[dict[str, Any]]:
    """The blocks of an upstream message, without the gateway's automatic cache marks."""
    return [{k: v for k, v in block.items() if k != "cache_control"} for block in body["messages"][message]["content"]]


def image_block(data: bytes, media_type: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(data)}}


def usage_row(gateway: Gateway, request_id: str) -> dict[str, Any]:
    (row,) = [r for r in gateway.usage() if r["request_id"] == request_id]
    return row


def org_money(gateway: Gateway, org: str) -> tuple[int, int]:
    """(balance, available) of ``org`` in micro-USD, read from the gateway's database."""
    engine = make_engine(f"sqlite:///{(gateway.root / 'ezat.db').as_posix()}")
    hot_path = make_hot_path(engine)
    try:
        info = Accounts(engine, hot_path).get_org(org)
    finally:
        hot_path.close()
        engine.dispose()
    return info.balance_micros, info.available_micros


def noise(width: int, height: int, kind: str = "png", **options: Any) -> bytes:
    """A ``width`` x ``height`` image of seeded noise (PNG can't compress it away), made with Pillow."""
    rng = random.Random(width * 7919 + height)
    picture = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    out = io.BytesIO()
    if kind == "png":
        options.setdefault("compress_level", 1)
    picture.save(out, {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[kind], **options)
    return out.getvalue()


def assert_within_upstream_rules(body: dict[str, Any], *, images: int | None = None) -> list[Image.Image]:
    """Every image rule of Anthropic's Messages API, on what reached the upstream: at most 5 MB
    of base64 each (``image exceeds 5 MB maximum``), at most 8000 px a side, at most 2000 px a
    side past 20 images (``… for many-image requests: 2000 pixels``), a body under 32 MB (413);
    each image decodes as the type it is labelled. Returns the images, in order."""
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    sources = [b["source"] for b in blocks if b["type"] == "image"]
    if images is not None:
        assert len(sources) == images
    max_side = 2000 if len(sources) > 20 else 8000
    opened: list[Image.Image] = []
    for source in sources:
        assert source["type"] == "base64" and len(source["data"]) <= 5 * MB, len(source["data"])
        picture = Image.open(io.BytesIO(base64.b64decode(source["data"])))
        picture.load()
        assert Image.MIME[picture.format or ""] == source["media_type"]
        assert max(picture.size) <= max_side, picture.size
        opened.append(picture)
    assert len(json.dumps(body)) < 32 * MB
    return opened


# ---------------------------------------------------------------- data URLs


@pytest.mark.parametrize(
    ("kind", "detail"),
    [("png", "high"), ("jpeg", "low"), ("gif", "auto"), ("webp", None)],
    ids=["png-detail-high", "jpeg-detail-low", "gif-detail-auto", "webp-no-detail"],
)
def test_data_url_images_reach_the_upstream_as_base64_blocks_and_detail_is_ignored(gw, key, sim, kind, detail, sdk):
    data, media_type = IMAGES[kind]
    extra = {} if detail is None else {"detail": detail}
    sim.clear()
    completion = sdk.chat.completions.create(
        model=MODEL,
        max_completion_tokens=16,
        messages=[{"role": "user", "content": [text(), image(data_url(data, media_type), **extra)]}],
    )
    assert completion.choices[0].message.content

    body = only_body(sim)
    validate_anthropic_request(body)
    assert content_blocks(body) == [text(), image_block(data, media_type)]  # no trace of "detail"


def test_the_data_url_type_is_case_insensitive_and_sent_lowercase(gw, key, sim):
    sim.clear()
    resp = post(gw, key, chat(image(f"data:IMAGE/PNG;BASE64,{b64(PNG)}"), text()))
    assert resp.status_code == 200, resp.text
    assert content_blocks(only_body(sim))[0] == image_block(PNG, "image/png")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (f"data:image/png,{PNG[:4].hex()}", "data URLs must be base64: data:<type>;base64,<data>"),
        ("data:image/png;charset=utf-8,abc", "data URLs must be base64: data:<type>;base64,<data>"),
        ("data:image/png;base64", "data URLs must be base64: data:<type>;base64,<data>"),
        ("data:image/png;base64,", "the data URL holds no data"),
        (
            data_url(b"BM" + bytes(60), "image/bmp"),
            'image type "image/bmp" is not supported; use image/jpeg, image/png, image/gif or image/webp',
        ),
        (
            data_url(PNG, "image/svg+xml"),
            'image type "image/svg+xml" is not supported; use image/jpeg, image/png, image/gif or image/webp',
        ),
        ("ftp://example.com/x.png", "must be an http(s) URL or a base64 data URL (data:<type>;base64,<data>)"),
    ],
    ids=["not-base64", "charset-not-base64", "no-comma", "empty", "bmp", "svg", "ftp"],
)
def test_data_urls_that_are_not_base64_or_not_one_of_the_four_types_are_refused(gw, key, sim, url, reason, sdk):
    sim.clear()
    err = sdk_refusal(
        lambda: sdk.chat.completions.create(
            model=MODEL, max_completion_tokens=16, messages=[{"role": "user", "content": [text(), image(url)]}]
        )
    )
    assert err.body == {
        "message": f"{url_path(0, 1)}: {reason}",
        "type": "invalid_request_error",
        "param": url_path(0, 1),
        "code": None,
    }
    assert sim.bodies() == []


def test_a_data_url_whose_data_is_not_base64_is_refused_by_the_gateway(gw, key, sim):
    sim.clear()
    resp = post(gw, key, chat(text(), image("data:image/png;base64,!!not base64!!")))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == url_path(0, 1)
    assert resp.json()["error"]["message"] == url_path(0, 1) + ": the data is not valid base64"
    assert sim.bodies() == []


# ---------------------------------------------------------------- http(s) URLs: formats and the bytes rule


@pytest.mark.parametrize("kind", ["png", "jpeg", "gif", "gif87", "webp"])
def test_image_urls_are_downloaded_and_inlined_with_the_type_of_their_bytes(gw, key, sim, images, kind, sdk):
    data, media_type = IMAGES[kind]
    sim.clear()
    completion = sdk.chat.completions.create(
        model=MODEL,
        max_completion_tokens=16,
        messages=[{"role": "user", "content": [text(), image(images.url(f"/image/{kind}"), detail="high")]}],
    )
    assert completion.choices[0].finish_reason == "stop"
    body = only_body(sim)
    validate_anthropic_request(body)
    assert content_blocks(body) == [text(), image_block(data, media_type)]


def test_the_content_type_header_is_ignored_a_png_served_as_text_plain_is_a_png(gw, key, sim, images):
    sim.clear()
    resp = post(gw, key, chat(text(), image(images.url("/png-as-text?tag=ct"))))
    assert resp.status_code == 200, resp.text
    assert content_blocks(only_body(sim))[1] == image_block(PNG, "image/png")


def test_html_served_as_image_png_is_refused(gw, key, sim, images):
    sim.clear()
    resp = post(gw, key, chat(text(), image(data_url(PNG, "image/png")), image(images.url("/html-as-png"))))
    assert_refused(resp, url_path(0, 2), NOT_AN_IMAGE)
    assert sim.bodies() == []


def test_data_urls_and_downloads_mix_in_order_across_messages(gw, key, sim, images, sdk):
    sim.clear()
    messages = [
        {"role": "system", "content": "Describe images."},
        {"role": "user", "content": [image(images.url("/image/gif")), text("first")]},
        {"role": "assistant", "content": "A pixel."},
        {
            "role": "user",
            "content": [
                text("second"),
                image(data_url(IMAGES["jpeg"][0], "image/jpeg")),
                image(images.url("/image/webp")),
            ],
        },
    ]
    completion = sdk.chat.completions.create(model=MODEL, max_completion_tokens=16, messages=messages)
    assert completion.choices[0].message.content
    body = only_body(sim)
    validate_anthropic_request(body)
    assert content_blocks(body, 0) == [image_block(IMAGES["gif"][0], "image/gif"), text("first")]
    assert content_blocks(body, 2) == [
        text("second"),
        image_block(IMAGES["jpeg"][0], "image/jpeg"),
        image_block(IMAGES["webp"][0], "image/webp"),
    ]


# ---------------------------------------------------------------- failures: 400 naming the part


def test_an_image_that_does_not_decode_is_refused_before_the_upstream(gw, key, sim, images):
    """Its header reads, its IDAT is random bytes: the real API answers 400 for it, the gateway first."""
    sim.clear()
    resp = post(gw, key, chat(text(), image(data_url(PNG, "image/png")), image(data_url(PNG_RANDOM_IDAT, "image/png"))))
    assert_refused(resp, url_path(0, 2), "the image could not be decoded")
    resp = post(gw, key, chat(text(), image(images.url("/random-idat")), image(data_url(PNG, "image/png"))))
    assert_refused(resp, url_path(0, 1), "the image could not be decoded")
    assert sim.bodies() == []
    resp = post(gw, key, chat(text(), image(data_url(PNG, "image/png")), image(images.url("/image/png"))))
    assert resp.status_code == 200, resp.text  # good images still go through


def test_a_404_is_the_spec_example_word_for_word(gw, key, sim, images, sdk):
    sim.clear()
    err = sdk_refusal(
        lambda: sdk.chat.completions.create(
            model=MODEL,
            max_completion_tokens=16,
            messages=[
                {
                    "role": "user",
                    "content": [text(), image(data_url(PNG, "image/png")), image(images.url("/status/404"))],
                }
            ],
        )
    )
    assert err.body["message"] == "messages[0].content[2].image_url.url: could not download the image (HTTP 404)"
    assert err.param == "messages[0].content[2].image_url.url"
    assert sim.bodies() == []


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        ("/status/404", could_not("HTTP 404")),
        ("/status/500", could_not("HTTP 500")),
        ("/status/204", could_not("HTTP 204")),
        ("/html-as-png", NOT_AN_IMAGE),
        (f"/bytes/{11 * MB}/length", TOO_LARGE),
        (f"/bytes/{11 * MB}/close", TOO_LARGE),
        ("/redirect/4", could_not("more than 3 redirects")),
        ("closed-port", could_not("connection failed")),
        ("http://nothing.invalid/x.png", could_not("the host name could not be resolved")),
    ],
    ids=[
        "http-404",
        "http-500",
        "http-204",
        "html-as-png",
        "11MB-with-length",
        "11MB-without-length",
        "4-redirects",
        "connection-refused",
        "unresolvable-name",
    ],
)
def test_every_download_failure_is_a_400_naming_the_part_never_a_500(gw, key, sim, images, route, reason):
    if route == "closed-port":
        url = f"http://127.0.0.1:{free_port()}/x.png"
    elif route.startswith("http"):
        url = route
    else:
        url = images.url(route)
    sim.clear()
    resp = post(gw, key, chat(text(), image(data_url(PNG, "image/png")), image(url)))
    assert_refused(resp, url_path(0, 2), reason)
    assert sim.bodies() == []


def test_the_path_names_the_clients_message_and_part_not_the_upstream_ones(gw, key, sim, images):
    """System messages leave the upstream's messages; the client's indexes must still be named."""
    body = {
        "model": MODEL,
        "max_completion_tokens": 16,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [text(), image(images.url("/image/png"))]},
            {"role": "assistant", "content": "ok"},
            {"role": "developer", "content": "Really brief."},
            {
                "role": "user",
                "content": [
                    text(),
                    image(images.url("/image/gif")),
                    text("and"),
                    image(images.url("/status/404?tag=path")),
                ],
            },
        ],
    }
    resp = post(gw, key, body)
    assert_refused(resp, url_path(4, 3), could_not("HTTP 404"))


def test_a_failed_download_refuses_a_stream_before_it_starts(gw, key, sim, images, sdk):
    sim.clear()
    resp = post(gw, key, chat(text(), image(data_url(PNG, "image/png")), image(images.url("/status/404")), stream=True))
    assert_refused(resp, url_path(0, 2), could_not("HTTP 404"))
    err = sdk_refusal(
        lambda: sdk.chat.completions.create(
            model=MODEL,
            max_completion_tokens=16,
            stream=True,
            messages=[{"role": "user", "content": [image(images.url("/html-as-png"))]}],
        )
    )
    assert err.param == url_path(0, 0)
    assert sim.bodies() == []


def test_a_stream_with_downloaded_images_works(gw, key, sim, images, sdk):
    sim.clear()
    stream = sdk.chat.completions.create(
        model=MODEL,
        max_completion_tokens=16,
        stream=True,
        messages=[{"role": "user", "content": [text(), image(images.url("/image/jpeg"))]}],
    )
    with stream:
        chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    body = only_body(sim)
    validate_anthropic_request(body)
    assert content_blocks(body)[1] == image_block(*IMAGES["jpeg"])


# ---------------------------------------------------------------- redirects


def test_three_redirects_are_followed(gw, key, sim, images):
    sim.clear()
    resp = post(gw, key, chat(text(), image(images.url("/redirect/3?tag=three"))))
    assert resp.status_code == 200, resp.text
    assert content_blocks(only_body(sim))[1] == image_block(PNG, "image/png")
    assert len(images.seen("tag=three")) == 4


def test_a_fourth_redirect_is_not_followed(gw, key, images):
    resp = post(gw, key, chat(text(), image(images.url("/redirect/4?tag=four"))))
    assert_refused(resp, url_path(0, 1), could_not("more than 3 redirects"))
    assert len(images.seen("tag=four")) == 4  # the first URL and 3 redirects; the 4th is never asked for


# ---------------------------------------------------------------- limits: size, count, total, time


def test_an_image_of_exactly_10_mb_is_accepted(gw, key, sim, images):
    """10 MB is 13.3 MB of base64: it reaches the upstream scaled to its 5 MB."""
    sim.clear()
    resp = post(gw, key, chat(text(), image(images.url(f"/noise/{10 * MB}/close"))))
    assert resp.status_code == 200, resp.text
    assert_within_upstream_rules(only_body(sim))


def test_20_image_urls_are_accepted(gw, key, sim, images):
    sim.clear()
    parts = [image(images.url(f"/image/{kind}?i={i}")) for i in range(5) for kind in TYPES]
    resp = post(gw, key, chat(text(), *parts))
    assert resp.status_code == 200, resp.text
    body = only_body(sim)
    validate_anthropic_request(body)
    media_types = [block["source"]["media_type"] for block in content_blocks(body)[1:]]
    assert media_types == list(TYPES.values()) * 5


def test_a_21st_image_url_is_refused_before_anything_is_downloaded(gw, key, sim, images):
    sim.clear()
    parts = [image(images.url(f"/image/png?tag=twenty-one&i={i}")) for i in range(21)]
    resp = post(gw, key, chat(text(), image(data_url(PNG, "image/png")), *parts))
    assert_refused(resp, url_path(0, 22), TOO_MANY)
    assert images.seen("tag=twenty-one") == []
    assert sim.bodies() == []


def test_data_urls_do_not_count_against_the_20_urls(gw, key, sim, images):
    sim.clear()
    parts = [image(images.url(f"/image/gif?i={i}")) for i in range(20)]
    resp = post(gw, key, chat(*[image(data_url(PNG, "image/png"))] * 5, *parts))
    assert resp.status_code == 200, resp.text
    assert len(content_blocks(only_body(sim))) == 25


def test_two_10_mb_images_in_one_request_are_accepted(fit_gw, fit_key, big_sim, images):
    big_sim.clear()
    resp = post(
        fit_gw,
        fit_key,
        chat(text(), image(images.url(f"/noise/{10 * MB}/length?a")), image(images.url(f"/noise/{10 * MB}/close?b"))),
    )
    assert resp.status_code == 200, resp.text
    assert_within_upstream_rules(only_body(big_sim), images=2)


@pytest.mark.parametrize("framing", ["length", "close"])
def test_more_than_32_mb_of_downloads_in_one_request_is_refused(gw, key, sim, images, framing):
    sim.clear()
    parts = [image(images.url(f"/noise/{9 * MB}/{framing}?i={i}")) for i in range(4)]  # 36 MB
    resp = post(gw, key, chat(text(), *parts))
    assert resp.status_code == 400, resp.text
    param = resp.json()["error"]["param"]
    assert param in [url_path(0, i) for i in range(1, 5)]
    assert_refused(resp, param, OVER_TOTAL)
    assert sim.bodies() == []


def test_an_upstream_413_is_413_not_500_and_is_not_billed(fit_gw, fit_key, small_sim, images):
    """An upstream whose body limit (8 MB here) is below the model's (32 MB in the catalog):
    three downloads, each fitted to 5 MB of base64, make a 15 MB body that it refuses. Its 413
    comes back as 413 ``request_too_large``, not a 500, and isn't billed."""
    small_sim.clear()
    parts = [image(images.url(f"/noise/{int(9.9 * MB)}/length?upstream={i}")) for i in range(3)]
    resp = post(fit_gw, fit_key, {**chat(text(), *parts), "model": SMALL_BODY_MODEL})
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "request_too_large"
    assert usage_row(fit_gw, resp.headers["request-id"])["cost_usd"] == "0.000000"


@pytest.mark.slow
def test_a_download_that_drips_past_15_s_is_cut_at_15_s(gw, key, sim, images):
    """100 bytes, one every 0.2 s: every read is quick, the download (20 s) is not."""
    sim.clear()
    started = time.monotonic()
    resp = post(gw, key, chat(text(), image(images.url("/drip/0.2?tag=drip"))))
    elapsed = time.monotonic() - started
    assert_refused(resp, url_path(0, 1), could_not("timed out after 15 s"))
    assert 14.5 <= elapsed < 18
    assert sim.bodies() == []


def test_ten_images_that_take_1_s_each_arrive_in_parallel(gw, key, sim, images, sdk):
    sim.clear()
    parts = [image(images.url(f"/slow/1?tag=parallel&i={i}")) for i in range(10)]
    started = time.monotonic()
    completion = sdk.chat.completions.create(
        model=MODEL, max_completion_tokens=16, messages=[{"role": "user", "content": [text(), *parts]}]
    )
    elapsed = time.monotonic() - started
    assert completion.choices[0].message.content
    assert len(images.seen("tag=parallel")) == 10
    assert elapsed < 5, f"10 one-second downloads took {elapsed:.1f} s"
    assert len(content_blocks(only_body(sim))) == 11


def test_the_download_pool_is_shared_by_concurrent_requests(gw, key, images):
    """Two requests of 5 one-second images at once: 10 downloads on 10 threads, about 1 s."""

    def one(i: int) -> requests.Response:
        parts = [image(images.url(f"/slow/1?tag=shared-{i}&j={j}")) for j in range(5)]
        return post(gw, key, chat(text(), *parts))

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(one, range(2)))
    elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    assert elapsed < 4, f"two requests of five one-second downloads took {elapsed:.1f} s"


def test_the_download_pool_is_bounded_by_image_fetch_threads(gw, key, images):
    """20 one-second images on a pool of 10 threads take two rounds, not one (and not twenty)."""
    parts = [image(images.url(f"/slow/1?tag=bounded&i={i}")) for i in range(20)]
    started = time.monotonic()
    resp = post(gw, key, chat(text(), *parts))
    elapsed = time.monotonic() - started
    assert resp.status_code == 200, resp.text
    assert 2 <= elapsed < 8, f"20 one-second downloads on {POOL} threads took {elapsed:.1f} s"


# ---------------------------------------------------------------- images fitted to the upstream


def test_a_6_mb_data_url_image_reaches_the_upstream_within_5_mb(fit_gw, fit_key, big_sim, sdk_fit):
    """6 MiB of base64: the real API's example refusal (``6291456 bytes > 5242880 bytes``)."""
    raw = noise(1300, 1210)
    assert len(b64(raw)) > 6 * MB
    big_sim.clear()
    completion = sdk_fit.chat.completions.create(
        model=MODEL,
        max_completion_tokens=16,
        messages=[{"role": "user", "content": [text(), image(data_url(raw, "image/png"))]}],
    )
    assert completion.choices[0].message.content
    (picture,) = assert_within_upstream_rules(only_body(big_sim))
    assert picture.format == "PNG" and picture.width < 1300
    assert abs(picture.height - 1210 * picture.width / 1300) <= 0.5 + 1e-9  # the aspect ratio is kept


def test_a_9000_by_4_image_reaches_the_upstream_at_8000_px(fit_gw, fit_key, big_sim):
    big_sim.clear()
    resp = post(fit_gw, fit_key, chat(text(), image(data_url(noise(9000, 4), "image/png"))))
    assert resp.status_code == 200, resp.text
    (picture,) = assert_within_upstream_rules(only_body(big_sim))
    assert picture.size == (8000, 4)


def test_21_images_of_2100_px_reach_the_upstream_at_2000_px(fit_gw, fit_key, big_sim, images):
    """Data URLs and downloads alike: the many-images rule counts every image of the request."""
    big_sim.clear()
    parts = [image(data_url(noise(2100, 50 + i, "jpeg"), "image/jpeg")) for i in range(20)]
    parts.append(image(images.url(f"/noise/{3 * MB}?many")))  # 1024 x 975: already within 2000 px
    parts.append(image(data_url(noise(1500, 2100, "webp"), "image/webp")))
    resp = post(fit_gw, fit_key, chat(text(), *parts))
    assert resp.status_code == 200, resp.text
    pictures = assert_within_upstream_rules(only_body(big_sim), images=22)
    assert [p.format for p in pictures] == ["JPEG"] * 20 + ["PNG", "WEBP"]
    assert [p.size for p in pictures[:3]] == [(2000, 48), (2000, 49), (2000, 50)]
    assert pictures[-1].size == (1429, 2000)


def test_three_9_9_mb_downloads_answer_200_within_the_upstreams_body(fit_gw, fit_key, big_sim, images, sdk_fit):
    """Within the spec's 10 MB and 32 MB, but ~40 MB of base64: without fitting, the upstream's 413."""
    big_sim.clear()
    parts = [image(images.url(f"/noise/{int(9.9 * MB)}/length?three={i}")) for i in range(3)]
    completion = sdk_fit.chat.completions.create(
        model=MODEL, max_completion_tokens=16, messages=[{"role": "user", "content": [text(), *parts]}]
    )
    assert completion.choices[0].finish_reason == "stop"
    pictures = assert_within_upstream_rules(only_body(big_sim), images=3)
    assert all(p.format == "PNG" for p in pictures)


def test_a_stream_with_images_to_fit_works(fit_gw, fit_key, big_sim, sdk_fit):
    big_sim.clear()
    stream = sdk_fit.chat.completions.create(
        model=MODEL,
        max_completion_tokens=16,
        stream=True,
        messages=[{"role": "user", "content": [text(), image(data_url(noise(8100, 30), "image/png"))]}],
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    (picture,) = assert_within_upstream_rules(only_body(big_sim))
    assert picture.size == (8000, 30)


def test_images_within_the_upstreams_limits_reach_it_byte_for_byte(fit_gw, fit_key, big_sim, images):
    big_sim.clear()
    photo = noise(1600, 1200, "jpeg", quality=90)
    resp = post(fit_gw, fit_key, chat(text(), image(data_url(photo, "image/jpeg")), image(images.url(f"/noise/{MB}"))))
    assert resp.status_code == 200, resp.text
    body = only_body(big_sim)
    assert content_blocks(body)[1:] == [image_block(photo, "image/jpeg"), image_block(noise_png(MB), "image/png")]


def bomb_png(width: int, height: int) -> bytes:
    """A 1-bit PNG of ``width`` x ``height`` black pixels: tiny, and past Pillow's pixel limit."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress((b"\x00" + bytes((width + 7) // 8)) * height, 9)
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def test_a_decompression_bomb_is_refused_naming_its_part_before_anything_goes_upstream(fit_gw, fit_key, big_sim):
    big_sim.clear()
    resp = post(
        fit_gw,
        fit_key,
        chat(text(), image(data_url(PNG, "image/png")), image(data_url(bomb_png(9500, 9500), "image/png"))),
    )
    assert_refused(
        resp, url_path(0, 2), f"the image has more than {Image.MAX_IMAGE_PIXELS} pixels (a decompression bomb?)"
    )
    assert big_sim.bodies() == []


@pytest.mark.parametrize(
    "where",
    ["data-url", "download"],
)
def test_bytes_pillow_cannot_decode_are_refused_naming_their_part(fit_gw, fit_key, big_sim, images, where):
    """A PNG signature followed by zeros: the signature check passes, Pillow doesn't."""
    big_sim.clear()
    garbage = PNG[:8] + bytes(4000)
    part = image(data_url(garbage, "image/png")) if where == "data-url" else image(images.url("/bytes/4000?garbage"))
    resp = post(fit_gw, fit_key, chat(text(), part))
    assert_refused(resp, url_path(0, 1), "the image could not be decoded")
    assert big_sim.bodies() == []


# ---------------------------------------------------------------- the body cap (413)


def test_a_body_over_32_mb_is_413(gw, key, sim):
    sim.clear()
    body = json.dumps(chat(text(), image(f"data:image/png;base64,{'A' * (32 * MB)}"))).encode()
    resp = post(gw, key, body)
    assert resp.status_code == 413, resp.text[:500]
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.json()["error"]["code"] == "request_too_large"
    assert sim.bodies() == []


def test_a_chunked_body_over_32_mb_is_413(gw, key, sim):
    """Without a content-length, the cap holds while reading."""
    sim.clear()
    body = json.dumps(chat(text(), image(f"data:image/png;base64,{'A' * (33 * MB)}"))).encode()
    chunks = (body[i : i + MB] for i in range(0, len(body), MB))
    resp = requests.post(
        gw.url + "/openai/v1/chat/completions",
        data=chunks,
        timeout=60,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert resp.status_code == 413, resp.text[:500]
    assert resp.json()["error"]["code"] == "request_too_large"
    assert sim.bodies() == []


# ---------------------------------------------------------------- billing


def test_a_failed_download_is_not_billed(gw, sim, images):
    key = gw.new_key("images-billing", balance="5")
    before = org_money(gw, "images-billing")
    resp = post(gw, key, chat(text(), image(images.url("/status/404?tag=billing"))))
    assert_refused(resp, url_path(0, 1), could_not("HTTP 404"))
    row = usage_row(gw, resp.headers["request-id"])
    assert (row["status"], row["cost_usd"]) == (400, "0.000000")
    assert row["input_tokens"] == row["output_tokens"] == 0
    assert org_money(gw, "images-billing") == before

    ok = post(gw, key, chat(text(), image(images.url("/image/png?tag=billing"))))
    assert ok.status_code == 200, ok.text
    assert usage_row(gw, ok.headers["request-id"])["cost_usd"] != "0.000000"
    assert org_money(gw, "images-billing")[0] < before[0]


# ---------------------------------------------------------------- PDFs


def test_a_pdf_file_part_becomes_a_document_block(gw, key, sim, sdk):
    sim.clear()
    completion = sdk.chat.completions.create(
        model=MODEL,
        max_completion_tokens=16,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "file", "file": {"file_data": data_url(PDF, "application/pdf"), "filename": "report.pdf"}},
                    {"type": "file", "file": {"file_data": data_url(PDF, "application/pdf")}},
                    text("Summarise these."),
                ],
            }
        ],
    )
    assert completion.choices[0].message.content
    body = only_body(sim)
    validate_anthropic_request(body)
    source = {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)}
    assert content_blocks(body) == [
        {"type": "document", "source": source, "title": "report.pdf"},
        {"type": "document", "source": source},
        text("Summarise these."),
    ]


def test_file_id_is_refused_with_the_spec_message(gw, key, sim, sdk):
    sim.clear()
    err = sdk_refusal(
        lambda: sdk.chat.completions.create(
            model=MODEL,
            max_completion_tokens=16,
            messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-abc123"}}, text()]}],
        )
    )
    assert err.body["message"] == f"messages[0].content[0].file: {FILE_ID}"
    assert err.param == "messages[0].content[0].file"
    assert sim.bodies() == []


@pytest.mark.parametrize(
    ("file_data", "path", "reason"),
    [
        (
            data_url(PNG, "image/png"),
            "file.file_data",
            'only PDF files are supported (got "image/png"); send data:application/pdf;base64,…',
        ),
        (
            "https://example.com/report.pdf",
            "file.file_data",
            "send the PDF as a base64 data URL (data:application/pdf;base64,…)",
        ),
        ("data:application/pdf,%PDF-1.4", "file.file_data", "data URLs must be base64: data:<type>;base64,<data>"),
    ],
    ids=["not-a-pdf", "a-url", "not-base64"],
)
def test_file_data_must_be_a_base64_pdf_data_url(gw, key, sim, file_data, path, reason):
    sim.clear()
    resp = post(gw, key, chat(text(), {"type": "file", "file": {"file_data": file_data}}))
    assert_refused(resp, f"messages[0].content[1].{path}", reason)
    assert sim.bodies() == []


# ---------------------------------------------------------------- public hosts only (the default configuration)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/image/png?tag={tag}",
        "http://169.254.169.254/latest/meta-data/?tag={tag}",
        "http://[::1]:{port}/image/png?tag={tag}",
        "http://[::ffff:127.0.0.1]:{port}/image/png?tag={tag}",
        "http://localhost:{port}/image/png?tag={tag}",
        "http://127.1:{port}/image/png?tag={tag}",
        "http://2130706433:{port}/image/png?tag={tag}",
        "http://0.0.0.0:{port}/image/png?tag={tag}",
        "https://10.0.0.1/x.png?tag={tag}",
        "http://[fd00::1]/x.png?tag={tag}",
        "http://[fe80::1%25eth0]:{port}/x.png?tag={tag}",
        "http://[64:ff9b::7f00:1]:{port}/x.png?tag={tag}",
        "http://[2002:7f00:1::]:{port}/x.png?tag={tag}",
        "http://[::ffff:169.254.169.254]/x.png?tag={tag}",
        "http://100.64.0.1/x.png?tag={tag}",
        "http://224.0.0.1/x.png?tag={tag}",
        "http://images.example.com@127.0.0.1:{port}/image/png?tag={tag}",
    ],
    ids=[
        "v4-loopback",
        "metadata",
        "v6-loopback",
        "v4-mapped-loopback",
        "localhost-name",
        "short-loopback",
        "decimal-loopback",
        "unspecified",
        "private-10",
        "v6-ula",
        "v6-link-local-zone",
        "nat64-loopback",
        "6to4-loopback",
        "v4-mapped-metadata",
        "cgnat",
        "multicast",
        "userinfo-before-loopback",
    ],
)
def test_non_public_hosts_are_refused_in_the_default_configuration(default_gw, default_key, sim, images, url):
    tag = f"guard-{time.monotonic_ns()}"
    sim.clear()
    resp = post(default_gw, default_key, chat(text(), image(url.format(port=images.port, tag=tag))))
    assert_refused(resp, url_path(0, 1), NOT_PUBLIC)
    assert images.seen(tag) == []
    assert sim.bodies() == []


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("private.test", NOT_PUBLIC),
        ("mixed.test", NOT_PUBLIC),
        ("nothing.test", could_not("the host name could not be resolved")),
    ],
    ids=["name-to-10.0.0.1", "public-and-private-answers", "no-answer"],
)
def test_names_are_judged_by_what_they_resolve_to(default_gw, default_key, sim, images, host, reason):
    tag = f"name-{time.monotonic_ns()}"
    sim.clear()
    resp = post(default_gw, default_key, chat(text(), image(f"http://{host}:{images.port}/image/png?tag={tag}")))
    assert_refused(resp, url_path(0, 1), reason)
    assert images.seen(tag) == []
    assert sim.bodies() == []


def test_a_public_host_is_downloaded_in_the_default_configuration(default_gw, default_key, sim, images):
    sim.clear()
    tag = f"public-{time.monotonic_ns()}"
    resp = post(default_gw, default_key, chat(text(), image(f"http://public.test/image/webp?tag={tag}")))
    assert resp.status_code == 200, resp.text
    assert content_blocks(only_body(sim))[1] == image_block(*IMAGES["webp"])
    assert images.seen(tag) == [(f"/image/webp?tag={tag}", "public.test")]


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/image/png?tag={tag}",
        "http://[::1]:{port}/image/png?tag={tag}",
        "http://169.254.169.254/latest/meta-data/?tag={tag}",
        "http://private.test:{port}/image/png?tag={tag}",
        "http://localhost:{port}/image/png?tag={tag}",
    ],
    ids=["to-v4-loopback", "to-v6-loopback", "to-metadata", "to-name-of-10.0.0.1", "to-localhost"],
)
def test_a_redirect_from_a_public_host_to_a_private_one_is_not_followed(default_gw, default_key, images, target):
    tag = f"hop-{time.monotonic_ns()}"
    location = target.format(port=images.port, tag=tag)
    first = f"/redirect-to?tag={tag}&url={quote(location)}"
    resp = post(default_gw, default_key, chat(text(), image(f"http://public.test{first}")))
    assert_refused(resp, url_path(0, 1), NOT_PUBLIC)
    assert images.seen(tag) == [(first, "public.test")]  # the public hop only


def test_the_connection_goes_to_the_checked_address_not_a_rebound_one(default_gw, default_key, images, canary):
    """DNS rebinding: public when checked, 127.0.0.1 afterwards; the loopback server sees nothing."""
    resp = post(default_gw, default_key, chat(text(), image(f"http://rebind.test:{images.port}/image/gif?tag=rebind")))
    assert resp.status_code == 200, resp.text
    assert images.seen("tag=rebind") == []
    assert canary.seen("tag=rebind") == [("/image/gif?tag=rebind", f"rebind.test:{images.port}")]


def test_the_default_configuration_still_takes_data_urls(default_gw, default_key, sim):
    sim.clear()
    resp = post(default_gw, default_key, chat(text(), image(data_url(*IMAGES["webp"]))))
    assert resp.status_code == 200, resp.text
    assert content_blocks(only_body(sim))[1] == image_block(*IMAGES["webp"])


def test_allowing_private_hosts_is_announced_at_start_up(gw, default_gw):
    assert "allow_private_image_hosts" not in default_gw.config_path.read_text()
    assert ALLOW_PRIVATE_WARNING in gw.log_text()
    assert "allow_private_image_hosts" not in default_gw.log_text()


def test_no_request_of_this_module_left_a_traceback_in_the_gateway_logs(gw, default_gw):
    """Runs last: every failure above was answered on purpose, none by the catch-all handler."""
    for server in (gw, default_gw):
        log = server.log_text()
        assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


# ---------------------------------------------------------------- PDFs by URL (Responses API)


def responses_post(gateway: Gateway, key: str, body: Any) -> requests.Response:
    return requests.post(
        gateway.url + "/openai/v1/responses",
        json=body,
        timeout=60,
        headers={"authorization": f"Bearer {key}"},
    )


def pdf_by_url(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_output_tokens": 16,
        "store": False,
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_file", "file_url": url, **extra},
                    {"type": "input_text", "text": "Sum up."},
                ],
            }
        ],
    }


def test_a_pdf_by_url_is_downloaded_and_sent_as_a_base64_document(gw, key, sim, images):
    tag = f"pdf-{time.monotonic_ns()}"
    sim.clear()
    resp = responses_post(gw, key, pdf_by_url(images.url(f"/pdf?tag={tag}"), filename="report.pdf"))
    assert resp.status_code == 200, resp.text
    assert len(images.seen(tag)) == 1  # the gateway fetched it, not the upstream
    body = only_body(sim)
    validate_anthropic_request(body)
    assert content_blocks(body)[0] == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
        "title": "report.pdf",
    }


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        ("/html-as-png", "the file is not a PDF"),
        ("/status/404", "could not download the PDF (HTTP 404)"),
    ],
    ids=["not-a-pdf", "http-404"],
)
def test_a_pdf_url_that_fails_is_a_400_naming_the_part(gw, key, sim, images, route, reason):
    sim.clear()
    resp = responses_post(gw, key, pdf_by_url(images.url(route)))
    assert_refused(resp, "input[0].content[0].file_url", reason)
    assert sim.bodies() == []


def test_a_pdf_url_to_a_private_host_is_refused_by_the_image_guard(default_gw, default_key, sim, images):
    tag = f"pdf-guard-{time.monotonic_ns()}"
    sim.clear()
    resp = responses_post(default_gw, default_key, pdf_by_url(images.url(f"/pdf?tag={tag}")))
    assert_refused(resp, "input[0].content[0].file_url", NOT_PUBLIC.replace("the image", "the PDF"))
    assert images.seen(tag) == []
    assert sim.bodies() == []
