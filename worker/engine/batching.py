"""Dynamic batch size control (DGI §4.1).

A batch is a run of consecutive destination rows, cut where either the node-count
threshold :math:`n_t` or the in-edge threshold :math:`n_i` would be exceeded (binary search
on the in-degree prefix sums). After batch :math:`k` with measured peak :math:`M_k`:

.. math:: r = M / M_k,\\qquad n_t^{k+1} = r\\,n_t^k,\\qquad n_i^{k+1} = r\\,n_i^k

with :math:`M` the memory target (90% of free device memory, capped by the configured
budget, or 80% of the CPU byte budget; :meth:`PeakMemory.target`).
``r`` is clamped to ``[1/4, 2]`` per step so one tiny batch cannot make the next one
explode, and a batch cut short by the end of its layer (not by a threshold) may shrink
the thresholds but never grow them: its peak says nothing about a batch at the
thresholds, and the sizer carries them into the next run's first batch. A device
out-of-memory batch halves both thresholds and is redone; a CPU batch whose account
exceeds the budget is redone at ``r = M / predicted`` (it knows by how much it is over).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hopserve.worker.engine.settings import CPU_BATCH_BUDGET_BYTES, DEVICE_MEMORY_FRACTION

CPU_TARGET_FRACTION = 0.8


class BatchOutOfMemory(RuntimeError):
    """A CPU batch whose account exceeded the budget (``predicted`` its bytes: the redo is
    sized to fit, :meth:`BatchSizer.fit`), or a device out-of-memory error (halved)."""

    def __init__(self, message: str, predicted: int | None = None) -> None:
        super().__init__(message)
        self.predicted = predicted


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is a device out-of-memory error (torch 2.2 and newer)."""
    oom_types = tuple(
        t
        for t in (
            getattr(torch, "OutOfMemoryError", None),
            getattr(torch.cuda, "OutOfMemoryError", None),
        )
        if t is not None
    )
    return isinstance(err, (BatchOutOfMemory, *oom_types))


@dataclass
class BatchSizer:
    """Node/edge thresholds for one block, adjusted after every batch (DGI Eq. 2)."""

    target_bytes: float
    max_nodes: float = 8192.0
    max_edges: float = 8192.0 * 16
    min_growth: float = 0.25
    max_growth: float = 2.0
    node_cap: float = float("inf")  # no batch needs more than the block's rows ...
    edge_cap: float = float("inf")  # ... or the graph's edges
    # Output bytes per destination row, learned from a batch: the CPU budget check of a
    # layer's first batch in the next run predicts its outputs from it.
    out_row_bytes: int = 0

    def next_end(self, cum_degree: Tensor, start: int) -> int:
        """End (exclusive) of the batch starting at row ``start``; at least one row.

        ``cum_degree`` is the prefix sum ``[0, d_0, d_0+d_1, …]`` over this block's rows.
        """
        n = cum_degree.numel() - 1
        by_nodes = min(n, start + max(1, int(self.max_nodes)))
        limit = cum_degree[start] + max(1, int(self.max_edges))
        by_edges = int(torch.searchsorted(cum_degree, limit, right=True)) - 1
        return max(start + 1, min(by_nodes, by_edges))

    def observe(self, peak_bytes: int, *, at_thresholds: bool = True) -> None:
        """Scale thresholds by ``r = M / M_k`` after a successful batch (``r <= 1`` when
        the batch was not ``at_thresholds``: cut short by the end of its rows)."""
        if peak_bytes <= 0:
            return
        r = min(self.max_growth, max(self.min_growth, self.target_bytes / peak_bytes))
        if not at_thresholds:
            r = min(r, 1.0)
        self.max_nodes = min(self.node_cap, max(1.0, self.max_nodes * r))
        self.max_edges = min(self.edge_cap, max(1.0, self.max_edges * r))

    def halve(self) -> None:
        """After an OOM: halve both thresholds (the batch is then redone)."""
        self.max_nodes = max(1.0, self.max_nodes / 2)
        self.max_edges = max(1.0, self.max_edges / 2)

    def fit(self, predicted_bytes: int, rows: int, edges: int) -> None:
        """After a CPU batch of ``rows`` rows and ``edges`` edges was predicted at
        ``predicted_bytes``, over its budget: scale both thresholds by
        ``r = M / predicted`` (in ``[min_growth, 0.9]``), so the redo aims at the target
        instead of at half the batch. When the scaled thresholds would still admit the
        whole batch (it was cut short by the end of its rows, far below them), the batch's
        own size is scaled instead, so the redo is smaller. Its sources shrink less than
        its rows, so a redo can still land over the budget and is then redone again; the
        20% between target and budget makes that rare."""
        r = max(self.min_growth, min(0.9, self.target_bytes / max(predicted_bytes, 1)))
        nodes, edge_limit = self.max_nodes * r, self.max_edges * r
        if rows <= nodes and edges <= edge_limit:  # the same batch again: shrink it
            nodes, edge_limit = min(nodes, max(rows, 1) * r), min(edge_limit, max(edges, 1) * r)
        self.max_nodes, self.max_edges = max(1.0, nodes), max(1.0, edge_limit)


class PeakMemory:
    """Peak bytes of one batch: CUDA allocator stats, or an account on CPU.

    CPU has no allocator peak counter, so the batch's footprint is accounted from the
    tensors it creates: gathered inputs, index structures, each conv's per-edge bytes
    (a message row for gather-scatter convs, an index and a value for fused SpMM) and
    destination-row temporaries (a multiple of the outputs).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)

    def stop(self, accounted: int) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device) - self._base)
        return accounted

    @staticmethod
    def budget(memory_budget_bytes: int | None) -> int:
        """The hard per-batch limit on CPU: the budget, or :data:`CPU_BATCH_BUDGET_BYTES`."""
        if memory_budget_bytes is None:
            return CPU_BATCH_BUDGET_BYTES
        return int(memory_budget_bytes)

    def target(self, memory_budget_bytes: int | None) -> float:
        """The memory target M of Eq. 2.

        GPU: :data:`DEVICE_MEMORY_FRACTION` of the free (plus cached) device memory, capped
        at ``memory_budget_bytes`` when given. CPU: the budget itself is the hard limit (a
        batch predicted over it counts as an OOM) and Eq. 2 aims at 80% of it: a batch's
        footprint varies with its edge/source mix, and a 10% margin redid about a third of
        the batches on power-law graphs.
        """
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(
                self.device
            )
            target = DEVICE_MEMORY_FRACTION * (free + cached)
            if memory_budget_bytes is not None:
                target = min(target, float(memory_budget_bytes))
            return target
        return CPU_TARGET_FRACTION * float(self.budget(memory_budget_bytes))
