"""The CUDA worker: one GPU per worker, memory from the CUDA caching allocator."""

from __future__ import annotations

import logging
import threading

import torch

from hopserve.proto.contract import DeviceMemory
from hopserve.worker.runtime.base import Worker

__all__ = ["GPUWorker"]

log = logging.getLogger(__name__)


class GPUWorker(Worker):
    """Runs jobs on one CUDA device.

    Args:
        device: ``"cuda"`` (the current device) or ``"cuda:N"``.
        **kwargs: see :class:`~hopserve.worker.runtime.base.Worker`.

    Memory: ``used`` is what the caching allocator has reserved, ``total`` the device's
    memory, ``peak`` the highest allocation seen since start-up. The evaluator resets the
    allocator's peak counter per batch, so the worker samples it after every job.
    """

    def __init__(self, device: str = "cuda", **kwargs) -> None:
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"GPUWorker needs a 'cuda' or 'cuda:N' device, got {device!r}")
        if not torch.cuda.is_available():
            raise RuntimeError(f"GPUWorker({device!r}): CUDA is not available on this machine")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise RuntimeError(
                f"GPUWorker({device!r}): only {torch.cuda.device_count()} CUDA device(s)"
            )
        super().__init__(str(dev), **kwargs)
        self._peak = 0
        self._peak_lock = threading.Lock()

    def init_device(self) -> None:
        torch.cuda.set_device(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        log.info(
            "GPU worker %s: %s (%s), %.1f of %.1f GiB free",
            self.worker_id,
            self.device,
            torch.cuda.get_device_name(self.device),
            free / 2**30,
            total / 2**30,
        )

    def _device_context(self) -> torch.cuda.device:
        return torch.cuda.device(self.device)

    def _after_job(self) -> None:
        peak = max(
            torch.cuda.max_memory_allocated(self.device), torch.cuda.memory_allocated(self.device)
        )
        with self._peak_lock:
            self._peak = max(self._peak, int(peak))

    def memory_info(self) -> DeviceMemory:
        _, total = torch.cuda.mem_get_info(self.device)
        self._after_job()
        return DeviceMemory(int(torch.cuda.memory_reserved(self.device)), int(total), self._peak)
