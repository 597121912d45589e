"""Which C allocator serves this process's CPU tensors, and how to start a child under
tcmalloc.

A CPU worker allocates and frees a batch's temporaries (gathered rows, edge lists,
messages) thousands of times a layer, in sizes that vary with the batch's degrees.
glibc's malloc serves them from its heap arenas and keeps what is freed, fragmented:
on the recommender graph's 2-layer HGT, peak RSS was 1.3-1.4 GB under glibc against
0.9 GB under tcmalloc (gperftools), which was also as fast or faster; DGL's GCN and
SAGE ran 15-25% faster under it. PyTorch's own CPU launcher
(``torch.backends.xeon.run_cpu``) preloads tcmalloc or jemalloc for the same reason;
jemalloc's default decay made these runs 1.6x slower here. The worker images preload
``libtcmalloc_minimal`` (``deploy/docker``); a worker started under glibc logs how to.
"""

from __future__ import annotations

import ctypes.util
import logging
from collections.abc import Mapping
from pathlib import Path

__all__ = ["active_allocator", "allocator_hint", "find_tcmalloc", "log_allocator", "with_tcmalloc"]

log = logging.getLogger("hopserve.worker")

_KNOWN = ("tcmalloc", "jemalloc", "mimalloc")
_SEARCH = (
    "/usr/local/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)


def active_allocator(maps: Path = Path("/proc/self/maps")) -> str:
    """``"tcmalloc"``, ``"jemalloc"`` or ``"mimalloc"`` when that library is mapped into
    the process (``maps``: this one's, or ``/proc/<pid>/maps``), else ``"glibc"``
    (``"unknown"`` without ``/proc``). A heuristic: an allocator library some package
    loads for itself, without serving ``malloc``, would count too."""
    try:
        text = maps.read_text()
    except OSError:
        return "unknown"
    for line in text.splitlines():
        known = _allocator_of(line)
        if known is not None:
            return known
    return "glibc"


def find_tcmalloc() -> str | None:
    """Path of ``libtcmalloc_minimal`` (Debian/Ubuntu: ``libtcmalloc-minimal4``), or
    ``None`` when it is not installed."""
    for directory in _SEARCH:
        for path in sorted(Path(directory).glob("libtcmalloc_minimal.so*")):
            return str(path)
    return ctypes.util.find_library("tcmalloc_minimal")  # a name ld.so resolves, or None


def with_tcmalloc(env: Mapping[str, str], library: str | None = None) -> dict[str, str]:
    """``env`` with tcmalloc first in ``LD_PRELOAD`` (a child process then allocates
    with it); unchanged when tcmalloc is not installed or an allocator is already
    preloaded (the operator's choice). ``HOPSERVE_ALLOCATOR=system`` opts out: known
    allocators are then taken out of ``LD_PRELOAD`` (the images preload tcmalloc)."""
    out = dict(env)
    preload = [p for p in out.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if out.get("HOPSERVE_ALLOCATOR", "").lower() == "system":
        kept = [p for p in preload if _allocator_of(p) is None]
        if kept:
            out["LD_PRELOAD"] = ":".join(kept)
        else:
            out.pop("LD_PRELOAD", None)
        return out
    library = library or find_tcmalloc()
    if library is None or any(_allocator_of(p) for p in preload):
        return out
    out["LD_PRELOAD"] = ":".join([library, *preload])
    return out


def _allocator_of(path: str) -> str | None:
    """The known allocator a library path (or a maps line ending in one) is, if any."""
    name = path.rsplit("/", 1)[-1]
    return next((known for known in _KNOWN if name.startswith(f"lib{known}")), None)


def allocator_hint(allocator: str) -> str | None:
    """A line for the worker's log when its CPU allocator fragments (glibc), else ``None``."""
    if allocator != "glibc":
        return None
    library = find_tcmalloc() or "libtcmalloc_minimal.so.4 (apt install libtcmalloc-minimal4)"
    return (
        "CPU tensors use glibc malloc, which keeps freed batch memory fragmented (peak RSS "
        f"up to 1.5x); start the worker with LD_PRELOAD={library} as the images do"
    )


def log_allocator() -> str:
    """Log this process's allocator (with the fix under glibc) at info level: a choice
    of memory footprint, not a fault; return it."""
    allocator = active_allocator()
    hint = allocator_hint(allocator)
    log.info("CPU allocator: %s%s", allocator, "" if hint is None else f"; {hint}")
    return allocator
