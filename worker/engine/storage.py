"""Where intermediate embeddings live between layers: device, host (pinned), or disk.

A layer's outputs are written once (contiguous row ranges) and gathered by later layers.
Tier choice per tensor, in order: the compute device when it is a GPU and the tensor fits
in a fraction of free device memory; host memory (pinned when a GPU computes) within the
host budget; otherwise a ``numpy.memmap`` file in the spill directory (DGI §4.3).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)

_NP_DTYPES = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.bool: np.bool_,
}


@dataclass
class TierAllocator:
    """Allocates per-layer embedding tensors across device / host / disk tiers."""

    device: torch.device
    host_budget_bytes: int
    spill_dir: str | None = None
    device_fraction: float = 0.5  # of free device memory a single tensor may take
    host_used: int = 0
    tiers: dict[str, str] = field(default_factory=dict)  # value name -> tier used
    _files: list[str] = field(default_factory=list)

    def allocate(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if nbytes <= self.device_fraction * free:
                try:
                    t = torch.empty(shape, dtype=dtype, device=self.device)
                except torch.cuda.OutOfMemoryError:  # free memory is shared: fall back to host
                    log.info("%s: %d bytes did not fit on %s; host tier", name, nbytes, self.device)
                else:
                    self.tiers[name] = "device"
                    return t
        if self._take_host(name, nbytes):
            pin = self.device.type == "cuda"
            return torch.empty(shape, dtype=dtype, pin_memory=pin)
        self.tiers[name] = "disk"
        fd, path = tempfile.mkstemp(prefix=f"hopserve-{name}-", suffix=".bin", dir=self.spill_dir)
        os.close(fd)
        self._files.append(path)
        arr = np.memmap(path, dtype=_NP_DTYPES[dtype], mode="w+", shape=shape)
        log.debug("spilling %s (%d bytes) to %s", name, nbytes, path)
        return torch.from_numpy(arr)

    def adopt(self, name: str, t: Tensor) -> bool:
        """Keep ``t`` itself as the tensor of ``name`` where :meth:`allocate` would put a
        new one on the host tier (a layer computed in one batch: no copy, no second
        layer-sized buffer); ``False``: allocate and copy instead.

        Only for a CPU compute device: on a GPU the tier choice is the device's free
        memory at allocation time, which the compute output already took.
        """
        if self.device.type != "cpu" or t.device.type != "cpu":
            return False
        return self._take_host(name, t.numel() * t.element_size())

    def _take_host(self, name: str, nbytes: int) -> bool:
        """Account ``nbytes`` of ``name`` on the host tier if the budget has room."""
        if self.host_used + nbytes > self.host_budget_bytes:
            return False
        self.host_used += nbytes
        self.tiers[name] = "host"
        return True

    def release(self, name: str, t: Tensor) -> None:
        if self.tiers.get(name) == "host":
            self.host_used -= t.numel() * t.element_size()

    def close(self) -> None:
        """Delete spill files (memmaps stay valid until their tensors are dropped)."""
        for path in self._files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._files.clear()
