"""Reusable plumbing for the benchmarks in ``bench/`` (not imported by the service).

What every benchmark script needs, once:

* **data** — :func:`prepare_sage`: a synthetic power-law graph store and seeded
  ``hopserve.examples:GraphSAGE`` weights on disk, built once per size and reused;
* **config** — :func:`model_entry` and :func:`write_config`: a ``hopserve`` YAML file;
* **processes** — :class:`ServiceProcess`: a ``python -m hopserve ...`` subprocess with its
  stderr in a log file, started/killed/terminated/restarted, RSS via psutil;
  :func:`start_frontend` and :func:`start_worker` wait until they report SERVING on gRPC
  health (:func:`grpc_health`, :func:`wait_serving`). Ports and Redis come from
  :mod:`hopserve.testing` (``free_port``, ``wait_for_port``, ``RedisServer``), re-exported
  here so scripts import one module;
* **measurement** — :func:`percentiles`, :class:`RssSampler` (a thread sampling RSS and
  CPU of named processes), :class:`MetricsScraper` (a thread scraping ``/metrics``),
  :func:`machine_info` / :func:`machine_line`;
* **output** — :func:`write_json` (numpy-safe), :func:`markdown_table`, :func:`write_lines`;
* **plots** — :func:`pyplot` (matplotlib, Agg backend), :func:`shade_spans`,
  :func:`mark_events`;
* **progress** — :func:`log`, periodic timestamped lines on stderr.

Heavy modules (torch, matplotlib, grpc health stubs, psutil) are imported inside the
functions that need them, so importing this module is cheap (benchmarks spawn children
that re-import it).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopserve.testing import RedisServer, free_port, wait_for_port

__all__ = [
    "BENCH",
    "REPO",
    "RESULTS",
    "RedisServer",
    "MetricsScraper",
    "RssSampler",
    "SageData",
    "ServiceProcess",
    "free_port",
    "git_revision",
    "grpc_health",
    "log",
    "machine_info",
    "machine_line",
    "mark_events",
    "markdown_table",
    "model_entry",
    "percentiles",
    "prepare_sage",
    "pyplot",
    "shade_spans",
    "start_frontend",
    "start_worker",
    "to_jsonable",
    "wait_for_port",
    "wait_serving",
    "write_config",
    "write_json",
    "write_lines",
]

BENCH = Path(__file__).resolve().parent
"""The ``bench/`` folder."""
REPO = BENCH.parent
"""The repository root."""
RESULTS = BENCH / "results"
"""Where benchmarks write their committed results."""

_T0 = time.monotonic()


# --------------------------------------------------------------------------- progress
def log(message: str, *, prefix: str = "bench") -> None:
    """One progress line on stderr: ``[prefix +12.3s] message`` (seconds since import)."""
    print(f"[{prefix} +{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class SageData:
    """A graph store and GraphSAGE weights on disk (see :func:`prepare_sage`)."""

    graph: Path
    weights: Path
    kwargs: dict[str, int]
    entrypoint: str = "hopserve.examples:GraphSAGE"


def prepare_sage(
    data_dir: Path,
    nodes: int,
    avg_degree: float,
    *,
    feature_dim: int = 64,
    hidden: int = 64,
    out_dim: int = 32,
    num_layers: int = 2,
    sparse_ids: bool = False,
    seed: int = 0,
) -> SageData:
    """Synthetic power-law graph + seeded ``GraphSAGE`` weights, built once under ``data_dir``.

    Args:
        data_dir: Parent folder; the data goes into a sub-folder named by the sizes, and
            is reused when it already exists.
        nodes, avg_degree, feature_dim: Graph sizes (``synth_powerlaw``, RCMK-ordered).
        hidden, out_dim, num_layers: The model's widths and depth.
        sparse_ids: Give the nodes sparse, non-contiguous external IDs (random distinct
            int64 values far above ``nodes``) instead of ``0..N-1``, so that clients must
            use the store's ``node_ids``.
        seed: Graph and weight seed.
    """
    import numpy as np
    import torch

    from hopserve.examples import GraphSAGE
    from hopserve.worker.graph.store import GraphStore
    from hopserve.worker.graph.synth import synth_powerlaw

    tag = f"{nodes}-{avg_degree:g}-{feature_dim}" + ("-sparse" if sparse_ids else "")
    folder = Path(data_dir) / f"sage-{tag}-s{seed}"
    graph = folder / "graph"
    if not (graph / "meta.json").exists():
        if not sparse_ids:
            synth_powerlaw(
                nodes,
                avg_degree,
                feature_dim,
                seed=seed,
                out=graph,
                overwrite=True,
                progress=False,
            )
        else:
            g = synth_powerlaw(nodes, avg_degree, feature_dim, seed=seed, progress=False)
            rng = np.random.default_rng(seed + 1)
            ids = np.unique(rng.integers(10**9, 2**40, size=int(nodes * 1.05) + 16))
            ids = rng.permutation(ids)[:nodes]
            if ids.size < nodes:  # pragma: no cover - 5% spare draws make this vanishing
                raise RuntimeError("could not draw distinct sparse node IDs")
            dst = torch.repeat_interleave(torch.arange(nodes), g.in_degrees)
            edge_index = torch.stack([g.indices.long(), dst])
            # Already RCMK-ordered: keep the storage order, attach the external IDs.
            store = GraphStore.from_edge_index(edge_index, g.features, node_ids=ids, reorder=None)
            store.save(graph, overwrite=True, progress=False)
    kwargs = {"in_dim": feature_dim, "hidden": hidden, "out_dim": out_dim, "num_layers": num_layers}
    weights = folder / "sage.pt"
    if not weights.exists():
        torch.manual_seed(seed)
        torch.save(GraphSAGE(**kwargs).state_dict(), weights)
    return SageData(graph=graph, weights=weights, kwargs=kwargs)


# --------------------------------------------------------------------------- config
def model_entry(name: str, data: SageData, *, device: str = "cpu", **extra: Any) -> dict[str, Any]:
    """The ``models[]`` entry of a config serving ``data`` as model ``name``."""
    entry = {
        "name": name,
        "entrypoint": data.entrypoint,
        "kwargs": dict(data.kwargs),
        "weights": str(data.weights),
        "graph": str(data.graph),
        "device": device,
    }
    entry.update(extra)
    return entry


def write_config(
    path: Path,
    models: Sequence[Mapping[str, Any]],
    *,
    server: Mapping[str, Any] | None = None,
    cache: Mapping[str, Any] | None = None,
    engine: Mapping[str, Any] | None = None,
    log_level: str = "WARNING",
) -> Path:
    """Write a ``hopserve`` YAML config (sections as in ``examples/hopserve.yaml``)."""
    import yaml

    cfg: dict[str, Any] = {"models": [dict(m) for m in models]}
    cfg["server"] = {"host": "127.0.0.1", **(server or {})}
    cfg["cache"] = dict(cache) if cache is not None else {"backend": "none"}
    if engine:
        cfg["engine"] = dict(engine)
    cfg["logging"] = {"level": log_level}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# --------------------------------------------------------------------------- processes
def grpc_health(target: str, service: str = "", timeout: float = 1.0) -> str:
    """The ``grpc.health.v1`` status of ``service`` at ``target``, e.g. ``"SERVING"``.

    Returns ``"UNREACHABLE"`` when the call fails (down, refused, timed out) and
    ``"NOT_FOUND"`` for an unknown service.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
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
) -> float:
    """Poll gRPC health until ``service`` is SERVING; the ``time.monotonic()`` it was seen.

    Raises:
        RuntimeError: ``proc`` exited, or not SERVING within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and not proc.alive:
            raise RuntimeError(f"{proc.name} exited with {proc.returncode}:\n{proc.log_tail()}")
        if grpc_health(target, service, timeout=min(1.0, max(0.05, interval * 4))) == "SERVING":
            return time.monotonic()
        if time.monotonic() > deadline:
            tail = f":\n{proc.log_tail()}" if proc is not None else ""
            raise RuntimeError(f"{target} ({service!r}) not SERVING after {timeout:g}s{tail}")
        time.sleep(interval)


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
    argv = [
        "worker",
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        device,
    ]
    if threads:
        argv += ["--threads", str(threads)]
    proc = ServiceProcess.hopserve("worker", argv, log_path).start()
    try:
        wait_serving(f"127.0.0.1:{port}", "", timeout=timeout, proc=proc)
    except BaseException:
        proc.kill()
        raise
    return proc


def start_frontend(
    config: Path, port: int, log_path: Path, *, model: str = "", timeout: float = 180.0
) -> ServiceProcess:
    """``hopserve serve`` (port from ``config``), started and SERVING for ``model``."""
    proc = ServiceProcess.hopserve("front-end", ["serve", "--config", str(config)], log_path)
    proc.start()
    try:
        wait_serving(f"127.0.0.1:{port}", model, timeout=timeout, interval=0.1, proc=proc)
    except BaseException:
        proc.kill()
        raise
    return proc


# --------------------------------------------------------------------------- measurement
def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of ``values`` (NaN when empty)."""
    import numpy as np

    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    if arr.size == 0:
        return {f"p{q:g}": math.nan for q in qs}
    return {f"p{q:g}": float(np.percentile(arr, q)) for q in qs}


