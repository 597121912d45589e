"""The front-end ↔ worker contract: typed messages, one stats type, the stage names, errors.

Plain dataclasses over numpy arrays (no torch, no protobuf): the front-end, the
in-process worker and the gRPC worker service exchange exactly these, and
:mod:`hopserve.proto.codec` maps them to and from ``worker.proto`` field by field, with
the same names. Rules (vLLM's ``SchedulerOutput`` style):

* Send node ids, never features or embeddings the worker already holds.
* Node ids are **storage ids** of the model's graph (the front-end maps external IDs).
* Exact jobs carry the frontiers the front-end planned once for the whole batch
  (DGI §3.3); the worker checks them and never plans them again. Sampling jobs carry
  fanouts and seed, and the worker samples (samples are keyed per node and layer, so where
  they are drawn does not change them).
* One stats type, :class:`RunStats`, from the engine to the wire and the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

__all__ = [
    "STAGES",
    "BlockInfo",
    "DeadlineExceededError",
    "DeviceMemory",
    "GraphVersionMismatchError",
    "InvalidJobError",
    "Job",
    "JobError",
    "JobResult",
    "LayerStats",
    "ModelNotFoundError",
    "ModelStatus",
    "RunStats",
    "WorkerBusyError",
    "WorkerClient",
    "WorkerStatus",
    "WorkerUnavailableError",
    "time_left",
    "validate_fanouts",
]

STAGES: tuple[str, ...] = (
    "cache_lookup",
    "queue_wait",
    "planning",
    "prepare",
    "compute",
    "transfer",
    "write_back",
)
"""Stages of one request, in pipeline order; defined here once. They are the fields of
``hopserve.v1.StageTiming`` (besides ``total``), the keys of the client's
``EmbeddingResult.timing`` and the ``stage`` label of ``hopserve_stage_duration_seconds``.

- ``cache_lookup``: reading the requested rows from the embedding cache;
- ``queue_wait``: waiting in the batcher until the request's batch was dispatched;
- ``planning``: annotating the batch's frontiers ``V^L … V^0`` (front-end, or worker for
  sampling jobs);
