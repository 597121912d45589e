"""What every ``hopserve`` command shares: failing with one line, loading the config,
and reporting models that cannot be served (one line each, the whole story with ``-v``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.config import HopserveConfig

__all__ = [
    "ConfigPath",
    "exit_now",
    "fail",
    "first_line",
    "load_cli_config",
    "report_model_failures",
    "verbose",
]

ConfigPath = Annotated[
    Path,
    typer.Option("--config", "-c", help="hopserve YAML config (see deploy/hopserve.yaml)."),
]
"""The ``--config`` option of the commands that serve."""

shut_down = False
"""Set by a long-running command once its graceful shutdown is complete (see
:func:`hopserve.cli.main`)."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` to stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def exit_now(code: int | str | None) -> NoReturn:
    """Flush logs and standard streams, then leave without the interpreter's teardown."""
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if isinstance(code, str):  # sys.exit("message") semantics
        sys.stderr.write(code + "\n")
        sys.stderr.flush()
        code = 1
    os._exit(code or 0)


def verbose() -> bool:
    """Whether ``-v`` asked for full detail (the root logger is at DEBUG)."""
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def first_line(text: str) -> str:
    """The first non-empty line of ``text`` (an error's one-line reason)."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def load_cli_config(path: Path, **server_overrides: object) -> HopserveConfig:
    """Load, override (``None`` values are ignored) and check the config, or fail.

    Exits with code 2 on any problem: unreadable or invalid file, missing paths, an
    override that fails validation, no models.
    """
    from hopserve.config import ConfigError, load_config

    overrides = {k: v for k, v in server_overrides.items() if v is not None}
    try:
        cfg = load_config(path)
        if overrides:
            merged = cfg.server.model_dump() | overrides
            cfg = cfg.model_copy(update={"server": type(cfg.server).model_validate(merged)})
        cfg.validate_paths()
    except ConfigError as err:
        fail(str(err))
    except ValueError as err:  # an override that fails validation (e.g. equal ports)
        fail(f"{path}: {err}")
    logging.getLogger().setLevel(
        logging.DEBUG if verbose() else getattr(logging, cfg.logging.level)
    )
    if not cfg.models:
        fail(f"{path}: no models configured")
    return cfg


def report_model_failures(failures: Iterable[tuple[str, str, str]]) -> int:
    """Print ``error: model 'name' version 'v': reason`` per failure; return how many.

    The reason is its first line unless ``-v`` (then the whole multi-line message).
    """
    count = 0
    for name, version, reason in failures:
        text = str(reason).strip()
        if not verbose() and "\n" in text:
            text = first_line(text) + " (more with -v)"
        prefix = f"model {name!r} version {version!r}"
        if not text.startswith(f"model {name!r}"):
            text = f"{prefix} cannot be served: {text}"
        typer.echo(f"error: {text}", err=True)
        count += 1
    return count
