"""Model versions on a running front-end: load beside, self-check, switch, drain, unload.

::

    load(config)        validate the entry (INVALID_ARGUMENT), refuse a loaded version
                        (ALREADY_EXISTS), reuse the served topology of its graph
      loading           every worker that serves the name's device loads it (off the loop)
      self-check        the engine's own load-time check (split vs. forward on a probe
                        graph), then a few real nodes through the version's own pipeline:
                        rows of the reported width, all finite
      ready             served to requests that name it; default when asked (or when it
                        is its name's first version) -- one synchronous registry change
    set_default(...)    route unversioned requests (optionally a canary percentage)
    unload(name, v)     not the default while other versions remain (FAILED_PRECONDITION)
      draining          out of routing at once; requests already resolved to it finish
      removed           pipeline closed, unloaded from the workers, forgotten

A failed load or self-check is rolled back entirely (the version is unloaded from any
worker that took it and forgotten): the served versions are never touched, and no
half-loaded version stays behind. Changes of one name are serialised; the registry is
only changed on the event loop, so every request sees one routing or the next.

Workers: the in-process worker of the version's device (started when the device is new)
or every remote worker of the front-end (``WorkerService.LoadModel`` /
``UnloadModel``); the worker processes of ``server.local_workers`` also get the new
model list, so a restarted one loads what is served now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from hopserve.config import ConfigError, HopserveConfig, ModelConfig
from hopserve.config.loader import parse_model_entry
from hopserve.proto.contract import ModelStatus, WorkerUnavailableError
from hopserve.server.batcher import BatchKey
from hopserve.server.edge import EmbeddingService
from hopserve.server.errors import InvalidRequestError, ServiceError, quote
from hopserve.server.models import ModelRegistry, ServedModel
from hopserve.server.workers import WorkerSet

__all__ = [
    "LifecycleConflictError",
    "ModelExistsError",
    "ModelLifecycle",
    "ModelLoadFailedError",
]

logger = logging.getLogger(__name__)

SELF_CHECK_NODES = 8
"""Nodes computed through a new version's pipeline before it is served."""
SELF_CHECK_TIMEOUT_S = 120.0
"""Deadline of that computation."""


