"""Build and run a whole front-end: metrics, cache, workers, dispatch, gRPC services.

``service = await build_server(config)`` assembles everything from a
:class:`~hopserve.config.HopserveConfig`; ``await service.start()`` binds the
gRPC server (``EmbeddingService``, ``grpc.health.v1`` and server reflection) and the
Prometheus endpoint, then loads the models in the background; ``await service.stop()``
shuts down gracefully. Readiness (health) is NOT_SERVING until the models are loaded:

* ``""``: SERVING once every version that takes unversioned traffic (each name's
  default and canary) is ready;
* ``"hopserve.v1.EmbeddingService"``: SERVING while the server accepts requests;
* ``"<model name>"``: SERVING once that name's default (and canary) version is ready;
* ``"<model name>:<version>"``: SERVING while that version is ready.

Model versions are loaded, switched and unloaded at run time by
:class:`~hopserve.server.model_lifecycle.ModelLifecycle`, through ``AdminService``
(:mod:`hopserve.server.admin`, scope ``admin``) or :meth:`Service.reload_models` (SIGHUP).

Workers: with ``server.workers`` empty, one in-process worker per device
(``make_worker(model.device)``) loads the models in a thread; otherwise every address
is a remote worker (``RemoteWorkerClient``) that loads the models itself, and a model
becomes ready once a worker reports it (polled through ``WorkerStatus``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hopserve.config import ConfigError, HopserveConfig
from hopserve.logs import rate_limited
from hopserve.proto.contract import JobError, ModelStatus, WorkerUnavailableError
from hopserve.proto.v1 import embedding_pb2
from hopserve.rpc import add_service, bind_port
from hopserve.security.factory import (
    exposure_warnings,
    posture,
    public_credentials,
    public_gate,
)
from hopserve.security.gate import Gate
from hopserve.server.admin import ADMIN_SERVICE, AdminService
from hopserve.server.cache import EmbeddingCache, make_cache
from hopserve.server.edge import EmbeddingService
from hopserve.server.graphs import GraphAdmin
from hopserve.server.metrics import Metrics
from hopserve.server.metrics_http import start_metrics_server
from hopserve.server.model_lifecycle import ModelLifecycle
from hopserve.server.models import ModelRegistry, ServedModel
from hopserve.server.workers import WorkerSet, make_workers
from hopserve.worker.graph.live import open_live

__all__ = ["SERVICE_NAME", "Service", "build_server"]

logger = rate_limited(__name__)

SERVICE_NAME = embedding_pb2.DESCRIPTOR.services_by_name["EmbeddingService"].full_name
"""``"hopserve.v1.EmbeddingService"``: the health service name of the front-end."""

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DRAIN_LINGER_S = 0.5
"""On shutdown, how long the gRPC server keeps taking calls after new work is refused."""
DRAIN_FLUSH_S = 1.0
"""On shutdown, once the service has answered everything it took: gRPC's grace to flush
the answers (and finish health or reflection calls) before it cancels what is left."""
_POLL_LOADING_S = 0.5  # worker status poll while a remote model is not ready yet
_POLL_READY_S = 5.0  # worker status poll afterwards (memory gauges)


class Service:
    """A built front-end; see :func:`build_server`.

    Attributes:
        port: The bound gRPC port.
        metrics_port: The bound ``/metrics`` port, ``None`` when disabled (set by
            :meth:`start`).
        edge: The ``EmbeddingService`` servicer (the RPC edge).
        models: The served models.
        metrics: The process's metrics (own registry).
        cache: The embedding cache.
        admin: The ``AdminService`` servicer (set ``admin.graphs`` to serve graph RPCs).
        lifecycle: Loads, switches and unloads model versions.
    """

    def __init__(
        self,
        config: HopserveConfig,
        *,
        server: grpc.aio.Server,
        port: int,
        edge: EmbeddingService,
        models: ModelRegistry,
        metrics: Metrics,
        cache: EmbeddingCache,
        workers: WorkerSet,
        health_servicer: health.aio.HealthServicer,
        gate: Gate,
        admin: AdminService,
    ) -> None:
        self.config = config
        self.port = port
        self.metrics_port: int | None = None
        self.edge = edge
        self.models = models
        self.metrics = metrics
        self.cache = cache
        self._server = server
        self._workers = workers
        self._health = health_servicer
        self._gate = gate
        self._serving = False  # health of "": every model ready, none stalled, not stopping
        self._metrics_http: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._settled = asyncio.Event()
        self._stalled: set[str] = set()  # model names (see _watch_stalls)
        self._started = self._stopped = False
        self._startup = list(models)  # the configured versions (loaded by start())
        self.admin = admin
        self.lifecycle = admin.lifecycle
        self.lifecycle.publish = self._publish

    async def start(self) -> None:
        """Serve gRPC and ``/metrics`` now; load (or wait for) the models in the background.

        Raises:
            ConfigError: the metrics port cannot be bound.
        """
        if self._started:
            return
        self._started = True
        server_cfg = self.config.server
        if server_cfg.metrics_port:
            addr = server_cfg.host.strip("[]") or "0.0.0.0"
            try:
                self._metrics_http, self.metrics_port = start_metrics_server(
                    server_cfg.metrics_port, self.metrics.registry, addr=addr,
                    healthy=lambda: self._serving,
                )  # fmt: skip
            except OSError as err:
                raise ConfigError(
                    f"server.metrics_port: cannot listen on {addr}:{server_cfg.metrics_port} "
                    f"({err})"
                ) from None
        for model in self.models:
            await self._publish(model)
        await self._health.set(SERVICE_NAME, _SERVING)
        await self._server.start()
        if self._workers.pool is not None:
            self._workers.pool.start()
        loop = asyncio.get_running_loop()
        if self._workers.local:
            self._tasks.append(loop.create_task(self._load_local(), name="hopserve-load"))
        self._tasks.append(loop.create_task(self._poll_workers(), name="hopserve-status"))
        self._tasks.append(loop.create_task(self._watch_stalls(), name="hopserve-stalls"))
        for dispatcher in self._workers.dispatchers:
            dispatcher.start()
        logger.info(
            "gRPC on %s:%d, metrics on %s", server_cfg.host, self.port,
            f"{server_cfg.host}:{self.metrics_port}/metrics" if self.metrics_port else "(off)",
        )  # fmt: skip
        logger.info("security: %s", posture(self.config.security, server_cfg.host))
        for warning in exposure_warnings(self.config.security, server_cfg.host):
            logger.warning("%s", warning)

    def reload_credentials(self) -> None:
        """Re-read the token file now (SIGHUP). Certificates need no call: they are
        re-read on change before each new TLS handshake."""
        if self._gate.tokens is not None:
            self._gate.tokens.reload()

    async def reload_models(self, config: HopserveConfig) -> list[str]:
        """Serve the ``models:`` of ``config`` (a re-read config file, SIGHUP): load new and
        changed versions beside the served ones, switch defaults, unload removed versions
        (:meth:`ModelLifecycle.reconcile`). Returns one line per step that failed."""
        return await self.lifecycle.reconcile(list(config.models))

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until no model is loading any more; True if every model is ready."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), timeout)
        return all(m.ready for m in self.models)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: refuse new requests, let running ones finish for ``grace``
        seconds (default ``server.grace_period_s``), then release everything.

        Order matters for what clients see: first new embedding requests are answered
        UNAVAILABLE (retryable) by the service itself and health turns NOT_SERVING, while
        the gRPC server keeps taking calls for at least :data:`DRAIN_LINGER_S`, so calls it
        has received but not yet handed to the service (a busy event loop) get that answer
        too; once the requests already in flight have their answers (or ``grace`` passed)
        the gRPC server stops. Stopping it first made gRPC cancel every call it held but
        had not handed over (``CANCELLED`` to the client, for requests sent before the
        signal).
        """
        if self._stopped:
            return
        self._stopped = True
        self._serving = False
        grace = self.config.server.grace_period_s if grace is None else grace
        logger.info("shutting down (grace %.1fs)", grace)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        self.edge.stop_accepting()
        self.admin.stop_accepting()
        await self._health.enter_graceful_shutdown()
        await asyncio.sleep(min(DRAIN_LINGER_S, grace))
        idle = await self.edge.wait_idle(max(0.0, deadline - loop.time()))
        if not idle:
            logger.warning("requests still in flight after the %.1fs grace period", grace)
        # Every request the service took has its answer: gRPC needs only to flush them.
        # Given the whole remaining grace, gRPC's stop sometimes waited all of it for a
        # call it held without ever handing it over (a 10 s exit, test_shutdown.py).
        flush = min(DRAIN_FLUSH_S, grace) if idle else 0.0
        await self._server.stop(min(flush, max(0.0, deadline - loop.time())))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.lifecycle.close()
        await self.edge.close(timeout=max(grace, 1.0))
        for dispatcher in self._workers.dispatchers:
            await dispatcher.close()
        for worker in self._workers.local.values():
            await asyncio.to_thread(worker.close)
        if self._workers.pool is not None:
            await self._workers.pool.stop(grace)
        await self.cache.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        for model in self.models:
            self.metrics.model_ready.labels(model.name, model.version).set(0)
        logger.info("stopped")

    async def wait_for_termination(self) -> None:
        """Return when the gRPC server has stopped."""
        await self._server.wait_for_termination()

    # ------------------------------------------------------------------ models

    async def _publish(self, model: ServedModel) -> None:
        """Mirror a version's state (or its removal) into health, ``hopserve_model_ready``
        and ``_stalled``.

        A version is SERVING when it is ready; its name when the versions taking its
        unversioned traffic are ready and it is not stalled; the process (``""``) when
        every name is.
        """
        name, version = model.key
        known = self.models.find(name, version) is model
        await self._health.set(
            f"{name}:{version}", _SERVING if known and model.ready else _NOT_SERVING
        )
        if known:
            self.metrics.model_ready.labels(name, version).set(1 if model.ready else 0)
        else:  # unloaded (or a rolled-back load): no series for it any more
            with contextlib.suppress(KeyError):
                self.metrics.model_ready.remove(name, version)
        stalled = name in self._stalled
        routed = self.models.routed()
        serving = (
            name in self.models
            and all(m.ready for m in routed if m.name == name)
            and not stalled
        )  # fmt: skip
        await self._health.set(name, _SERVING if serving else _NOT_SERVING)
        self.metrics.model_stalled.labels(name).set(1 if stalled else 0)
        every = all(m.ready and m.name not in self._stalled for m in routed)
        self._serving = every and not self._stopped
        await self._health.set("", _SERVING if every else _NOT_SERVING)
        if all(m.state != "loading" for m in self._startup):
            self._settled.set()

    async def _watch_stalls(self) -> None:
        """Turn a model's health NOT_SERVING while its batches stop finishing with work
        waiting, and back once one finishes (checked every quarter of the stall timeout)."""
        period = min(1.0, self.config.server.stall_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            for model in self.models:
                stalled = self.edge.stalled(model.name)
                if stalled == (model.name in self._stalled):
                    continue
                if stalled:
                    self._stalled.add(model.name)
                    logger.error(
                        "model %r is stalled: requests wait and no batch has finished for "
                        "%.1fs; health NOT_SERVING until one does",
                        model.name, self.config.server.stall_timeout_s,
                    )  # fmt: skip
                else:
                    self._stalled.discard(model.name)
                    logger.info("model %r is no longer stalled", model.name)
                await self._publish(model)

    async def _load_local(self) -> None:
        """Load every model on its device's in-process worker, one at a time."""
        for model in self.models:
            worker = self._workers.local[model.config.device]
            try:
                loaded = await asyncio.to_thread(
                    worker.load_model, model.config, self.config.engine
                )
                model.adopt(loaded.status())
            except Exception as err:
                logger.error("model %r failed to load: %s", model.name, err, exc_info=True)
                model.mark_failed(_first_line(err))
            else:
                if model.ready:
                    logger.info(
                        "model %r version %r ready: %d layers, dim %d, graph %s",
                        model.name, model.version, model.num_layers, model.dim,
                        model.graph_version[:12],
                    )  # fmt: skip
                else:
                    logger.error("model %r cannot be served: %s", model.name, model.error)
            await self._publish(model)

    async def _poll_workers(self) -> None:
        """Poll worker status: device memory gauges; remote models become ready."""
        while True:
            reported: dict[tuple[str, str], ModelStatus] = {}
            for dispatcher in self._workers.dispatchers:
                for client in dispatcher.clients:
                    try:
                        status = await client.status()
                    except (WorkerUnavailableError, OSError) as err:
                        logger.debug("status of worker %s: %s", client.name, err)
                        continue
                    except JobError as err:  # e.g. refused: the link's credentials differ
                        logger.error("status of worker %s refused: %s", client.name, err)
                        continue
                    except Exception:
                        logger.warning("status of worker %s failed", client.name, exc_info=True)
                        continue
                    memory = status.memory
                    self.metrics.set_worker_memory(
                        client.name, status.device, memory.used, memory.total, memory.peak
                    )
                    for entry in status.models:
                        reported[(entry.name, entry.version)] = entry
                    self.lifecycle.heal(client, status)  # a restarted remote worker
            pool = self._workers.pool
            startup = [m for m in self._startup if self.models.find(*m.key) is m]
            if pool is not None and pool.failure is not None:
                for model in startup:
                    if model.state == "loading":
                        model.mark_failed(f"worker process: {pool.failure}")
                        await self._publish(model)
            if not self._workers.local:
                for model in startup:  # versions loaded later are adopted by the lifecycle
                    entry = reported.get((model.name, model.version))
                    if entry is not None and model.state == "loading":
                        model.adopt(entry)
                        if model.ready:
                            logger.info("model %r is ready on a remote worker", model.name)
                        else:
                            logger.error("model %r cannot be served: %s", model.name, model.error)
                        await self._publish(model)
            pending = any(m.state == "loading" for m in startup)
            await asyncio.sleep(_POLL_LOADING_S if pending else _POLL_READY_S)


async def build_server(config: HopserveConfig) -> Service:
    """Assemble a front-end from ``config`` (nothing is served before ``start()``).

    Opens the topology of every model's graph store (ID mapping and planning: no features,
    no torch), creates the metrics, the cache (``make_cache``), the workers and their
    dispatchers, and binds the gRPC server with ``EmbeddingService``, health and
    reflection.

    Raises:
        ConfigError: a graph store cannot be opened, the gRPC port cannot be bound, or a
            certificate, key or token file cannot be used.
    """

    metrics = Metrics()
    gate = public_gate(config.security, on_reject=lambda r: metrics.refused.labels(r).inc())
    credentials = public_credentials(config.security)
    served: list[ServedModel] = []
    for index, model_cfg in enumerate(config.models):
        try:
            topology = await asyncio.to_thread(open_live, model_cfg.graph)
        except (OSError, ValueError) as err:
            raise ConfigError(f"models[{index}].graph: {err}") from None
        served.append(ServedModel(model_cfg, topology))
    models = ModelRegistry(served)
    workers = await make_workers(config, metrics)
    for model in served:
        model.dispatcher = workers.dispatcher_for(model.config)
    cache = await make_cache(config.cache, observer=metrics.cache_observer())
    edge = EmbeddingService(
        config.server, models, cache, {n: d for n, d in workers.by_model.items()}, metrics
    )
    max_message = max(4 << 20, config.server.max_request_nodes * 11 + (1 << 16))
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared port
        ]
    )
    add_service(server, edge, embedding_pb2.DESCRIPTOR.services_by_name["EmbeddingService"],
                on_undecodable=edge.reject_undecodable, gate=gate)  # fmt: skip
    lifecycle = ModelLifecycle(config, models, edge, workers)
    edge.invalidation = config.cache.invalidation
    edge.refresh_hot_rows = config.cache.refresh_hot_rows
    admin = AdminService(lifecycle, metrics, GraphAdmin(models, metrics, edge=edge))
    add_service(server, admin, ADMIN_SERVICE, gate=gate)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, ADMIN_SERVICE.full_name,
         health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )  # fmt: skip
    port, address = bind_port(server, config.server.host, config.server.port, credentials)
    if not port:
        await cache.close()
        if workers.pool is not None:
            await workers.pool.stop(0)  # never started: removes its directory
        raise ConfigError(f"server.port: cannot listen on {address} (in use?)")
    return Service(
        config,
        server=server,
        port=port,
        edge=edge,
        models=models,
        metrics=metrics,
        cache=cache,
        workers=workers,
        health_servicer=health_servicer,
        gate=gate,
        admin=admin,
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
