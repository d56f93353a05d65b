"""The configuration file: defaults, overrides, and errors that name the file and key path."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ezat_compat.catalog import Catalog
from ezat_compat.config import ConfigError, load_config, parse_config

MINIMAL = """
[[models]]
id = "anthropic/claude-sonnet-5-5"
aliases = ["claude-sonnet-5-5", "claude-sonnet-5.5"]
price = { input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }

[[models.deployments]]
name = "primary"
base_url = "https://api.anthropic.com"
upstream_model = "claude-sonnet-5-5"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ezat.toml"
    path.write_text(text)
    return path


def test_minimal_file_gets_every_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={"ANTHROPIC_API_KEY": "sk-test"})
    gw, model = config.gateway, config.models[0]
    assert (
        gw.database_url,
        gw.redis_url,
        gw.upstream_timeout_s,
        gw.keepalive_s,
        gw.max_body_mb,
        gw.allow_private_image_hosts,
    ) == (f"sqlite:///{tmp_path / 'ezat.db'}", "", 590, 15, 32, False)  # beside the file, not in the cwd
    assert model.price.cache_read == Decimal("0.30") and model.price.input == Decimal("3.0")
    assert model.deployments[0].api_key == "sk-test" and model.deployments[0].priority == 0
    assert model.deployments[0].weight == 1 and model.max_output_tokens == 64000 and model.sampling is False
    assert config.max_body_bytes == 32 * 1024 * 1024


@pytest.mark.parametrize(
    "url, data_dir, expected",
    [
        ("sqlite:///ezat.db", "", "sqlite:///{conf}/ezat.db"),
        ("sqlite:///db/ezat.db", "", "sqlite:///{conf}/db/ezat.db"),
        ("sqlite:///ezat.db", "state", "sqlite:///{conf}/state/ezat.db"),
        ("sqlite:///ezat.db", "/var/lib/ezat-compat", "sqlite:////var/lib/ezat-compat/ezat.db"),
        ("sqlite:////srv/ezat.db", "state", "sqlite:////srv/ezat.db"),
        ("sqlite+pysqlite:///ezat.db?timeout=5", "", "sqlite+pysqlite:///{conf}/ezat.db?timeout=5"),
        ("sqlite://", "", "sqlite://"),
        ("sqlite:///:memory:", "", "sqlite:///:memory:"),
        ("postgresql+psycopg://u@h/ezat.db", "", "postgresql+psycopg://u@h/ezat.db"),
    ],
    ids=[
        "beside-the-file",
        "subfolder",
        "in-data-dir",
        "absolute-data-dir",
        "absolute",
        "driver",
        "memory",
        "memory-path",
        "postgresql",
    ],
)
def test_a_relative_sqlite_path_is_in_the_data_folder(
    tmp_path: Path, url: str, data_dir: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path was relative to the working directory: an admin command run elsewhere made
    a second, empty database. It is now relative to the data folder, the config file's folder by
    default, like every other relative path of the file."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    conf = tmp_path / "conf"
    conf.mkdir()
    text = f'[gateway]\ndatabase_url = "{url}"\ndata_dir = "{data_dir}"\n' + MINIMAL
    config = load_config(write(conf, text), environ={})
    assert config.gateway.database_url == expected.format(conf=conf)
    by_env = load_config(conf / "ezat.toml", environ={"EZAT_DATABASE_URL": url, "EZAT_DATA_DIR": data_dir})
    assert by_env.gateway.database_url == expected.format(conf=conf)


def test_environment_overrides_urls(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, MINIMAL),
        environ={"EZAT_DATABASE_URL": "postgresql+psycopg://x@h/db", "EZAT_REDIS_URL": "redis://h:6379/0"},
    )
    assert config.gateway.database_url == "postgresql+psycopg://x@h/db"
    assert config.gateway.redis_url == "redis://h:6379/0"


