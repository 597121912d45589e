"""Which workers serve which model: the remote ones of ``server.workers`` (over the
link's credentials, ``security.link``) behind one dispatcher; the front-end's own worker
processes (``server.local_workers``, :mod:`~hopserve.server.local_workers`) behind one
dispatcher; or one in-process worker per device, each behind its own dispatcher.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from hopserve.config import ConfigError, HopserveConfig, ModelConfig
from hopserve.security.factory import link_channel
from hopserve.server.dispatch import Dispatcher
from hopserve.server.local_workers import LocalWorkerPool
from hopserve.server.metrics import Metrics
from hopserve.server.worker_clients import InProcessWorkerClient, RemoteWorkerClient

__all__ = ["WorkerSet", "make_workers"]


@dataclass
class WorkerSet:
    """The workers of a front-end and which dispatcher serves which model."""

    dispatchers: list[Dispatcher]
    by_model: dict[str, Dispatcher]
    local: dict[str, Any] = field(default_factory=dict)  # device -> in-process Worker
    pool: LocalWorkerPool | None = None  # the worker processes this front-end started
    remote: bool = False  # models live on remote workers (server.workers / local_workers)
    by_device: dict[str, Dispatcher] = field(default_factory=dict)  # in-process only
    on_state: Any = None  # the dispatchers' worker up/down callback

    def dispatcher_for(self, model: ModelConfig) -> Dispatcher:
        """The dispatcher that reaches the workers of ``model`` (its device's, in process)."""
        return self.dispatchers[0] if self.remote else self.by_device[model.device]

    async def local_worker(self, device: str) -> tuple[Dispatcher, Any]:
        """The in-process worker of ``device`` and its dispatcher, started if new (a model
        version loaded on a running front-end).

        Raises:
            ConfigError: the engine is not installed, or the device cannot be used.
        """
        if device not in self.local:
            worker = await _start_local(device, f"device {device!r}")
            if device in self.local:  # another load started it meanwhile
                await asyncio.to_thread(worker.close)
            else:
                self.local[device] = worker
                dispatcher = Dispatcher(
                    [InProcessWorkerClient(worker)], on_worker_state=self.on_state
                )
                self.by_device[device] = dispatcher
                self.dispatchers.append(dispatcher)
                dispatcher.start()
        return self.by_device[device], self.local[device]


async def make_workers(config: HopserveConfig, metrics: Metrics) -> WorkerSet:
    """The workers of ``config``: remote ones (``server.workers``, over the link's
    credentials) behind one dispatcher, or one in-process worker per device.

    Raises:
        ConfigError: the engine is not installed for in-process workers, a device cannot
            be used, or a link file cannot be read.
    """

    def on_state(name: str, up: bool) -> None:
        metrics.worker_up.labels(name).set(1 if up else 0)

    if config.server.workers or config.server.local_workers:
        link = link_channel(config.security.link)
        pool = None
        addresses, names = list(config.server.workers), list(config.server.workers)
        if config.server.local_workers:
            pool = LocalWorkerPool(config, config.server.local_workers)  # started by Service
            addresses, names = pool.addresses, pool.names
        clients = [
            RemoteWorkerClient(
                address,
                name=name,
                credentials=link.credentials,
                metadata=link.metadata,
                channel_options=link.options,
            )  # fmt: skip
            for address, name in zip(addresses, names, strict=True)
        ]
        dispatcher = Dispatcher(clients, on_worker_state=on_state, probe_interval_s=0.25)
        return WorkerSet(
            [dispatcher],
            {m.name: dispatcher for m in config.models},
            pool=pool,
            remote=True,
            on_state=on_state,
        )
    local: dict[str, Any] = {}
    by_device: dict[str, Dispatcher] = {}
    for model_cfg in config.models:
        device = model_cfg.device
        if device not in local:
            local[device] = await _start_local(device, f"model {model_cfg.name!r}")
            client = InProcessWorkerClient(local[device])
            by_device[device] = Dispatcher([client], on_worker_state=on_state)
    return WorkerSet(
        list(by_device.values()),
        {m.name: by_device[m.device] for m in config.models},
        local,
        by_device=by_device,
        on_state=on_state,
    )


async def _start_local(device: str, what: str) -> Any:
    """An in-process worker on ``device`` (raises ``ConfigError`` naming ``what``)."""
    try:
        from hopserve.worker.runtime import make_worker

        return await asyncio.to_thread(make_worker, device)
    except ImportError as err:  # a front-end-only install (no torch)
        raise ConfigError(
            "server.workers is empty, so the models would run in this process, which "
            f"needs the engine ({err}): install hopserve[serve] (with torch), or list "
            "remote workers in server.workers"
        ) from None
    except (RuntimeError, ValueError) as err:
        raise ConfigError(f"{what}: cannot start a worker on device {device!r}: {err}") from None
