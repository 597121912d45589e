"""Turn a :class:`~hopserve.worker.job.Job` into an evaluator :class:`Plan`, checked.

Exact jobs carry the frontiers ``V^0 … V^L`` the front-end planned (``None`` entry = all
nodes); they are validated cheaply (1-D int, strictly ascending, in range, nested
``V^L ⊆ … ⊆ V^0``, targets ⊆ ``V^L``, and no in-neighbour of ``V^l`` above the largest
id of ``V^(l-1)``) so that a malformed job fails with :class:`InvalidJobError` rather
than crashing the evaluator. The last check costs O(|V^l|): in-neighbour lists are
ascending in the graph store (``indices[indptr[v]:indptr[v+1]]``), so a node's largest
in-neighbour is the last of its list; it is exactly what keeps the evaluator's row lookup
(a ``searchsorted`` into ``V^(l-1)``) in bounds. Full neighbour coverage
``N_in(V^l) ⊆ V^(l-1)`` costs as much as planning, so it is checked only on request
(``verify=True``); without it, frontiers that miss an in-neighbour below that largest id
are not detected (the front-end's planner never sends such frontiers). The worker.proto
form with ``L`` entries ``V^1 … V^L`` is accepted too: ``V^0`` is then derived from
``V^1`` exactly as the planner would.

Sampling jobs (``fanouts`` set) are always planned here from ``targets``, ``fanouts`` and
``seed``: the sampled per-layer edges cannot travel in a job, and sampling is keyed per
node, so the worker draws the same samples the front-end would. Every fanout must be -1
or >= 1 (worker.proto). Frontiers sent with a sampling job are ignored.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hopserve.rpc import clip
from hopserve.worker.engine.plan import LayerFrontier, Plan, plan_frontiers, segment_positions
from hopserve.worker.engine.stats import EvalStats
from hopserve.worker.job import Job, JobStats, time_left
from hopserve.worker.runtime.errors import DeadlineExceededError, InvalidJobError

__all__ = ["build_plan", "check_deadline", "check_targets", "to_job_stats"]


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    """int64 tensor over ``arr`` (copied when read-only, e.g. decoded from wire bytes)."""
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr)


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
    out = np.ascontiguousarray(t, dtype=np.int64)
    return out if out.flags.writeable else out.copy()  # torch.from_numpy needs writable


def check_deadline(job: Job) -> None:
    """Raise :class:`DeadlineExceededError` if ``job.deadline`` has passed."""
    left = time_left(job)
    if left is not None and left <= 0:
        raise DeadlineExceededError(
            f"{_job(job)}: deadline passed {-left:.3f}s before the job started"
        )


def build_plan(job: Job, evaluator, targets: np.ndarray, *, verify: bool = False) -> Plan:
    """The evaluator plan for ``job`` (``targets`` as returned by :func:`check_targets`).

    Raises:
        InvalidJobError: bad frontiers or fanouts (message names the layer and value).
    """
    graph = evaluator.graph
    if job.fanouts is not None:
        fanouts = _check_fanouts(job, evaluator.num_layers)
        try:
            return evaluator.plan(_as_tensor(targets), fanouts, int(job.seed))
        except (ValueError, TypeError) as err:
            raise InvalidJobError(f"{_job(job)}: {err}") from None
    if job.frontiers is None:
        return evaluator.plan(_as_tensor(targets), None)
    input_layer = bool(getattr(evaluator, "reads_input_frontier", True))
    layers = _frontier_layers(job, graph, evaluator.num_layers, targets, verify, input_layer)
    return Plan(layers, None)


def _job(job: Job) -> str:
    """``"job <id>"`` for messages (a long or unprintable id is quoted and cut)."""
    return f"job {clip(job.job_id)}"


def _check_fanouts(job: Job, num_layers: int) -> list[int]:
    """``job.fanouts`` as ints: one per layer, each -1 (all) or >= 1 (worker.proto)."""
    fanouts = [int(f) for f in job.fanouts or ()]
    if len(fanouts) != num_layers:
        raise InvalidJobError(
            f"{_job(job)}: {len(fanouts)} fanouts; the model has {num_layers} layers "
            "(one fanout per layer, -1 = all neighbours)"
        )
    for i, f in enumerate(fanouts):
        if f != -1 and f < 1:
            raise InvalidJobError(
                f"{_job(job)}: fanouts[{i}] (layer {i + 1}) is {f}: use -1 (all neighbours) "
                "or a count >= 1"
            )
    return fanouts


def _frontier_layers(
    job: Job, graph, num_layers: int, targets: np.ndarray, verify: bool, input_layer: bool
) -> list[LayerFrontier]:
    n = graph.num_nodes
    sent = list(job.frontiers)
    if len(sent) not in (num_layers, num_layers + 1):
        raise InvalidJobError(
            f"{_job(job)}: {len(sent)} frontiers for a {num_layers}-layer model "
            f"(expected {num_layers + 1}: V^0 … V^{num_layers})"
        )
    layers: list[torch.Tensor | None] = []
    for i, f in enumerate(sent):
        layer = i + (len(sent) == num_layers)
        layers.append(None if f is None else _as_tensor(_check_frontier(job, layer, f, n)))
    if len(sent) == num_layers:  # worker.proto form: V^1 … V^L, derive V^0 from V^1
        v1 = layers[0]
        v0 = None if v1 is None else plan_frontiers(graph, v1, 1).layers[0].nodes
        layers.insert(0, v0)
    for layer in range(num_layers, 0, -1):
        upper, lower = layers[layer], layers[layer - 1]
        if lower is None:
            continue
        if upper is None:
            raise InvalidJobError(
                f"{_job(job)}: frontier V^{layer} is all nodes but V^{layer - 1} is not"
            )
        _check_subset(job, f"V^{layer}", upper, f"V^{layer - 1}", lower)
        if verify:
            nbrs = graph.indices[segment_positions(graph.indptr, upper)[0]].long().unique()
            _check_subset(job, f"in-neighbours of V^{layer}", nbrs, f"V^{layer - 1}", lower)
        elif layer > 1 or input_layer:  # without a block 0, layer 1 reads no V^0 rows
            _check_largest_neighbour(job, graph, layer, upper, lower)
    if layers[-1] is not None:
        _check_subset(
            job, "targets", torch.from_numpy(np.unique(targets)), f"V^{num_layers}", layers[-1]
        )
    return [LayerFrontier(nodes) for nodes in layers]


def _check_largest_neighbour(
    job: Job, graph, layer: int, upper: torch.Tensor, lower: torch.Tensor
) -> None:
    """No in-neighbour of ``V^layer`` (``upper``) is above the largest id of
    ``V^(layer-1)`` (``lower``); O(|upper|), reading each node's last in-edge."""
    indptr = graph.indptr
    ends = indptr[upper + 1]
    has = ends > indptr[upper]
    if not bool(has.any()):
        return
    last = graph.indices[ends[has] - 1].long()  # ascending lists: the largest in-neighbour
    at = int(torch.argmax(last))
    top, bound = int(last[at]), int(lower[-1])
    if top > bound:
        node = int(upper[has][at])
        raise InvalidJobError(
            f"{_job(job)}: frontier V^{layer - 1} does not contain the in-neighbours of "
            f"V^{layer}: node {node} has in-neighbour {top}, above the largest id of "
            f"V^{layer - 1} ({bound})"
        )


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
    return f