@pytest.mark.parametrize(
    "change, message",
    [
        (("input = 3.0", 'input = "three"'), "ezat.toml: models[0].price.input: Not a valid number."),
        (("[[models]]", '[gateway]\ndatabse_url = "x"\n[[models]]'), "ezat.toml: gateway.databse_url: Unknown field."),
        (
            ('name = "primary"', 'name = "primary"\nweigth = 2'),
            "ezat.toml: models[0].deployments[0].weigth: Unknown field.",
        ),
        (
            ('upstream_model = "claude-sonnet-5-5"', ""),
            "ezat.toml: models[0].deployments[0].upstream_model: Missing data for required field.",
        ),
        (
            ('aliases = ["claude-sonnet-5-5", "claude-sonnet-5.5"]', 'aliases = ["anthropic/CLAUDE-sonnet-5-5"]'),
            "ezat.toml: models[0].aliases[0]: 'anthropic/CLAUDE-sonnet-5-5' "
            "is already used by anthropic/claude-sonnet-5-5.",
        ),
        (('id = "anthropic', "id = anthropic"), "ezat.toml: invalid TOML"),
    ],
    ids=["not-a-number", "unknown-gateway-key", "unknown-deployment-key", "missing-key", "alias-clash", "bad-toml"],
)
def test_errors_name_the_file_and_the_key_path(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, MINIMAL.replace(*change)))
    assert str(info.value).startswith(message)


def test_missing_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such configuration file.*--config PATH or set EZAT_CONFIG"):
        load_config(tmp_path / "nope.toml")


def _catalog() -> Catalog:
    data: dict[str, Any] = {
        "models": [
            {
                "id": "anthropic/claude-sonnet-5-5",
                "aliases": ["claude-sonnet-5-5", "claude-sonnet-5.5"],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "d", "base_url": "http://h", "upstream_model": "m"}],
            }
        ]
    }
    return Catalog(parse_config(data).models, created=1)


@pytest.mark.parametrize(
    "name",
    [
        "anthropic/claude-sonnet-5-5",
        "claude-sonnet-5-5",
        "claude-sonnet-5.5",
        "Claude-Sonnet-5.5",
        "  ANTHROPIC/CLAUDE-SONNET-5-5  ",
    ],
)
def test_model_names_match_in_any_case_with_spaces_ignored(name: str) -> None:
    model = _catalog().resolve(name)
    assert model is not None and model.id == "anthropic/claude-sonnet-5-5"


@pytest.mark.parametrize("name", ["gpt-9", "claude-sonnet", "anthropic/claude-sonnet-5-5x", ""])
def test_unknown_models_do_not_match(name: str) -> None:
    assert _catalog().resolve(name) is None


def _pattern_catalog() -> Catalog:
    def model(name: str, *aliases: str) -> dict[str, Any]:
        return {
            "id": f"anthropic/{name}",
            "aliases": list(aliases),
            "price": {"input": 1, "output": 1},
            "deployments": [{"name": "d", "base_url": "http://h", "upstream_model": name}],
        }

    return Catalog(
        parse_config(
            {
                "models": [
                    model("claude-opus-5-5", "claude-opus-5-5", "claude-opus-*"),
                    model("claude-sonnet-5-5", "claude-*"),
                    model("claude-opus-legacy", "claude-opus-4-1", "claude-*-x[1m]?"),
                ]
            }
        ).models
    )


@pytest.mark.parametrize(
    ("name", "model_id"),
    [
        ("claude-opus-4-8", "anthropic/claude-opus-5-5"),  # the pattern of the first model
        ("  CLAUDE-OPUS-4-8[1m] ", "anthropic/claude-opus-5-5"),  # any case, spaces ignored
        ("claude-opus-", "anthropic/claude-opus-5-5"),  # "*" matches nothing too
        ("claude-opus-4-1", "anthropic/claude-opus-legacy"),  # a plain alias wins over every pattern
        ("claude-haiku-4-5", "anthropic/claude-sonnet-5-5"),  # the next pattern, in file order
        ("claude-a-x[1m]?", "anthropic/claude-sonnet-5-5"),  # "[", "]" and "?" are plain characters…
        ("anthropic/claude-opus-legacy", "anthropic/claude-opus-legacy"),  # ids are names
    ],
)
def test_pattern_aliases_match_whole_names_after_ids_and_plain_aliases(name: str, model_id: str) -> None:
    model = _pattern_catalog().resolve(name)
    assert model is not None and model.id == model_id


@pytest.mark.parametrize("name", ["gpt-5", "xclaude-opus-4-8", "anthropic/claude-opus-4-8", "", "  "])
def test_a_name_no_pattern_matches_is_unknown(name: str) -> None:
    assert _pattern_catalog().resolve(name) is None


