"""Closed-loop load generator for a hopserve server (``hopserve loadtest``).

``concurrency`` clients each send a request, wait for the answer, and send the next,
for ``duration_s`` seconds (after ``warmup_s`` seconds not recorded). Target nodes follow
a bounded Zipf law over a random permutation of the ID space (popularity is not tied
to ID order); set sizes are fixed or log-normal. Uses the asyncio client only, so it
runs without torch.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hopserve.client.aio import AsyncEmbeddingClient
from hopserve.client.errors import HopserveError


@dataclass
class LoadSpec:
    """What load to generate."""

    model: str
    concurrency: int = 32
    duration_s: float = 10.0
    warmup_s: float = 1.0
    set_size: int = 16  # median target-set size
    set_size_sigma: float = 0.0  # log-normal spread of set sizes (0 = fixed)
    max_set_size: int = 4096
    zipf_a: float = 1.1  # popularity exponent: P(rank k) ∝ k^-a
    cache_policy: str = "use"
    fanouts: list[int] | None = None
    seed: int = 0
    node_ids: np.ndarray | None = None  # IDs to draw from (read_node_ids); default 0..N-1
    timeout_s: float = 10.0


@dataclass
class LoadReport:
    """Throughput and latency of one run (latencies in milliseconds)."""

    requests: int
    errors: dict[str, int]
    seconds: float
    qps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    targets_per_request: float
    concurrency: int
    first_error: str = ""  # the first failed request's error ("[CODE] message")
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def read_node_ids(path: str | Path) -> np.ndarray:
    """External node IDs to draw targets from: a graph-store directory (its ID map), a
    ``.npy`` array, or a text/CSV file with one ID per line (first column; a header line
    is skipped).

    Raises:
        ValueError: no IDs, or a value that is not an integer (naming the file and line).
    """
    path = Path(path)
    if path.is_dir():  # a graph store: node_ids.npy, or identity IDs 0..N-1 (meta.json)
        if (path / "node_ids.npy").is_file():
            ids = np.load(path / "node_ids.npy", mmap_mode="r")
        else:
            ids = np.arange(int(json.loads((path / "meta.json").read_text())["num_nodes"]))
    elif path.suffix == ".npy":
        ids = np.load(path)
    else:
        values = []
        for line_no, line in enumerate(path.read_text().splitlines(), start=1):
            cell = line.split(",")[0].strip()
            if not cell:
                continue
            try:
                values.append(int(cell))
            except ValueError:
                if line_no == 1:
                    continue  # a header
                raise ValueError(f"{path}:{line_no}: {cell!r} is not an integer node ID") from None
        ids = np.asarray(values)
    ids = np.asarray(ids).reshape(-1)
    if ids.size == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"{path}: no integer node IDs")
    return ids.astype(np.int64)


class TargetSampler:
    """Draws target sets: bounded Zipf popularity over a shuffled ID space."""

    def __init__(self, ids: np.ndarray, spec: LoadSpec) -> None:
        self.rng = np.random.default_rng(spec.seed)
        self.ids = self.rng.permutation(np.asarray(ids, dtype=np.int64))
        weights = 1.0 / np.arange(1, self.ids.size + 1, dtype=np.float64) ** spec.zipf_a
        self.cdf = np.cumsum(weights) / weights.sum()
        self.spec = spec

    def size(self) -> int:
        s = self.spec
        if s.set_size_sigma <= 0:
            return s.set_size
        drawn = self.rng.lognormal(np.log(s.set_size), s.set_size_sigma)
        return int(np.clip(round(drawn), 1, s.max_set_size))

    def draw(self) -> np.ndarray:
        ranks = np.searchsorted(self.cdf, self.rng.random(self.size()), side="right")
        return self.ids[np.minimum(ranks, self.ids.size - 1)]


async def run_load(target: str, spec: LoadSpec, **client_options: Any) -> LoadReport:
    """Run the closed loop against ``target`` and report QPS and latency percentiles.

    ``client_options`` go to :class:`AsyncEmbeddingClient` (TLS options, token).
    """
    async with AsyncEmbeddingClient(
        target, timeout=spec.timeout_s, max_retries=0, **client_options
    ) as client:
        ids = spec.node_ids
        if ids is None:
            info = await client.get_model(spec.model)
            ids = np.arange(info.graph_num_nodes, dtype=np.int64)
        sampler = TargetSampler(ids, spec)
        latencies: list[float] = []
        sizes: list[int] = []
        errors: dict[str, int] = {}
        first_error: list[str] = []
        start = time.perf_counter()
        record_from = start + spec.warmup_s
        stop_at = record_from + spec.duration_s

        async def one_client() -> None:
            while (now := time.perf_counter()) < stop_at:
                nodes = sampler.draw()
                try:
                    await client.get_embeddings(
                        spec.model,
                        nodes,
                        fanouts=spec.fanouts,
                        cache_policy=spec.cache_policy,
                        seed=spec.seed if spec.fanouts else None,
                    )
                    ok = True
                except HopserveError as err:
                    ok = False
                    if not first_error:
                        first_error.append(str(err))
                    if now >= record_from:
                        errors[err.code.name] = errors.get(err.code.name, 0) + 1
                done = time.perf_counter()
                if ok and now >= record_from and done <= stop_at:
                    latencies.append(done - now)
                    sizes.append(nodes.size)

        await asyncio.gather(*(one_client() for _ in range(spec.concurrency)))
    lat = np.asarray(latencies) * 1e3 if latencies else np.asarray([np.nan])
    return LoadReport(
        requests=len(latencies),
        errors=errors,
        seconds=spec.duration_s,
        qps=len(latencies) / spec.duration_s,
        p50_ms=float(np.percentile(lat, 50)),
        p95_ms=float(np.percentile(lat, 95)),
        p99_ms=float(np.percentile(lat, 99)),
        mean_ms=float(lat.mean()),
        targets_per_request=float(np.mean(sizes)) if sizes else 0.0,
        concurrency=spec.concurrency,
        first_error=first_error[0] if first_error else "",
    )