class ModelExistsError(ServiceError):
    """The version is loaded already (ALREADY_EXISTS)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class LifecycleConflictError(ServiceError):
    """The change conflicts with the served state, e.g. unloading the default
    (FAILED_PRECONDITION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ModelLoadFailedError(ServiceError):
    """The version could not be loaded from its config (INVALID_ARGUMENT), no worker could
    take it (UNAVAILABLE) or it failed its self-check (FAILED_PRECONDITION); nothing
    served was changed."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


Publish = Callable[[ServedModel], Awaitable[None]]
"""Mirror a version's state (or its removal) into health and metrics."""


class ModelLifecycle:
    """Loads, switches and unloads model versions of a running front-end.

    Args:
        config: The front-end's configuration (engine settings, deadlines, workers).
        models: The registry requests are resolved in.
        edge: The RPC edge (pipelines of versions; the self-check runs through one).
        workers: The front-end's workers.
        publish: Called after every state change of a version, and after its removal
            (health, metrics); the front-end's :class:`Service` sets it.
        base: Folder that relative paths of a loaded entry are resolved against (the
            config file's folder).
    """

    def __init__(
        self,
        config: HopserveConfig,
        models: ModelRegistry,
        edge: EmbeddingService,
        workers: WorkerSet,
        publish: Publish | None = None,
        base: Path | None = None,
    ) -> None:
        self.config = config
        self.models = models
        self.edge = edge
        self.workers = workers
        self.publish = publish
        self.base = base or next(
            (m.config_dir for m in config.models if m.config_dir is not None), Path.cwd()
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self._healing: set[tuple[str, str, str]] = set()  # (worker, name, version) loading
        self._tasks: set[asyncio.Task[None]] = set()
        self._graphs: dict[Path, Any] = {}  # resolved folder -> the graph its versions share
        for model in models:
            self._graphs.setdefault(Path(model.config.graph).resolve(), model.graph)
        self.drain_timeout_s = max(config.server.default_deadline_s, config.server.grace_period_s)

    # ------------------------------------------------------------------ load

    def parse(self, text: str) -> ModelConfig:
        """A ``LoadModel`` config entry, validated, its paths checked (INVALID_ARGUMENT)."""
        try:
            cfg = parse_model_entry(text, self.base, source="config")
            cfg.validate_paths("config")
        except ConfigError as err:
            raise InvalidRequestError(str(err)) from None
        return cfg

    async def load(self, cfg: ModelConfig, make_default: bool = False) -> ServedModel:
        """Load, self-check and serve a new version; make it the default if asked (or if
        it is the first version of its name; either ends a canary split of the name).

        A version that failed at start-up is replaced; any other loaded version is
        ALREADY_EXISTS. On failure the version is rolled back and nothing served changes.

        Raises:
            InvalidRequestError: the graph is not one the server serves.
            ModelExistsError: the version is loaded already (or loading).
            ModelLoadFailedError: the worker could not load it, or its self-check failed.
        """
        async with self._lock(cfg.name):
            old = self.models.find(cfg.name, cfg.version)
            if old is not None and old.state != "failed":
                raise ModelExistsError(
                    f"model {quote(cfg.name)} version {quote(cfg.version)} is already "
                    f"loaded (state {old.state}); unload it first, or load another version"
                )
            topology = self._topology(cfg)
            if old is not None:  # a failed start-up version: replaced by this one
                self.models.remove(old)
                await self._notify(old)
            model = ServedModel(cfg, topology)
            self.models.add(model)
            first = len(self.models.versions(cfg.name)) == 1
            await self._notify(model)
            logger.info("loading model %r version %r", cfg.name, cfg.version)
            started = time.perf_counter()
            try:
                await self._load_on_workers(model)
                await self._self_check(model)
            except BaseException as err:
                await self._roll_back(model)
                if isinstance(err, ServiceError | asyncio.CancelledError):
                    raise
                if isinstance(err, WorkerUnavailableError):
                    raise ModelLoadFailedError(
                        f"model {quote(cfg.name)} version {quote(cfg.version)}: no worker "
                        f"could load it: {_first_line(err)}",
                        code=grpc.StatusCode.UNAVAILABLE,
                    ) from None
                reason = _first_line(err)
                where = f"model {quote(cfg.name)} version {quote(cfg.version)}"
                if not reason.startswith(where):
                    reason = f"{where} cannot be loaded: {reason}"
                raise ModelLoadFailedError(reason) from None
            model.state = "ready"
            if make_default or first:
                self.models.set_default(cfg.name, cfg.version)
            for version in self.models.versions(cfg.name):
                await self._notify(version)
            logger.info(
                "model %r version %r ready in %.1fs: %d layers, dim %d%s",
                cfg.name, cfg.version, time.perf_counter() - started, model.num_layers,
                model.dim, " (default)" if self.models.is_default(model) else "",
            )  # fmt: skip
            return model

    def _topology(self, cfg: ModelConfig) -> Any:
        """The served graph of ``cfg.graph`` (shared with the versions on it; a graph
        stays served after its last model was unloaded)."""
        for model in self.models:
            self._graphs.setdefault(Path(model.config.graph).resolve(), model.graph)
        graph = self._graphs.get(Path(cfg.graph).resolve())
        if graph is not None:
            return graph
        served = sorted(str(path) for path in self._graphs)
        raise InvalidRequestError(
            f"config: graph {quote(str(cfg.graph), 200)} is not a graph this server serves "
            f"(served: {', '.join(repr(s) for s in served) or 'none'}); a new graph needs "
            "a restart with it in the config file"
        )

    async def _load_on_workers(self, model: ServedModel) -> None:
        """Load ``model`` on the workers that will serve it; adopt what they report."""
        cfg = model.config
        if not self.workers.remote:
            dispatcher, worker = await self.workers.local_worker(cfg.device)
            loaded = await asyncio.to_thread(worker.load_model, cfg, self.config.engine)
            status: ModelStatus = loaded.status()
        else:
            dispatcher = self.workers.dispatchers[0]
            statuses = await self._load_remote(dispatcher.clients, cfg)
            status = statuses[0]
            if self.workers.pool is not None:
                self.workers.pool.set_models(self._served_configs())
        model.dispatcher = dispatcher
        model.adopt(status, ready=False)
        if model.state == "failed":
            raise ModelLoadFailedError(
                f"model {quote(cfg.name)} version {quote(cfg.version)} cannot be served: "
                f"{model.error}"
            )

    async def _load_remote(self, clients: Iterable[Any], cfg: ModelConfig) -> list[ModelStatus]:
        """Load on every remote worker; on any failure unload from those that took it."""
        clients = list(clients)
        results = await asyncio.gather(
            *(c.load_model(cfg) for c in clients), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            loaded = [
                c for c, r in zip(clients, results, strict=True) if not isinstance(r, BaseException)
            ]
            await asyncio.gather(
                *(c.unload_model(cfg.name, cfg.version) for c in loaded), return_exceptions=True
            )
            raise failed[0]
        return list(results)  # type: ignore[arg-type]

    async def _self_check(self, model: ServedModel) -> None:
        """A few real nodes through the version's own pipeline: right width, finite."""
        n = min(SELF_CHECK_NODES, int(model.topology.num_nodes))
        if n == 0:
            return
        ids = np.linspace(0, model.topology.num_nodes - 1, n).astype(np.int64)
        ids = np.unique(ids)
        loop = asyncio.get_running_loop()
        pipeline = self.edge.pipeline(model)
        try:
            reply = await pipeline.batcher.submit(
                ids, BatchKey(), loop.time() + SELF_CHECK_TIMEOUT_S
            )
        except Exception as err:
            raise ModelLoadFailedError(
                f"model {quote(model.name)} version {quote(model.version)} failed its "
                f"self-check: computing {len(ids)} nodes raised {type(err).__name__}: "
                f"{_first_line(err)}",
                code=grpc.StatusCode.FAILED_PRECONDITION,
            ) from None
        rows = np.asarray(reply.rows)
        problem = ""
        if rows.shape != (len(ids), model.dim):
            problem = f"rows of shape {rows.shape}, expected {(len(ids), model.dim)}"
        elif not np.isfinite(rows).all():
            problem = (
                f"{int((~np.isfinite(rows)).any(axis=1).sum())} of {len(ids)} rows are not finite"
            )
        if problem:
            raise ModelLoadFailedError(
                f"model {quote(model.name)} version {quote(model.version)} failed its "
                f"self-check: {problem}",
                code=grpc.StatusCode.FAILED_PRECONDITION,
            )

    async def _roll_back(self, model: ServedModel) -> None:
        """Undo a failed load: pipeline, workers, registry (never raises)."""
        try:
            await self.edge.retire(model)
            await self._unload_from_workers(model)
        except Exception:
            logger.warning(
                "rolling back model %r version %r", model.name, model.version, exc_info=True
            )
        self.models.remove(model)
        await self._notify(model)

    # ------------------------------------------------------------------ switch

    async def set_default(
        self, name: str, version: str, canary: str = "", percent: int = 0
    ) -> ServedModel:
        """Route ``name``'s unversioned requests to ``version``, and ``percent`` percent of
        them to ``canary`` when given (atomically).

        Raises:
            ModelNotFoundError: unknown name or version.
            InvalidRequestError: a bad percentage, or a canary equal to the default.
            LifecycleConflictError: a version that is not ready.
        """
        if not 0 <= percent <= 100:
            raise InvalidRequestError(f"canary_percent must be 0..100, got {percent}")
        if percent and not canary:
            raise InvalidRequestError(
                f"canary_percent {percent} needs a canary_version to send the requests to"
            )
        if canary and not percent:
            raise InvalidRequestError(
                f"canary_version {quote(canary)} needs a canary_percent of 1..100"
            )
        if canary and canary == version:
            raise InvalidRequestError(
                f"canary_version {quote(canary)} is the default version itself"
            )
        async with self._lock(name):
            chosen = [self.models.get(name, v) for v in (version, canary) if v]
            if not version:
                raise InvalidRequestError("version is empty: name the version to make default")
            for model in chosen:
                if model.state != "ready":
                    raise LifecycleConflictError(
                        f"model {quote(name)} version {quote(model.version)} is "
                        f"{model.state}, not ready; only a ready version can take traffic"
                    )
            self.models.set_default(name, version, canary, percent)
            for model in self.models.versions(name):
                await self._notify(model)
            logger.info(
                "model %r: default version %r%s", name, version,
                f", canary {canary!r} at {percent}%" if canary else "",
            )  # fmt: skip
            return chosen[0]

    # ------------------------------------------------------------------ unload

    async def unload(self, name: str, version: str) -> tuple[ServedModel, int]:
        """Take a version out of routing, wait for its in-flight requests, unload it.

        Returns:
            The version and how many requests were in flight when the unload began.

        Raises:
            ModelNotFoundError: unknown name or version.
            LifecycleConflictError: the default while other versions remain, or a version
                still loading.
        """
        if not version:
            raise InvalidRequestError("version is empty: name the version to unload")
        async with self._lock(name):
            model = self.models.get(name, version)
            if model.state == "loading":
                raise LifecycleConflictError(
                    f"model {quote(name)} version {quote(version)} is still loading"
                )
            others = [m.version for m in self.models.versions(name) if m is not model]
            if self.models.is_default(model) and others:
                raise LifecycleConflictError(
                    f"model {quote(name)} version {quote(version)} is the default; make "
                    f"another version the default first (SetDefaultModel; loaded: "
                    f"{', '.join(repr(v) for v in others)})"
                )
            drained = model.inflight
            was_ready = model.ready
            self.models.drain(model)
            await self._notify(model)
            if was_ready and not await model.wait_idle(self.drain_timeout_s):
                logger.warning(
                    "model %r version %r: %d requests still in flight after %.0fs; "
                    "failing them", name, version, model.inflight, self.drain_timeout_s,
                )  # fmt: skip
            await self.edge.retire(model)
            await self._unload_from_workers(model)
            self.models.remove(model)
            await self._notify(model)
            for other in self.models.versions(name):
                await self._notify(other)
            logger.info(
                "model %r version %r unloaded (%d requests drained)", name, version, drained
            )
            return model, drained

    async def _unload_from_workers(self, model: ServedModel) -> None:
        cfg = model.config
        if not self.workers.remote:
            worker = self.workers.local.get(cfg.device)
            if worker is not None:
                await asyncio.to_thread(worker.unload_model, cfg.name, cfg.version, 60.0)
            return
        if self.workers.pool is not None:
            self.workers.pool.set_models(
                [
                    c
                    for c in self._served_configs()
                    if c.name != cfg.name or c.version != cfg.version
                ]
            )
        results = await asyncio.gather(
            *(c.unload_model(cfg.name, cfg.version) for c in self.workers.dispatchers[0].clients),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                logger.warning("unloading %s:%s from a worker: %s", cfg.name, cfg.version, result)

    # ------------------------------------------------------------------ remote workers

    def heal(self, client: Any, status: Any) -> None:
        """Load on a remote worker the ready versions its status lacks (it restarted with
        its own config file, which does not list the versions loaded since), in the
        background; a version unloaded meanwhile is unloaded from it again."""
        if not self.workers.remote:
            return
        have = {(m.name, m.version) for m in status.models}
        for model in self.models:
            key = (client.name, *model.key)
            if model.ready and model.key not in have and key not in self._healing:
                self._healing.add(key)
                task = asyncio.get_running_loop().create_task(self._heal(client, model, key))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _heal(self, client: Any, model: ServedModel, key: tuple[str, str, str]) -> None:
        try:
            logger.warning(
                "worker %s lacks model %r version %r (restarted?): loading it",
                client.name, model.name, model.version,
            )  # fmt: skip
            await client.load_model(model.config)
            if self.models.find(*model.key) is not model or not model.ready:
                await client.unload_model(model.name, model.version)  # unloaded meanwhile
        except Exception as err:
            logger.error(
                "loading model %r version %r on worker %s failed: %s",
                model.name, model.version, client.name, _first_line(err),
            )  # fmt: skip
        finally:
            self._healing.discard(key)

    async def close(self) -> None:
        """Cancel the background loads on remote workers (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ reload

    async def reconcile(self, wanted: list[ModelConfig]) -> list[str]:
        """Make the served versions those of ``wanted`` (a re-read config file): load new
        and changed versions, switch defaults, unload the versions no longer listed.

        Each step is one of :meth:`load`, :meth:`set_default` and :meth:`unload`; a step
        that fails is logged and reported, the others go on (what is served stays
        consistent after every step). A version whose entry changed (other weights,
        kwargs, ...) under the same version string is reloaded: the entry is unloaded
        and loaded again only when it is not the default; change the version to swap a
        default without a gap.

        Returns:
            One line per failed step.
        """
        problems: list[str] = []
        want = {(c.name, c.version): c for c in wanted}
        defaults = {c.name: c.version for c in wanted if c.default}
        for c in wanted:
            defaults.setdefault(c.name, c.version)

        async def step(what: str, coro: Awaitable[Any]) -> None:
            try:
                await coro
            except Exception as err:
                problems.append(f"{what}: {_first_line(err)}")
                logger.error("config reload: %s: %s", what, err)

        for key, cfg in want.items():
            current = self.models.find(*key)
            if current is not None and current.state != "failed" and _same(current.config, cfg):
                continue
            if current is not None and current.state != "failed":
                if self.models.is_default(current):
                    problems.append(
                        f"model {key[0]!r} version {key[1]!r}: changed in the file but it "
                        "is the default; give the new entry a new version"
                    )
                    continue
                await step(f"unload {key[0]}:{key[1]}", self.unload(*key))
            await step(f"load {key[0]}:{key[1]}", self.load(cfg))
        for name, version in defaults.items():
            model = self.models.find(name, version)
            if model is not None and model.ready and not self.models.is_default(model):
                await step(f"default {name}:{version}", self.set_default(name, version))
        for model in list(self.models):
            if model.key not in want:
                await step(f"unload {model.name}:{model.version}", self.unload(*model.key))
        return problems

    # ------------------------------------------------------------------ helpers

    def _served_configs(self) -> list[ModelConfig]:
        """The served versions' entries, each name's default marked (what a restarted
        worker process loads)."""
        return [
            m.config.model_copy(update={"default": self.models.is_default(m)})
            for m in self.models
            if m.state in ("ready", "loading")
        ]

    async def _notify(self, model: ServedModel) -> None:
        if self.publish is not None:
            await self.publish(model)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


def _same(a: ModelConfig, b: ModelConfig) -> bool:
    """Whether two entries load the same thing (``default`` aside)."""
    skip = {"default"}
    return a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
