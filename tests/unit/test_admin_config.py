"""``[admin]`` in the configuration (config.py) and the admin listener's address at start-up
(server/serving.py ``admin_bind``)."""

from __future__ import annotations

from typing import Any

import pytest

from ezat_compat.config import ConfigError, parse_config
from ezat_compat.domain import AdminSettings
from ezat_compat.server.serving import StartupError, admin_bind

MODELS = [
    {
        "id": "anthropic/claude-sonnet-5-5",
        "aliases": [],
        "price": {"input": 3, "output": 15},
        "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "m"}],
    }
]


def _config(environ: dict[str, str] | None = None, **tables: Any) -> Any:
    return parse_config({"models": MODELS, **tables}, environ=environ or {})


def test_the_admin_api_has_its_own_loopback_listener_by_default() -> None:
    assert _config().admin == AdminSettings(bind="127.0.0.1:8081", on_main_listener=False)


@pytest.mark.parametrize(("value", "expected"), [("", ""), ("127.0.0.1:9999", "127.0.0.1:9999")])
def test_ezat_admin_bind_overrides_the_file_even_when_empty(value: str, expected: str) -> None:
    config = _config({"EZAT_ADMIN_BIND": value}, admin={"bind": "10.0.0.1:8081"})
    assert config.admin.bind == expected


@pytest.mark.parametrize(
    "tables",
    [
        {"admin": {"bind": "127.0.0.1:8080"}},
        {"server": {"bind": "127.0.0.1:8081"}},
        {"server": {"metrics_bind": "127.0.0.1:9464"}, "admin": {"bind": "127.0.0.1:9464"}},
    ],
    ids=["main-default", "admin-default", "metrics"],
)
def test_the_admin_listener_must_differ_from_the_others(tables: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"admin\.bind: Must differ"):
        _config(**tables)


def test_unknown_admin_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"admin\.port: Unknown field"):
        _config(admin={"port": 8081})


@pytest.mark.parametrize(
    ("admin", "main", "bound"),
    [
        ("127.0.0.1:8081", "127.0.0.1:8080", "127.0.0.1:8081"),
        ("", "127.0.0.1:8080", ""),
        ("unix:/run/ezat-admin.sock", "127.0.0.1:8080", "unix:/run/ezat-admin.sock"),
    ],
)
def test_the_admin_address_bound_besides_the_main_one(admin: str, main: str, bound: str) -> None:
    assert admin_bind(_config({"EZAT_ADMIN_BIND": admin}), main) == bound


@pytest.mark.parametrize("main", ["127.0.0.1:8081", "0.0.0.0:8081", "[::1]:8081"])
def test_the_admin_address_may_not_share_the_main_port(main: str) -> None:
    with pytest.raises(StartupError, match="for the admin API: the main listener"):
        admin_bind(_config({"EZAT_ADMIN_BIND": "127.0.0.1:8081"}), main)
