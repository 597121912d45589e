"""hopserve in a child process, the way a user starts it, with tests/ on ``PYTHONPATH``.

Config entrypoints such as ``support.models:GraphSAGE`` then import in the child too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from hopserve.config import HopserveConfig

TESTS = str(Path(__file__).resolve().parents[1])


def child_env() -> dict[str, str]:
    """This process's environment with tests/ first on ``PYTHONPATH``."""
    return os.environ | {"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}


def write_config(config: HopserveConfig, path: Path) -> Path:
    """``config`` as a YAML file at ``path``."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def start_serve(
    config: HopserveConfig, path: Path, python: Sequence[str] = ("-m", "hopserve"), **popen: Any
) -> subprocess.Popen:
    """``hopserve serve --config path`` (``config`` written there) in a child process.

    ``python``: the interpreter's arguments that run the CLI (``("-c", script)`` for a
    wrapper); ``popen``: :class:`subprocess.Popen` keywords (``stdout``, ``text``, ...).
    """
    write_config(config, path)
    argv = [sys.executable, *python, "serve", "--config", str(path)]
    return subprocess.Popen(argv, env=child_env(), **popen)


def run_hopserve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``hopserve ARGS...`` run to completion (text output captured, exit code kept)."""
    return subprocess.run(
        [sys.executable, "-m", "hopserve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        check=False,
    )