class RssSampler(threading.Thread):
    """Samples RSS and CPU time of named processes every ``interval`` seconds (daemon thread).

    Args:
        pids: Called at every sample; ``{name: pid or None}`` (so a restarted process is
            followed under its name).
        interval: Seconds between samples.

    ``samples`` holds ``(time.monotonic(), name, pid, rss bytes, cpu seconds)``;
    :meth:`series` gives one name's RSS, :meth:`cpu_percent` its CPU use between samples;
    ``host`` the whole machine's CPU use (100 per core) between samples — what else runs.
    """

    def __init__(self, pids: Callable[[], Mapping[str, int | None]], interval: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self._pids = pids
        self.interval = interval
        self.samples: list[tuple[float, str, int, int, float]] = []
        self.host: list[tuple[float, float]] = []  # (time, whole-machine CPU %, 100 per core)
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        import psutil

        ncpu = os.cpu_count() or 1
        psutil.cpu_percent(None)  # the first call only starts the interval
        while not self._stop_event.is_set():
            now = time.monotonic()
            with self._lock:
                self.host.append((now, psutil.cpu_percent(None) * ncpu))
            for name, pid in self._pids().items():
                if pid is None:
                    continue
                try:
                    proc = psutil.Process(pid)
                    with proc.oneshot():
                        rss = int(proc.memory_info().rss)
                        times = proc.cpu_times()
                except psutil.Error:
                    continue
                with self._lock:
                    self.samples.append((now, name, pid, rss, times.user + times.system))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        """Stop sampling and join the thread."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)

    def _rows(self, name: str) -> list[tuple[float, str, int, int, float]]:
        with self._lock:
            return [row for row in self.samples if row[1] == name]

    def series(self, name: str) -> tuple[list[float], list[int]]:
        """``(times, rss bytes)`` of one process name."""
        rows = self._rows(name)
        return [r[0] for r in rows], [r[3] for r in rows]

    def cpu_percent(self, name: str) -> tuple[list[float], list[float]]:
        """``(times, CPU %)`` of one process name (100 = one core), between samples of
        the same pid (a restart starts a new series)."""
        rows = self._rows(name)
        times: list[float] = []
        values: list[float] = []
        for prev, cur in zip(rows, rows[1:], strict=False):
            if prev[2] == cur[2] and cur[0] > prev[0]:
                times.append(cur[0])
                values.append(100.0 * (cur[4] - prev[4]) / (cur[0] - prev[0]))
        return times, values

    def latest(self, name: str) -> int | None:
        """The most recent RSS sample of ``name``."""
        rows = self._rows(name)
        return rows[-1][3] if rows else None


class MetricsScraper(threading.Thread):
    """Scrapes a Prometheus ``/metrics`` endpoint every ``interval`` s (daemon thread).

    Args:
        url: e.g. ``http://127.0.0.1:9090/metrics``.
        interval: Seconds between scrapes.
        names: Sample names to keep (e.g. ``"hopserve_inflight_requests"``,
            ``"hopserve_requests_total"``).

    ``samples`` holds ``(time.monotonic(), {series key: value})`` where a key is
    ``name{label="value",...}`` (labels sorted); failed scrapes are skipped.
    """

    def __init__(self, url: str, interval: float, names: Iterable[str]) -> None:
        super().__init__(name="metrics-scraper", daemon=True)
        self.url = url
        self.interval = interval
        self.names = frozenset(names)
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.failures = 0
        self._stop_event = threading.Event()

    @staticmethod
    def key(name: str, labels: Mapping[str, str]) -> str:
        """The series key of a sample."""
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}}"

    def scrape(self) -> dict[str, float]:
        """One scrape: the kept samples."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url, timeout=max(1.0, self.interval)) as reply:
            text = reply.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in self.names:
                    out[self.key(sample.name, sample.labels)] = float(sample.value)
        return out

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = time.monotonic()
            try:
                values = self.scrape()
            except Exception:  # the process is down or busy: a gap in the series
                self.failures += 1
            else:
                self.samples.append((now, values))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        """Stop scraping and join the thread."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """``(times, values)`` of one series key (scrapes without it are skipped)."""
        rows = [(t, v[key]) for t, v in list(self.samples) if key in v]
        return [t for t, _ in rows], [x for _, x in rows]

    def matching(self, name: str, **labels: str) -> list[str]:
        """Series keys of ``name`` whose labels include ``labels``."""
        keys: set[str] = set()
        want = [f'{k}="{v}"' for k, v in labels.items()]
        for _, values in list(self.samples):
            for key in values:
                if key.startswith(name + "{") and all(w in key for w in want):
                    keys.add(key)
        return sorted(keys)

    def histogram_quantiles(
        self, name: str, t_from: float, t_to: float, qs: Sequence[float], **labels: str
    ) -> dict[str, float]:
        """Quantiles of histogram ``name`` (base name, no ``_bucket``) over the observations
        made between the scrapes around ``t_from`` and ``t_to``, summed over series matching
        ``labels``; linear within a bucket like PromQL's ``histogram_quantile`` (NaN when
        nothing was observed)."""
        counts: dict[float, float] = {}
        for key in self.matching(f"{name}_bucket", **labels):
            match = re.search(r'le="([^"]+)"', key)
            after = self.value_at(key, t_to)
            if match is None or after is None:
                continue
            le = float(match.group(1))
            counts[le] = counts.get(le, 0.0) + after - (self.value_at(key, t_from) or 0.0)
        bounds = sorted(counts)
        total = counts[bounds[-1]] if bounds else 0.0
        out: dict[str, float] = {}
        for q in qs:
            if total <= 0:
                out[f"p{q:g}"] = math.nan
                continue
            rank, lower, below = q / 100.0 * total, 0.0, 0.0
            value = math.nan
            for le in bounds:
                if counts[le] >= rank:
                    if math.isinf(le):
                        value = lower  # above the last finite bound: report that bound
                    else:
                        inside = counts[le] - below
                        value = lower + (le - lower) * ((rank - below) / inside if inside else 1)
                    break
                lower, below = le, counts[le]
            out[f"p{q:g}"] = value
        return out

    def value_at(self, key: str, t: float) -> float | None:
        """The last value of ``key`` scraped at or before ``t`` (``None`` if none)."""
        best = None
        for ts, values in list(self.samples):
            if ts > t:
                break
            if key in values:
                best = values[key]
        return best


def machine_info() -> dict[str, Any]:
    """Where a benchmark ran: CPU, cores, memory, OS, Python, key package versions."""
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except (ImportError, OSError):
        pass
    for package in ("torch", "grpc", "numpy"):
        module = sys.modules.get(package)
        if module is not None:
            info[f"{package}_version"] = getattr(module, "__version__", "?")
    return info


def git_revision(repo: Path = REPO) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}`` of the checkout (empty when git is unavailable);
    ``dirty`` means the run measured uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "dirty": bool(status.strip())}


def machine_line(info: Mapping[str, Any]) -> str:
    """``"x86_64, 2 cores, 7.8 GiB (Intel ...)"`` for report headers."""
    text = f"{info.get('machine', '?')}, {info.get('cpu_count', '?')} cores"
    if "memory_gib" in info:
        text += f", {info['memory_gib']} GiB"
    if "cpu_model" in info:
        text += f" ({info['cpu_model']})"
    return text


# --------------------------------------------------------------------------- output
def to_jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars/arrays, paths, sets and NaN/inf made JSON-safe (NaN → None)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if np is not None:
        if isinstance(obj, np.ndarray):
            return to_jsonable(obj.tolist())
        if isinstance(obj, np.generic):
            obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` (see :func:`to_jsonable`) as indented JSON; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_jsonable(obj), indent=2) + "\n")
    return path


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None
) -> list[str]:
    """A GitHub markdown table as lines; ``align`` one char per column: ``l``/``r``/``c``."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    align = align or "l" * len(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    """Write ``lines`` joined by newlines (with a final one); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------- plots
