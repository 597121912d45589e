"""One served configuration: a private copy of the graph, its config file, ``hopserve serve``.

Both models (2-layer GraphSAGE and 2-layer GCN, ``hopserve.examples``) serve one graph, so
an update changes both; every configuration starts from the same base store (a hard-linked
copy: the base files are never written, the update log and snapshots go to the copy's
``updates/``). Configurations differ only in the ``cache`` section (:data:`CONFIGS`).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness

from .streams import MODELS

CONFIGS: dict[str, dict[str, Any]] = {
    "exact": {"invalidation": "exact", "refresh_hot_rows": 0},
    "refresh": {"invalidation": "exact", "refresh_hot_rows": 1024},
    "flush": {"invalidation": "flush", "refresh_hot_rows": 0},
    "none": None,  # cache.backend: none
}
"""The ``cache`` settings of each configuration (Redis unless ``None``)."""

LABELS = {
    "exact": "exact invalidation",
    "refresh": "exact + refresh_hot_rows 1024",
    "flush": "flush",
    "none": "no cache",
}


@dataclass(frozen=True)
class ModelData:
    """The graph store and both models' weights on disk."""

    graph: Path
    sage: dict[str, Any]
    gcn: dict[str, Any]

    def entries(self, graph: Path) -> list[dict[str, Any]]:
        """The ``models:`` entries serving ``graph`` (a private copy of :attr:`graph`)."""
        return [{**self.sage, "graph": str(graph)}, {**self.gcn, "graph": str(graph)}]


def prepare(
    data_dir: Path, nodes: int, avg_degree: float, dim: int, hidden: int, out_dim: int, seed: int
) -> ModelData:
    """The power-law graph and seeded weights of both models, built once under ``data_dir``
    (``harness.prepare_sage``; the GCN weights are written beside)."""
    import torch

    from hopserve.examples import GCN

    sage = harness.prepare_sage(
        data_dir, nodes, avg_degree, feature_dim=dim, hidden=hidden, out_dim=out_dim, seed=seed
    )
    gcn_kwargs = {"in_dim": dim, "hidden": hidden, "out_dim": out_dim}
    gcn_weights = sage.graph.parent / f"gcn-{hidden}-{out_dim}.pt"
    if not gcn_weights.exists():
        torch.manual_seed(seed + 1)
        torch.save(GCN(**gcn_kwargs).state_dict(), gcn_weights)
    common = {"device": "cpu", "version": "1"}
    return ModelData(
        graph=sage.graph,
        sage={"name": "sage", "entrypoint": sage.entrypoint, "kwargs": dict(sage.kwargs),
              "weights": str(sage.weights), **common},
        gcn={"name": "gcn", "entrypoint": "hopserve.examples:GCN", "kwargs": gcn_kwargs,
             "weights": str(gcn_weights), **common},
    )  # fmt: skip


def private_graph(src: Path, dst: Path) -> Path:
    """``dst``: the store ``src`` without its ``updates/``, its files hard-linked (copied
    when the folders are on different file systems)."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=link, ignore=shutil.ignore_patterns("updates"))
    return dst


class Service:
    """``hopserve serve`` for configuration ``name`` (a context manager).

    Args:
        name: A key of :data:`CONFIGS`.
        work: Scratch folder (graph copy, config, log).
        data: Graph and weights.
        redis: The run's Redis (flushed before the start).
    """

    def __init__(self, name: str, work: Path, data: ModelData, redis: harness.RedisServer) -> None:
        self.name = name
        self.folder = Path(work) / name
        self.data = data
        self.redis = redis
        self.port = harness.free_port()
        self.metrics_port = harness.free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.proc: harness.ServiceProcess | None = None
        self.start_s = 0.0

    @property
    def log_path(self) -> Path:
        return self.folder / "front-end.log"

    def __enter__(self) -> Service:
        self.folder.mkdir(parents=True, exist_ok=True)
        graph = private_graph(self.data.graph, self.folder / "graph")
        settings = CONFIGS[self.name]
        if settings is None:
            cache = {"backend": "none"}
        else:
            with self.redis.client() as client:
                client.flushall()
            cache = {"backend": "redis", "redis_url": self.redis.url, "ttl_s": 3600, **settings}
        config = harness.write_config(
            self.folder / "hopserve.yaml",
            self.data.entries(graph),
            server={
                "port": self.port, "metrics_port": self.metrics_port, "max_wait_ms": 2.0,
                "max_queue": 1024, "grace_period_s": 2.0,
            },
            cache=cache,
        )  # fmt: skip
        start = time.monotonic()
        self.proc = harness.start_frontend(config, self.port, self.log_path, model=MODELS[0])
        try:
            for model in MODELS[1:]:
                harness.wait_serving(self.target, model, proc=self.proc, timeout=300)
        except BaseException:
            self.proc.kill()
            raise
        self.start_s = time.monotonic() - start
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate(30)
        shutil.rmtree(self.folder / "graph", ignore_errors=True)

    def metrics(self, *names: str) -> dict[str, float]:
        """One scrape of the front-end's ``/metrics``: the samples named ``names`` by series
        key (``name{label="value",...}``; empty when the scrape fails)."""
        scraper = harness.MetricsScraper(
            f"http://127.0.0.1:{self.metrics_port}/metrics", 1.0, names
        )
        try:
            return scraper.scrape()
        except Exception:  # a gap: the caller reports what it has
            return {}


def metric_total(values: dict[str, float], name: str, **labels: str) -> float:
    """The sum of the series of ``name`` whose labels include ``labels`` (NaN if none)."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found = [v for k, v in values.items()
             if k.startswith(name + "{") and all(w in k for w in want)]  # fmt: skip
    return sum(found) if found else float("nan")
