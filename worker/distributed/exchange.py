"""The job's process group: halo exchange with ``all_to_all``, agreement, barriers.

Started by ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``… in the environment),
:meth:`Comm.from_env` joins the group over gloo when the job computes on the CPU and over
NCCL on CUDA; without those variables (or with one process) it is a world of one and
every collective is a no-op, so the same job code runs single-process.

Rows travel as they are computed (dtype and width of the layer's output): one
``all_to_all_single`` per value and layer, the split sizes fixed by the
:class:`~.halo.HaloPlan` (which :meth:`Comm.plan_halo` builds with two small ones: the
counts, then the ids each rank needs).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from hopserve.worker.distributed.halo import HaloPlan, halo_ids, recv_counts
from hopserve.worker.distributed.partition import Partition

__all__ = ["Comm", "ExchangeStats"]

log = logging.getLogger(__name__)


@dataclass
class ExchangeStats:
    """What one exchange moved (this rank's side)."""

    rows_sent: int = 0
    rows_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


class Comm:
    """This rank's view of the job: rank, world size and the collectives the job uses.

    Args:
        rank, world_size: this process's place in the job.
        device: where collectives' tensors must live (``cpu`` for gloo, the rank's GPU for
            NCCL).
        owned: whether this object started the process group (and so ends it).
    """

    def __init__(
        self, rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu", owned=False
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self._owned = owned

    @classmethod
    def from_env(cls, device: str | torch.device = "cpu", timeout_s: float | None = None) -> Comm:
        """Join the group ``torchrun`` describes in the environment (gloo on CPU, NCCL on
        CUDA), or a world of one when there is none.

        With ``device="cuda"`` each rank takes GPU ``LOCAL_RANK``; the returned comm's
        :attr:`device` says which. ``timeout_s``: how long a collective waits for the other
        ranks (default: torch's, 30 minutes for gloo).
        """
        device = torch.device(device)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank if world > 1 else torch.cuda.current_device())
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if dist.is_available() and dist.is_initialized():  # a caller's group: use it as is
            return cls(dist.get_rank(), dist.get_world_size(), _comm_device(device), owned=False)
        if world <= 1:
            return cls(0, 1, device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict = {"device_id": device} if backend == "nccl" else {}
        if timeout_s is not None:
            kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
        timeout = {"timeout": kwargs["timeout"]} if "timeout" in kwargs else {}
        store, rank, world = next(dist.rendezvous("env://", **timeout))
        # After torchrun restarts a failed group, the store may still hold the previous
        # attempt's keys (gloo would connect to a dead rank's address): one prefix per
        # attempt.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"hopserve/attempt-{attempt}", store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kwargs)
        comm = cls(dist.get_rank(), dist.get_world_size(), _comm_device(device), owned=True)
        log.debug("rank %d of %d joined (%s)", comm.rank, comm.world_size, backend)
        return comm

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def close(self) -> None:
        """Leave the process group (if this comm started it)."""
        if self._owned and dist.is_initialized():
            dist.destroy_process_group()
            self._owned = False

    # ------------------------------------------------------------------ agreement
    def min(self, value: int) -> int:
        """The smallest ``value`` over all ranks."""
        return self._reduce(value, dist.ReduceOp.MIN)

    def max(self, value: int) -> int:
        """The largest ``value`` over all ranks."""
        return self._reduce(value, dist.ReduceOp.MAX)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def _reduce(self, value: int, op: dist.ReduceOp) -> int:
        if not self.distributed:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=op)
        return int(t.item())

    # ------------------------------------------------------------------ halo
    def plan_halo(self, partition: Partition, indptr: np.ndarray, indices: np.ndarray) -> HaloPlan:
        """This rank's halo and what it sends to whom (two small ``all_to_all`` calls)."""
        start, end = partition.range(self.rank)
        need = halo_ids(indptr, indices, start, end)
        recv = recv_counts(partition, need)
        if not self.distributed:
            empty = np.empty(0, dtype=np.int64)
            return HaloPlan(self.rank, start, end, need, recv, empty, (0,))
        counts_out = torch.tensor(recv, dtype=torch.long, device=self.device)
        counts_in = torch.empty_like(counts_out)
        dist.all_to_all_single(counts_in, counts_out)  # how many of my rows each rank needs
        send = tuple(int(c) for c in counts_in.tolist())
        asked = torch.empty(sum(send), dtype=torch.long, device=self.device)
        dist.all_to_all_single(
            asked, torch.from_numpy(need).to(self.device), list(send), list(recv)
        )
        send_rows = asked.cpu().numpy() - start
        if send_rows.size and (send_rows.min() < 0 or send_rows.max() >= end - start):
            raise RuntimeError(f"rank {self.rank}: asked for rows it does not own")  # a bug
        return HaloPlan(self.rank, start, end, need, recv, send_rows, send)

    def exchange(self, plan: HaloPlan, local: Tensor) -> tuple[Tensor, ExchangeStats]:
        """This rank's rows of a value, extended by its halo rows from their owners.

        Args:
            plan: this rank's :class:`~.halo.HaloPlan`.
            local: the value's rows ``plan.start:plan.end`` (``[n, ...]``).

        Returns:
            The value at ``plan.rows`` (halo below, own rows, halo above), on
            ``local``'s device, and what moved.
        """
        n = plan.end - plan.start
        if local.shape[0] != n:
            raise ValueError(f"rank {self.rank}: {local.shape[0]} local rows, expected {n}")
        stats = ExchangeStats()
        if not self.distributed:
            return local, stats
        flat = local.reshape(n, -1)
        index = torch.from_numpy(plan.send_rows).to(flat.device)
        send = flat.index_select(0, index).to(self.device).contiguous()
        recv = torch.empty(
            (sum(plan.recv_counts), flat.shape[1]), dtype=flat.dtype, device=self.device
        )
        dist.all_to_all_single(recv, send, list(plan.recv_counts), list(plan.send_counts))
        recv = recv.to(flat.device)
        k = plan.split
        table = torch.cat([recv[:k], flat, recv[k:]]).reshape(-1, *local.shape[1:])
        item = flat.element_size() * flat.shape[1]
        stats.rows_sent, stats.rows_received = send.shape[0], recv.shape[0]
        stats.bytes_sent, stats.bytes_received = send.shape[0] * item, recv.shape[0] * item
        return table, stats


def _comm_device(device: torch.device) -> torch.device:
    """Where a backend wants its tensors: the GPU for NCCL, the CPU for gloo."""
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return device if backend == "nccl" else torch.device("cpu")
