"""hopserve.config: example loads, errors name key path and value, env overrides."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hopserve.config import (
    CacheConfig,
    ConfigError,
    HopserveConfig,
    SecretUrl,
    ServerConfig,
    load_config,
    redact_url,
)
from hopserve.worker.engine.settings import EngineSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hopserve.yaml"

MINIMAL = """
models:
  - name: cora
    entrypoint: my_models.gcn:GCN
    graph: data/cora
"""


def write(tmp_path: Path, text: str, name: str = "hopserve.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path | None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    return str(info.value)


def test_example_loads() -> None:
    config = load_config(EXAMPLE, env={})
    assert isinstance(config, HopserveConfig)
    assert config.models[0].name == "cora-gcn"
    assert config.models[0].kwargs["hidden_channels"] == 64
    assert config.server.port == 50051
    assert config.engine.memory_budget_bytes is None  # the engine's default, shared
    assert config.engine.settings() == EngineSettings()


def test_example_documents_every_field() -> None:
    """Each section key of the example exists and every model field has a description."""
    text = EXAMPLE.read_text()
    for section in ("server", "cache", "engine", "logging"):
        model = HopserveConfig.model_fields[section].annotation
        for field, info in model.model_fields.items():
            assert f"{field}:" in text, f"{section}.{field} missing from the example"
            assert info.description, f"{section}.{field} has no docstring"


def test_defaults_without_file() -> None:
    config = load_config(None, env={})
    assert config.models == []
    assert config.server.port == 50051
    assert config.server.metrics_port == 9090
    assert config.server.max_wait_ms == 2.0
    assert config.cache.backend == "auto"
    assert config.cache.key_prefix == "hopserve"


def test_minimal_model_defaults(tmp_path: Path) -> None:
    model = load_config(write(tmp_path, MINIMAL), env={}).models[0]
    assert (model.version, model.device, model.fanouts_allowed) == ("1", "cpu", True)
    assert model.weights is None and model.graph == tmp_path / "data" / "cora"  # anchored
    assert model.python_path == [] and model.search_path == [tmp_path]


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path, monkeypatch) -> None:
    """Regression: paths were relative to the working directory, so `weights: w.pt` next
    to the config was "file not found" from any other folder."""
    folder = tmp_path / "deploy"
    config_file = write(
        folder.mkdir() or folder,
        """
        models:
          - name: m
            entrypoint: my_models:GCN
            weights: w.pt
            graph: ../data/g
            python_path: [lib]
        cache: {integrity_key_file: secrets/cache.key}
        engine: {spill_dir: /abs/spill}
        """,
    )
    monkeypatch.chdir(tmp_path.parent)  # anywhere else
    config = load_config(config_file, env={"HOPSERVE_MODELS__0__WEIGHTS": "other.pt"})
    model = config.models[0]
    assert model.weights == folder / "other.pt"  # env values are anchored the same way
    assert model.graph == tmp_path / "data" / "g"
    assert model.python_path == [folder / "lib"]
    assert model.search_path == [folder, folder / "lib"]
    assert "config_dir" not in config.model_dump()["models"][0]
    assert config.cache.integrity_key_file == folder / "secrets" / "cache.key"
    assert config.engine.spill_dir == Path("/abs/spill")
    with pytest.raises(ConfigError, match=str(folder / "other.pt")):
        config.validate_paths()  # says where it looked


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "server: {port: 70000}",
            "hopserve.yaml: server.port: Input should be less than or equal to 65535 (got 70000)",
        ),
        ("server: {port: 0}", "server.port: Input should be greater than or equal to 1 (got 0)"),
        ("server: {max_wait_ms: -1}", "server.max_wait_ms: Input should be greater than"),
        ("server: {workers: ['a:1', 'nope']}", "server.workers[1]: must be 'host:port'"),
        ("server: {workers: ['a:1', 'a:1']}", "server.workers: duplicate worker address(es): a:1"),
        ("server: {port: 9000, metrics_port: 9000}", "server: metrics_port must differ from port"),
        ("cache: {backend: redix}", "cache.backend: Input should be 'auto', 'redis', 'memory'"),
        ("cache: {ttl_s: -5}", "cache.ttl_s: Input should be greater than or equal to 0 (got -5)"),
        ("cache: {redis_url: 'http://h:1'}", "cache.redis_url: URL scheme must be one of"),
        (  # regression: crashed start-up with a traceback and exit code 1
            "cache: {redis_url: 'redis://127.0.0.1:99999/0'}",
            "cache.redis_url: URL port is invalid (Port out of range 0-65535)",
        ),
        ("cache: {redis_url: 'redis://h:port/0'}", "cache.redis_url: URL port is invalid"),
        ("cache: {key_prefix: 'a:b'}", "cache.key_prefix: must be 1-128 letters"),
        (
            "cache: {backend: redis-cluster, redis_cluster_nodes: ['h:1', 'nope']}",
            "cache.redis_cluster_nodes[1]: must be 'host:port'",
        ),
        (
            "cache: {backend: redis-cluster, redis_cluster_nodes: ['h:1', 'h:1']}",
            "cache.redis_cluster_nodes: duplicate node address(es): h:1",
        ),
        (
            "cache: {backend: redis-cluster, redis_url: 'unix:///run/redis.sock'}",
            "cache: with backend: redis-cluster, redis_url must be redis:// or rediss:// "
            "(a cluster node; got 'unix:///run/redis.sock')",
        ),
        (  # the password stays redacted in the error
            "cache: {backend: redis-cluster, redis_url: 'redis://:pw@h:1/3'}",
            "must name database 0 or none (a cluster has only database 0; got "
            "'redis://:***@h:1/3')",
        ),
        (
            "cache: {backend: redis, redis_cluster_nodes: ['h:1']}",
            "cache: redis_cluster_nodes is only used with backend: redis-cluster "
            "(backend is 'redis')",
        ),
        ("engine: {memory_budget_bytes: 1KiB}", "engine.memory_budget_bytes: Input should be"),
        ("engine: {memory_budget_bytes: lots}", "engine.memory_budget_bytes: could not parse"),
        ("logging: {level: LOUD}", "logging.level: Input should be 'DEBUG'"),
        ("server: 5", "server: Input should be a valid dictionary"),
    ],
)
def test_bad_value_names_key_path(tmp_path: Path, yaml_text: str, expected: str) -> None:
    message = error_of(write(tmp_path, yaml_text))
    assert expected in message
    assert message.startswith(str(tmp_path / "hopserve.yaml"))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("device", "gpu", "models[0].device: must be 'cpu', 'cuda' or 'cuda:N' (got 'gpu')"),
        ("device", "cuda:x", "models[0].device: must be"),
        ("entrypoint", "my_models.GCN", "models[0].entrypoint: must be 'package.module:Class"),
        ("name", "has space", "models[0].name: must be 1-128 letters"),
        ("name", "a:b", "models[0].name: must be"),
        ("max_targets", 0, "models[0].max_targets: Input should be greater than or equal to 1"),
        ("fanouts_allowed", "maybe", "models[0].fanouts_allowed: Input should be a valid bool"),
    ],
)
def test_bad_model_field(tmp_path: Path, field: str, value: object, expected: str) -> None:
    model = {"name": "cora", "entrypoint": "my_models.gcn:GCN", "graph": "data/cora"}
    model[field] = value
    assert expected in error_of(write(tmp_path, yaml.safe_dump({"models": [model]})))


def test_missing_required_model_field(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "models: [{name: a, entrypoint: 'm:C'}]"))
    assert "models[0].graph: Field required" in message


def test_duplicate_model_names(tmp_path: Path) -> None:
    text = MINIMAL + "  - {name: cora, entrypoint: 'm:C', graph: g}\n"
    assert "models: duplicate model name(s): cora" in error_of(write(tmp_path, text))


def test_every_problem_is_reported(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "server: {port: 70000, max_queue: 0}"))
    assert len(message.splitlines()) == 2
    assert "server.port" in message and "server.max_queue" in message


@pytest.mark.parametrize(
    ("yaml_text", "key", "allowed"),
    [
        ("server: {prot: 1}", "server.prot", "host, port"),
        ("caches: {}", "caches", "models, server, cache, engine, logging"),
        (MINIMAL + "    batch: 3\n", "models[0].batch", "name, version, entrypoint"),
    ],
)
def test_unknown_key_is_named(tmp_path: Path, yaml_text: str, key: str, allowed: str) -> None:
    message = error_of(write(tmp_path, yaml_text))
    assert f"{key}: unknown key (expected one of: {allowed}" in message


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 1\n  host: [unclosed\ncache: {}\n")
    message = error_of(path)
    assert message.startswith(f"{path}:4:")
    assert "YAML syntax error" in message


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 1\n  port: 2\n")
    message = error_of(path)
    assert message.startswith(f"{path}:3:") and "duplicate key 'port'" in message


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    assert "config file not found" in error_of(tmp_path / "nope.yaml")
    assert "top level must be a mapping" in error_of(write(tmp_path, "- a\n- b\n"))
    assert load_config(write(tmp_path, "# only a comment\n"), env={}).models == []


def test_config_error_is_value_error_with_problem_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        load_config(write(tmp_path, "server: {port: 70000, max_queue: 0}"), env={})
    assert isinstance(info.value, ConfigError)
    assert len(info.value.problems) == 2


def test_env_overrides_nested_with_coercion(tmp_path: Path) -> None:
    env = {
        "HOPSERVE_SERVER__PORT": "6000",
        "HOPSERVE_SERVER__MAX_WAIT_MS": "0.5",
        "HOPSERVE_CACHE__BACKEND": "memory",
        "HOPSERVE_CACHE__REDIS_URL": "redis://:pw@redis:6380/1",
        "HOPSERVE_ENGINE__PREFETCH": "false",
        "HOPSERVE_ENGINE__MEMORY_BUDGET_BYTES": "512MiB",
        "HOPSERVE_LOGGING__LEVEL": "debug",
        "HOPSERVE_MODELS__0__DEVICE": "cuda:1",
        "HOPSERVE_MODELS__0__VERSION": "7",
        "HOPSERVE_MODELS__0__KWARGS": '{"hidden": 64}',
        "HOPSERVE_SERVER__WORKERS": "w1:7000, w2:7000",
        "HOPSERVE_CONFIG": "/etc/hopserve.yaml",  # not a section: ignored
        "OTHER_SERVER__PORT": "1",
    }
    config = load_config(write(tmp_path, MINIMAL + "server: {port: 1234, host: h}\n"), env=env)
    assert config.server.port == 6000 and config.server.host == "h"
    assert config.server.max_wait_ms == 0.5
    assert config.server.workers == ["w1:7000", "w2:7000"]
    assert config.cache.backend == "memory"
    assert config.cache.redis_url.get_secret_value() == "redis://:pw@redis:6380/1"
    assert config.engine.prefetch is False
    assert config.engine.memory_budget_bytes == 512 * 1024**2
    assert config.logging.level == "DEBUG"
    model = config.models[0]
    assert (model.device, model.version, model.kwargs) == ("cuda:1", "7", {"hidden": 64})


def test_env_json_list(tmp_path: Path) -> None:
    config = load_config(None, env={"HOPSERVE_SERVER__WORKERS": '["a:1", "b:2"]'})
    assert config.server.workers == ["a:1", "b:2"]


def test_env_error_names_variable_and_key() -> None:
    message = error_of(None, {"HOPSERVE_SERVER__PORT": "70000"})
    assert message == (
        "env HOPSERVE_SERVER__PORT: server.port: Input should be less than or equal to "
        "65535 (got '70000')"
    )
    assert "server.port: Input should be a valid integer" in error_of(
        None, {"HOPSERVE_SERVER__PORT": "six"}
    )
    assert "env HOPSERVE_SERVER__PROT: server.prot: unknown key" in error_of(
        None, {"HOPSERVE_SERVER__PROT": "1"}
    )
    assert "invalid JSON" in error_of(None, {"HOPSERVE_SERVER__WORKERS": "[oops"})
    assert "no list item '3'" in error_of(None, {"HOPSERVE_MODELS__3__DEVICE": "cpu"})


def test_redis_password_redacted_everywhere(tmp_path: Path) -> None:
    env = {"HOPSERVE_CACHE__REDIS_URL": "redis://user:s3cret@redis:6379/0?password=s3cret"}
    config = load_config(None, env=env)
    assert config.cache.redis_url.get_secret_value().count("s3cret") == 2
    for text in (
        repr(config),
        str(config),
        repr(config.cache),
        str(config.cache.redis_url),
        config.model_dump_json(),
        str(config.model_dump()),
    ):
        assert "s3cret" not in text
    assert "redis://user:***@redis:6379/0" in repr(config.cache)
    # An invalid URL's error message is redacted too.
    message = error_of(None, {"HOPSERVE_CACHE__REDIS_URL": "http://:s3cret@h:1"})
    assert "s3cret" not in message and "cache.redis_url" in message


def test_password_not_logged_by_config_logging(caplog: pytest.LogCaptureFixture) -> None:
    config = CacheConfig(redis_url="redis://:s3cret@h:1/0")
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("config: %s / %r", config, config)
    assert "s3cret" not in caplog.text and "***" in caplog.text


@given(
    password=st.text(alphabet=st.characters(categories=("L", "N"), max_codepoint=127), min_size=1),
    user=st.sampled_from(["", "default", "u"]),
)
def test_redact_url_never_leaks(password: str, user: str) -> None:
    url = f"redis://{user}:{password}@host:6379/0"
    redacted = redact_url(url)
    assert redacted == f"redis://{user}:***@host:6379/0"
    assert str(SecretUrl(url)) == redacted


def test_redact_url_keeps_urls_without_secrets() -> None:
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("unix:///tmp/redis.sock?db=1") == "unix:///tmp/redis.sock?db=1"


def test_validate_paths(tmp_path: Path) -> None:
    graph = tmp_path / "graph"
    graph.mkdir()
    weights = tmp_path / "w.pt"
    text = MINIMAL.replace("data/cora", str(graph)) + f"    weights: {weights}\n"
    config = load_config(write(tmp_path, text), env={})
    with pytest.raises(ConfigError, match=r"models\[0\]\.weights: file not found"):
        config.validate_paths()
    weights.write_bytes(b"")
    config.validate_paths()
    broken = config.models[0].model_copy(update={"graph": tmp_path / "missing"})
    with pytest.raises(ConfigError, match=r"model 'cora'\.graph: directory not found"):
        broken.validate_paths()


def test_config_is_frozen_and_lookup_by_name(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), env={})
    assert config.model("cora").entrypoint == "my_models.gcn:GCN"
    with pytest.raises(KeyError):
        config.model("nope")
    with pytest.raises(ValueError):
        config.server.port = 1  # type: ignore[misc]


def test_redis_cluster_cache(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """
            cache:
              backend: redis-cluster
              redis_url: rediss://:pw@10.0.0.1:7000
              redis_cluster_nodes: ["10.0.0.2:7000", "[fd00::3]:7000"]
            """,
        ),
        env={},
    )
    assert config.cache.backend == "redis-cluster"
    assert config.cache.redis_cluster_nodes == ["10.0.0.2:7000", "[fd00::3]:7000"]
    assert "pw" not in str(config.model_dump())


def test_local_workers_and_remote_workers_exclude_each_other() -> None:
    with pytest.raises(ValueError, match=r"local_workers \(2\) and workers \(w:1\) exclude"):
        ServerConfig(local_workers=2, workers=["w:1"])
    assert ServerConfig(local_workers=2).local_workers == 2