- ``prepare``: building batches and gathering their inputs on the worker (and checking
  the job's frontiers);
- ``compute``: conv forward passes;
- ``transfer``: copies to and from the device, layer write-outs and the dispatch round
  trip beyond the worker's own time;
- ``write_back``: storing computed rows in the cache (after the answer is sent).
"""

_INT32_MAX = 2**31 - 1


def validate_fanouts(
    fanouts: Sequence[int] | None, num_layers: int | None = None
) -> tuple[int, ...] | None:
    """The one check of per-layer sampling fanouts (client, front-end, worker, engine).

    Args:
        fanouts: ``fanouts[i]`` for layer ``i + 1``: ``-1`` (all neighbours) or a count
            in ``1 .. 2**31 - 1``; ``None`` or empty means exact.
        num_layers: When given, the required length.

    Returns:
        The fanouts as a tuple, or ``None`` when they sample nothing (exact evaluation:
        empty, or all ``-1``).

    Raises:
        ValueError: naming the entry (index and layer) or the length that is wrong.
    """
    if fanouts is None:
        return None
    if isinstance(fanouts, str | bytes):
        raise ValueError(f"fanouts must be a sequence of integers, got {fanouts!r}")
    values = []
    for i, f in enumerate(fanouts):
        if isinstance(f, bool) or not isinstance(f, int | np.integer):
            raise ValueError(f"fanouts[{i}] (layer {i + 1}) must be an integer, got {f!r}")
        if f != -1 and not 1 <= f <= _INT32_MAX:
            raise ValueError(
                f"fanouts[{i}] (layer {i + 1}) is {int(f)}: use -1 (all neighbours) or a count >= 1"
            )
        values.append(int(f))
    if not values:
        return None
    if num_layers is not None and len(values) != num_layers:
        shown = ", ".join(map(str, values[:8])) + (", ..." if len(values) > 8 else "")
        raise ValueError(
            f"fanouts [{shown}] has {len(values)} entries; the model has {num_layers} layers "
            "(one fanout per layer, or none for exact)"
        )
    return None if all(f == -1 for f in values) else tuple(values)


# ---------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Job:
    """One layer-wise evaluation: the union of a batch's targets."""

    job_id: str
    """Unique per front-end; echoed in the result and in logs."""
    model: str
    """Model name as configured."""
    model_version: str
    """The version the front-end validated the requests against (never empty)."""
    targets: np.ndarray
    """int64 storage ids whose rows are wanted, in result-row order (the front-end sends
    them unique and ascending; duplicates are allowed)."""
    frontiers: tuple[np.ndarray | None, ...] | None = None
    """``V^0 … V^L`` as ascending int64 storage ids (a ``None`` entry = all nodes) for
    exact jobs; ``None`` for sampling jobs and when the worker should plan."""
    fanouts: tuple[int, ...] | None = None
    """Per-layer sampling fanouts (:func:`validate_fanouts`); ``None`` = exact."""
    seed: int | None = None
    """Sampling seed in ``0 .. 2**64 - 1``; required when ``fanouts`` samples."""
    deadline: float | None = None
    """Absolute wall-clock deadline (``time.time()``); ``None`` = none."""
    graph_version: str = ""
    """Graph version the front-end planned on; a worker serving another refuses the job
    (:class:`GraphVersionMismatchError`). Empty = not checked."""
    graph_seq: int = 0
    """Graph sequence planned at (updates on top of ``graph_version``): a worker behind
    applies the update log up to it first; one ahead refuses the job
    (:class:`GraphVersionMismatchError`, the front-end plans again)."""
    delta: bytes = b""
    """A request-scoped graph delta resolved at ``graph_seq`` (the update log's record
    encoding): the job runs on graph + delta, nothing is stored. Empty = none."""
    updates: tuple[bytes, ...] = ()
    """Update-log records ending at ``graph_seq`` for a worker with its own copy of the
    graph folder (it appends the ones it lacks, then evaluates). Empty = none."""


def time_left(job: Job, now: float | None = None) -> float | None:
    """Seconds until ``job.deadline`` (negative once past), ``None`` without a deadline."""
    if job.deadline is None:
        return None
    return job.deadline - (time.time() if now is None else now)


# ---------------------------------------------------------------------------- stats
@dataclass
class LayerStats:
    """Counters of one evaluated block (layer) of one run."""

    layer: int
    """Block index: 0 = node-wise ops before the first conv, 1..L = layers."""
    rows: int = 0
    """Destination rows computed (``|V^layer|``)."""
    batches: int = 0
    """Device batches run."""
    input_nodes: int = 0
    """Source rows gathered, summed over batches."""
    edges: int = 0
    """In-edges aggregated, summed over batches."""
    oom_halvings: int = 0
    """Batches redone at half size after an out-of-memory error."""
    compute_s: float = 0.0
    """Conv forward seconds."""
    peak_bytes: int = 0
    """Peak bytes of one batch (device allocator peak on GPU, accounted on CPU)."""
    gather_free: bool = False
    """Sources were read in place from the stored node table (no per-batch gather)."""
    reused_rows: int = 0
    """Rows of the layer taken from the layer cache instead of computed (not in ``rows``)."""
    freed_inputs: int = 0
    """Stored inputs freed before the layer's batches: every reader derived its source
    table from them up front (full layers; the batches read only the tables)."""


@dataclass
class RunStats:
    """Where one evaluation's time went and how big it was: produced by the engine,
    carried by :class:`JobResult` and ``worker.proto``'s ``JobStats`` under the same names."""

    planning_s: float = 0.0
    """Annotating frontiers on the worker (sampling jobs; library calls)."""
    prepare_s: float = 0.0
    """Building batches, gathering inputs and checking a job's frontiers."""
    transfer_s: float = 0.0
    """Host-to-device copies."""
    compute_s: float = 0.0
    """Conv forward passes."""
    write_out_s: float = 0.0
    """Writing layer outputs and gathering the result rows."""
    total_s: float = 0.0
    """Wall time of the whole evaluation (job) on the worker."""
    frontier_sizes: list[int] = field(default_factory=list)
    """``|V^0| … |V^L|`` (0 for a frontier nothing reads)."""
    layers: list[LayerStats] = field(default_factory=list)
    """Per evaluated block, in execution order."""
    tiers: dict[str, str] = field(default_factory=dict)
    """Where each stored value lived: ``device``, ``host`` or ``disk``."""
    device: str = ""
    """Device the evaluation ran on, e.g. ``"cuda:0"``."""

    @property
    def batches(self) -> int:
        """Device batches over all blocks."""
        return sum(s.batches for s in self.layers)

    @property
    def oom_halvings(self) -> int:
        """Batches redone after out-of-memory errors, over all blocks."""
        return sum(s.oom_halvings for s in self.layers)

    @property
    def peak_bytes(self) -> int:
        """Largest batch peak over all blocks."""
        return max((s.peak_bytes for s in self.layers), default=0)

    @property
    def layer_compute_s(self) -> list[float]:
        """Compute seconds per evaluated block, in execution order."""
        return [s.compute_s for s in self.layers]

    def to_dict(self) -> dict:
        """A JSON-ready dict (with the derived counters)."""
        d = asdict(self)
        d |= {"batches": self.batches, "oom_halvings": self.oom_halvings}
        d["peak_bytes"] = self.peak_bytes
        return d


@dataclass
class JobResult:
    """Embeddings of a job's targets: row ``i`` belongs to ``job.targets[i]``."""

    job_id: str
    """The job's id, echoed."""
    embeddings: np.ndarray
    """float32 ``[len(targets), dim]``."""
    stats: RunStats
    """Timings and sizes of the job."""
    worker: str = ""
    """Which worker ran it (filled by the client that received it)."""
    model_version: str = ""
    """Model version that computed the rows."""
    graph_version: str = ""
    """Graph version the rows were computed on."""
    graph_seq: int = 0
    """Graph sequence the rows were computed at."""


# ---------------------------------------------------------------------------- status
@dataclass(frozen=True)
class BlockInfo:
    """One layer (ConvBlock) of a model as the engine split it (``hopserve.v1.BlockInfo``)."""

    layer: int
    """1-based layer index: the block computes ``h^layer`` from ``h^(layer-1)``."""
    kind: str
    """Conv class name(s), e.g. ``"SAGEConv"`` (``"+"``-joined for several)."""
    in_dim: int = 0
    """Width of the layer's input (0 = unknown)."""
    out_dim: int = 0
    """Width of the layer's output (0 = unknown)."""
    description: str = ""
    """The schema line for humans."""


@dataclass(frozen=True)
class ModelStatus:
    """A model loaded on a worker, as the front-end needs to serve it."""

    name: str
    """Model name."""
    version: str
    """Model version."""
    dim: int
    """Output embedding width."""
    num_layers: int
    """Message-passing layers L (a request's fanouts have this length)."""
    graph_version: str
    """Version of the graph it runs on."""
    graph_num_nodes: int
    """Nodes of that graph."""
    mode: str = "layerwise"
    """``"layerwise"`` or ``"nodewise"`` (the fallback; exact jobs only)."""
    reads_input_frontier: bool = True
    """Whether plans need ``V^0`` (node-wise ops before the first conv); when false the
    front-end skips annotating ``V^0``, the largest frontier."""
    blocks: tuple[BlockInfo, ...] = ()
    """The layers, ``blocks[i]`` being layer ``i + 1``."""
    description: str = ""
    """Free-form description (entrypoint, mode, schema) for humans."""
    graph_seq: int = 0
    """Graph sequence the worker has applied."""
    degree_normalized: bool = True
    """Whether a conv normalizes by node degrees (invalidation then reaches the changed
    edges' endpoints' out-neighbours); ``True`` when unknown (invalidates more, never less)."""
    reads_source_degrees: bool = True
    """Whether a conv reads the out-degrees of edge sources (DGL ``GraphConv``'s norm):
    then a changed edge's source's out-neighbours are invalidated too; PyG's ``gcn_norm``
    reads in-degrees only. ``True`` when unknown."""
    reads_out_edges: bool = False
    """Whether a row reads out-neighbours too (the node-wise fallback's field both ways,
    e.g. ``DirGNNConv``): a change then reaches in-neighbours as well as out-neighbours."""
    layer_cache_rows: int = 0
    """Hub rows the worker keeps per intermediate layer (``engine.layer_cache_rows``; 0 =
    no layer cache). Such a worker plans exact jobs itself, where frontiers stop at its
    cached rows: the front-end sends none."""
    output_types: tuple[str, ...] = ()
    """Node types whose rows the model outputs (a dict model's; empty: every node)."""
    output_dims: tuple[int, ...] = ()
    """Width of each output type's embeddings (aligned with :attr:`output_types`; the
    narrower are zero-padded to ``dim``)."""


@dataclass(frozen=True)
class DeviceMemory:
    """Device memory of a worker in bytes (0 = unknown)."""

    used: int = 0
    """In use (CUDA: reserved by the caching allocator; CPU: process RSS)."""
    total: int = 0
    """Device (or host) total."""
    peak: int = 0
    """Highest use since the worker started."""


@dataclass(frozen=True)
class WorkerStatus:
    """A snapshot of one worker (``WorkerStatus`` RPC; in-process ``Worker.status()``)."""

    worker_id: str
    """Stable identifier (``host:pid:device`` by default)."""
    device: str
    """Device it computes on, e.g. ``"cuda:0"``."""
    models: tuple[ModelStatus, ...] = ()
    """Models loaded and ready."""
    inflight_jobs: int = 0
    """Jobs running."""
    queued_jobs: int = 0
    """Jobs accepted and waiting (for their model or a thread)."""
    memory: DeviceMemory = DeviceMemory()
    """Device memory."""

    def model(self, name: str, version: str) -> ModelStatus | None:
        """The loaded ``(name, version)``, or ``None``."""
        return next((m for m in self.models if (m.name, m.version) == (name, version)), None)


class WorkerClient(Protocol):
    """How the front-end reaches a worker: in-process or over gRPC, one interface."""

    name: str
    """Unique among a dispatcher's workers."""

    @property
    def inflight(self) -> int:
        """Jobs sent and not yet answered (for least-loaded dispatch)."""
        ...

    async def run(self, job: Job) -> JobResult:
        """Run ``job``; :class:`WorkerUnavailableError` if the worker cannot be reached."""
        ...

    async def status(self) -> WorkerStatus:
        """The worker's status; :class:`WorkerUnavailableError` if unreachable."""
        ...

    async def close(self) -> None:
        """Release the connection (in-process: stop taking jobs)."""
        ...


# ---------------------------------------------------------------------------- errors
class WorkerUnavailableError(RuntimeError):
    """The worker cannot be reached or went away; the dispatcher may fail over."""


class JobError(RuntimeError):
    """The worker ran the job and it failed (not retried on another worker)."""


class ModelNotFoundError(JobError):
    """The job names a model (name, version) the worker has not loaded (``NOT_FOUND``)."""


class InvalidJobError(JobError):
    """Malformed job: bad targets, frontiers, fanouts or seed (``INVALID_ARGUMENT``)."""


class DeadlineExceededError(JobError):
    """The job's deadline passed before it started or while it ran (``DEADLINE_EXCEEDED``)."""


class GraphVersionMismatchError(JobError):
    """The job was planned on another graph version (``FAILED_PRECONDITION``)."""


class WorkerBusyError(JobError):
    """The worker's queue is full; another worker may take it (``RESOURCE_EXHAUSTED``)."""
