"""Configuration of every hopserve process (front-end and workers): one YAML file.

Both sides read the same file (the front-end its ``server`` and ``cache`` sections, the
workers ``models`` and ``engine``), so configuration is a top-level concept, validated
by pydantic, and importable without torch.

One model per area (:class:`ModelConfig`, :class:`ServerConfig`, :class:`CacheConfig`,
:class:`EngineConfig`, :class:`LoggingConfig`) gathered into :class:`HopserveConfig`;
:func:`load_config` reads the file, applies ``HOPSERVE_*`` environment overrides and
raises :class:`ConfigError` naming the source, key path and value of every problem.
``examples/hopserve.yaml`` is a commented example.
"""

from hopserve.config.errors import ConfigError
from hopserve.config.loader import ENV_NESTED_DELIMITER, ENV_PREFIX, load_config
from hopserve.config.models import (
    CacheConfig,
    EngineConfig,
    HopserveConfig,
    LoggingConfig,
    ModelConfig,
    ServerConfig,
)
from hopserve.config.types import SecretUrl, redact_url

__all__ = [
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "CacheConfig",
    "ConfigError",
    "EngineConfig",
    "HopserveConfig",
    "LoggingConfig",
    "ModelConfig",
    "SecretUrl",
    "ServerConfig",
    "load_config",
    "redact_url",
]
