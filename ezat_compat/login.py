"""A person's sign-in from a laptop: ``ezat-compat login`` and ``ezat-compat token`` (docs/people.md).

``login(gateway)`` runs the device authorization grant (RFC 8628) against the gateway's
``/oauth/device/code`` and ``/oauth/token`` (api/oauth.py): it prints the verification address
and the code on stderr (and opens the browser on the address with the code filled in, unless
``no_browser``), polls at the interval the gateway asks (``slow_down``: 5 s more, section 3.5)
until the person has signed in at the company's IdP, and keeps what it got: the refresh token,
the current key and when it expires.

``token(gateway)`` prints a valid key on stdout, alone on its line: the kept one while more than
``refresh_margin`` of its life is left (5 minutes, or a tenth of its life if that is less), else
a new one, from the refresh token (rotated at each use: the new one is kept). Concurrent calls are
safe: one file lock around reading, refreshing and writing, so two programs asking at once refresh
once. When it can't (never signed in, the sign-in is over, the gateway refuses), it prints one
line on stderr naming ``ezat-compat login --gateway URL`` and exits 1.

Where it is kept, one entry per gateway URL: the OS keyring (service ``ezat-compat``, the
gateway's URL as the user name) when the ``keyring`` package is importable and has a usable
backend (``PYTHON_KEYRING_BACKEND=keyring.backends.null.Keyring`` turns it off), and an index of
the gateways in ``credentials.json``; else the secrets themselves in ``credentials.json``. The
file is in ``$XDG_CONFIG_HOME/ezat-compat/`` (``~/.config`` by default), made 0600 in a folder
made 0700, and replaced atomically. Neither command reads the gateway's configuration file.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import tempfile
import time
import webbrowser
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import requests

CLIENT_ID = "ezat-cli"  # the ``client_id`` this command presents
DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
KEYRING_SERVICE = "ezat-compat"
FOLDER_NAME = "ezat-compat"
FILE_NAME = "credentials.json"
LOCK_NAME = "credentials.lock"
TIMEOUT_S = 30.0  # connect and read, each request to the gateway
REFRESH_BEFORE_S = 300.0  # a key with less than this left (or a tenth of its life) is replaced
SLOW_DOWN_S = 5.0  # RFC 8628 section 3.5
FORMAT_VERSION = 1


class LoginError(Exception):
    """The sign-in or the refresh can't be done; the message is the one line to print."""


class SignInOverError(LoginError):
    """The gateway refused the refresh token (``invalid_grant``): the person signs in again."""


@dataclass(frozen=True, slots=True)
class Credential:
    """What is kept for one gateway."""

    gateway: str
    refresh_token: str
    key: str
    expires_at: float  # the key's end, seconds since the epoch
    life_s: float  # the key's life when it was minted

    def fresh(self, now: float) -> bool:
        """Whether the key has more than the refresh margin left at ``now``."""
        return self.expires_at - now > refresh_margin(self.life_s)


def refresh_margin(life_s: float) -> float:
    """How much of a key's life must be left to keep using it: 5 minutes, or a tenth of its life
    if that is less (a key of a few minutes is not refreshed at every call)."""
    return min(REFRESH_BEFORE_S, max(life_s, 0.0) / 10)


