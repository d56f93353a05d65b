"""Sealed reasoning (docs/responses.md, "Reasoning"): blocks come back exactly; a changed byte,
another organisation fails to open; a key the ring doesn't hold gives nothing (the caller drops
the thinking); older keys still open; the key from the environment or generated once into the
data folder (0600)."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ezat_compat.sealing import (
    KEY_ENV,
    KEY_FILE,
    KEY_ID_BYTES,
    OLD_KEYS_ENV,
    PREFIX,
    PREFIX_V1,
    Sealer,
    SealError,
    load_sealer,
)

BLOCKS = [
    {"type": "thinking", "thinking": "Tōkyō first\n", "signature": "EuYBCkQYAiJA+/=="},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix=="},
]
KEY = bytes(range(32))


def test_blocks_come_back_exactly() -> None:
    sealer = Sealer(KEY)
    sealed = sealer.seal(7, BLOCKS)
    assert sealed.startswith(PREFIX) and "Tōkyō" not in sealed and "signature" not in sealed
    assert sealer.unseal(7, sealed) == BLOCKS
    assert sealer.seal(7, BLOCKS) != sealed  # a fresh nonce each time


def _flip(sealed: str, at: int) -> str:
    text = sealed[len(PREFIX) :]
    raw = bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    raw[at] ^= 1
    return PREFIX + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


@pytest.mark.parametrize(
    ("change", "org"),
    [
        pytest.param(lambda s: _flip(s, KEY_ID_BYTES), 7, id="nonce-changed"),
        pytest.param(lambda s: _flip(s, 20), 7, id="ciphertext-changed"),
        pytest.param(lambda s: _flip(s, -1), 7, id="tag-changed"),
        pytest.param(lambda s: s, 8, id="another-organisation"),
        pytest.param(lambda s: s[:-10], 7, id="truncated"),
        pytest.param(lambda s: "gAAAA" + s, 7, id="not-ours"),
        pytest.param(lambda s: PREFIX + "!!!", 7, id="not-base64"),
        pytest.param(lambda s: PREFIX, 7, id="empty"),
        pytest.param(lambda s: 42, 7, id="not-a-string"),
    ],
)
def test_tampered_or_foreign_fails(change, org: int) -> None:
    sealed = Sealer(KEY).seal(7, BLOCKS)
    with pytest.raises(SealError):
        Sealer(KEY).unseal(org, change(sealed))


def test_a_key_the_ring_does_not_hold_gives_nothing() -> None:
    sealed = Sealer(KEY).seal(7, BLOCKS)
    assert Sealer(bytes(32)).unseal(7, sealed) is None  # rotated out, another node's key: dropped, not refused
    assert Sealer(KEY).unseal(7, _flip(sealed, 0)) is None  # a changed key id names no key either


def test_older_keys_open_and_the_current_key_seals() -> None:
    a, b, c = KEY, bytes(32), bytes(range(1, 33))
    sealed_a = Sealer(a).seal(7, BLOCKS)
    ring = Sealer(b, old=[a])
    assert ring.unseal(7, sealed_a) == BLOCKS
    sealed_b = ring.seal(7, BLOCKS)
    assert Sealer(b).unseal(7, sealed_b) == BLOCKS and Sealer(a).unseal(7, sealed_b) is None
    assert Sealer(c, old=[b]).unseal(7, sealed_a) is None
    with pytest.raises(SealError):  # a key of the ring, another organisation: still refused
        ring.unseal(8, sealed_a)


def test_the_first_format_is_opened_by_any_key_of_the_ring() -> None:
    nonce = bytes(12)
    sealed = AESGCM(KEY).encrypt(nonce, json.dumps(BLOCKS).encode(), b"ezat-compat reasoning v1 org:7")
    v1 = PREFIX_V1 + base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")
    assert Sealer(bytes(32), old=[KEY]).unseal(7, v1) == BLOCKS
    assert Sealer(bytes(32)).unseal(7, v1) is None


def test_old_keys_from_the_environment_and_the_key_file(tmp_path: Path) -> None:
    a, b, c = KEY, bytes(32), bytes(range(1, 33))
    sealed_a, sealed_c = Sealer(a).seal(1, BLOCKS), Sealer(c).seal(1, BLOCKS)
    ring = load_sealer(tmp_path, {KEY_ENV: b.hex(), OLD_KEYS_ENV: f"{a.hex()}, {base64.b64encode(c).decode()}"})
    assert ring.unseal(1, sealed_a) == BLOCKS and ring.unseal(1, sealed_c) == BLOCKS
    (tmp_path / "data").mkdir(mode=0o700)
    (tmp_path / "data" / KEY_FILE).write_text(f"{b.hex()}\n{a.hex()}\n")
    ring = load_sealer(tmp_path / "data", {})
    assert ring.unseal(1, sealed_a) == BLOCKS and Sealer(b).unseal(1, ring.seal(1, BLOCKS)) == BLOCKS
    with pytest.raises(ValueError, match=OLD_KEYS_ENV):
        load_sealer(tmp_path, {KEY_ENV: b.hex(), OLD_KEYS_ENV: "short"})


@pytest.mark.parametrize("encode", [bytes.hex, lambda k: base64.b64encode(k).decode()], ids=["hex", "base64"])
def test_key_from_the_environment(tmp_path: Path, encode) -> None:
    sealer = load_sealer(tmp_path, {KEY_ENV: encode(KEY)})
    assert Sealer(KEY).unseal(1, sealer.seal(1, BLOCKS)) == BLOCKS
    assert not (tmp_path / KEY_FILE).exists()


def test_a_bad_environment_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=KEY_ENV):
        load_sealer(tmp_path, {KEY_ENV: "too-short"})


def test_key_generated_once_into_the_data_folder(tmp_path: Path) -> None:
    first = load_sealer(tmp_path / "data", {})
    path = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    second = load_sealer(tmp_path / "data", {})
    assert path.read_text() == text
    assert second.unseal(3, first.seal(3, BLOCKS)) == BLOCKS


def test_an_empty_key_file_is_refused_after_a_bounded_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ezat_compat.sealing.KEY_FILE_WAIT_S", 0.1)
    (tmp_path / KEY_FILE).write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_sealer(tmp_path, {})


def test_a_sealing_failure_is_logged_once_with_its_path_and_answered_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the shipped unit the data folder was read-only: the client got "no key to seal reasoning
    with (Permission denied …/ezat-sealing.key)", a server path. The operator's
    log names the path, once; the client's 500 names none."""
    from types import SimpleNamespace

    from flask import Flask

    from ezat_compat.api.responses import NO_SEALING_KEY, dialect_of, install
    from ezat_compat.config import parse_config
    from ezat_compat.errors import GatewayError

    monkeypatch.delenv(KEY_ENV, raising=False)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # the key file can't be made inside it, whoever runs the test
    config = parse_config(
        {
            "gateway": {"data_dir": str(blocked)},
            "responses": {"store": False},
            "models": [
                {
                    "id": "anthropic/m",
                    "aliases": ["m"],
                    "price": {"input": 3, "output": 15},
                    "deployments": [{"name": "a", "base_url": "http://a", "upstream_model": "ma"}],
                }
            ],
        },
        path=str(tmp_path / "ezat.toml"),
        environ={},
    )
    app = Flask("t")
    app.extensions["ezat"] = SimpleNamespace(config=config)
    install(app, config, None)  # the composition root's step: the sealer is loaded here, or not
    for _ in range(3):
        with pytest.raises(GatewayError) as caught, caplog.at_level("ERROR", logger="ezat_compat"):
            dialect_of(app)
        assert caught.value.status == 500 and caught.value.message == NO_SEALING_KEY
        assert str(tmp_path) not in caught.value.message and "/" not in caught.value.message
    (record,) = [r for r in caplog.records if "seal" in r.getMessage()]
    assert str(blocked / KEY_FILE) in record.getMessage() and KEY_ENV in record.getMessage()
