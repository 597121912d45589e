"""The worker: one device, the models loaded on it, and synchronous job execution.

vLLM's split: a :class:`Worker` base class owns the device-independent parts (model
registry, job execution, status), and one subclass per device kind implements
:meth:`Worker.init_device` and :meth:`Worker.memory_info`. Call order::

    worker = make_worker("cuda:0")             # constructs and calls init_device()
    worker.load_model(model_cfg, engine_cfg)   # per model: weights, graph, evaluator
    result = worker.execute(job)               # any thread; see below
    worker.status()                            # a WorkerStatus snapshot

Thread safety: :meth:`Worker.execute` may be called from several threads. Jobs for one
model run one at a time (a per-model lock, acquired with the job's deadline as timeout);
jobs for different models run concurrently.
"""

from __future__ import annotations

import abc
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from hopserve.proto.contract import (
    DeadlineExceededError,
    DeviceMemory,
    GraphVersionMismatchError,
    InvalidJobError,
    Job,
    JobError,
    JobResult,
    ModelNotFoundError,
    ModelStatus,
    WorkerStatus,
    time_left,
)
from hopserve.rpc import clip, quote
from hopserve.worker.engine.settings import DEFAULT_LAYER_CACHE_ROWS
from hopserve.worker.graph.live import GraphSeqError, open_live
from hopserve.worker.graph.live.mutations import decode as decode_delta
from hopserve.worker.loader import ModelLoadError, load_model
from hopserve.worker.runtime.degrees import degree_reads
from hopserve.worker.runtime.fx_guard import FX_GUARD
from hopserve.worker.runtime.job_checks import (
    check_deadline,
    check_graph_version,
    check_targets,
    plan_job,
)
from hopserve.worker.runtime.layer_reuse import ModelLayerCache

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.config import EngineConfig, ModelConfig
    from hopserve.worker.engine.factory import Evaluator
    from hopserve.worker.graph.live import LiveGraph
    from hopserve.worker.graph.store import GraphStore

