"""Throw-away local processes: free ports and a restartable ``redis-server``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "free_port", "wait_for_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (it may be taken later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int, timeout_s: float, proc: subprocess.Popen | None = None, host: str = "127.0.0.1"
) -> None:
    """Wait until ``host:port`` accepts a TCP connection.

    Raises:
        RuntimeError: ``proc`` exited first, or nothing listened within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {host}:{port} after {timeout_s:g}s")
        time.sleep(0.02)


class RedisServer:
    """A ``redis-server`` subprocess on loopback, on a fixed port, without persistence.

    Args:
        workdir: Its working directory (created).
        port: TCP port; default a free one.
        password: ``requirepass``; ``None`` for none.
        maxmemory: e.g. ``"64mb"``; with it the eviction policy is ``allkeys-lru``, as
            hopserve recommends (``server/cache/README.md``).
        extra_args: More ``redis-server`` arguments (e.g. ``("--cluster-enabled", "yes")``).

    :meth:`stop` is SIGKILL (an abrupt outage); :meth:`start` again reuses the port.
    """

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        password: str | None = None,
        maxmemory: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.workdir = Path(workdir)
        self.port = port if port is not None else free_port()
        self.password = password
        self.maxmemory = maxmemory
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:<port>/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self):  # noqa: ANN201 - redis.Redis; redis is imported lazily
        """A synchronous ``redis.Redis`` for assertions (TTL, INFO, raw SET)."""
        import redis

        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=2
        )

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start on ``self.port`` and wait until it answers PING; returns ``self``."""
        import redis

        assert self.proc is None, "already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.workdir),
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        if self.maxmemory:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        args += list(self.extra_args)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"redis-server exited at start-up (port {self.port})")
            try:
                with self.client() as client:
                    if client.ping():
                        return self
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server (SIGKILL: an abrupt outage) and wait for it to exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # in case it was paused
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Kill and start again on the same port (the data is gone: no persistence)."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers (a hung Redis)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    @classmethod
    def launch(cls, workdir: Path, attempts: int = 3, **kwargs) -> RedisServer:
        """Start one on a free port, trying again if the port was taken meanwhile."""
        error: RuntimeError | None = None
        for _ in range(attempts):
            try:
                return cls(workdir, **kwargs).start()
            except RuntimeError as err:
                error = err
        raise RuntimeError(f"could not start redis-server: {error}")
