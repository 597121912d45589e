"""One model's pipeline behind the RPC edge: batch, plan, dispatch, collect (vLLM's engine side).

::

    Batcher.submit(storage ids)         coalesces concurrent requests (batcher.py)
      └─ run_batch(union, key)          once per batch:
           plan   V^L … V^0 of the union (exact batches; numpy, off the event loop)
           job    a contract Job: targets, frontiers, fanouts + seed, deadline, graph version
           dispatch to the least-loaded worker (dispatch.py)
           collect the rows; stage timings and metrics from the job's RunStats

Planning the union once serves every request of the batch (DGI §3.3): frontiers are
monotone in the target set, so the union's frontiers contain each request's own.

A living graph is planned on its current snapshot and the job names that sequence; a
worker that has applied a later update refuses it (``GraphVersionMismatchError``) and the
batch is planned again on the newer snapshot (up to :data:`MAX_REPLANS` times). A worker
that is behind and cannot catch up from the folder (its own copy, on another machine)
refuses it too; the next attempt carries the update-log records, which it appends.
Sampling batches are not planned here: the job carries fanouts and seed, and the worker
samples (keyed per node and layer, so where the sample is drawn does not matter).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hopserve.config import ServerConfig
from hopserve.proto.contract import (
    DeadlineExceededError,
    GraphVersionMismatchError,
    Job,
    JobError,
)
from hopserve.server.batcher import Batcher, BatchKey, BatchRun
from hopserve.server.dispatch import Dispatcher
from hopserve.server.metrics import Metrics
from hopserve.server.models import ServedModel
from hopserve.server.timing import StageTimes
from hopserve.worker.graph.planner import Plan, plan_frontiers

__all__ = ["MAX_REPLANS", "ModelPipeline", "plan_batch", "topology_of"]

MAX_REPLANS = 4
"""Plans of one batch when workers keep moving to newer graph sequences."""


def topology_of(model: ServedModel):  # -> GraphTopology (a snapshot when the graph lives)
    """The model's graph as it is now: one immutable snapshot to plan a batch on."""
    live = getattr(model, "live", None)
    return live.topology if live is not None else model.topology


