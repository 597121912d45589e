"""LayerwiseEvaluator: the user's model, split into ConvBlocks, run layer by layer.

Call order of :meth:`LayerwiseEvaluator.evaluate`::

    evaluate(targets, fanouts, seed)
      ├─ graph.to_storage(targets)            external IDs → storage ids
      ├─ planner.plan_frontiers               V^L … V^0 (BFS, shortcut, or sampling)
      └─ run.evaluate_plan                    one LayerwiseRun: blocks × batches (run.py)

The parts: the split and its self-check at load (:mod:`~.self_check`), per-run state
(:mod:`~.run`), one batch's block and inputs (:mod:`~.batch`), batch sizes and memory
(:mod:`~.batching`), storage tiers (:mod:`~.storage`), defaults (:mod:`~.settings`).
:func:`~.factory.make_evaluator` picks this class or the node-wise fallback.

Exactness: each block sees every in-edge of its destinations and the stored outputs of
earlier layers for every source row, so every row equals the full-graph forward.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import torch
from torch import Tensor, nn

from hopserve.proto.contract import BlockInfo, RunStats, validate_fanouts
from hopserve.worker.convs.base import served_edge_values
from hopserve.worker.engine.batching import BatchSizer
from hopserve.worker.engine.device_graph import DeviceGraph
from hopserve.worker.engine.layer_cache import LayerReuse
from hopserve.worker.engine.run import RunContext, evaluate_plan
from hopserve.worker.engine.self_check import check_split
from hopserve.worker.engine.settings import INIT_BATCH_NODES
from hopserve.worker.graph.planner import LayerFrontier, Plan, plan_frontiers
from hopserve.worker.hetero import as_homogeneous
from hopserve.worker.trace.blocks import ConvBlock, ModelSplit
from hopserve.worker.trace.split import split_model

__all__ = ["LayerwiseEvaluator", "default_prefetch"]

log = logging.getLogger(__name__)


def default_prefetch(device: torch.device) -> bool:
    """Whether to prefetch by default: on CUDA (copies overlap compute), not on CPU (the
    thread competes with compute for the same cores)."""
    return device.type == "cuda"


class LayerwiseEvaluator:
    """Exact full, partial and sampling evaluation of a GNN model (DGI).

    Args:
        model: the user's unmodified training model (``forward(x, edge_index)`` or DGL's
            ``forward(graph, x)``).
        graph: a :class:`~hopserve.worker.graph.GraphStore`.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, …
        memory_budget_bytes, host_memory_budget_bytes, spill_dir, prefetch,
            init_batch_nodes, graph_on_device, device_tier_fraction: see
            :class:`~.settings.EngineSettings` (``None`` = the device's default).
        progress: show a progress bar for full evaluation (default: when on a TTY).
        self_check: compare layer-wise and full-graph results on a probe graph at load.

    Raises:
        ModelTraceError: the model cannot be split into ConvBlocks, or fails the self-check
            (:func:`~.factory.make_evaluator` can fall back to node-wise evaluation).
    """

    mode = "layerwise"

    def __init__(
        self,
        model: nn.Module,
        graph,
        device: str | torch.device = "cpu",
        *,
        memory_budget_bytes: int | None = None,
        host_memory_budget_bytes: int | None = None,
        spill_dir: str | None = None,
        prefetch: bool | None = None,
        progress: bool | None = None,
        init_batch_nodes: int = INIT_BATCH_NODES,
        graph_on_device: bool | None = None,
        device_tier_fraction: float = 0.5,
        self_check: bool = True,
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.graph = graph
        model = as_homogeneous(model.eval(), graph)
        self.model = model.eval().to(self.device)
        self.memory_budget_bytes = None if memory_budget_bytes is None else int(memory_budget_bytes)
        self.host_memory_budget_bytes = int(
            host_memory_budget_bytes
            if host_memory_budget_bytes is not None
            else psutil.virtual_memory().available // 2
        )
        self.spill_dir = spill_dir
        self.prefetch = default_prefetch(self.device) if prefetch is None else bool(prefetch)
        self.progress = progress
        self.init_batch_nodes = init_batch_nodes
        self.graph_on_device = graph_on_device
        if not 0.0 <= device_tier_fraction <= 1.0:
            raise ValueError(f"device_tier_fraction must be in [0, 1], got {device_tier_fraction}")
        self.device_tier_fraction = float(device_tier_fraction)
        self._device_graph: DeviceGraph | None = None
        self.last_stats: RunStats | None = None
        self._lock = threading.Lock()
        self._sizers: dict[int, BatchSizer] = {}
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="hopserve-prep") if self.prefetch else None
        )
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.split: ModelSplit = split_model(model, graph.feature_dim)
        if self_check:
            check_split(
                self.model,
                self.split,
                self._context(),
                graph.feature_dim,
                self.reads_input_frontier,
            )
        for adapter in self.split.adapters.values():  # whole-graph statistics, load-time refusals
            adapter.prepare(graph)
        self._resident_graph()  # upload at load, not on the first request

    # ------------------------------------------------------------------ schema
    @property
    def num_layers(self) -> int:
        """Message-passing layers L."""
        return self.split.num_layers

    @property
    def reads_input_frontier(self) -> bool:
        """Whether plans need ``V^0`` (only a node-wise block 0 reads it)."""
        return any(b.index == 0 for b in self.split.blocks)

    @property
    def graph_resident(self) -> bool:
        """Whether the graph's CSC and features are on the device (``graph_on_device``)."""
        return self._device_graph is not None and self._device_graph.serves(self.graph)

    def describe(self) -> str:
        """The ConvBlock schema, one line per block."""
        return self.split.describe()

    def blocks(self) -> tuple[BlockInfo, ...]:
        """Layers ``1..L`` as :class:`~hopserve.proto.contract.BlockInfo` (conv kinds, widths)."""
        lines = self.split.describe().splitlines()
        infos = []
        for block, line in zip(self.split.blocks, lines, strict=True):
            if block.index < 1:
                continue
            convs = [self.model.get_submodule(name) for name in block.convs]
            kind = "+".join(type(c).__name__ for c in convs) or "-"
            in_dim = _width(convs[0], "in_channels", "in_feats", "_in_src_feats") if convs else 0
            out_dim = _out_width(convs[-1]) if convs else 0
            infos.append(BlockInfo(block.index, kind, in_dim, out_dim, line))
        return tuple(infos)

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self,
        targets: Sequence[int] | Tensor | None = None,
        fanouts: Sequence[int] | None = None,
        seed: int = 0,
    ) -> Tensor:
        """Embeddings of ``targets`` (external node IDs), or of all nodes.

        Args:
            targets: node IDs; ``None`` for all nodes. Rows come back in the order of
                ``targets`` (duplicates allowed); for all nodes, in ascending node ID.
            fanouts: per-layer neighbour fanouts for sampling evaluation
                (``fanouts[l-1]`` for layer ``l``; -1 = all), ``None`` for exact.
            seed: sampling seed (same seed → same samples).

        Returns:
            CPU tensor ``[len(targets) or N, d_out]``.
        """
        t0 = time.perf_counter()
        storage = None
        if targets is not None:
            ids = torch.as_tensor(targets, dtype=torch.long).reshape(-1)
            if ids.numel() == 0:
                raise ValueError("targets is empty")
            storage = self.graph.to_storage(ids)
            self._check_output_types(ids, storage)
        elif self.graph.num_nodes == 0:
            return self._empty_graph_output()
        elif fanouts is not None:
            storage = self.graph.sorted_external_order()
        plan = self.plan(storage, fanouts, seed)
        planning_s = time.perf_counter() - t0
        stats = RunStats(planning_s=planning_s)
        with self._lock:
            out = evaluate_plan(
                self._context(), plan, storage, stats, t0, show_progress=targets is None
            )
            self.last_stats = stats
        if targets is None:
            self._zero_other_types(out)
        return out

    @property
    def output_types(self) -> tuple[str, ...]:
        """Node types whose rows are the model's output (a dict model returning some types;
        empty: every node)."""
        return tuple(getattr(self.model, "output_types", ()))

    def _check_output_types(self, ids: Tensor, storage: Tensor) -> None:
        """Refuse targets of types the model does not output (naming the first IDs)."""
        types = self.graph.node_types
        if not self.output_types or not types:
            return
        layout = self.model.layout
        layout.bind(self.graph)  # this graph's type ranges (updates append runs)
        kinds = layout.types_of(torch.as_tensor(storage), len(storage), torch.device("cpu"))
        wanted = torch.tensor([layout.index(t) for t in self.output_types])
        bad = ~torch.isin(kinds, wanted)
        if bool(bad.any()):
            raise ValueError(
                f"the model outputs embeddings of node types {', '.join(self.output_types)} "
                f"only; {int(bad.sum())} target(s) are of other types (IDs "
                f"{ids[bad][:10].tolist()})"
            )

    def _zero_other_types(self, out: Tensor) -> None:
        """All rows (ascending ID): rows of types the model does not output are zero, not
        the intermediate values the homogeneous form leaves there."""
        if not self.output_types or not self.graph.node_types:
            return
        for t in self.graph.node_types:
            if t.name not in self.output_types:
                for first, count in t.ranges:
                    out[first : first + count] = 0

    def _empty_graph_output(self) -> Tensor:
        """All rows of a graph without nodes: the model's own forward on it (no layer has a
        row to batch, but the output still has the model's width)."""
        from hopserve.worker.trace.probe import call_model
        from hopserve.worker.trace.tracer import EDGE_COLUMNS

        edge = {}
        for arg, column in self.split.edge_args.items():
            values = getattr(self.graph, EDGE_COLUMNS[column])
            edge[arg] = served_edge_values(column, values[:0].to(self.device))
        x = self.graph.features[:0].to(self.device, torch.float32)
        ei = torch.zeros(2, 0, dtype=torch.long, device=self.device)
        with torch.no_grad():
            return call_model(self.model, self.split.style, x, ei, edge).cpu()

    def evaluate_plan(
        self, plan: Plan, storage_targets: Tensor | None, reuse: LayerReuse | None = None
    ) -> Tensor:
        """Run a precomputed plan (e.g. a front-end batch's union of targets).

        Args:
            plan: frontiers from the planner (or a worker's checked job).
            storage_targets: storage ids whose rows to return, in this order; ``None``
                for all nodes in ascending node-ID order (``plan`` must then be full).
            reuse: the layer cache's rows for the plan's reused nodes, and its capture
                hook (:meth:`~.layer_cache.LayerCache.reuse`).

        Raises:
            FrontierError: the plan lacks a row some layer reads (inconsistent frontiers).
        """
        stats = RunStats()
        with self._lock:
            ctx = self._context()
            ctx.reuse = reuse
            out = evaluate_plan(ctx, plan, storage_targets, stats, time.perf_counter())
            self.last_stats = stats
        if storage_targets is None:
            self._zero_other_types(out)
        return out

    def plan(
        self,
        storage_targets: Tensor | None,
        fanouts: Sequence[int] | None = None,
        seed: int = 0,
        reusable: Mapping[int, np.ndarray] | None = None,
    ) -> Plan:
        """Frontiers ``V^0 … V^L`` for storage-id targets (``None`` = all nodes, exact);
        ``reusable``: per layer, the nodes whose rows the layer cache holds (a mask)."""
        fanouts = validate_fanouts(fanouts, self.num_layers)
        if storage_targets is None and fanouts is None:
            return Plan([LayerFrontier(None)] * (self.num_layers + 1), None)
        if storage_targets is None:
            storage_targets = torch.arange(self.graph.num_nodes)
        return plan_frontiers(
            self.graph.topology,
            np.asarray(storage_targets, dtype=np.int64),
            self.num_layers,
            fanouts,
            seed,
            input_layer=self.reads_input_frontier,
            reusable=reusable,
        )

    def close(self) -> None:
        """Stop the prefetch thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ internals
    def _resident_graph(self) -> DeviceGraph | None:
        """The graph's device copy under the ``graph_on_device`` policy (re-uploaded when
        the store's version changed)."""
        dg = self._device_graph
        if dg is not None and dg.serves(self.graph):
            return dg
        self._device_graph = None  # free the stale copy before uploading the new one
        if DeviceGraph.wanted(self.graph, self.device, self.graph_on_device):
            self._device_graph = DeviceGraph.upload(self.graph, self.device)
        return self._device_graph

    def _context(self) -> RunContext:
        return RunContext(
            graph=self.graph,
            split=self.split,
            device=self.device,
            memory_budget_bytes=self.memory_budget_bytes,
            host_memory_budget_bytes=self.host_memory_budget_bytes,
            spill_dir=self.spill_dir,
            sizer_for=self._sizer,
            pool=self._pool,
            copy_stream=self._copy_stream,
            progress=self.progress,
            device_graph=self._resident_graph(),
            device_tier_fraction=self.device_tier_fraction,
        )

    def _sizer(self, block: ConvBlock, target_bytes: float) -> BatchSizer:
        """The block's batch sizer (it keeps learning across runs), aimed at ``target``."""
        sizer = self._sizers.get(block.index)
        if sizer is None:
            sizer = BatchSizer(
                target_bytes,
                max_nodes=float(self.init_batch_nodes),
                max_edges=float(self.init_batch_nodes) * max(1.0, self.graph.avg_degree),
            )
            self._sizers[block.index] = sizer
        sizer.target_bytes = target_bytes
        # A long-lived evaluator keeps learning; never past what any batch can hold.
        sizer.node_cap = float(max(1, self.graph.num_nodes))
        sizer.edge_cap = float(max(1, self.graph.num_edges))
        return sizer


def _width(conv: nn.Module, *attrs: str) -> int:
    for attr in attrs:
        value = getattr(conv, attr, 0)
        if isinstance(value, tuple | list):
            value = value[0]
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _out_width(conv: nn.Module) -> int:
    out = _width(conv, "out_channels", "_out_feats")
    heads = getattr(conv, "heads", getattr(conv, "_num_heads", 1))
    concat = getattr(conv, "concat", getattr(conv, "_num_heads", 1) > 1)
    if out and isinstance(heads, int) and heads > 1 and concat:
        out *= heads
    return out