def _check_range(job: Job, what: str, ids: np.ndarray, n: int) -> None:
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= n:
        bad = ids[(ids < 0) | (ids >= n)][:5].tolist()
        raise InvalidJobError(f"{_job(job)}: {what} has storage ids outside 0..{n - 1}: {bad}")


def _check_subset(job: Job, small_name: str, small, big_name: str, big) -> None:
    """Both sorted ascending; every element of ``small`` must be in ``big``."""
    if small.numel() == 0:
        return
    pos = torch.searchsorted(big, small).clamp_(max=big.numel() - 1)
    missing = small[big[pos] != small]
    if missing.numel():
        raise InvalidJobError(
            f"{_job(job)}: {small_name} not contained in {big_name}: {missing[:5].tolist()} missing"
        )


def to_job_stats(stats: EvalStats, *, planning_s: float, started: float) -> JobStats:
    """Job stats from the evaluator's ``EvalStats``; ``started`` is a ``perf_counter`` time."""
    return JobStats(
        prepare_s=stats.prepare_s,
        transfer_s=stats.transfer_s,
        compute_s=stats.compute_s,
        write_out_s=stats.write_out_s,
        planning_s=planning_s + stats.planning_s,
        total_s=time.perf_counter() - started,
        batches=stats.batches,
        frontier_sizes=[int(s) for s in stats.frontier_sizes],
        layer_compute_s=[layer.compute_s for layer in stats.layers],
        peak_bytes=max((layer.peak_bytes for layer in stats.layers), default=0),
        oom_retries=stats.oom_retries,
    )
