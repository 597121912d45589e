"""Worker processes the front-end starts and supervises on its own host.

``server.local_workers: N`` (``hopserve serve --workers N``) runs N ``hopserve worker``
children, each its own interpreter, so compute leaves the front-end's GIL. They are
ordinary remote workers to the dispatcher (``RemoteWorkerClient``), reached over Unix
domain sockets in a private directory (mode 0700: only this user can connect; with
``security.link`` set the children also demand its token and mutual TLS). Every child
memory-maps the same graph store, so the page cache holds one copy.

Supervision: a child that exits while the pool runs is restarted after a backoff
(0.5 s doubling to 10 s, reset once a child has run for a minute); the dispatcher sends
its jobs to the others meanwhile. A child that exits with code 2 (bad configuration, or
a model it cannot load) is not restarted: :attr:`LocalWorkerPool.failure` holds its
error lines, and the front-end marks the models failed. Children import what the
front-end can: its ``sys.path`` is their ``PYTHONPATH``. :meth:`LocalWorkerPool.stop` sends SIGTERM (the
worker drains in-flight jobs), then SIGKILL after the grace period. Each child's log
lines are relayed through this process's log, prefixed with its name.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from hopserve.config import ConfigError, HopserveConfig, ModelConfig
from hopserve.worker.runtime.allocator import with_tcmalloc

__all__ = ["LocalWorkerPool"]

log = logging.getLogger(__name__)

BACKOFF_S = (0.5, 10.0)  # first and largest restart delay
STABLE_S = 60.0  # a child that ran this long resets the backoff


class LocalWorkerPool:
    """N supervised ``hopserve worker`` processes on Unix sockets.

    Args:
        config: The front-end's config; the children load its models and engine and
            security sections (the cache section, with its credentials, is left out).
        count: Number of processes.
        threads: CPU torch threads per child (default: the host's cores divided among
            them, at least 1).
    """

    def __init__(self, config: HopserveConfig, count: int, threads: int | None = None) -> None:
        devices = sorted({m.device for m in config.models})
        if len(devices) != 1:
            raise ConfigError(
                f"server.local_workers: every model must use one device, got {devices} "
                "(each worker process serves all models on one device)"
            )
        self.device = devices[0]
        self.count = count
        self.threads = threads or max(1, (os.cpu_count() or 1) // count)
        self.names = [f"worker-{i}" for i in range(count)]
        self._dir = Path(tempfile.mkdtemp(prefix="hopserve-workers-"))
        os.chmod(self._dir, 0o700)
        self._config_path = self._dir / "config.json"
        self._write_config(config)
        self.addresses = [f"unix:{self._dir / f'{name}.sock'}" for name in self.names]
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.restarts = dict.fromkeys(self.names, 0)
        self.failure: str | None = None  # a child's error lines after it exited with code 2

    def _write_config(self, config: HopserveConfig) -> None:
        data = config.model_dump(mode="json", exclude={"cache"})
        data["server"]["local_workers"] = 0
        fd = os.open(self._config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)

    def set_models(self, models: list[ModelConfig]) -> None:
        """The models a child loads when it (re)starts from now on: the versions served
        after a hot load or unload (the running children are told by the front-end)."""
        data = json.loads(self._config_path.read_text())
        data["models"] = [m.model_dump(mode="json") for m in models]
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix="config-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self._config_path)  # a child starting now reads one or the other

    def start(self) -> None:
        """Start every child and its supervisor (on the running event loop)."""
        loop = asyncio.get_running_loop()
        for name, address in zip(self.names, self.addresses, strict=True):
            self._tasks.append(loop.create_task(self._supervise(name, address), name=name))

    def pid(self, name: str) -> int | None:
        """The running child's process id (``None`` between restarts)."""
        proc = self._procs.get(name)
        return proc.pid if proc is not None and proc.returncode is None else None

    async def _spawn(self, name: str, socket_path: str) -> asyncio.subprocess.Process:
        with contextlib.suppress(FileNotFoundError):  # a crashed child's socket
            os.unlink(socket_path)
        argv = [
            sys.executable, "-m", "hopserve", "worker", "--config", str(self._config_path),
            "--device", self.device, "--unix-socket", socket_path,
        ]  # fmt: skip
        if self.device == "cpu":
            argv += ["--threads", str(self.threads)]
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        # tcmalloc where installed: glibc keeps a worker's freed batch memory fragmented.
        env = with_tcmalloc(os.environ | {"PYTHONPATH": os.pathsep.join(paths)})
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C reaches the front-end, which stops them
        )
        log.info("%s started (pid %d) on %s", name, proc.pid, socket_path)
        return proc

    async def _supervise(self, name: str, address: str) -> None:
        socket_path = address.removeprefix("unix:")
        delay = BACKOFF_S[0]
        while not self._stopping:
            began = time.monotonic()
            proc = self._procs[name] = await self._spawn(name, socket_path)
            tail: collections.deque[str] = collections.deque(maxlen=8)
            relay = asyncio.ensure_future(_relay(name, proc.stderr, tail))
            code = await proc.wait()
            await relay
            if self._stopping:
                return
            if code == 2:  # the worker's own verdict: configuration or models unusable
                errors = [line for line in tail if line.startswith("error:")] or list(tail)
                self.failure = "; ".join(errors) or f"{name} exited with code 2"
                log.error("%s cannot serve (not restarted): %s", name, self.failure)
                return
            if time.monotonic() - began > STABLE_S:  # it had been running fine: start over
                delay = BACKOFF_S[0]
            log.error("%s exited with code %s; restarting in %.1f s", name, code, delay)
            self.restarts[name] += 1
            await asyncio.sleep(delay)
            delay = min(BACKOFF_S[1], delay * 2)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM every child, SIGKILL what is left after ``grace_s`` + 5 s; remove the
        socket directory."""
        self._stopping = True
        procs = [p for p in self._procs.values() if p.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(p.wait()) for p in procs]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=grace_s + 5)
            for proc in procs:
                if proc.returncode is None:
                    log.warning("worker pid %d did not stop in time; killing it", proc.pid)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.gather(*(p.wait() for p in procs))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)


async def _relay(
    name: str, stream: asyncio.StreamReader | None, tail: collections.deque[str]
) -> None:
    """Log a child's stderr lines under its name until it closes; keep the last few."""
    if stream is None:
        return
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip()
        tail.append(text)
        log.info("%s: %s", name, text)