def test_a_model_id_cannot_be_a_pattern() -> None:
    data: dict[str, Any] = {
        "models": [
            {
                "id": "anthropic/claude-*",
                "aliases": [],
                "price": {"input": 1, "output": 1},
                "deployments": [{"name": "d", "base_url": "http://h", "upstream_model": "m"}],
            }
        ]
    }
    with pytest.raises(ConfigError, match=r"models\[0\]\.id: A model id is a name, not a pattern"):
        parse_config(data)


def test_public_catalog_entry() -> None:
    catalog = _catalog()
    entry = catalog.public_catalog()["data"][0]
    assert entry["id"] == "anthropic/claude-sonnet-5-5" and entry["maxOutputTokens"] == 64000
    assert entry["capabilities"]["sampling"] is False and entry["capabilities"]["forcedToolChoice"] is True
    assert entry["capabilities"]["efforts"] == ["low", "medium", "high", "xhigh", "max"]
    assert catalog.openai_list(catalog.models) == {
        "object": "list",
        "data": [{"id": "anthropic/claude-sonnet-5-5", "object": "model", "created": 1, "owned_by": "anthropic"}],
    }


def test_image_limits_default_to_anthropics(tmp_path: Path) -> None:
    """Anthropic's Messages API: 5 MB of base64 per image, 8000 px per side, 2000 px past 20
    images, 32 MB of request body ("Images and PDFs" fits every image to these)."""
    model = load_config(write(tmp_path, MINIMAL)).models[0]
    assert (
        model.max_image_bytes,
        model.max_image_px,
        model.many_images,
        model.many_images_max_px,
        model.max_request_bytes,
    ) == (5 * 1024 * 1024, 8000, 20, 2000, 32 * 1024 * 1024)


def test_image_limits_are_set_per_model(tmp_path: Path) -> None:
    keys = "max_image_bytes = 3145728\nmax_image_px = 4096\nmany_images = 10\nmany_images_max_px = 1024\n"
    keys += "max_request_bytes = 20971520\n"
    model = load_config(write(tmp_path, MINIMAL.replace("price = {", keys + "price = {"))).models[0]
    assert (
        model.max_image_bytes,
        model.max_image_px,
        model.many_images,
        model.many_images_max_px,
        model.max_request_bytes,
    ) == (3 * 1024 * 1024, 4096, 10, 1024, 20 * 1024 * 1024)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_image_px = 0", "ezat.toml: models[0].max_image_px: Must be greater than or equal to 1."),
        ("max_image_bytes = 5.5", "ezat.toml: models[0].max_image_bytes: Not a valid integer."),
        ("many_images = -1", "ezat.toml: models[0].many_images: Must be greater than or equal to 0."),
        ("max_image_size = 10", "ezat.toml: models[0].max_image_size: Unknown field."),
    ],
    ids=["zero-px", "not-an-integer", "negative-count", "unknown-key"],
)
def test_image_limit_errors_name_the_key(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, MINIMAL.replace("price = {", line + "\nprice = {")))
    assert str(info.value).startswith(message)


def test_server_pidfile_and_name(tmp_path: Path) -> None:
    from ezat_compat.server.serving import process_title

    default = load_config(write(tmp_path, MINIMAL))
    assert (default.server.pidfile, default.server.name) == ("", "")
    assert process_title(default, "127.0.0.1:8080") == f"ezat-compat: {tmp_path / 'ezat.toml'}"
    text = '[server]\npidfile = "/run/ezat-compat/ezat-compat.pid"\nname = "eu-1"\n' + MINIMAL
    named = load_config(write(tmp_path, text))
    assert named.server.pidfile == "/run/ezat-compat/ezat-compat.pid" and named.server.name == "eu-1"
    assert process_title(named, "127.0.0.1:8080") == "ezat-compat: eu-1"
    relative = load_config(write(tmp_path, '[server]\npidfile = "run/ezat.pid"\n' + MINIMAL))
    assert relative.server.pidfile == str(tmp_path / "run" / "ezat.pid")  # beside the file, not the cwd
    with pytest.raises(ConfigError, match=r"ezat.toml: server.pidfil: Unknown field."):
        load_config(write(tmp_path, '[server]\npidfil = "x"\n' + MINIMAL))


