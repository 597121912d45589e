"""LayerwiseEvaluator: the user's model, split into ConvBlocks, run layer by layer.

Call order of :meth:`LayerwiseEvaluator.evaluate`::

    evaluate(targets, fanouts)
      ├─ graph.to_storage(targets)          external IDs → storage ids
      ├─ plan_frontiers                     V^L … V^0 (BFS, shortcut, or sampling)
      └─ for each ConvBlock (layer order):
            for each batch (consecutive rows, BatchSizer thresholds):
               prepare  [CPU thread, one batch ahead]: block + gathered inputs (→ device)
               compute  block.module(block, *inputs)
               write    outputs → layer storage (device / pinned host / disk memmap)
            free values no later block reads

Exactness: each block sees every in-edge of its destinations and the stored outputs of
earlier layers for every source row, so every row equals the full-graph forward.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import psutil
import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import Block, fresh_conv_caches
from hopserve.worker.convs.registry import NODEWISE_ADVICE
from hopserve.worker.engine.batch import build_block, row_positions
from hopserve.worker.engine.batching import BatchOutOfMemory, BatchSizer, PeakMemory, is_oom
from hopserve.worker.engine.plan import LayerFrontier, Plan, plan_frontiers
from hopserve.worker.engine.stats import EvalStats, LayerStats
from hopserve.worker.engine.storage import TierAllocator
from hopserve.worker.trace.blocks import (
    FEATURES,
    ConvBlock,
    FeatureWidthError,
    ModelSplit,
    split_model,
)
from hopserve.worker.trace.splitter import SRC
from hopserve.worker.trace.tracer import ModelTraceError

log = logging.getLogger(__name__)

DEFAULT_CPU_BUDGET = 256 * 2**20


def default_prefetch(device: torch.device) -> bool:
    """Whether to prefetch by default: on CUDA (copies overlap compute), not on CPU (the
    thread competes with compute for the same cores)."""
    return device.type == "cuda"


# CPU accounting: a block's destination-row temporaries (aggregates, linear outputs,
# activations) are estimated as this many times its output rows.
OUTPUT_FACTOR = 4


@dataclass
class _Prepared:
    start: int
    end: int
    block: Block
    inputs: list[Tensor]
    bytes_in: int  # accounted bytes known before compute
    event: object = None  # CUDA event marking the end of the H2D copy


class LayerwiseEvaluator:
    """Exact full, partial and sampling evaluation of a GNN model (DGI).

    Args:
        model: the user's unmodified training model (``forward(x, edge_index)``).
        graph: a :class:`~hopserve.worker.graph.GraphStore`.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, …
        memory_budget_bytes: CPU per-batch byte budget (GPU: 90% of free memory).
        host_memory_budget_bytes: host bytes for intermediate embeddings before spilling
            to disk (default: half of available RAM).
        spill_dir: directory for disk-tier memmaps (default: system temp).
        prefetch: prepare the next batch on a CPU thread while the current one computes
            (default: on for CUDA devices; on CPU the thread competes with compute).
        progress: show a progress bar for full evaluation (default: when on a TTY).
        init_batch_nodes: initial node threshold; the edge threshold starts at
            ``init_batch_nodes × avg degree``.
        self_check: compare layer-wise and full-graph results on a probe graph at load.
        fallback: ``"error"`` to refuse models that cannot be split, ``"nodewise"`` to
            serve them with the slow but exact :class:`NodewiseEvaluator`.
        hops: receptive field for the node-wise fallback when it cannot be inferred.
    """

    def __init__(
        self,
        model: nn.Module,
        graph,
        device: str | torch.device = "cpu",
        *,
        memory_budget_bytes: int = DEFAULT_CPU_BUDGET,
        host_memory_budget_bytes: int | None = None,
        spill_dir: str | None = None,
        prefetch: bool | None = None,
        progress: bool | None = None,
        init_batch_nodes: int = 4096,
        self_check: bool = True,
        fallback: str = "error",
        hops: int | None = None,
    ) -> None:
        if fallback not in ("error", "nodewise"):
            raise ValueError(f"fallback must be 'error' or 'nodewise', got {fallback!r}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.graph = graph
        self.model = model.eval().to(self.device)
        self.memory_budget_bytes = int(memory_budget_bytes)
        self.host_memory_budget_bytes = int(
            host_memory_budget_bytes
            if host_memory_budget_bytes is not None
            else psutil.virtual_memory().available // 2
        )
        self.spill_dir = spill_dir
        self.prefetch = default_prefetch(self.device) if prefetch is None else bool(prefetch)
        self.progress = progress
        self.init_batch_nodes = init_batch_nodes
        self.last_stats: EvalStats | None = None
        self._lock = threading.Lock()
        self._sizers: dict[int, BatchSizer] = {}
        self._max_growth = 2.0
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="hopserve-prep") if self.prefetch else None
        )
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._nodewise = None
        try:
            self.split: ModelSplit | None = split_model(model, graph.feature_dim)
            if self_check:
                self._self_check()
        except ModelTraceError as err:
            if fallback == "error" or isinstance(err, FeatureWidthError):
                raise
            from hopserve.worker.engine.nodewise import NodewiseEvaluator

            log.warning("layer-wise split refused (%s); serving node-wise (exact, slow)", err)
            self.split = None
            self._nodewise = NodewiseEvaluator(model, graph, self.device, hops=hops)

    # ------------------------------------------------------------------ properties
    @property
    def mode(self) -> str:
        """``"layerwise"`` or ``"nodewise"`` (fallback)."""
        return "layerwise" if self.split is not None else "nodewise"

    @property
    def reads_input_frontier(self) -> bool:
        """Whether plans need ``V^0`` (only a node-wise block 0 reads it)."""
        return self.split is None or any(b.index == 0 for b in self.split.blocks)

    @property
    def num_layers(self) -> int:
        return self.split.num_layers if self.split is not None else self._nodewise.hops

    def describe(self) -> str:
        return self.split.describe() if self.split is not None else "node-wise fallback"

    # ------------------------------------------------------------------ public API
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
        with self._lock:
            if self._nodewise is not None:
                if fanouts is not None:
                    raise ValueError("sampling evaluation is not available in node-wise mode")
                out = self._nodewise.evaluate(targets)
                self.last_stats = self._nodewise.last_stats
                return out
            return self._evaluate(targets, fanouts, seed)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ internals
    def _validate_fanouts(self, fanouts: Sequence[int] | None) -> list[int] | None:
        if fanouts is None:
            return None
        fanouts = [int(f) for f in fanouts]
        if len(fanouts) != self.num_layers:
            raise ValueError(
                f"fanouts {fanouts} has {len(fanouts)} entries; the model has "
                f"{self.num_layers} layers"
            )
        bad = [f for f in fanouts if f < -1]
        if bad:
            raise ValueError(f"fanout {bad[0]} is invalid: use -1 (all) or a count >= 0")
        return fanouts

    def evaluate_plan(self, plan: Plan, storage_targets: Tensor | None) -> Tensor:
        """Run a precomputed plan (e.g. a front-end batch's union of targets).

        Args:
            plan: frontiers from :func:`~hopserve.worker.engine.plan.plan_frontiers`.
            storage_targets: storage ids whose rows to return, in this order; ``None``
                for all nodes in ascending node-ID order (``plan`` must then be full).
        """
        with self._lock:
            if self._nodewise is not None:  # exact only; the plan's frontiers are not needed
                if plan.fanouts is not None:
                    raise ValueError("sampling evaluation is not available in node-wise mode")
                if storage_targets is None:
                    storage_targets = self.graph.sorted_external_order()
                out = self._nodewise.evaluate_storage_ids(storage_targets)
                self.last_stats = self._nodewise.last_stats
                return out
            return self._execute(plan, storage_targets, EvalStats(), time.perf_counter())

    def plan(
        self, storage_targets: Tensor | None, fanouts: Sequence[int] | None = None, seed: int = 0
    ) -> Plan:
        """Frontiers ``V^0 … V^L`` for storage-id targets (``None`` = all nodes, exact)."""
        fanouts = self._validate_fanouts(fanouts)
        if storage_targets is None and fanouts is None:
            return Plan([LayerFrontier(None)] * (self.num_layers + 1), None)
        if storage_targets is None:
            storage_targets = torch.arange(self.graph.num_nodes)
        return plan_frontiers(
            self.graph,
            storage_targets,
            self.num_layers,
            fanouts,
            seed,
            input_layer=self.reads_input_frontier,
        )

    def _evaluate(self, targets, fanouts, seed) -> Tensor:
        t0 = time.perf_counter()
        stats = EvalStats()
        storage_targets = None
        if targets is not None:
            ids = torch.as_tensor(targets, dtype=torch.long).reshape(-1)
            if ids.numel() == 0:
                raise ValueError("targets is empty")
            storage_targets = self.graph.to_storage(ids)
        elif fanouts is not None:
            storage_targets = self.graph.sorted_external_order()
        plan = self.plan(storage_targets, fanouts, seed)
        stats.planning_s = time.perf_counter() - t0
        return self._execute(plan, storage_targets, stats, t0)

    def _execute(
        self, plan: Plan, storage_targets: Tensor | None, stats: EvalStats, t0: float
    ) -> Tensor:
        graph = self.graph
        for adapter in self.split.adapters.values():
            adapter.prepare(graph)
        stats.frontier_sizes = plan.sizes(graph.num_nodes)
        # Full evaluation: the last layer writes rows straight into node-ID order.
        scatter = None
        if storage_targets is None and graph.node_ids is not None:
            order = graph.sorted_external_order()
            scatter = torch.empty_like(order)
            scatter[order] = torch.arange(order.numel())
        final, final_rows = self._run_blocks(
            plan, stats, show_progress=storage_targets is None, final_positions=scatter
        )
        t1 = time.perf_counter()
        if storage_targets is None:
            out = final
        else:
            pos = row_positions(final_rows, storage_targets)
            out = final.index_select(0, pos.to(final.device))
        out = out.cpu() if out.device.type != "cpu" else out
        stats.write_out_s += time.perf_counter() - t1
        stats.total_s = time.perf_counter() - t0
        self.last_stats = stats
        return out

    def _sizer(self, block: ConvBlock, target_bytes: float) -> BatchSizer:
        sizer = self._sizers.get(block.index)
        if sizer is None:
            sizer = BatchSizer(
                target_bytes,
                max_nodes=float(self.init_batch_nodes),
                max_edges=float(self.init_batch_nodes) * max(1.0, self.graph.avg_degree),
                max_growth=self._max_growth,
            )
            self._sizers[block.index] = sizer
        sizer.target_bytes = target_bytes
        # A long-lived evaluator keeps learning; never past what any batch can hold.
        sizer.node_cap = float(max(1, self.graph.num_nodes))
        sizer.edge_cap = float(max(1, self.graph.num_edges))
        return sizer

    def _run_blocks(
        self,
        plan: Plan,
        stats: EvalStats,
        show_progress: bool,
        final_positions: Tensor | None = None,
    ):
        graph = self.graph
        n = graph.num_nodes
        split = self.split
        allocator = TierAllocator(self.device, self.host_memory_budget_bytes, self.spill_dir)
        stored: dict[str, tuple[Tensor, Tensor | None]] = {}
        peak = PeakMemory(self.device)
        bar = None
        if show_progress and self.progress is not False:
            import sys

            from tqdm.auto import tqdm

            total = sum(plan.layers[b.index].size(n) for b in split.blocks)
            disable = not sys.stderr.isatty() if self.progress is None else False
            bar = tqdm(total=total, unit="row", desc="layer-wise", disable=disable)
        try:
            for block in split.blocks:
                frontier = plan.layers[block.index]
                rows = frontier.nodes
                count = frontier.size(n)
                lstats = LayerStats(layer=block.index, rows=count)
                stats.layers.append(lstats)
                if block.index == 0:
                    degrees = torch.zeros(count, dtype=torch.long)
                elif frontier.sampled:
                    degrees = frontier.indptr[1:] - frontier.indptr[:-1]
                elif rows is None:
                    degrees = graph.in_degrees
                else:
                    degrees = graph.in_degrees[rows]
                cum = torch.zeros(count + 1, dtype=torch.long)
                torch.cumsum(degrees, 0, out=cum[1:])
                sizer = self._sizer(block, peak.target(self.memory_budget_bytes))
                outputs: dict[str, Tensor] = {}
                positions = {split.output: final_positions} if final_positions is not None else {}
                self._run_block(
                    block,
                    frontier,
                    cum,
                    sizer,
                    stored,
                    outputs,
                    allocator,
                    peak,
                    stats,
                    lstats,
                    bar,
                    positions,
                )
                if self.device.type == "cuda":
                    # Pinned write-outs are async; the next layer's prefetch reads them.
                    torch.cuda.synchronize(self.device)
                for name, t in outputs.items():
                    stored[name] = (t, rows)
                for name in list(stored):
                    if split.last_use.get(name, -1) <= block.index and name != split.output:
                        allocator.release(name, stored[name][0])
                        del stored[name]
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            stats.tiers = dict(allocator.tiers)
            return stored[split.output]
        finally:
            if bar is not None:
                bar.close()
            allocator.close()

    def _gather_free(self, block: ConvBlock, stored: dict) -> bool:
        """Whether every source-row input can be handed over whole (no per-batch gather).

        Needs: only convs read it over source rows and each adapter accepts global
        sources, and the value is stored for all nodes (indexed by storage id) on the
        compute device.
        """
        specs = [s for s in block.inputs if s.rows == SRC]
        if not specs or block.index == 0:
            return False
        for spec in specs:
            if spec.src_convs is None or not all(
                self.split.adapters[c].supports_global_src for c in spec.src_convs
            ):
                return False
            if spec.producer == FEATURES:
                table, rows = self.graph.features, None
            else:
                table, rows = stored[spec.name]
            if rows is not None or table.device != self.device or table.dtype != torch.float32:
                return False
        return True

    def _prepare(
        self,
        block: ConvBlock,
        frontier: LayerFrontier,
        start: int,
        end: int,
        stored: dict[str, tuple[Tensor, Tensor | None]],
        gather_free: bool = False,
    ) -> _Prepared:
        blk = build_block(self.graph, frontier, start, end, block.index, global_src=gather_free)
        inputs, nbytes = [], 0
        for spec in block.inputs:
            if gather_free and spec.rows == SRC:  # the whole node table, no copy
                table = self.graph.features if spec.producer == FEATURES else stored[spec.name][0]
                inputs.append(table)
                continue
            ids = blk.src_nodes if spec.rows == SRC else blk.dst_nodes
            if spec.producer == FEATURES:
                t = self.graph.features.index_select(0, ids)
                if t.dtype == torch.float16:
                    t = t.float()
            else:
                tensor, rows = stored[spec.name]
                pos = row_positions(rows, ids)
                t = tensor.index_select(0, pos.to(tensor.device))
            nbytes += t.numel() * t.element_size()
            inputs.append(t)
        src_row_bytes = sum(
            t[0].numel() * t.element_size()
            for t, spec in zip(inputs, block.inputs, strict=True)
            if spec.rows == SRC and t.shape[0]
        )
        if gather_free:
            src_row_bytes = 0  # nothing gathered; fused SpMM reads the table in place
        per_edge = max(
            (self.split.adapters[c].edge_bytes(src_row_bytes) for c in block.convs), default=0
        )
        nbytes += blk.num_edges * (24 + per_edge)  # local index tensors + conv per-edge bytes
        prepared = _Prepared(start, end, blk, inputs, nbytes)
        if self.device.type == "cuda":
            with torch.cuda.stream(self._copy_stream):
                prepared.block = blk.to(self.device, non_blocking=True)
                prepared.inputs = [
                    t
                    if t.device == self.device
                    else t.pin_memory().to(self.device, non_blocking=True)
                    for t in inputs
                ]
                ev = torch.cuda.Event()
                ev.record(self._copy_stream)
                prepared.event = ev
        return prepared

    def _run_block(
        self,
        block,
        frontier,
        cum,
        sizer,
        stored,
        outputs,
        allocator,
        peak,
        stats,
        lstats,
        bar,
        positions: dict[str, Tensor],
    ) -> None:
        """Run one block over all its rows; ``positions`` remaps output rows by value."""
        count = cum.numel() - 1
        pool = self._pool
        gather_free = self._gather_free(block, stored)
        lstats.gather_free = gather_free

        def submit(start: int) -> Future | functools.partial:
            """Prepare rows from ``start`` now on the prefetch thread, or lazily."""
            end = sizer.next_end(cum, start)
            if pool is None:
                return functools.partial(
                    self._prepare, block, frontier, start, end, stored, gather_free
                )
            return pool.submit(self._prepare, block, frontier, start, end, stored, gather_free)

        def result(job: Future | functools.partial) -> _Prepared:
            return job.result() if isinstance(job, Future) else job()

        start = 0
        out_row_bytes = 0  # learned from the first batch's outputs
        t = time.perf_counter()
        job = submit(0) if count else None
        while start < count:
            prepared = result(job)
            stats.prepare_s += time.perf_counter() - t
            nxt = submit(prepared.end) if prepared.end < count else None
            try:
                t = time.perf_counter()
                if prepared.event is not None:
                    torch.cuda.current_stream(self.device).wait_event(prepared.event)
                    compute_stream = torch.cuda.current_stream(self.device)
                    blk = prepared.block
                    for x in (
                        *prepared.inputs,
                        blk.src_nodes,
                        blk.indptr,
                        blk.src_index,
                        blk.edge_ids,
                    ):
                        x.record_stream(compute_stream)
                stats.transfer_s += time.perf_counter() - t
                num_dst = prepared.end - prepared.start
                predicted = prepared.bytes_in + OUTPUT_FACTOR * out_row_bytes * num_dst
                if (
                    self.device.type != "cuda"
                    and num_dst > 1
                    and predicted > self.memory_budget_bytes
                ):
                    raise BatchOutOfMemory(
                        f"batch of {num_dst} rows needs ~{predicted} bytes "
                        f"> budget {self.memory_budget_bytes}"
                    )
                t = time.perf_counter()
                peak.start()
                with torch.no_grad():
                    outs = block.module(prepared.block, *prepared.inputs)
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
                dt = time.perf_counter() - t
                stats.compute_s += dt
                lstats.compute_s += dt
            except Exception as err:
                if not is_oom(err) or num_dst <= 1:
                    if isinstance(nxt, Future):
                        nxt.cancel()
                    raise
                lstats.oom_retries += 1
                log.info("layer %d: batch of %d rows out of memory; halving", block.index, num_dst)
                del prepared
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                sizer.halve()
                if isinstance(nxt, Future):
                    nxt.result()  # let the prefetch finish, then drop it
                t = time.perf_counter()
                job = submit(start)
                continue
            t = time.perf_counter()
            out_bytes = 0
            for name, out in zip(block.outputs, outs, strict=True):
                if name not in outputs:
                    outputs[name] = allocator.allocate(name, (count, *out.shape[1:]), out.dtype)
                dest = outputs[name]
                if name in positions:
                    rows_out = positions[name][prepared.start : prepared.end]
                    dest.index_copy_(0, rows_out.to(dest.device), out.to(dest.device))
                else:
                    dest[prepared.start : prepared.end].copy_(
                        out, non_blocking=dest.device.type == "cpu" and dest.is_pinned()
                    )
                out_bytes += out.numel() * out.element_size()
            stats.write_out_s += time.perf_counter() - t
            out_row_bytes = out_bytes // max(1, num_dst)
            used = peak.stop(prepared.bytes_in + OUTPUT_FACTOR * out_bytes)
            sizer.observe(used)
            lstats.peak_bytes = max(lstats.peak_bytes, used)
            lstats.batches += 1
            lstats.input_nodes += prepared.block.num_dst if gather_free else prepared.block.num_src
            lstats.edges += prepared.block.num_edges
            if bar is not None:
                bar.update(num_dst)
            start = prepared.end
            job = nxt
            t = time.perf_counter()

    def _self_check(self) -> None:
        """Layer-wise vs the model's own forward on a probe graph; refuse on mismatch.

        Runs with tiny fixed batches (so an op that mixes nodes across a batch shows up)
        for all nodes and for a partial target set.
        """
        from hopserve.worker.graph.store import GraphStore
        from hopserve.worker.trace.blocks import call_model, probe_edge_index

        ei, n = probe_edge_index(self.model, self.split.style)
        gen = torch.Generator().manual_seed(11)
        x = torch.randn(n, self.graph.feature_dim, generator=gen)
        probe = GraphStore.from_edge_index(ei, x, reorder=None)
        with torch.no_grad(), fresh_conv_caches(self.model):
            expected = call_model(
                self.model, self.split.style, x.to(self.device), ei.to(self.device)
            ).cpu()
        targets = torch.tensor([n - 1, 0, 5, 5, n // 2])
        saved = (self.graph, self._sizers, self.progress, self.init_batch_nodes, self._max_growth)
        self.graph, self._sizers, self.progress = probe, {}, False
        self.init_batch_nodes, self._max_growth = 6, 1.0
        try:
            got_all = self._evaluate(None, None, 0)
            got_part = self._evaluate(targets, None, 0)
        finally:
            (self.graph, self._sizers, self.progress, self.init_batch_nodes, self._max_growth) = (
                saved
            )
            for adapter in self.split.adapters.values():
                adapter.prepare(self.graph)
        for got, want in ((got_all, expected), (got_part, expected[targets])):
            if got.shape != want.shape or not torch.allclose(got, want, atol=1e-4, rtol=1e-3):
                err = (got - want).abs().max().item() if got.shape == want.shape else "shape"
                raise ModelTraceError(
                    "layer-wise evaluation differs from the model's own forward on a probe "
                    f"graph (max abs error {err}); an op outside the convs likely mixes "
                    "nodes (e.g. a reduction or softmax over dim 0, graph-level "
                    f"normalization). {NODEWISE_ADVICE}. "
                    f"Schema:\n{self.split.describe()}"
                )
