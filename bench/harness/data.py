"""Benchmark inputs on disk: synthetic graphs, seeded model weights and ``hopserve`` configs.

* :func:`prepare_sage` — a power-law graph store and seeded ``hopserve.examples:GraphSAGE``
  weights, built once per size and reused (serving benchmarks, the soak);
* :func:`powerlaw_pair` — one power-law graph stored twice, as generated and RCMK-ordered
  (the engine benchmarks: ``full_eval.py``, ``dgl_compare.py``);
* :func:`model_entry` and :func:`write_config` — a ``hopserve`` YAML file serving them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report import log


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
        sizes = (nodes, avg_degree, feature_dim)
        if not sparse_ids:
            synth_powerlaw(*sizes, seed=seed, out=graph, overwrite=True, progress=False)
        else:
            g = synth_powerlaw(*sizes, seed=seed, progress=False)
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


def powerlaw_pair(
    data_dir: Path, nodes: int, avg_degree: float, dim: int, *, seed: int = 0
) -> dict[str, str]:
    """One synthetic power-law graph stored twice under ``data_dir``, built once.

    ``orig`` keeps the generated (unordered) numbering; ``rcmk`` holds the same nodes,
    edges and feature rows in RCMK order, with the ``orig`` numbers as its node IDs.
    Returns ``{"rcmk": folder, "orig": folder}``.
    """
    import time

    import torch

    from hopserve import GraphStore
    from hopserve.worker.graph.synth import synth_powerlaw

    data = Path(data_dir)
    rcmk, orig = data / "rcmk", data / "orig"
    t = time.perf_counter()
    if not (orig / "meta.json").exists():
        synth_powerlaw(
            nodes,
            avg_degree,
            dim,
            seed=seed,
            reorder=None,
            out=orig,
            overwrite=True,
            progress=False,
        )
    if not (rcmk / "meta.json").exists():
        src_store = GraphStore.open(orig)
        dst = torch.repeat_interleave(torch.arange(src_store.num_nodes), src_store.in_degrees)
        edge_index = torch.stack([src_store.indices.long(), dst])
        GraphStore.from_edge_index(edge_index, src_store.features, reorder="rcmk").save(
            rcmk, overwrite=True, progress=False
        )
    log(f"graphs ready in {time.perf_counter() - t:.1f}s")
    return {"rcmk": str(rcmk), "orig": str(orig)}


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
