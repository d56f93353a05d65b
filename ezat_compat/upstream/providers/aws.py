"""AWS credentials and SigV4 signatures, one place for every provider that reaches AWS:
Bedrock's InvokeModel (``bedrock.py``), Bedrock's Messages endpoint and Claude Platform on AWS
(``aws_messages.py``).

- Credentials: botocore's standard chain (the environment, the shared files' profile
  ``aws_profile``, SSO, container and instance roles), found once per deployment and process and
  refreshed by botocore itself.
- botocore's own calls for them (STS AssumeRole and AssumeRoleWithWebIdentity, SSO) leave through
  the deployment's egress, as its requests do: its ``proxy``, its CA files and its client
  certificate, set with botocore's public session settings (``AwsCredentials.session``).
- ``sign`` adds ``Authorization``, ``X-Amz-Date`` (and ``X-Amz-Security-Token`` for temporary
  credentials) to a prepared request: ``SigV4Auth(credentials, service, region)`` over its
  method, URL, body and the header fields the provider names, as botocore signs them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import requests

from ezat_compat.domain import Deployment
from ezat_compat.errors import UpstreamAuthError
from ezat_compat.upstream.egress import Egress, missing_file
from ezat_compat.upstream.providers import ProviderSetupError

try:
    import botocore.config
    import botocore.session
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.exceptions import BotoCoreError
except ImportError:  # pragma: no cover - the extra is installed in tests
    botocore = None

log = logging.getLogger("ezat_compat")


def needs_botocore(deployment: Deployment) -> None:
    """``ProviderSetupError`` naming the extra when botocore isn't installed."""
    if botocore is None:
        raise ProviderSetupError(
            f"deployment {deployment.name}: provider {deployment.provider!r} needs botocore: "
            "pip install 'ezat-compat[bedrock]'"
        )


