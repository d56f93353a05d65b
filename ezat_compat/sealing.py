"""Sealed reasoning: thinking blocks handed to a client as an opaque, tamper-proof string
(docs/responses.md, "Reasoning": ``include: ["reasoning.encrypted_content"]``).

A reasoning item's ``encrypted_content`` carries the Anthropic ``thinking`` and
``redacted_thinking`` blocks of a reply, signatures included, so a stateless client (one that
sends ``store: false``) can give them back on its next tool round and the blocks are restored
exactly as received. They are sealed with AES-256-GCM (the ``cryptography`` package) under the
gateway's secret, with the organisation's id as associated data.

A key ring: the current key seals, older keys still open. Each sealed text names the key that
sealed it (``ezs2.``: a 4-byte key id, a digest of the key, before the nonce), so opening tries
one key, and the outcomes are told apart:

- sealed under a key of the ring: the blocks; a changed byte or another organisation's item
  fails to open (``SealError``) and the request answers 400 naming the item (the client's to fix);
- sealed under a key the ring doesn't hold (rotated out, another node's generated key):
  ``None``, and the caller drops the blocks: the request goes on without that thinking
  (docs/responses.md, "Reasoning"), never a 400 the client can't fix. Texts of the first format
  (``ezs1.``, no key id) are tried with every key, and dropped when none opens them.

The current key comes from ``EZAT_SEALING_KEY`` (32 bytes, base64 or hex) when it is set — set it
on every node of a cluster so that each opens what the others sealed — or else from the file
``ezat-sealing.key`` in the data folder, generated once (mode 0600) by the first process. Older
keys: ``EZAT_SEALING_KEYS_OLD`` (the same encodings, separated by commas or white space), and the
key file's further lines. To rotate: move the current key to ``EZAT_SEALING_KEYS_OLD`` (on every
node), set the new one, restart; drop the old one once no stored response needs it
(``[responses] ttl_days``).

    sealer = load_sealer(folder)
    text = sealer.seal(org_id, blocks)       # -> "ezs2.<base64url>"
    blocks = sealer.unseal(org_id, text)     # None: no key of the ring sealed it; SealError: changed or foreign
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ezat_compat.datafiles import private_dir, writable_problem

KEY_ENV = "EZAT_SEALING_KEY"
OLD_KEYS_ENV = "EZAT_SEALING_KEYS_OLD"
KEY_FILE = "ezat-sealing.key"
KEY_BYTES = 32
NONCE_BYTES = 12
PREFIX = "ezs2."  # the format version (a key id, the nonce, the sealed blocks)
PREFIX_V1 = "ezs1."  # the first format (the nonce, the sealed blocks): still opened
KEY_ID_BYTES = 4
_AAD = b"ezat-compat reasoning v1 org:"
KEY_FILE_WAIT_S = 2.0  # how long an empty key file may wait for its creator to write it


class SealError(Exception):
    """The sealed text can't be opened: not ours, changed, or sealed for another organisation."""


def _decode_key(text: str, name: str = KEY_ENV) -> bytes:
    text = text.strip()
    for decode in (bytes.fromhex, base64.b64decode, base64.urlsafe_b64decode):
        try:
            key = decode(text + ("" if decode is bytes.fromhex else "=" * (-len(text) % 4)))
        except (ValueError, binascii.Error):
            continue
        if len(key) == KEY_BYTES:
            return key
    raise ValueError(f"{name} must hold {KEY_BYTES} bytes as hex or base64")


def _decode_keys(text: str, name: str) -> list[bytes]:
    """Keys separated by commas or white space (``EZAT_SEALING_KEYS_OLD``, the key file's lines)."""
    return [_decode_key(part, name) for part in re.split(r"[,\s]+", text) if part]


def key_id(key: bytes) -> bytes:
    """The 4 bytes that name ``key`` in what it sealed: a digest, which tells nothing of the key."""
    return hashlib.sha256(b"ezat-compat sealing key id:" + key).digest()[:KEY_ID_BYTES]