__all__ = ["LoadedModel", "Worker"]

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model ready to serve: its evaluator, graph store and output width."""

    name: str
    version: str
    evaluator: Evaluator
    graph: GraphStore
    dim: int  # output embedding width
    description: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    live: LiveGraph | None = None  # the graph's updates (None: a fixed in-memory graph)
    layer_cache: ModelLayerCache | None = None  # hub rows of intermediate layers

    @property
    def num_layers(self) -> int:
        return int(self.evaluator.num_layers)

    @property
    def status_graph_version(self) -> str:
        """The graph's version as jobs name it (a living graph's lineage version)."""
        return self.live.lineage_version if self.live is not None else self.graph.version

    def status(self) -> ModelStatus:
        """What the front-end needs to serve this model (the same in process and remote)."""
        live = self.live
        reads_degrees, reads_source_degrees = degree_reads(self.evaluator)
        return ModelStatus(
            name=self.name,
            version=self.version,
            dim=self.dim,
            num_layers=self.num_layers,
            graph_version=live.lineage_version if live is not None else self.graph.version,
            graph_num_nodes=live.topology.num_nodes if live is not None else self.graph.num_nodes,
            mode=self.evaluator.mode,
            reads_input_frontier=bool(self.evaluator.reads_input_frontier),
            blocks=self.evaluator.blocks(),
            description=self.description,
            graph_seq=live.seq if live is not None else 0,
            degree_normalized=reads_degrees,
            reads_source_degrees=reads_source_degrees,
            reads_out_edges=bool(getattr(self.evaluator, "both_ways", False)),
            layer_cache_rows=self.layer_cache.capacity if self.layer_cache is not None else 0,
            output_types=tuple(getattr(self.evaluator.model, "output_types", ())),
            output_dims=tuple(getattr(self.evaluator.model, "output_dims", ())),
        )

    @contextmanager
    def graph_at(self, job: Job) -> Iterator[GraphStore]:
        """The graph store at the job's sequence, held (no update applies) while inside.

        Raises:
            GraphVersionMismatchError: the graph moved past the job's sequence.
        """
        if self.live is None:
            if job.delta:
                raise InvalidJobError(f"job {clip(job.job_id)}: this graph takes no delta")
            yield self.graph
            return
        seq = job.graph_seq if job.graph_version else None
        try:
            if job.updates and seq is not None and seq > self.live.seq:
                self.live.catch_up(seq)  # a shared folder has them already
                if seq > self.live.seq:  # a copy of the folder: append the shipped ones
                    try:
                        self.live.ingest(job.updates)
                    except (ValueError, struct.error) as err:
                        raise InvalidJobError(
                            f"job {clip(job.job_id)}: bad update record: {err}"
                        ) from None
            if job.delta:  # cold start: graph + the request's own nodes and edges
                try:
                    delta = decode_delta(job.delta, self.live.topology.feature_dim)
                except (ValueError, struct.error) as err:
                    raise InvalidJobError(f"job {clip(job.job_id)}: bad delta: {err}") from None
                with self.live.with_delta(job.graph_seq, delta) as store:
                    yield store
                return
            with self.live.reading(seq) as snapshot:
                yield self.live.store(snapshot)
        except GraphSeqError as err:
            raise GraphVersionMismatchError(f"job {clip(job.job_id)}: {err}") from None


class Worker(abc.ABC):
    """Runs :class:`~hopserve.proto.contract.Job` s on one device.

    Args:
        device: torch device string (``"cpu"``, ``"cuda:0"``).
        worker_id: stable identifier reported in results and status
            (default ``host:pid:device``).
        verify_frontiers: also check up front that sent frontiers cover every
            in-neighbour (costs as much as planning; the evaluator's checked row lookups
            catch an incomplete frontier anyway).
    """

    def __init__(
        self, device: str, *, worker_id: str | None = None, verify_frontiers: bool = False
    ) -> None:
        self.device = torch.device(device)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{device}"
        self.verify_frontiers = verify_frontiers
        self._models: dict[tuple[str, str], LoadedModel] = {}
        self._state = threading.Lock()  # guards _models and the counters
        self._jobs = {"queued": 0, "running": 0}  # guarded by self._state
        self._device_ready = False

    # ------------------------------------------------------------------ device
    @abc.abstractmethod
    def init_device(self) -> None:
        """Prepare the device (select it, reset counters, threads). Idempotent."""

    @abc.abstractmethod
    def memory_info(self) -> DeviceMemory:
        """Device memory in bytes (0 = unknown)."""

    def _after_job(self) -> None:  # noqa: B027 - optional hook
        """Called after each job (e.g. to sample the device's peak memory)."""

    def _device_context(self) -> AbstractContextManager[Any]:
        """Context that makes this worker's device current in the calling thread."""
        return nullcontext()

    def _ensure_device(self) -> None:
        if not self._device_ready:
            self.init_device()
            self._device_ready = True

    # ------------------------------------------------------------------ models
    def load_model(self, cfg: ModelConfig, engine: EngineConfig | None = None) -> LoadedModel:
        """Load a configured model onto this worker's device (replacing the same key).

        Args:
            cfg: The model's configuration (entrypoint, kwargs, weights, graph, name,
                version, fallback). ``cfg.device`` is advisory: the worker's device wins.
            engine: The evaluator's settings; ``None`` = defaults.

        Raises:
            ModelLoadError: the class, weights, graph or split cannot be used.
        """

        if torch.device(cfg.device).type != self.device.type:
            log.info(
                "model %s: configured for %s, loading on this worker's %s",
                cfg.name,
                cfg.device,
                self.device,
            )
        self._ensure_device()
        where = f"model {cfg.name!r} version {cfg.version!r}"
        try:
            live = open_live(cfg.graph, with_features=True)
            with live.reading():
                graph = live.store()
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"{where}: graph {str(cfg.graph)!r}: {err}") from err
        try:
            model = load_model(
                cfg.entrypoint,
                cfg.kwargs,
                cfg.weights,
                device="cpu",
                search_path=cfg.search_path,
                weights_key=cfg.weights_key,
            )
        except ModelLoadError as err:
            raise ModelLoadError(f"{where}: {err}") from None
        entry = self.add_model(
            cfg.name,
            cfg.version,
            model,
            graph,
            engine,
            fallback=cfg.fallback,
            hops=cfg.hops,
            description=cfg.entrypoint,
        )
        entry.live = live
        if getattr(entry.evaluator, "both_ways", False):  # fields read out-edges: the
            live.snapshot.ensure_out_edges()  # index now, so each request-scoped delta
        return entry  # splices it instead of building it under the graph's lock

    def add_model(
        self,
        name: str,
        version: str,
        model: nn.Module,
        graph: GraphStore,
        engine: EngineConfig | None = None,
        *,
        fallback: str = "error",
        hops: int | None = None,
        description: str = "",
    ) -> LoadedModel:
        """Serve an already built ``model`` on ``graph`` as ``(name, version)``.

        ``fallback="nodewise"`` serves a model the layer-wise engine refuses node by node
        (``hops`` is its receptive field when it cannot be inferred).

        Raises:
            ModelLoadError: the model cannot be split into layers (names the reason).
        """
        from hopserve.worker.engine.factory import make_evaluator
        from hopserve.worker.trace.tracer import ModelTraceError

        self._ensure_device()
        settings = engine.settings().kwargs() if engine is not None else {}
        try:
            with FX_GUARD.tracing():  # fx patches the process: no model runs meanwhile
                evaluator = make_evaluator(
                    model,
                    graph,
                    self.device,
                    fallback=fallback,
                    hops=hops,
                    progress=False,
                    **settings,
                )
        except (ModelTraceError, ValueError) as err:
            raise ModelLoadError(f"model {name!r} version {version!r}: {err}") from None
        text = f"{description} ({evaluator.mode})\n{evaluator.describe()}".strip()
        with FX_GUARD.running():
            dim = _output_dim(evaluator)
        entry = LoadedModel(name, str(version), evaluator, graph, dim, text)
        rows = DEFAULT_LAYER_CACHE_ROWS if engine is None else engine.layer_cache_rows
        if evaluator.mode == "layerwise" and rows > 0:
            entry.layer_cache = ModelLayerCache(evaluator, rows)
        with self._state:
            old = self._models.get((name, entry.version))
            self._models[(name, entry.version)] = entry
        if old is not None:
            old.evaluator.close()
        log.info(
            "loaded model %s version %s on %s: %d layers, dim %d, graph %s (%d nodes)",
            name,
            entry.version,
            self.device,
            entry.num_layers,
            entry.dim,
            graph.version[:12],
            graph.num_nodes,
        )
        return entry

    def unload_model(self, name: str, version: str, timeout: float | None = None) -> bool:
        """Stop serving ``(name, version)``: new jobs get ``ModelNotFoundError`` at once;
        a job already running finishes first (up to ``timeout`` s), then the evaluator is
        released. False when the model was not loaded (idempotent)."""
        with self._state:
            entry = self._models.pop((name, str(version)), None)
        if entry is None:
            return False
        acquired = entry.lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        try:
            entry.evaluator.close()
        finally:
            if acquired:
                entry.lock.release()
        log.info("unloaded model %s version %s from %s", name, version, self.device)
        return True

    @property
    def models(self) -> Mapping[tuple[str, str], LoadedModel]:
        """Loaded models by ``(name, version)`` (a snapshot)."""
        with self._state:
            return dict(self._models)

    def model(self, name: str, version: str) -> LoadedModel:
        """The loaded model ``(name, version)``.

        Raises:
            ModelNotFoundError: naming the model and listing what is loaded.
        """
        with self._state:
            entry = self._models.get((name, version))
            if entry is None:
                loaded = ", ".join(f"{n}:{v}" for n, v in sorted(self._models)) or "none"
                raise ModelNotFoundError(
                    f"model {quote(name)} version {quote(version)} is not loaded on worker "
                    f"{self.worker_id} (loaded: {loaded})"
                )
            return entry

    # ------------------------------------------------------------------ jobs
    def execute(self, job: Job) -> JobResult:
        """Run ``job`` synchronously; row ``i`` of the result is ``job.targets[i]``.

        Raises:
            ModelNotFoundError: unknown ``(job.model, job.model_version)``.
            GraphVersionMismatchError: the job was planned on another graph version.
            InvalidJobError: bad targets, frontiers, fanouts or seed.
            DeadlineExceededError: ``job.deadline`` passed before the job started.
            JobError: the evaluation itself failed (message names the job).
        """
        started = time.perf_counter()
        entry = self.model(job.model, job.model_version)
        check_graph_version(job, entry.status_graph_version)
        check_deadline(job)
        # The model's lock first, then the graph: a job waiting for its model holds no
        # graph lock, so an update waits only for the jobs that are running.
        with self._counted("queued"):
            left = time_left(job)
            timeout = -1 if left is None else min(max(left, 0.0), threading.TIMEOUT_MAX)
            acquired = entry.lock.acquire(timeout=timeout)
        if not acquired:
            raise DeadlineExceededError(
                f"job {clip(job.job_id)}: deadline passed while waiting for model "
                f"{quote(job.model)}"
            )
        try:
            if entry.layer_cache is not None:  # before the graph's read lock (see track)
                entry.layer_cache.track(entry.live)
            with entry.graph_at(job) as graph:
                return self._execute_on(job, entry, graph, started)
        finally:
            entry.lock.release()
            self._after_job()

    def _execute_on(
        self, job: Job, entry: LoadedModel, graph: GraphStore, started: float
    ) -> JobResult:
        """Evaluate ``job`` on ``graph`` (the caller holds the model's lock)."""
        targets = check_targets(job, graph.num_nodes)
        with self._counted("running"), self._device_context():
            check_deadline(job)
            if entry.graph is not graph:  # the graph moved on: evaluate on this one
                entry.graph = entry.evaluator.graph = graph
            t0 = time.perf_counter()
            # A job that carries frontiers runs on them as sent (checked); one without is
            # planned here, around the layer cache's rows when the model keeps one.
            cache = entry.layer_cache if job.frontiers is None else None
            planned = None if cache is None else cache.plan(job, graph, targets, entry.live)
            if planned is not None:  # frontiers stop at cached hub rows
                plan, reuse = planned
            else:
                plan = plan_job(job, entry.evaluator, targets, verify=self.verify_frontiers)
                reuse = None
            checked_s = time.perf_counter() - t0
            out = self._evaluate(job, entry, plan, targets, reuse)
            stats = entry.evaluator.last_stats
            # Exact jobs arrive planned: checking them is preparation, not planning.
            if job.frontiers is not None and job.fanouts is None and reuse is None:
                stats.prepare_s += checked_s
            else:
                stats.planning_s += checked_s
            stats.total_s = time.perf_counter() - started
        # [rows, dim] float32; a per-node scalar or tensor output is flattened per row
        rows = out.detach().reshape(len(targets), -1).numpy()
        embeddings = np.ascontiguousarray(rows, dtype=np.float32)
        log.debug("job %s: %d targets in %.3fs", clip(job.job_id), len(targets), stats.total_s)
        return JobResult(
            job.job_id,
            embeddings,
            stats,
            worker=self.worker_id,
            model_version=entry.version,
            graph_version=entry.status_graph_version,
            graph_seq=int(getattr(graph.topology, "seq", 0)),
        )

    def _evaluate(
        self, job: Job, entry: LoadedModel, plan, targets: np.ndarray, reuse=None
    ) -> torch.Tensor:  # noqa: ANN001 - Plan, LayerReuse
        from hopserve.worker.engine.batch import FrontierError

        try:
            with FX_GUARD.running():  # never while another model is traced (hot loads)
                if reuse is None:
                    return entry.evaluator.evaluate_plan(plan, torch.from_numpy(targets))
                return entry.evaluator.evaluate_plan(plan, torch.from_numpy(targets), reuse)
        except FrontierError as err:
            raise InvalidJobError(
                f"job {clip(job.job_id)}: inconsistent frontiers: {err}"
            ) from None
        except Exception as err:
            log.exception("job %s failed", clip(job.job_id))
            raise JobError(
                f"job {clip(job.job_id)}: evaluation of model {quote(job.model)} failed: "
                f"{type(err).__name__}: {err}"
            ) from err

    @contextmanager
    def _counted(self, state: str) -> Iterator[None]:
        """Count a job as ``"queued"`` (waiting for its model) or ``"running"`` while inside."""
        with self._state:
            self._jobs[state] += 1
        try:
            yield
        finally:
            with self._state:
                self._jobs[state] -= 1

    @property
    def inflight(self) -> int:
        """Jobs running or waiting for their model."""
        with self._state:
            return self._jobs["running"] + self._jobs["queued"]

    # ------------------------------------------------------------------ status
    def status(self) -> WorkerStatus:
        """Snapshot: device, loaded models, job counts and device memory."""
        memory = self.memory_info()
        with self._state:
            models = tuple(self._models[k].status() for k in sorted(self._models))
            running, queued = self._jobs["running"], self._jobs["queued"]
        return WorkerStatus(
            worker_id=self.worker_id,
            device=str(self.device),
            models=models,
            inflight_jobs=running,
            queued_jobs=queued,
            memory=memory,
        )

    def close(self) -> None:
        """Release the evaluators' threads; the worker cannot run jobs afterwards."""
        with self._state:
            models, self._models = list(self._models.values()), {}
        for entry in models:
            entry.evaluator.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.device)!r}, models={len(self._models)})"