def normal_gateway(url: str) -> str:
    """The gateway's URL as kept: ``http(s)://host[:port][/prefix]``, no final slash."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise LoginError(f"--gateway: an http(s) URL such as https://llm.example.com, not {url!r}")
    return url


def _relogin(gateway: str) -> str:
    return f"run `ezat-compat login --gateway {gateway}`"


# ---------------------------------------------------------------- where credentials are kept


def config_folder(environ: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/ezat-compat`` (``~/.config/ezat-compat`` when unset or empty)."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / FOLDER_NAME


def _usable_keyring() -> Any | None:
    """The ``keyring`` module when it is installed and its backend can keep secrets, else None."""
    try:
        keyring = importlib.import_module("keyring")
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
        priority = float(getattr(backend, "priority", 0))
    except Exception:  # a backend that fails to load (no D-Bus…) is no backend
        return None
    module = type(backend).__module__
    if priority <= 0 or module.startswith(("keyring.backends.fail", "keyring.backends.null")):
        return None
    return keyring


class Credentials:
    """The credentials of every gateway signed in to (module docstring), in ``folder``."""

    def __init__(self, folder: Path, keyring: Any | None = None) -> None:
        self.folder = folder
        self.path = folder / FILE_NAME
        self._keyring = keyring

    @classmethod
    def default(cls) -> Credentials:
        return cls(config_folder(), _usable_keyring())

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lock every reader and writer of the credentials takes (blocking)."""
        self._make_folder()
        fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _lock(fd)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _make_folder(self) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.folder, 0o700)

    def _read(self) -> dict[str, Any]:
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise LoginError(f"{self.path} can't be read ({exc}); remove it and sign in again") from None
        entries = document.get("gateways") if isinstance(document, dict) else None
        return entries if isinstance(entries, dict) else {}

    def _write(self, entries: dict[str, Any]) -> None:
        self._make_folder()
        data = json.dumps({"version": FORMAT_VERSION, "gateways": entries}, indent=2, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".credentials-", dir=self.folder)  # made 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def gateways(self) -> list[str]:
        """The gateways signed in to, sorted."""
        return sorted(self._read())

    def load(self, gateway: str) -> Credential | None:
        entry = self._read().get(gateway)
        if not isinstance(entry, dict):
            return None
        if entry.get("store") == "keyring":
            if self._keyring is None:
                return None
            try:
                secret = self._keyring.get_password(KEYRING_SERVICE, gateway)
            except Exception as exc:
                raise LoginError(f"the OS keyring can't be read ({type(exc).__name__}); {_relogin(gateway)}") from None
            if not secret:
                return None
            try:
                entry = json.loads(secret)
            except ValueError:
                return None
        try:
            return Credential(
                gateway=gateway,
                refresh_token=str(entry["refresh_token"]),
                key=str(entry["key"]),
                expires_at=float(entry["expires_at"]),
                life_s=float(entry["life_s"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def save(self, credential: Credential) -> None:
        entries = self._read()
        fields = asdict(credential)
        del fields["gateway"]
        if self._keyring is not None:
            try:
                self._keyring.set_password(KEYRING_SERVICE, credential.gateway, json.dumps(fields))
            except Exception:  # a keyring that refuses (locked, no session): the file
                pass
            else:  # the file names the keyring only; its own failure must not put the secrets in it
                entries[credential.gateway] = {"store": "keyring"}
                self._write(entries)
                return
        entries[credential.gateway] = {"store": "file", **fields}
        self._write(entries)


def _lock(fd: int) -> None:
    """Take the exclusive lock of the open file ``fd`` (released when it is closed)."""
    if sys.platform == "win32":  # pragma: no cover - Windows
        import msvcrt

        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # retries for 10 s, then OSError: again
                return
            except OSError:
                continue
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)


# ---------------------------------------------------------------- talking to the gateway


def _post(url: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST ``form`` to ``url``: the status and the JSON object answered. ``requests``'
    ``RequestException`` when the gateway can't be reached."""
    response = requests.post(url, data=form, timeout=TIMEOUT_S, headers={"accept": "application/json"})
    try:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"error": f"HTTP {response.status_code}", "error_description": response.text[:200].strip()}
        return response.status_code, body
    finally:
        response.close()


def _described(body: dict[str, Any]) -> str:
    error = str(body.get("error") or "error")
    description = str(body.get("error_description") or "").strip()
    return f"{error}: {description}" if description else error


def _credential(gateway: str, body: dict[str, Any], now: float) -> Credential:
    try:
        key, refresh, life = str(body["access_token"]), str(body["refresh_token"]), float(body["expires_in"])
    except (KeyError, TypeError, ValueError):
        raise LoginError(f"the gateway's answer has no usable tokens; {_relogin(gateway)}") from None
    return Credential(gateway=gateway, refresh_token=refresh, key=key, expires_at=now + life, life_s=life)


def sign_in(
    gateway: str,
    *,
    no_browser: bool = False,
    out: TextIO | None = None,
    sleep: Any = time.sleep,
    clock: Any = time.time,
) -> Credential:
    """The device grant against ``gateway`` (module docstring): the credential it gave.
    ``LoginError`` when the person refused, the code expired, or the gateway can't be used."""
    out = out or sys.stderr
    try:
        status, body = _post(f"{gateway}/oauth/device/code", {"client_id": CLIENT_ID})
    except requests.RequestException as exc:
        raise LoginError(f"can't reach {gateway} ({type(exc).__name__})") from None
    if status == 404:
        raise LoginError(f"{gateway} offers no command-line sign-in (its [identity] issuer is not set)")
    if status != 200 or "device_code" not in body:
        raise LoginError(f"{gateway} refused to start a sign-in ({_described(body)})")
    code, user_code = str(body["device_code"]), str(body.get("user_code", ""))
    uri = str(body.get("verification_uri", ""))
    complete = str(body.get("verification_uri_complete") or uri)
    interval = float(body.get("interval") or 5)
    deadline = clock() + float(body.get("expires_in") or 600)
    print(f"To sign in, open {uri} and enter the code {user_code}", file=out)
    print(f"(or open {complete})", file=out)
    if not no_browser:
        with contextlib.suppress(Exception):
            webbrowser.open(complete)
    print("Waiting for the sign-in to finish in the browser…", file=out, flush=True)
    while True:
        sleep(interval)
        if clock() >= deadline:
            raise LoginError("the code has expired before the sign-in finished; run `ezat-compat login` again")
        try:
            status, body = _post(
                f"{gateway}/oauth/token", {"grant_type": DEVICE_CODE_GRANT, "device_code": code, "client_id": CLIENT_ID}
            )
        except requests.RequestException:
            continue  # a blip: poll again at the interval until the code expires
        if status == 200:
            return _credential(gateway, body, clock())
        error = body.get("error")
        if error == "authorization_pending":
            continue
        if error == "slow_down":
            interval = max(interval + SLOW_DOWN_S, float(body.get("interval") or 0))
            continue
        if error == "access_denied":
            raise LoginError("the sign-in was refused (see the browser's page for why)")
        if error == "expired_token":
            raise LoginError("the code has expired before the sign-in finished; run `ezat-compat login` again")
        if status >= 500:
            continue
        raise LoginError(f"the sign-in failed ({_described(body)})")


def refreshed(credential: Credential, *, clock: Any = time.time) -> Credential:
    """A new key (and refresh token) for ``credential``. ``SignInOverError`` when the gateway
    refuses the refresh token (the sign-in is over), ``LoginError`` when it can't be used now."""
    gateway = credential.gateway
    try:
        status, body = _post(
            f"{gateway}/oauth/token",
            {"grant_type": "refresh_token", "refresh_token": credential.refresh_token, "client_id": CLIENT_ID},
        )
    except requests.RequestException as exc:
        raise LoginError(f"can't reach {gateway} ({type(exc).__name__}); {_relogin(gateway)}") from None
    if status == 200:
        return _credential(gateway, body, clock())
    if body.get("error") == "invalid_grant":
        raise SignInOverError(f"the sign-in to {gateway} is over; {_relogin(gateway)}")
    raise LoginError(f"{gateway} refused the refresh ({_described(body)}); {_relogin(gateway)}")


def _gateway_for_token(credentials: Credentials, gateway: str | None) -> str:
    if gateway:
        return normal_gateway(gateway)
    known = credentials.gateways()
    if len(known) == 1:
        return known[0]
    if not known:
        raise LoginError("not signed in; run `ezat-compat login --gateway URL`")
    raise LoginError(f"signed in to several gateways ({', '.join(known)}); name one with --gateway URL")


def current_key(credentials: Credentials, gateway: str | None, *, clock: Any = time.time) -> str:
    """A valid key for ``gateway`` (or the one gateway signed in to), refreshed if need be
    under the credentials' lock."""
    with credentials.locked():
        url = _gateway_for_token(credentials, gateway)
        credential = credentials.load(url)
        if credential is None:
            raise LoginError(f"not signed in to {url}; {_relogin(url)}")
        if credential.fresh(clock()):
            return credential.key
        try:
            credential = refreshed(credential, clock=clock)
        except SignInOverError:
            raise
        except LoginError:
            if credential.expires_at > clock():  # the gateway is away: the kept key still works a little longer
                print(f"ezat-compat: warning: {url} could not renew the key; it expires soon", file=sys.stderr)
                return credential.key
            raise
        credentials.save(credential)
        return credential.key


# ---------------------------------------------------------------- the commands


def login(gateway: str, no_browser: bool = False) -> int:
    """``ezat-compat login --gateway URL [--no-browser]``: the exit status."""
    try:
        url = normal_gateway(gateway)
        credential = sign_in(url, no_browser=no_browser)
        credentials = Credentials.default()
        with credentials.locked():
            credentials.save(credential)
    except LoginError as exc:
        print(f"ezat-compat: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"Signed in to {url}. `ezat-compat token` prints a key.", file=sys.stderr)
    return 0


def token(gateway: str | None = None) -> int:
    """``ezat-compat token [--gateway URL]``: prints a valid key; the exit status."""
    try:
        key = current_key(Credentials.default(), gateway)
    except LoginError as exc:
        print(f"ezat-compat: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(key + "\n")
    return 0
