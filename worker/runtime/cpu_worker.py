"""The CPU worker: intra-op threads from the config, memory reported as process RSS."""

from __future__ import annotations

import logging
import resource
import sys

import psutil
import torch

from hopserve.proto.contract import DeviceMemory
from hopserve.worker.runtime.base import Worker

__all__ = ["CPUWorker"]

log = logging.getLogger(__name__)


class CPUWorker(Worker):
    """Runs jobs on the host CPU.

    Args:
        device: must be ``"cpu"``.
        num_threads: torch intra-op threads (``torch.set_num_threads``); ``None`` keeps
            torch's default.
        **kwargs: see :class:`~hopserve.worker.runtime.base.Worker`.
    """

    def __init__(self, device: str = "cpu", *, num_threads: int | None = None, **kwargs) -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(f"CPUWorker needs device 'cpu', got {device!r}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        super().__init__("cpu", **kwargs)
        self.num_threads = num_threads

    def init_device(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        log.info("CPU worker %s: %d torch threads", self.worker_id, torch.get_num_threads())

    def memory_info(self) -> DeviceMemory:
        """``used`` = process RSS, ``total`` = host RAM, ``peak`` = the process's max RSS."""
        rss = psutil.Process().memory_info().rss
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak *= 1 if sys.platform == "darwin" else 1024  # Linux reports KiB
        return DeviceMemory(int(rss), int(psutil.virtual_memory().total), int(peak))