class AwsCredentials:
    """One deployment's AWS credentials (module docstring), made on first use."""

    __slots__ = ("_ca_file", "_credentials", "_egress", "_lock", "deployment")

    def __init__(self, deployment: Deployment, egress: Egress | None) -> None:
        self.deployment = deployment
        self._egress = egress
        self._lock = threading.Lock()
        self._credentials: Any = None
        self._ca_file = ""  # the combined CA file of the credential calls, once written
        logging.getLogger("botocore.auth").setLevel(logging.INFO)  # its debug lines hold the signature

    def session(self) -> Any:
        """The botocore session the credentials are found and refreshed with. With an egress,
        every client botocore makes for them (``create_nested_client``: STS, SSO) gets it
        through the session's public settings: a default client ``Config`` with ``proxies``
        (only when the deployment sets ``proxy``: ``{}`` for ``""`` is direct; unset, botocore
        reads the environment per URL, as requests does) and ``client_cert``; the
        ``ca_bundle`` variable naming one file, the bundle followed by the extra CA files
        (``_ca_bundle``). Egress None: botocore's own reading of the environment.
        ``ProviderSetupError`` when a file it names can't be read."""
        session = botocore.session.Session(profile=self.deployment.aws_profile or None)
        egress = self._egress
        if egress is None:
            return session
        problem = missing_file(egress)
        if problem is not None:
            raise ProviderSetupError(f"deployment {self.deployment.name}: {problem}")
        options: dict[str, Any] = {}
        if self.deployment.proxy is not None:
            options["proxies"] = dict(egress.proxies)
        if egress.client_cert:
            options["client_cert"] = (
                (egress.client_cert, egress.client_key) if egress.client_key else egress.client_cert
            )
        if options:
            session.set_default_client_config(botocore.config.Config(**options))
        bundle = self._ca_bundle(session.get_config_variable("ca_bundle"), egress)
        if bundle:
            session.set_config_variable("ca_bundle", bundle)
        return session

    def _ca_bundle(self, configured: str | None, egress: Egress) -> str:
        """The one CA file botocore's ``ca_bundle`` names for the credential calls ("": keep
        ``configured``, botocore's own ``AWS_CA_BUNDLE`` or the profile's ``ca_bundle``). With
        extra CA files: a private copy (0600, removed at exit) of the bundle (``configured``,
        else the egress's: ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` or certifi's) followed by
        them, read now."""
        if not egress.extra_ca_files:
            return "" if configured else egress.ca_bundle
        parts = []
        named = [("CA bundle", configured or egress.ca_bundle)] + [("ca_file", p) for p in egress.extra_ca_files]
        for what, path in named:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise ProviderSetupError(
                    f"deployment {self.deployment.name}: {what} {path}: {exc.strerror or exc}"
                ) from None
            parts.append(data if data.endswith(b"\n") else data + b"\n")
        try:
            if not self._ca_file:  # one per deployment, written again if the credentials are made again
                fd, self._ca_file = tempfile.mkstemp(prefix="ezat-aws-ca-", suffix=".pem")  # mode 0600
                os.close(fd)
                atexit.register(_remove, self._ca_file, os.getpid())
            with open(self._ca_file, "wb") as f:
                f.write(b"".join(parts))
        except OSError as exc:
            raise ProviderSetupError(f"deployment {self.deployment.name}: the combined CA file: {exc}") from None
        return self._ca_file

    def get(self) -> Any:
        """botocore's credentials (refreshable ones refresh themselves); made once, on first use.
        ``ProviderSetupError`` when the chain finds none."""
        if self._credentials is None:
            with self._lock:
                if self._credentials is None:
                    try:
                        credentials = self.session().get_credentials()
                    except BotoCoreError as exc:
                        raise ProviderSetupError(f"deployment {self.deployment.name}: {exc}") from None
                    if credentials is None:
                        raise ProviderSetupError(
                            f"deployment {self.deployment.name}: botocore found no AWS credentials "
                            "(environment, shared files"
                            + (f" profile {self.deployment.aws_profile!r}" if self.deployment.aws_profile else "")
                            + ", SSO, container or instance role)"
                        )
                    self._credentials = credentials
        return self._credentials

    def sign(self, request: requests.PreparedRequest, service: str, signed: Callable[[str], bool]) -> None:
        """Sign ``request`` for ``service`` in the deployment's region, over the header fields
        whose lower-case name ``signed`` takes (besides host and X-Amz-Date, which botocore
        adds). ``UpstreamAuthError`` (logged with the deployment's name, never a secret) when
        the credentials can't be had or refreshed."""
        try:
            frozen = self.get().get_frozen_credentials()
        except ProviderSetupError as exc:
            log.error("%s", exc)
            raise UpstreamAuthError(f"no AWS credentials for {self.deployment.name}") from None
        except Exception as exc:  # a refresh that failed (an expired SSO session, the role's endpoint)
            log.error(
                "deployment %s: AWS credentials could not be refreshed: %s", self.deployment.name, type(exc).__name__
            )
            raise UpstreamAuthError(f"the AWS credentials of {self.deployment.name} could not be refreshed") from None
        fields = {k: v for k, v in request.headers.items() if signed(k.lower())}
        aws = AWSRequest(method=request.method or "POST", url=request.url, data=request.body, headers=fields)
        SigV4Auth(frozen, service, self.deployment.region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            value = aws.headers.get(name)
            if value is not None:
                request.headers[name] = value

    def describe(self) -> str:
        """check-config's line on where the credentials come from (never the secret);
        ``ProviderSetupError`` when they can't be found."""
        method = getattr(self.get(), "method", "") or "unknown"
        d = self.deployment
        profile = f" (profile {d.aws_profile})" if d.aws_profile else ""
        via = "; its STS and SSO calls use this egress" if self._egress is not None else ""
        return f"credentials: AWS SigV4, found by botocore's chain in {method}{profile}{via}"


def _remove(path: str, owner: int) -> None:
    """Remove the combined CA file at exit, in the process that wrote it only (a forked
    worker's exit must not take it from the others)."""
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            os.unlink(path)
