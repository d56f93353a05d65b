"""Sealed reasoning: thinking blocks handed to a client as an opaque, tamper-proof string
(docs/responses.md, "Reasoning": ``include: ["reasoning.encrypted_content"]``).

A reasoning item's ``encrypted_content`` carries the Anthropic ``thinking`` and
``redacted_thinking`` blocks of a reply, signatures included, so a stateless client (one that
sends ``store: false``) can give them back on its next tool round and the blocks are restored
exactly as received. They are sealed with AES-256-GCM (the ``cryptography`` package) under the
gateway's secret, with the organisation's id as associated data: a changed byte, another
gateway's item or another organisation's item fails to open (``SealError``), and the request
answers 400.

The secret comes from ``EZAT_SEALING_KEY`` (32 bytes, base64 or hex) when it is set — set it on
every node of a cluster so that each opens what the others sealed — or else from the file
``ezat-sealing.key`` in the data folder, generated once (mode 0600) by the first process.

    sealer = load_sealer(folder)
    text = sealer.seal(org_id, blocks)       # -> "ezs1.<base64url>"
    blocks = sealer.unseal(org_id, text)     # SealError when tampered with or foreign
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ezat_compat.datafiles import private_dir, writable_problem

KEY_ENV = "EZAT_SEALING_KEY"
KEY_FILE = "ezat-sealing.key"
KEY_BYTES = 32
NONCE_BYTES = 12
PREFIX = "ezs1."  # the format version: a later format gets another prefix
_AAD = b"ezat-compat reasoning v1 org:"
KEY_FILE_WAIT_S = 2.0  # how long an empty key file may wait for its creator to write it


class SealError(Exception):
    """The sealed text can't be opened: not ours, changed, or sealed for another organisation."""


def _decode_key(text: str) -> bytes:
    text = text.strip()
    for decode in (bytes.fromhex, base64.b64decode, base64.urlsafe_b64decode):
        try:
            key = decode(text + ("" if decode is bytes.fromhex else "=" * (-len(text) % 4)))
        except (ValueError, binascii.Error):
            continue
        if len(key) == KEY_BYTES:
            return key
    raise ValueError(f"{KEY_ENV} must hold {KEY_BYTES} bytes as hex or base64")


class Sealer:
    """Seals and opens block lists under one 32-byte key."""

    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"the sealing key must be {KEY_BYTES} bytes")
        self._aead = AESGCM(key)

    def seal(self, org_id: int, blocks: list[dict[str, Any]]) -> str:
        """``blocks`` as a sealed string bound to ``org_id`` (a fresh random nonce each time)."""
        nonce = os.urandom(NONCE_BYTES)
        plain = json.dumps(blocks, ensure_ascii=True, separators=(",", ":")).encode()
        sealed = self._aead.encrypt(nonce, plain, _AAD + str(org_id).encode())
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii").rstrip("=")

    def unseal(self, org_id: int, text: Any) -> list[dict[str, Any]]:
        """The blocks sealed in ``text`` for ``org_id``; ``SealError`` otherwise."""
        if not isinstance(text, str) or not text.startswith(PREFIX):
            raise SealError("not sealed by this gateway")
        raw = text[len(PREFIX) :]
        try:
            data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        except (ValueError, binascii.Error):
            raise SealError("not valid base64url") from None
        if len(data) <= NONCE_BYTES:
            raise SealError("too short")
        try:
            plain = self._aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], _AAD + str(org_id).encode())
        except InvalidTag:
            raise SealError("changed, or sealed by another gateway or for another organisation") from None
        blocks = json.loads(plain)
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise SealError("not a list of blocks")
        return blocks


def _key_from_file(path: Path) -> bytes:
    """Read the key file, or create it (0600) if absent; a race between processes is settled by
    ``O_EXCL``: the loser reads what the winner wrote."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        deadline = time.monotonic() + KEY_FILE_WAIT_S  # the creator writes right after creating
        while True:
            text = path.read_text().strip()
            if text:
                return _decode_key(text)
            if time.monotonic() >= deadline:
                raise ValueError(f"{path} is empty: delete it to let the gateway generate a key") from None
            time.sleep(0.01)
    key = os.urandom(KEY_BYTES)
    with os.fdopen(fd, "w") as out:
        out.write(key.hex() + "\n")
    return key


def sealing_key_problem(folder: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str | None:
    """Why no sealing key could be had (``None`` when one can): ``EZAT_SEALING_KEY`` that isn't
    a key, a key file that can't be read or isn't a key, or no key file and a data folder where
    one can't be made. Nothing is created: ``check-config`` may run as another user (root) than
    the server, and a key file it made would be unreadable to the server."""
    environ = os.environ if environ is None else environ
    text = environ.get(KEY_ENV, "")
    if text.strip():
        try:
            _decode_key(text)
        except ValueError as exc:
            return str(exc)
        return None
    path = Path(folder) / KEY_FILE
    if not path.exists():
        problem = writable_problem(folder)
        return None if problem is None else f"cannot make the sealing key {path}: {problem}; or set {KEY_ENV}"
    try:
        _decode_key(path.read_text())
    except OSError as exc:
        return f"cannot read the sealing key {path}: {exc.strerror}"
    except ValueError:
        return f"{path} holds no {KEY_BYTES}-byte key (hex or base64): restore it from a backup, or delete it"
    return None


def load_sealer(folder: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Sealer:
    """The process's sealer: the key from ``EZAT_SEALING_KEY``, else ``folder/ezat-sealing.key``
    (generated once)."""
    environ = os.environ if environ is None else environ
    text = environ.get(KEY_ENV, "")
    if text.strip():
        return Sealer(_decode_key(text))
    return Sealer(_key_from_file(private_dir(folder) / KEY_FILE))  # a missing data folder is made 0700
