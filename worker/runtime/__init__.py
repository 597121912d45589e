"""Workers split by device behind one base class (vLLM's worker split).

``make_worker("cpu" | "cuda" | "cuda:N")`` returns a :class:`CPUWorker` or
:class:`GPUWorker` with its device initialised. Jobs, results, status and the job errors
are the contract's (:mod:`hopserve.proto.contract`); :mod:`.job_checks` holds what a
worker checks before running a job. The worker classes are loaded lazily on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.worker.runtime.base import LoadedModel, Worker
    from hopserve.worker.runtime.cpu_worker import CPUWorker
    from hopserve.worker.runtime.gpu_worker import GPUWorker

__all__ = ["CPUWorker", "GPUWorker", "LoadedModel", "Worker", "make_worker"]

_LAZY = {
    "Worker": "hopserve.worker.runtime.base",
    "LoadedModel": "hopserve.worker.runtime.base",
    "CPUWorker": "hopserve.worker.runtime.cpu_worker",
    "GPUWorker": "hopserve.worker.runtime.gpu_worker",
}


def make_worker(device: str = "cpu", **kwargs: Any) -> Worker:
    """The worker class for ``device``, constructed and with its device initialised.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        **kwargs: passed to the class (``worker_id``, ``verify_frontiers``; CPU:
            ``num_threads``).

    Raises:
        ValueError: an unknown device kind.
        RuntimeError: a CUDA device that is not available.
    """
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind == "cpu":
        from hopserve.worker.runtime.cpu_worker import CPUWorker as cls
    elif kind == "cuda":
        from hopserve.worker.runtime.gpu_worker import GPUWorker as cls
    else:
        raise ValueError(f"no worker for device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    worker = cls(device, **kwargs)
    worker._ensure_device()
    return worker


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