class Sealer:
    """Seals under the current key and opens what any key of the ring sealed (module docstring)."""

    __slots__ = ("_aead", "_derived", "_id", "_ring")

    def __init__(self, key: bytes, old: Sequence[bytes] = ()) -> None:
        for k in (key, *old):
            if len(k) != KEY_BYTES:
                raise ValueError(f"the sealing key must be {KEY_BYTES} bytes")
        self._aead = AESGCM(key)
        self._id = key_id(key)
        self._derived = hmac.new(key, b"ezat-compat derived key:", "sha256")  # ``derive``'s start
        self._ring: dict[bytes, AESGCM] = {}  # key id -> cipher: the current key first
        for k in (key, *old):
            self._ring.setdefault(key_id(k), AESGCM(k))

    def derive(self, purpose: bytes) -> bytes:
        """A 32-byte key for another use of the gateway's secret, named by ``purpose`` (HMAC-SHA256
        under the current key): the same on every node that shares the key, another once it is
        rotated, and telling nothing of the key (``translate.cache_scope.CacheScopes``)."""
        mac = self._derived.copy()
        mac.update(purpose)
        return mac.digest()

    def seal(self, org_id: int, blocks: list[dict[str, Any]]) -> str:
        """``blocks`` as a sealed string bound to ``org_id`` (a fresh random nonce each time)."""
        nonce = os.urandom(NONCE_BYTES)
        plain = json.dumps(blocks, ensure_ascii=True, separators=(",", ":")).encode()
        sealed = self._aead.encrypt(nonce, plain, _AAD + str(org_id).encode())
        return PREFIX + base64.urlsafe_b64encode(self._id + nonce + sealed).decode("ascii").rstrip("=")

    def unseal(self, org_id: int, text: Any) -> list[dict[str, Any]] | None:
        """The blocks sealed in ``text`` for ``org_id``; ``None`` when no key of the ring sealed
        it (the caller goes on without them); ``SealError`` when it isn't a sealed text, or was
        changed, or was sealed for another organisation."""
        if not isinstance(text, str) or not text.startswith((PREFIX, PREFIX_V1)):
            raise SealError("not sealed by this gateway")
        raw = text[len(PREFIX) :]
        try:
            data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        except (ValueError, binascii.Error):
            raise SealError("not valid base64url") from None
        aad = _AAD + str(org_id).encode()
        if text.startswith(PREFIX_V1):  # no key id: every key is tried
            if len(data) <= NONCE_BYTES:
                raise SealError("too short")
            plain = next((p for a in self._ring.values() if (p := _open(a, data, aad)) is not None), None)
            return None if plain is None else _blocks(plain)
        if len(data) <= KEY_ID_BYTES + NONCE_BYTES:
            raise SealError("too short")
        aead = self._ring.get(data[:KEY_ID_BYTES])
        if aead is None:
            return None  # a key this gateway doesn't hold (rotated out, another node's)
        plain = _open(aead, data[KEY_ID_BYTES:], aad)
        if plain is None:
            raise SealError("changed, or sealed for another organisation")
        return _blocks(plain)


def _open(aead: AESGCM, data: bytes, aad: bytes) -> bytes | None:
    try:
        return aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], aad)
    except InvalidTag:
        return None


def _blocks(plain: bytes) -> list[dict[str, Any]]:
    blocks = json.loads(plain)
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise SealError("not a list of blocks")
    return blocks


def _keys_from_file(path: Path) -> list[bytes]:
    """Read the key file (its first line the current key, further lines older keys), or create it
    (0600) with one key if absent; a race between processes is settled by ``O_EXCL``: the loser
    reads what the winner wrote."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        deadline = time.monotonic() + KEY_FILE_WAIT_S  # the creator writes right after creating
        while True:
            text = path.read_text().strip()
            if text:
                return _decode_keys(text, str(path))
            if time.monotonic() >= deadline:
                raise ValueError(f"{path} is empty: delete it to let the gateway generate a key") from None
            time.sleep(0.01)
    key = os.urandom(KEY_BYTES)
    with os.fdopen(fd, "w") as out:
        out.write(key.hex() + "\n")
    return [key]


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
    """The process's key ring: the current key from ``EZAT_SEALING_KEY``, else the first line of
    ``folder/ezat-sealing.key`` (generated once); older keys from ``EZAT_SEALING_KEYS_OLD`` and
    the key file's further lines."""
    environ = os.environ if environ is None else environ
    old = _decode_keys(environ.get(OLD_KEYS_ENV, ""), OLD_KEYS_ENV)
    text = environ.get(KEY_ENV, "")
    if text.strip():
        return Sealer(_decode_key(text), old)
    current, *older = _keys_from_file(private_dir(folder) / KEY_FILE)  # a missing data folder is made 0700
    return Sealer(current, [*old, *older])
