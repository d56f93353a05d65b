"""Deployments of each cloud provider for the providers' unit tables (nothing listens at their
``base_url``: the tables shape bodies, they don't send them)."""

from __future__ import annotations

from ezat_compat.domain import Deployment

BEDROCK = Deployment(
    name="b",
    base_url="http://127.0.0.1:9",
    upstream_model="anthropic.claude-x-v1:0",
    provider="bedrock",
    region="us-east-1",
    api_key_env="",
)
VERTEX = Deployment(
    name="v",
    base_url="http://127.0.0.1:9",
    upstream_model="claude-x@1",
    provider="vertex",
    region="us-east5",
    project="p",
    api_key_env="",
)
