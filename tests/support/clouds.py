"""Cloud deployments on the simulator, for the tests that run them: Amazon Bedrock and Google
Vertex AI deployments' provider keys, and a Google service account (its key file, a new RSA key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

BEDROCK_MODEL = "anthropic.claude-sonnet-5-5-v1:0"
VERTEX_MODEL = "claude-sonnet-5-5@20260101"


def service_account(path: Path, token_uri: str, pem: str) -> None:
    """Write a Google service account's key file at ``path``: its key ``pem``, its tokens from ``token_uri``."""
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "ezat-sim",
                "private_key_id": "sim-key-1",
                "private_key": pem,
                "client_email": "gateway@ezat-sim.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )


def bedrock_at(url: str) -> dict[str, Any]:
    """A Bedrock deployment's provider keys, its endpoint the simulator at ``url``."""
    return {"provider": "bedrock", "region": "us-east-1", "base_url": url, "upstream_model": BEDROCK_MODEL}


def vertex_at(url: str) -> dict[str, Any]:
    """A Vertex AI deployment's provider keys, its endpoint the simulator at ``url``."""
    return {
        "provider": "vertex",
        "project": "ezat-sim",
        "region": "us-east5",
        "base_url": url,
        "upstream_model": VERTEX_MODEL,
    }


def private_pem() -> str:
    """A new RSA key, PEM (PKCS#8): a test service account's."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