def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def shade_spans(
    axes: Iterable[Any],
    spans: Sequence[tuple[float, float, str]],
    *,
    colors: Sequence[str] = ("#f2f2f2", "#ffffff"),
    label_ax: Any = None,
) -> None:
    """Alternate background shading of ``(start, end, label)`` spans on every axis;
    labels are written at the top of ``label_ax`` (if given)."""
    for i, (start, end, label) in enumerate(spans):
        for ax in axes:
            ax.axvspan(start, end, color=colors[i % len(colors)], zorder=0, lw=0)
        if label_ax is not None:
            label_ax.text(
                (start + end) / 2,
                1.01,
                label,
                transform=label_ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=8,
            )


def mark_events(
    axes: Iterable[Any],
    events: Sequence[tuple[float, str]],
    *,
    color: str = "#c0392b",
    label_ax: Any = None,
) -> None:
    """Dashed vertical lines at ``(time, label)`` events; labels rotated on ``label_ax``."""
    for t, label in events:
        for ax in axes:
            ax.axvline(t, color=color, ls="--", lw=0.8, zorder=1)
        if label_ax is not None:
            label_ax.text(
                t,
                0.98,
                f" {label}",
                transform=label_ax.get_xaxis_transform(),
                rotation=90,
                ha="left",
                va="top",
                fontsize=7,
                color=color,
            )