def test_server_log_files_default_to_stderr_and_sit_beside_the_config(tmp_path: Path) -> None:
    default = load_config(write(tmp_path, MINIMAL))
    assert (default.server.access_log, default.server.error_log) == ("-", "-")
    text = '[server]\naccess_log = "logs/access.log"\nerror_log = "/var/log/ezat/error.log"\n' + MINIMAL
    files = load_config(write(tmp_path, text))
    assert files.server.access_log == str(tmp_path / "logs" / "access.log")
    assert files.server.error_log == "/var/log/ezat/error.log"
    with pytest.raises(ConfigError, match=r"server.access_log"):
        load_config(write(tmp_path, '[server]\naccess_log = ""\n' + MINIMAL))


@pytest.mark.parametrize(
    "environ, warnings",
    [
        ({"ANTHROPIC_API_KEY": "sk", "BACKUP_KEY": "sk2"}, []),
        (
            {"ANTHROPIC_API_KEY": "sk"},
            ["deployment backup of model anthropic/claude-sonnet-5-5: BACKUP_KEY is not set"],
        ),
        (
            {"ANTHROPIC_API_KEY": ""},
            [
                "deployment primary of model anthropic/claude-sonnet-5-5: ANTHROPIC_API_KEY is not set",
                "deployment backup of model anthropic/claude-sonnet-5-5: BACKUP_KEY is not set",
            ],
        ),
    ],
    ids=["all-set", "one-unset", "none-set"],
)
def test_a_warning_per_deployment_without_its_key(tmp_path: Path, environ: dict[str, str], warnings: list[str]) -> None:
    from ezat_compat.server.serving import deployment_warnings

    text = MINIMAL + '\n[[models.deployments]]\nname = "backup"\nbase_url = "https://b.example"\n'
    text += 'upstream_model = "m"\napi_key_env = "BACKUP_KEY"\n'
    lines = deployment_warnings(load_config(write(tmp_path, text), environ=environ))
    assert [line.split(", so routing")[0] for line in lines] == warnings
    none_left = len(warnings) == 2
    assert not any("has no other deployment" in line for line in lines)  # it has two
    none = "none of the 2 deployments of anthropic/claude-sonnet-5-5 has its key: its requests fail until "
    assert all(line.endswith(none + "ANTHROPIC_API_KEY or BACKUP_KEY is set") == none_left for line in lines)


def test_a_single_deployment_without_its_key_leaves_no_other(tmp_path: Path) -> None:
    from ezat_compat.server.serving import deployment_warnings

    (line,) = deployment_warnings(load_config(write(tmp_path, MINIMAL), environ={}))
    assert line == (
        "deployment primary of model anthropic/claude-sonnet-5-5: ANTHROPIC_API_KEY is not set, so routing "
        "skips it; anthropic/claude-sonnet-5-5 has no other deployment: its requests fail until ANTHROPIC_API_KEY "
        "is set"
    )


_BACKUP = '\n[[models.deployments]]\nname = "backup"\nbase_url = "https://b.example"\nupstream_model = "m"\n'


@pytest.mark.parametrize(
    "backup, environ, unusable",
    [
        (None, {"ANTHROPIC_API_KEY": "sk"}, []),
        (
            None,
            {"ANTHROPIC_API_KEY": ""},
            [
                "model anthropic/claude-sonnet-5-5 has no usable deployment: ANTHROPIC_API_KEY (deployment primary) "
                "is not set in the environment"
            ],
        ),
        ('api_key_env = "BACKUP_KEY"\n', {"ANTHROPIC_API_KEY": "sk"}, []),
        ('api_key_env = "BACKUP_KEY"\n', {"BACKUP_KEY": "sk"}, []),
        (
            'api_key_env = "BACKUP_KEY"\n',
            {},
            [
                "model anthropic/claude-sonnet-5-5 has no usable deployment: ANTHROPIC_API_KEY (deployment primary), "
                "BACKUP_KEY (deployment backup) are not set in the environment"
            ],
        ),
        (
            "",
            {},
            [
                "model anthropic/claude-sonnet-5-5 has no usable deployment: ANTHROPIC_API_KEY (deployments primary, "
                "backup) is not set in the environment"
            ],
        ),
    ],
    ids=["one-set", "one-unset", "two-first-set", "two-second-set", "two-unset", "two-share-an-unset-variable"],
)
def test_a_model_no_deployment_can_serve_is_named_with_its_variables(
    tmp_path: Path, backup: str | None, environ: dict[str, str], unusable: list[str]
) -> None:
    from ezat_compat.server.serving import unusable_models

    text = MINIMAL if backup is None else MINIMAL + _BACKUP + backup
    assert unusable_models(load_config(write(tmp_path, text), environ=environ)) == unusable
