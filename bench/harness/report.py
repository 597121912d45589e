"""Where benchmarks write, what they say while running, and how their results are written.

Paths (:data:`BENCH`, :data:`REPO`, :data:`RESULTS`), progress lines (:func:`log`), the
description of the machine and the checkout (:func:`machine_info`, :func:`machine_line`,
:func:`git_revision`) and the writers: :func:`write_json` (numpy-safe),
:func:`markdown_table`, :func:`write_lines` and :func:`write_outputs`, the
``name.{json,md,png}`` triple every benchmark leaves in its ``--out`` folder.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
"""The ``bench/`` folder."""
REPO = BENCH.parent
"""The repository root."""
RESULTS = BENCH / "results"
"""Where benchmarks write their committed results."""

_T0 = time.monotonic()


def log(message: str, *, prefix: str = "bench") -> None:
    """One progress line on stderr: ``[prefix +12.3s] message`` (seconds since import)."""
    print(f"[{prefix} +{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the machine
def machine_info() -> dict[str, Any]:
    """Where a benchmark ran: CPU, cores, memory, OS, Python, key package versions."""
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except (ImportError, OSError):
        pass
    for package in ("torch", "grpc", "numpy"):
        module = sys.modules.get(package)
        if module is not None:
            info[f"{package}_version"] = getattr(module, "__version__", "?")
    return info


def machine_line(info: Mapping[str, Any] | None = None) -> str:
    """``"x86_64, 2 cores, 7.8 GiB (Intel ...)"`` for report headers (``info``: this machine's
    :func:`machine_info` when not given)."""
    info = machine_info() if info is None else info
    text = f"{info.get('machine', '?')}, {info.get('cpu_count', '?')} cores"
    if "memory_gib" in info:
        text += f", {info['memory_gib']} GiB"
    if "cpu_model" in info:
        text += f" ({info['cpu_model']})"
    return text


def git_revision(repo: Path = REPO) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}`` of the checkout (empty when git is unavailable);
    ``dirty`` means the run measured uncommitted changes."""

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *argv], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "dirty": bool(status.strip())}


# --------------------------------------------------------------------------- writers
def to_jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars/arrays, paths, sets and NaN/inf made JSON-safe (NaN → None)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if np is not None:
        if isinstance(obj, np.ndarray):
            return to_jsonable(obj.tolist())
        if isinstance(obj, np.generic):
            obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` (see :func:`to_jsonable`) as indented JSON; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_jsonable(obj), indent=2) + "\n")
    return path


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None
) -> list[str]:
    """A GitHub markdown table as lines; ``align`` one char per column: ``l``/``r``/``c``."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    align = align or "l" * len(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    """Write ``lines`` joined by newlines (with a final one); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_outputs(
    out: Path,
    name: str,
    summary: Any,
    lines: Sequence[str],
    plot: Callable[[Path], None] | None = None,
) -> Path:
    """``out/name.json`` (``summary``), ``out/name.md`` (``lines``) and ``out/name.png``
    (``plot(path)``, when given); the report is also printed. Returns ``out/name``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{name}.json", summary)
    write_lines(out / f"{name}.md", lines)
    if plot is not None:
        plot(out / f"{name}.png")
    print("\n".join(lines))
    return out / name