class ModelPipeline:
    """Batcher + planner + dispatch of one model.

    Args:
        model: The served model (ready: its width, layers and mode are known).
        dispatcher: Reaches the workers that have the model.
        config: Batching and queueing limits.
        metrics: Stage, layer, frontier and job metrics.
    """

    def __init__(
        self, model: ServedModel, dispatcher: Dispatcher, config: ServerConfig, metrics: Metrics
    ) -> None:
        self.model = model
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.batcher = Batcher(
            model.name,
            self.run_batch,
            max_batch_targets=config.max_batch_targets,
            max_wait_s=config.max_wait_ms / 1000.0,
            max_queue=config.max_queue,
            max_inflight=len(dispatcher.clients),
            max_batch_requests=config.max_batch_requests,
            stall_after_s=config.stall_timeout_s,
            metrics=metrics,
        )
        self._job_ids = itertools.count()
        clients = dispatcher.clients
        self._worker_hint = clients[0].name if len(clients) == 1 else "unknown"

    async def run_batch(self, targets: np.ndarray, key: BatchKey, deadline: float) -> BatchRun:
        """The batcher's runner: plan the union once, run one job, record its stats."""
        model, metrics = self.model, self.metrics
        loop = asyncio.get_running_loop()
        behind = False  # a worker refused the last plan: ship the log records with it
        for attempt in range(MAX_REPLANS):
            topology = topology_of(model)
            plan, planned_s = await asyncio.to_thread(
                plan_batch, model, targets, key, metrics, topology
            )
            seq = int(getattr(topology, "seq", 0))
            updates = await asyncio.to_thread(model.live.records, seq) if behind and seq else ()
            job = Job(
                job_id=f"{model.name}-{next(self._job_ids)}",
                model=model.name,
                model_version=model.version,
                targets=targets,
                frontiers=None if plan is None else plan.frontiers,
                fanouts=key.fanouts,
                seed=None if key.exact else key.seed,
                deadline=time.time() + max(0.0, deadline - loop.time()),
                graph_version=model.graph_version,
                graph_seq=seq,
                updates=updates,
            )
            start = time.perf_counter()
            try:
                result = await self.dispatcher.run(job)
                break
            except asyncio.CancelledError:
                metrics.worker_jobs.labels(self._worker_hint, "cancelled").inc()
                raise
            except GraphVersionMismatchError:
                metrics.worker_jobs.labels(self._worker_hint, "replanned").inc()
                if attempt + 1 == MAX_REPLANS or getattr(model, "live", None) is None:
                    raise
                await asyncio.to_thread(model.live.catch_up)  # planned on an old snapshot
                behind = True
            except JobError as exc:
                metrics.worker_jobs.labels(self._worker_hint, _job_outcome(exc)).inc()
                raise
        wall = time.perf_counter() - start
        metrics.worker_jobs.labels(result.worker or self._worker_hint, "ok").inc()
        if result.embeddings.shape != (len(targets), model.dim):
            raise JobError(
                f"job {job.job_id}: worker {result.worker} answered rows of shape "
                f"{result.embeddings.shape}, expected {(len(targets), model.dim)}"
            )
        stats = result.stats
        timing = StageTimes.of_batch(
            stats, planned_s=planned_s, wall_s=wall, num_layers=model.num_layers, exact=key.exact
        )
        for stage in ("prepare", "compute", "transfer"):
            metrics.observe_stage(model.name, stage, getattr(timing, stage))
        if not key.exact:
            metrics.observe_stage(model.name, "planning", timing.planning)
        first = 0 if len(stats.layers) == model.num_layers + 1 else 1  # block 0 reported?
        for block, seconds in enumerate(stats.layer_compute_s, start=first):
            metrics.layer_compute.labels(model.name, str(block)).observe(seconds)
        if plan is None and key.exact:  # the worker planned (around its layer cache)
            for layer, size in enumerate(stats.frontier_sizes):
                if size:
                    metrics.frontier_nodes.labels(model.name, str(layer)).observe(size)
        for layer in stats.layers:
            if 1 <= layer.layer < model.num_layers:
                label = str(layer.layer)
                metrics.layer_rows.labels(model.name, label, "computed").inc(layer.rows)
                metrics.layer_rows.labels(model.name, label, "reused").inc(layer.reused_rows)
        return BatchRun(rows=result.embeddings, timing=timing, graph_seq=result.graph_seq)

    async def run_delta(
        self, resolve_at: Callable[[Any], tuple[bytes, Any, np.ndarray]], deadline: float
    ) -> tuple[np.ndarray, int]:
        """Rows of a cold-start request: its own graph delta, never batched with others.

        ``resolve_at(snapshot)`` checks the request's delta against a snapshot and
        returns ``(encoded delta, snapshot + delta, storage ids of the targets)``; it is
        called again on a newer snapshot when a worker had moved on. Returns the rows
        (target order) and the graph sequence they were computed at.
        """
        model, loop = self.model, asyncio.get_running_loop()
        behind = False
        for attempt in range(MAX_REPLANS):
            topology = topology_of(model)
            delta, extended, storage = await asyncio.to_thread(resolve_at, topology)
            seq = int(topology.seq)
            updates = await asyncio.to_thread(model.live.records, seq) if behind and seq else ()
            targets = np.unique(storage)
            plan = await asyncio.to_thread(
                plan_frontiers, extended, targets, model.num_layers,
                input_layer=model.reads_input_frontier,
            )  # fmt: skip
            job = Job(
                job_id=f"{model.name}-delta-{next(self._job_ids)}",
                model=model.name,
                model_version=model.version,
                targets=targets,
                frontiers=plan.frontiers if model.plans_frontiers else None,
                deadline=time.time() + max(0.0, deadline - loop.time()),
                graph_version=model.graph_version,
                graph_seq=seq,
                delta=delta,
                updates=updates,
            )
            try:
                result = await self.dispatcher.run(job)
            except GraphVersionMismatchError:
                self.metrics.worker_jobs.labels(self._worker_hint, "replanned").inc()
                if attempt + 1 == MAX_REPLANS:
                    raise
                await asyncio.to_thread(model.live.catch_up)
                behind = True
                continue
            self.metrics.worker_jobs.labels(result.worker or self._worker_hint, "ok").inc()
            rows = result.embeddings[np.searchsorted(targets, storage)]
            return rows, result.graph_seq
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Fail what is still queued and cancel running batches."""
        await self.batcher.close()


def plan_batch(
    model: ServedModel,
    targets: np.ndarray,
    key: BatchKey,
    metrics: Metrics | None = None,
    topology=None,  # noqa: ANN001 - a GraphTopology; default: topology_of(model)
) -> tuple[Plan | None, float]:
    """The frontiers of a batch's union (exact layer-wise batches; else ``None``) and the
    seconds spent; records ``planning`` and ``hopserve_frontier_nodes`` per layer.

    Thread-safe (reads one immutable snapshot); call it off the event loop.
    """
    if not key.exact or not model.plans_frontiers:
        return None, 0.0
    topology = topology_of(model) if topology is None else topology
    start = time.perf_counter()
    plan = plan_frontiers(
        topology, targets, model.num_layers, input_layer=model.reads_input_frontier
    )
    seconds = time.perf_counter() - start
    if metrics is not None:
        metrics.observe_stage(model.name, "planning", seconds)
        for layer, size in enumerate(plan.sizes(topology.num_nodes)):
            if plan.layers[layer].planned:
                metrics.frontier_nodes.labels(model.name, str(layer)).observe(size)
    return plan, seconds


def _job_outcome(exc: JobError) -> str:
    """``hopserve_worker_jobs_total`` outcome of a failed job."""
    if isinstance(exc, DeadlineExceededError):
        return "timeout"
    return "oom" if "out of memory" in str(exc).lower() else "error"
