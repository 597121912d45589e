"""What a worker checks before running a :class:`~hopserve.proto.contract.Job`.

Exact jobs carry the frontiers ``V^0 … V^L`` the front-end planned (``None`` entry = all
nodes, or a ``V^0`` nothing reads); the worker checks them cheaply and never plans them
again: 1-D integer ids, strictly ascending, in range, nested ``V^L ⊆ … ⊆ V^0`` and
``targets ⊆ V^L``. Whether ``V^(l-1)`` holds every in-neighbour of ``V^l`` costs as much
as planning; the evaluator checks it where it matters instead: every row it gathers is
looked up with a checked position (:func:`~hopserve.worker.engine.batch.row_positions`),
so inconsistent frontiers fail with :class:`InvalidJobError` naming the missing node,
and can never read another node's row. ``verify=True`` checks coverage up front.

Sampling jobs (``fanouts`` set) and jobs without frontiers are planned here from
``targets``, ``fanouts`` and ``seed`` (the sampled per-layer edges cannot travel in a job,
and sampling is keyed per node, so the worker draws the samples the front-end would).
"""

from __future__ import annotations

import numpy as np

from hopserve.proto.contract import (
    DeadlineExceededError,
    GraphVersionMismatchError,
    InvalidJobError,
    Job,
    time_left,
    validate_fanouts,
)
from hopserve.rpc import clip, quote
from hopserve.worker.graph.planner import LayerFrontier, Plan, segment_positions

__all__ = ["check_deadline", "check_graph_version", "check_targets", "plan_job"]


def _job(job: Job) -> str:
    """``"job <id>"`` for messages (a long or unprintable id is quoted and cut)."""
    return f"job {clip(job.job_id)}"


def check_targets(job: Job, num_nodes: int) -> np.ndarray:
    """``job.targets`` as a writable contiguous int64 array of storage ids in ``[0, n)``.

    Order and duplicates are kept (result row ``i`` is ``targets[i]``).

    Raises:
        InvalidJobError: not a non-empty 1-D integer array, or an id out of range.
    """
    t = job.targets
    if not isinstance(t, np.ndarray) or t.ndim != 1 or t.dtype.kind not in "iu":
        what = f"{t.dtype}{list(t.shape)}" if isinstance(t, np.ndarray) else type(t).__name__
        raise InvalidJobError(f"{_job(job)}: targets must be 1-D integer ids, got {what}")
    if t.size == 0:
        raise InvalidJobError(f"{_job(job)}: targets is empty")
    _check_range(job, "targets", t, num_nodes)
    return np.array(t, dtype=np.int64)  # a writable copy (wire arrays are read-only views)


def check_deadline(job: Job) -> None:
    """Raise :class:`DeadlineExceededError` if ``job.deadline`` has passed."""
    left = time_left(job)
    if left is not None and left <= 0:
        raise DeadlineExceededError(
            f"{_job(job)}: deadline passed {-left:.3f}s before the job started"
        )


def check_graph_version(job: Job, version: str) -> None:
    """Raise :class:`GraphVersionMismatchError` if the job was planned on another graph
    (a living graph's sequence is checked separately)."""
    if job.graph_version and job.graph_version != version:
        raise GraphVersionMismatchError(
            f"{_job(job)}: planned on graph version {quote(job.graph_version)}; model "
            f"{quote(job.model)} runs on {version!r}"
        )


def plan_job(job: Job, evaluator, targets: np.ndarray, *, verify: bool = False) -> Plan:
    """The evaluator plan for ``job`` (``targets`` as returned by :func:`check_targets`).

    Raises:
        InvalidJobError: bad frontiers, fanouts or seed (the message names the value).
    """
    try:
        fanouts = validate_fanouts(job.fanouts, evaluator.num_layers)
    except ValueError as err:
        raise InvalidJobError(f"{_job(job)}: {err}") from None
    if fanouts is not None or job.frontiers is None:
        if fanouts is not None and job.seed is None:
            raise InvalidJobError(f"{_job(job)}: seed is required when fanouts sample")
        try:
            return evaluator.plan(targets, fanouts, int(job.seed or 0))
        except (ValueError, TypeError) as err:
            raise InvalidJobError(f"{_job(job)}: {err}") from None
    return Plan(_frontiers(job, evaluator, targets, verify), None)


