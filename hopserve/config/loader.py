"""Load :class:`HopserveConfig` from one YAML file plus ``HOPSERVE_*`` environment overrides.

Precedence: model defaults < YAML file < environment. An environment variable
``HOPSERVE_<SECTION>__<KEY>[__<KEY>...]`` overrides one key (case-insensitive, ``__``
separates levels, a number indexes a list)::

    HOPSERVE_SERVER__PORT=6000
    HOPSERVE_CACHE__REDIS_URL=redis://:secret@redis:6379/0
    HOPSERVE_MODELS__0__DEVICE=cuda:1
    HOPSERVE_SERVER__WORKERS='["w1:7000", "w2:7000"]'   # JSON for lists and mappings

Values stay strings (pydantic coerces ``"6000"`` to an int and ``"true"`` to a bool)
unless they start with ``[`` or ``{``, which are parsed as JSON. Variables whose first
segment is not a config section (``HOPSERVE_CONFIG``, say) are ignored.

Every problem is reported in one :class:`ConfigError`, one line each, naming where the
value came from, its key path and the value, e.g.
``hopserve.yaml: server.port: Input should be less than or equal to 65535 (got 70000)``.
"""

from __future__ import annotations

import json
import logging
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hopserve.config.errors import ConfigError
from hopserve.config.models import HopserveConfig, ModelConfig
from hopserve.config.types import redact_url

__all__ = ["ENV_NESTED_DELIMITER", "ENV_PREFIX", "load_config", "parse_model_entry"]

logger = logging.getLogger(__name__)

ENV_PREFIX = "HOPSERVE_"
"""Prefix of environment variables that override config keys."""

ENV_NESTED_DELIMITER = "__"
"""Separates nesting levels in an override's name."""

_Loc = tuple[str | int, ...]


def load_config(
    path: str | Path | None = None, env: Mapping[str, str] = os.environ
) -> HopserveConfig:
    """Read, merge and validate the configuration.

    Args:
        path: YAML file; ``None`` uses the defaults (plus ``env``).
        env: Environment to take ``HOPSERVE_*`` overrides from (``{}`` for none).

    Returns:
        The validated, frozen configuration, relative paths resolved against the config
        file's folder (:meth:`HopserveConfig.anchored`; the working directory without a
        file). Paths are not checked for existence here; call
        :meth:`HopserveConfig.validate_paths` for that.

    Raises:
        ConfigError: unreadable file, YAML syntax error (with file and line), unknown key
            or invalid value (with source, key path and value).
    """
    source = str(path) if path is not None else "<defaults>"
    data = _read_yaml(Path(path)) if path is not None else {}
    env_sources = _apply_env(data, env)
    try:
        config = HopserveConfig.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(error, source, env_sources) for error in exc.errors()]
        raise ConfigError(problems) from None
    base = Path(path).expanduser().resolve().parent if path is not None else Path.cwd()
    return config.anchored(base)


def parse_model_entry(text: str, base: Path, source: str = "config") -> ModelConfig:
    """One entry of a config file's ``models:`` list, given as YAML or JSON text (an admin
    ``LoadModel`` request), validated, its relative paths resolved against ``base``.

    Paths are not checked for existence here (:meth:`ModelConfig.validate_paths`).

    Raises:
        ConfigError: not a mapping, YAML syntax error, unknown key or invalid value, each
            problem as ``<source>: <key>: <reason> (got <value>)``.
    """
    if not text.strip():
        raise ConfigError(f"{source}: empty; expected one models: entry (name, entrypoint, ...)")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if isinstance(data, list) and len(data) == 1:  # a pasted "- name: ..." list item
        data = data[0]
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected one models: entry as a mapping (name, entrypoint, graph, "
            f"...), got {type(data).__name__}"
        )
    try:
        config = HopserveConfig.model_validate({"models": [data]})
    except ValidationError as exc:
        problems = [
            _describe(error, source, {}).replace(f"{source}: models[0].", f"{source}: ", 1)
            for error in exc.errors()
        ]
        raise ConfigError(problems) from None
    return config.models[0].anchored(base)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections "
            f"({', '.join(HopserveConfig.model_fields)}), got {type(data).__name__}"
        )
    return data


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[_Loc, str]:
    """Write the overrides in ``env`` into ``data``; return {key path: variable name}."""
    sources: dict[_Loc, str] = {}
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split(ENV_NESTED_DELIMITER)
        if parts[0] not in HopserveConfig.model_fields:
            logger.debug("ignoring %s: %r is not a config section", name, parts[0])
            continue
        if any(not part for part in parts):
            raise ConfigError(f"env {name}: empty key segment in the variable name")
        loc = _set_path(data, parts, _parse_env_value(name, env[name]), name)
        sources[loc] = name
    return sources


def _parse_env_value(name: str, value: str) -> Any:
    if value.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"env {name}: invalid JSON ({exc})") from None
    return value


def _set_path(data: dict[str, Any], parts: list[str], value: Any, name: str) -> _Loc:
    node: Any = data
    loc: list[str | int] = []
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        key: str | int = part
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"env {name}: {_loc_str(tuple(loc))}: no list item {part!r} "
                    f"(the list has {len(node)} item(s))"
                )
            key = int(part)
        elif not isinstance(node, dict):
            raise ConfigError(
                f"env {name}: {_loc_str(tuple(loc))}: cannot set a key inside a "
                f"{type(node).__name__} value"
            )
        loc.append(key)
        if last:
            node[key] = value
        else:
            child = node[key] if isinstance(node, list) else node.get(key)
            if child is None:  # absent: a list if indexed next, else a mapping
                child = node[key] = [] if parts[depth + 1].isdigit() else {}
            node = child
    return tuple(loc)


def _loc_str(loc: _Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<top level>"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(redact_url(value))
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _allowed_keys(loc: _Loc) -> list[str] | None:
    """Field names of the model that holds the last key of ``loc``."""
    cls: type[BaseModel] = HopserveConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        cls = annotation
    return list(cls.model_fields)


def _describe(error: Any, source: str, env_sources: dict[_Loc, str]) -> str:
    loc: _Loc = tuple(error["loc"])
    for env_loc, name in sorted(env_sources.items(), key=lambda kv: -len(kv[0])):
        if loc[: len(env_loc)] == env_loc:
            source = f"env {name}"
            break
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(loc)
        hint = f" (expected one of: {', '.join(allowed)})" if allowed else ""
        return f"{source}: {_loc_str(loc)}: unknown key{hint}"
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    structured = isinstance(value, dict | BaseModel) or (
        isinstance(value, list) and any(isinstance(v, dict | BaseModel) for v in value)
    )
    got = "" if error["type"] == "missing" or structured else f" (got {_show(value)})"
    return f"{source}: {_loc_str(loc)}: {message}{got}"