def _output_dim(evaluator: Evaluator) -> int:
    """Output width, from one forward of the model on a small probe graph.

    The model is called in its own style (``model(x, edge_index)`` for PyG,
    ``model(dgl_graph, x)`` for DGL), on the probe graph the evaluator's self-check uses
    (with the self-loops a DGL conv that refuses zero in-degree needs; a dict model's
    types split evenly over it, as in the load-time checks).
    """
    from hopserve.worker.convs.base import fresh_conv_caches
    from hopserve.worker.engine.nodewise import model_style
    from hopserve.worker.hetero.layout import probe_relation_ids, probe_type_ranges
    from hopserve.worker.trace.probe import call_model, probe_edge_data, probe_edge_index

    split = getattr(evaluator, "split", None)
    style = split.style if split is not None else model_style(evaluator.model)
    ei, n = probe_edge_index(evaluator.model, style)
    x = torch.zeros(n, evaluator.graph.feature_dim, device=evaluator.device)
    # A model whose convs need edge data (GINEConv's edge_attr, …) gets probe columns.
    edge_args = split.edge_args if split is not None else getattr(evaluator, "edge_args", {})
    features = evaluator.graph.edge_features
    width = None if features is None else int(features.shape[1])
    relations = getattr(evaluator.graph, "relations", None)
    num_relations = split.num_relations if split is not None else None
    num_relations = num_relations or (len(relations) if relations else None)
    types = evaluator.graph.node_types
    num_node_types = split.num_node_types if split is not None else None
    num_node_types = num_node_types or (len(types) if types else None)
    edge = probe_edge_data(
        edge_args,
        ei,
        width,
        num_relations=num_relations,
        num_nodes=n,
        num_node_types=num_node_types,
        relation_ids=probe_relation_ids(evaluator.model, ei, n),
    )
    dev = evaluator.device
    with torch.no_grad(), fresh_conv_caches(evaluator.model), probe_type_ranges(evaluator.model, n):
        out = call_model(
            evaluator.model, style, x, ei.to(dev), {k: v.to(dev) for k, v in edge.items()}
        )
    return int(out[0].numel()) if out.dim() > 1 else 1
