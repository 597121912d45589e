"""Processes a benchmark starts: ``hopserve`` services and one-measurement children.

* :class:`ServiceProcess` — a ``python -m hopserve ...`` subprocess with its output in a log
  file, started/killed/terminated/restarted, RSS via psutil; :func:`start_frontend` and
  :func:`start_worker` return it once it reports SERVING on gRPC health
  (:func:`grpc_health`, :func:`wait_serving`).
* Children — engine benchmarks run every measurement in a fresh interpreter so that its
  peak RSS is its own: the parent builds the command (:func:`script_command`), the child
  prints one ``RESULT {json}`` line (:func:`emit_result`) and the parent reads it
  (:func:`run_child`).

Ports and Redis come from :mod:`hopserve.testing` (``free_port``, ``RedisServer``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "
"""The line a child prints its measurements on (the rest of its stdout is ignored)."""


# --------------------------------------------------------------------------- children
def emit_result(result: Mapping[str, Any]) -> None:
    """Print ``result`` as the child's ``RESULT`` line."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def script_command(
    script: str | Path,
    args: argparse.Namespace,
    keys: Iterable[str],
    *extra: str,
) -> list[str]:
    """``python script *extra --key value ...``: the parent's options ``keys`` (attribute
    names of ``args``) passed on to a child run of ``script`` with this interpreter."""
    cmd = [sys.executable, str(script), *extra]
    for key in keys:
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return cmd


def run_child(
    cmd: Sequence[str], what: str, *, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run ``cmd`` to the end and return its ``RESULT`` record.

    Raises:
        SystemExit: no ``RESULT`` line (the child failed); the message ends with its stderr.
    """
    environ = None if env is None else dict(env)
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, env=environ)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT_PREFIX)), None)
    if line is None:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-4000:]}")
    return json.loads(line[len(RESULT_PREFIX) :])


# --------------------------------------------------------------------------- gRPC health
def grpc_health(
    target: str, service: str = "", timeout: float = 1.0, credentials: Any = None
) -> str:
    """The ``grpc.health.v1`` status of ``service`` at ``target``, e.g. ``"SERVING"``
    (over TLS with ``credentials``, a ``grpc.ChannelCredentials``).

    Returns ``"UNREACHABLE"`` when the call fails (down, refused, timed out) and
    ``"NOT_FOUND"`` for an unknown service.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            code = err.code() if callable(getattr(err, "code", None)) else None
            return "NOT_FOUND" if code == grpc.StatusCode.NOT_FOUND else "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_serving(
    target: str,
    service: str = "",
    *,
    timeout: float = 120.0,
    interval: float = 0.05,
    proc: ServiceProcess | None = None,
    credentials: Any = None,
) -> float:
    """Poll gRPC health until ``service`` is SERVING; the ``time.monotonic()`` it was seen
    (over TLS with ``credentials``).

    Raises:
        RuntimeError: ``proc`` exited, or not SERVING within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and not proc.alive:
            raise RuntimeError(f"{proc.name} exited with {proc.returncode}:\n{proc.log_tail()}")
        probe = min(1.0, max(0.05, interval * 4))
        if grpc_health(target, service, timeout=probe, credentials=credentials) == "SERVING":
            return time.monotonic()
        if time.monotonic() > deadline:
            tail = f":\n{proc.log_tail()}" if proc is not None else ""
            raise RuntimeError(f"{target} ({service!r}) not SERVING after {timeout:g}s{tail}")
        time.sleep(interval)


# --------------------------------------------------------------------------- services
class ServiceProcess:
    """A subprocess (usually ``python -m hopserve ...``) whose stderr goes to a log file.

    It can be started again after it exits or is killed (same command, same ports); the
    log file is appended to. Not thread-safe: drive it from one thread.

    Args:
        name: For messages, e.g. ``"front-end"``.
        args: The command line.
        log_path: stdout and stderr of every start are appended here.
        env: Extra environment variables.
    """

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @classmethod
    def hopserve(
        cls, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> ServiceProcess:
        """``python -m hopserve <argv>`` with this interpreter."""
        return cls(name, [sys.executable, "-m", "hopserve", *argv], log_path, env)

    @property
    def pid(self) -> int | None:
        """The current process id (``None`` before the first start)."""
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        """Started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last run (negative: killed by that signal); None if running."""
        return None if self.proc is None else self.proc.poll()

    def start(self) -> ServiceProcess:
        """Start (again); returns ``self``."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts + 1}: {' '.join(self.args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a terminal's ^C reaches only the benchmark
            )
        self.starts += 1
        return self

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process (if it runs)."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL (an abrupt crash) and reap it."""
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def terminate(self, timeout: float = 30.0) -> tuple[int | None, float]:
        """SIGTERM, wait up to ``timeout`` s (then SIGKILL); ``(exit code, seconds to exit)``.

        The exit code is the one of the graceful exit, or ``None`` when it had to be killed.
        """
        if self.proc is None:
            return None, 0.0
        start = time.monotonic()
        self.signal(signal.SIGTERM)
        return self.wait(timeout, since=start)

    def wait(self, timeout: float, *, since: float | None = None) -> tuple[int | None, float]:
        """Wait for exit (SIGKILL after ``timeout``); ``(exit code or None, seconds)``."""
        assert self.proc is not None
        start = time.monotonic() if since is None else since
        try:
            code: int | None = self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        return code, time.monotonic() - start

    def rss_bytes(self) -> int | None:
        """Resident set size now (``None`` when not running)."""
        import psutil

        if not self.alive:
            return None
        try:
            return int(psutil.Process(self.pid).memory_info().rss)
        except psutil.Error:
            return None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log file."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _started(proc: ServiceProcess, target: str, service: str, **wait: Any) -> ServiceProcess:
    """Start ``proc`` and wait until ``service`` is SERVING at ``target`` (killed if not)."""
    proc.start()
    try:
        wait_serving(target, service, proc=proc, **wait)
    except BaseException:
        proc.kill()
        raise
    return proc


def start_worker(
    config: Path,
    port: int,
    log_path: Path,
    *,
    device: str = "cpu",
    threads: int | None = None,
    timeout: float = 180.0,
) -> ServiceProcess:
    """``hopserve worker`` on ``127.0.0.1:port``, started and SERVING on gRPC health."""
    argv = ["worker", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--device", device] + (["--threads", str(threads)] if threads else [])
    proc = ServiceProcess.hopserve("worker", argv, log_path)
    return _started(proc, f"127.0.0.1:{port}", "", timeout=timeout)


def start_frontend(
    config: Path,
    port: int,
    log_path: Path,
    *,
    model: str = "",
    timeout: float = 180.0,
    credentials: Any = None,
) -> ServiceProcess:
    """``hopserve serve`` (port from ``config``), started and SERVING for ``model``
    (health polled over TLS with ``credentials``, for a TLS port)."""
    proc = ServiceProcess.hopserve("front-end", ["serve", "--config", str(config)], log_path)
    return _started(proc, f"127.0.0.1:{port}", model, timeout=timeout, interval=0.1,
                    credentials=credentials)  # fmt: skip