def _frontiers(job: Job, evaluator, targets: np.ndarray, verify: bool) -> list[LayerFrontier]:
    num_layers = evaluator.num_layers
    topology = evaluator.graph.topology
    sent = list(job.frontiers or ())
    if len(sent) != num_layers + 1:
        raise InvalidJobError(
            f"{_job(job)}: {len(sent)} frontiers for a {num_layers}-layer model "
            f"(expected {num_layers + 1}: V^0 … V^{num_layers})"
        )
    layers = [
        None if f is None else _check_frontier(job, layer, f, topology.num_nodes)
        for layer, f in enumerate(sent)
    ]
    reads_v0 = bool(getattr(evaluator, "reads_input_frontier", True))
    for layer in range(num_layers, 0, -1):
        upper, lower = layers[layer], layers[layer - 1]
        if lower is None:
            continue
        if upper is None:
            raise InvalidJobError(
                f"{_job(job)}: frontier V^{layer} is all nodes but V^{layer - 1} is not"
            )
        _check_subset(job, f"V^{layer}", upper, f"V^{layer - 1}", lower)
        if verify and (layer > 1 or reads_v0):
            pos, _ = segment_positions(topology.indptr, upper)
            nbrs = np.unique(topology.indices[pos])
            _check_subset(job, f"in-neighbours of V^{layer}", nbrs, f"V^{layer - 1}", lower)
    if layers[-1] is not None:
        _check_subset(job, "targets", np.unique(targets), f"V^{num_layers}", layers[-1])
    planned = [True] * (num_layers + 1)
    planned[0] = reads_v0 or layers[0] is not None
    return [LayerFrontier(nodes, planned=p) for nodes, p in zip(layers, planned, strict=True)]


def _check_frontier(job: Job, layer: int, f: np.ndarray, n: int) -> np.ndarray:
    where = f"{_job(job)}: frontier V^{layer}"
    if not isinstance(f, np.ndarray) or f.ndim != 1 or f.dtype.kind not in "iu":
        what = f"{f.dtype}{list(f.shape)}" if isinstance(f, np.ndarray) else type(f).__name__
        raise InvalidJobError(f"{where}: must be 1-D integer ids or None, got {what}")
    if f.size == 0:
        raise InvalidJobError(f"{where}: is empty (use None for all nodes)")
    _check_range(job, f"frontier V^{layer}", f, n)
    steps = np.diff(f.astype(np.int64, copy=False))
    if steps.size and steps.min() <= 0:
        i = int(np.argmax(steps <= 0))
        raise InvalidJobError(
            f"{where}: not strictly ascending at position {i + 1} ({int(f[i])}, {int(f[i + 1])})"
        )
    return np.array(f, dtype=np.int64)  # writable: the engine shares it with torch


def _check_range(job: Job, what: str, ids: np.ndarray, n: int) -> None:
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= n:
        bad = ids[(ids < 0) | (ids >= n)][:5].tolist()
        raise InvalidJobError(f"{_job(job)}: {what} has storage ids outside 0..{n - 1}: {bad}")


def _check_subset(job: Job, small_name: str, small, big_name: str, big) -> None:  # noqa: ANN001
    """Both sorted ascending; every element of ``small`` must be in ``big``."""
    if small.size == 0:
        return
    pos = np.minimum(np.searchsorted(big, small), big.size - 1)
    missing = small[big[pos] != small]
    if missing.size:
        raise InvalidJobError(
            f"{_job(job)}: {small_name} not contained in {big_name}: {missing[:5].tolist()} missing"
        )
