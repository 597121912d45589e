"""The evaluator's settings and their defaults: one place for the library and the service.

``LayerwiseEvaluator(**settings.kwargs())`` and ``hopserve.config.EngineConfig`` both
default to :class:`EngineSettings`' values, so an evaluator built in a notebook behaves
like the one a worker builds from an empty ``engine:`` section. Imports no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = [
    "DEFAULT_LAYER_CACHE_ROWS",
    "CPU_BATCH_BUDGET_BYTES",
    "DEVICE_MEMORY_FRACTION",
    "EngineSettings",
    "INIT_BATCH_NODES",
]

CPU_BATCH_BUDGET_BYTES = 256 * 2**20
"""Default accounted bytes one CPU batch may use (CPU has no allocator peak to measure)."""

DEVICE_MEMORY_FRACTION = 0.9
"""Share of free device memory one GPU batch aims at (DGI §4.1's M)."""

INIT_BATCH_NODES = 4096
"""First node threshold of a layer's batches; the edge threshold starts at this times the
average degree. Eq. 2 adapts both after every batch."""

DEFAULT_LAYER_CACHE_ROWS = 65_536
"""Hub rows a worker keeps per intermediate layer for exact reuse (``engine.layer_cache_rows``;
e.g. 32 MiB per layer at 128 float32 wide)."""


@dataclass(frozen=True)
class EngineSettings:
    """How the layer-wise evaluator uses memory and threads.

    Every ``None`` means "the device's default", resolved when the evaluator knows its
    device (a GPU's free memory, the host's available RAM).
    """

    memory_budget_bytes: int | None = None
    """Bytes one batch may use. CPU: the accounted budget, :data:`CPU_BATCH_BUDGET_BYTES`
    by default (a batch predicted over it is halved). GPU: a cap on top of
    :data:`DEVICE_MEMORY_FRACTION` of free device memory (default: no cap)."""
    host_memory_budget_bytes: int | None = None
    """Host bytes for intermediate layer outputs before they spill to disk (default: half
    of the available RAM at evaluator start)."""
    spill_dir: str | None = None
    """Directory of disk-tier memmaps (default: the system temp directory)."""
    prefetch: bool | None = None
    """Prepare the next batch on a thread while the current one computes (default: on for
    CUDA, where copies overlap compute; off on CPU, where the thread competes with it)."""
    init_batch_nodes: int = INIT_BATCH_NODES
    """First node threshold of a layer's batches."""
    graph_on_device: bool | None = None
    """Keep the graph's CSC and features on the GPU, uploaded once per graph version
    (default: when they take at most 40% of the free device memory; CPU: ignored)."""
    device_tier_fraction: float = 0.5
    """Share of free device memory one stored layer output may take on the GPU before it
    goes to (pinned) host memory; 0 keeps every layer output on the host."""

    def kwargs(self) -> dict[str, object]:
        """As keyword arguments of :class:`~.evaluator.LayerwiseEvaluator`."""
        return asdict(self)
