"""One layer-wise evaluation: its state and the loop over ConvBlocks and their batches.

Call order of :meth:`LayerwiseRun.execute` (DGI Algorithm 2 with §3.3's frontiers)::

    for each ConvBlock (layer order):
        for each batch (consecutive rows of V^l, BatchSizer thresholds):
            prepare  [prefetch thread, one batch ahead]: block + inputs (→ device)
            compute  block.module(block, *inputs); out-of-memory → shrink, redo
            write    outputs → layer storage (device / pinned host / disk memmap)
        free the values no later block reads

A run owns everything that lives for one evaluation (the plan, the stored values and
their tiers, the stats, the progress bar); the evaluator owns what outlives it (the
split, the batch sizers that keep learning, the prefetch thread).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hopserve.proto.contract import LayerStats, RunStats
from hopserve.worker.convs.base import ConvAdapter, LayerBatch
from hopserve.worker.convs.layer_table import stand_in
from hopserve.worker.engine.batch import PreparedBatch, prepare
from hopserve.worker.engine.batching import BatchOutOfMemory, BatchSizer, PeakMemory, is_oom
from hopserve.worker.engine.device_graph import DeviceGraph
from hopserve.worker.engine.layer_cache import LayerReuse
from hopserve.worker.engine.storage import TierAllocator
from hopserve.worker.graph.planner import LayerFrontier, Plan
from hopserve.worker.trace.blocks import FEATURES, ConvBlock, ModelSplit
from hopserve.worker.trace.splitter import SRC

__all__ = ["OUTPUT_FACTOR", "LayerwiseRun", "RunContext"]

log = logging.getLogger(__name__)

OUTPUT_FACTOR = 4
"""CPU accounting: a block's destination-row temporaries (aggregates, linear outputs,
activations) are estimated as this many times its output rows."""


@dataclass
class RunContext:
    """What a run borrows from its evaluator (it outlives the run)."""

    graph: object  # GraphStore
    split: ModelSplit
    device: torch.device
    memory_budget_bytes: int | None
    host_memory_budget_bytes: int
    spill_dir: str | None
    sizer_for: object  # (ConvBlock, target bytes) -> BatchSizer
    pool: ThreadPoolExecutor | None  # prefetch thread, or None
    copy_stream: torch.cuda.Stream | None
    progress: bool | None
    device_graph: DeviceGraph | None = None  # the graph's device copy, when resident
    device_tier_fraction: float = 0.5
    reuse: LayerReuse | None = None  # cached layer rows this run reuses and keeps

    @property
    def resident(self) -> DeviceGraph | None:
        """The device copy of *this* run's graph, or ``None`` (e.g. a self-check's probe)."""
        dg = self.device_graph
        return dg if dg is not None and dg.serves(self.graph) else None


class LayerwiseRun:
    """Runs ``plan`` over every ConvBlock once; :meth:`execute` returns the model output.

    Args:
        ctx: The evaluator's long-lived parts.
        plan: Frontiers ``V^0 … V^L`` (numpy, from the planner or a checked job).
        stats: Where timings and counters go (``planning_s`` already set by the caller).
        final_order: For full evaluation of a graph with external IDs: the storage node
            of each output row (the last layer then writes in external-ID order).
    """

    def __init__(
        self,
        ctx: RunContext,
        plan: Plan,
        stats: RunStats,
        *,
        final_order: Tensor | None = None,
        show_progress: bool = False,
    ) -> None:
        self.ctx = ctx
        self.plan = plan
        self.stats = stats
        self.final_order = final_order
        self._final_positions: Tensor | None = None  # its inverse, made when a scatter needs it
        self._final_storage_order = False  # the final output awaits its gather (_order_final)
        self.show_progress = show_progress
        self.allocator = TierAllocator(
            ctx.device,
            ctx.host_memory_budget_bytes,
            ctx.spill_dir,
            device_fraction=ctx.device_tier_fraction,
        )
        self.stored: dict[str, tuple[Tensor, Tensor | None]] = {}  # name -> (rows, their ids)
        self._freed: set[str] = set()  # inputs freed behind their source tables
        self._whole_batches: dict[bool, LayerBatch] = {}  # full layers' one-batch blocks
        self.peak = PeakMemory(ctx.device)

    # ------------------------------------------------------------------ blocks
    def execute(self) -> tuple[Tensor, Tensor | None]:
        """Every block in order; the model output and its rows (``None`` = all nodes)."""
        ctx, n = self.ctx, self.ctx.graph.num_nodes
        split = ctx.split
        for adapter in split.adapters.values():
            adapter.prepare(ctx.graph)
        self.stats.frontier_sizes = self.plan.sizes(n)
        bar = self._progress_bar()
        try:
            for block in split.blocks:
                self._run_block(block, bar)
                if ctx.device.type == "cuda":
                    # Pinned write-outs are async; the next layer's prefetch reads them.
                    torch.cuda.synchronize(ctx.device)
                for name in list(self.stored):
                    if split.last_use.get(name, -1) <= block.index and name != split.output:
                        self._release(name)
            self._order_final()
            self.stats.tiers = dict(self.allocator.tiers)
            return self.stored[split.output]
        finally:
            if bar is not None:
                bar.close()
            self.allocator.close()

    def _release(self, name: str) -> None:
        """Drop a stored value (no reference to it outlives this call: a local would keep
        a layer's rows alive through the next layer)."""
        if name in self._freed:  # a freed input's account was settled when it was freed
            del self.stored[name]
        else:
            self.allocator.release(name, self.stored.pop(name)[0])

    def _progress_bar(self):  # noqa: ANN202 - tqdm or None
        if not self.show_progress or self.ctx.progress is False:
            return None
        from tqdm.auto import tqdm

        n = self.ctx.graph.num_nodes
        total = sum(self.plan.layers[b.index].size(n) for b in self.ctx.split.blocks)
        disable = not sys.stderr.isatty() if self.ctx.progress is None else False
        return tqdm(total=total, unit="row", desc="layer-wise", disable=disable)

    def _run_block(self, block: ConvBlock, bar) -> None:  # noqa: ANN001 - tqdm or None
        ctx = self.ctx
        graph = ctx.graph
        layer = self.plan.layers[block.index]
        frontier = layer.computed()  # without the rows the layer cache supplies
        stored_rows = None if layer.nodes is None else torch.from_numpy(layer.nodes)
        rows = None if frontier.nodes is None else torch.from_numpy(frontier.nodes)
        count = frontier.size(graph.num_nodes)
        reused = 0 if layer.reused is None else int(layer.reused.size)
        lstats = LayerStats(layer=block.index, rows=count, reused_rows=reused)
        self.stats.layers.append(lstats)
        outputs: dict[str, Tensor] = {}
        positions: dict[str, Tensor] = {}  # output rows by value (the final order aside)
        if reused:  # computed rows go between the reused ones: V^l keeps its order
            at = torch.from_numpy(np.searchsorted(layer.nodes, frontier.nodes))
            positions = dict.fromkeys(block.outputs, at)
        if count:
            self._compute_rows(
                block, frontier, rows, count, outputs, positions, lstats, bar, reused
            )
        if reused:
            self._inject(block, layer, outputs)
        for name, t in outputs.items():
            self.stored[name] = (t, stored_rows)
        reuse = ctx.reuse
        if reuse is not None and reuse.capture is not None and outputs:
            reuse.capture(block.index, layer.nodes, frontier.nodes if reused else None, outputs)

    def _inject(self, block: ConvBlock, layer: LayerFrontier, outputs: dict[str, Tensor]) -> None:
        """Write the layer cache's rows of ``layer.reused`` into the block's outputs."""
        t = time.perf_counter()
        cached = self.ctx.reuse.rows[block.index]
        at = torch.from_numpy(np.searchsorted(layer.nodes, layer.reused))
        total = int(layer.nodes.size)
        for name in block.outputs:
            rows = cached.get(name)
            if rows is None:
                continue  # a value no later block reads (released right after this block)
            if name not in outputs:
                outputs[name] = self.allocator.allocate(name, (total, *rows.shape[1:]), rows.dtype)
            dest = outputs[name]
            dest.index_copy_(0, at.to(dest.device), rows.to(dest.device, dest.dtype))
        self.stats.write_out_s += time.perf_counter() - t

    def _compute_rows(
        self,
        block: ConvBlock,
        frontier: LayerFrontier,
        rows: Tensor | None,
        count: int,
        outputs: dict[str, Tensor],
        positions: dict[str, Tensor],
        lstats: LayerStats,
        bar,  # noqa: ANN001 - tqdm or None
        reused: int,
    ) -> None:
        """Run ``block`` over the ``count`` rows of ``frontier`` in batches."""
        ctx, graph = self.ctx, self.ctx.graph
        if block.index == 0:
            degrees = torch.zeros(count, dtype=torch.long)
        elif frontier.sampled:
            degrees = torch.from_numpy(frontier.indptr[1:] - frontier.indptr[:-1])
        elif rows is None:
            degrees = graph.in_degrees
        else:
            degrees = graph.in_degrees[rows]
        cum = torch.zeros(count + 1, dtype=torch.long)
        torch.cumsum(degrees, 0, out=cum[1:])
        gather_free = self._gather_free(block)
        lstats.gather_free = gather_free
        holders: list[ConvAdapter] = []  # adapters holding a table derived up front
        try:
            if gather_free and rows is None and not frontier.sampled:
                self._derive_source_tables(block, lstats, holders)
            # After the tables: a device's memory target sees what they hold
            target = self.peak.target(ctx.memory_budget_bytes)
            sizer: BatchSizer = ctx.sizer_for(block, target)
            self._batches(
                block, frontier, cum, sizer, outputs, positions, gather_free, lstats, bar,
                out_rows=count + reused,
            )  # fmt: skip
        finally:
            if gather_free and rows is None and not frontier.sampled:
                # every table made for this layer goes with it (also one made by a batch)
                holders.extend(ctx.split.adapters[c] for c in block.convs)
            for adapter in dict.fromkeys(holders):
                adapter.drop_full_layer_table()

    def _derive_source_tables(
        self, block: ConvBlock, lstats: LayerStats, holders: list[ConvAdapter]
    ) -> None:
        """Derive up front the source tables of a full layer's inputs that its convs read
        only through them, and free those inputs that no later block reads.

        An input read by this block through convs only, each of which can derive its
        source table up front and then read nothing else of it (GAT: the projected heads
        and their logits; DGL GraphConv: ``c_out ⊙ x``):

        * a value no later block reads: the tables are derived now, the input is freed and
          the batches get a :func:`stand_in`. Peak: input + tables while deriving, then
          tables + output, instead of all three at once;
        * the graph's features (which stay): the tables are derived now, keyed by the
          features themselves. An adapter whose table is as wide as its input makes it
          only when derived up front (:meth:`ConvAdapter.derive_full_layer_table`), never
          beside an input that later blocks keep.
        """
        ctx, split = self.ctx, self.ctx.split
        for spec in block.inputs:
            features = spec.producer == FEATURES  # the graph's own table stays
            if (
                spec.rows != SRC
                or spec.read_on_dst
                or not spec.src_convs
                or spec.name == split.output
                or (not features and split.last_use.get(spec.name, -1) > block.index)
                # a conv also called on another value holds one table per layer
                or any(block.convs.count(c) != spec.src_convs.count(c) for c in spec.src_convs)
            ):
                continue
            adapters = [split.adapters[c] for c in spec.src_convs]
            if not all(a.full_layer_table_only for a in adapters):
                continue
            if features:
                resident = ctx.resident
                x = resident.features if resident is not None else ctx.graph.features
                key = x
            else:
                x, rows = self.stored[spec.name]
                key = stand_in(x)
            for adapter in adapters:
                holders.append(adapter)
                with torch.no_grad():
                    adapter.derive_full_layer_table(x, key, block.index)
            if features:
                continue
            self.stored[spec.name] = (key, rows)
            self.allocator.release(spec.name, x)  # the block's outputs may take its place
            self._freed.add(spec.name)
            del x
            lstats.freed_inputs += 1

    def _gather_free(self, block: ConvBlock) -> bool:
        """Whether every source-row input can be handed over whole (no per-batch gather).

        Needs: only convs read it over source rows and each adapter accepts global
        sources (some on full layers only), the value is stored for all nodes (indexed
        by storage id) on the compute device, and the block writes into none of its
        inputs (:attr:`~hopserve.worker.trace.blocks.ConvBlock.writes_in_place`: a batch
        would change rows the next batch's convs read, or the graph's features).
        """
        specs = [s for s in block.inputs if s.rows == SRC]
        if not specs or block.index == 0 or block.writes_in_place:
            return False
        adapters = self.ctx.split.adapters
        full = self.plan.layers[block.index].nodes is None  # every node a destination
        for spec in specs:
            if spec.src_convs is None or not all(
                adapters[c].supports_global_src
                and (full or not adapters[c].global_src_full_layers_only)
                for c in spec.src_convs
            ):
                return False
            if spec.producer == FEATURES:
                resident = self.ctx.resident
                table = resident.features if resident is not None else self.ctx.graph.features
                rows = None
            else:
                table, rows = self.stored[spec.name]
            if rows is not None or table.device != self.ctx.device or table.dtype != torch.float32:
                return False
        return True

    # ------------------------------------------------------------------ batches
    def _batches(
        self,
        block: ConvBlock,
        frontier: LayerFrontier,
        cum: Tensor,
        sizer: BatchSizer,
        outputs: dict[str, Tensor],
        positions: dict[str, Tensor],
        gather_free: bool,
        lstats: LayerStats,
        bar,  # noqa: ANN001 - tqdm or None
        out_rows: int,
    ) -> None:
        """Run ``block`` over all its rows into outputs of ``out_rows`` rows;
        ``positions`` remaps output rows by value."""
        ctx, stats = self.ctx, self.stats
        count = cum.numel() - 1
        prep = functools.partial(
            prepare,
            ctx.graph,
            ctx.split,
            block,
            frontier,
            stored=self.stored,
            whole_batches=self._whole_batches,
            gather_free=gather_free,
            device=ctx.device,
            copy_stream=ctx.copy_stream,
            resident=ctx.resident,
        )

        def submit(start: int) -> tuple[Future | functools.partial, int]:
            """Prepare rows from ``start`` now on the prefetch thread, or lazily; the job
            and its row count."""
            end = sizer.next_end(cum, start)
            if ctx.pool is None:
                return functools.partial(prep, start, end), end - start
            return ctx.pool.submit(prep, start, end), end - start

        def result(job: Future | functools.partial) -> PreparedBatch:
            return job.result() if isinstance(job, Future) else job()

        def shrink(rows: int, where: str, err: BaseException, edges: int = 0) -> None:
            """Out of memory (preparing or computing ``rows`` rows): shrink, free, redo
            (a CPU batch over its budget is resized to fit; a real OOM halves)."""
            lstats.oom_halvings += 1
            log.info(
                "layer %d: batch of %d rows out of memory %s: %s", block.index, rows, where, err
            )
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            predicted = getattr(err, "predicted", None)
            if predicted is not None:
                sizer.fit(predicted, rows, edges)
            else:
                sizer.halve()

        start = 0
        out_row_bytes = sizer.out_row_bytes  # learned from a batch's outputs
        t = time.perf_counter()
        job, rows = submit(0) if count else (None, 0)
        while start < count:
            try:
                prepared = result(job)
            except Exception as err:  # gathering on the device can run out of memory too
                if not is_oom(err) or rows <= 1:
                    raise
                del job
                shrink(rows, "while preparing", err)
                job, rows = submit(start)
                continue
            stats.prepare_s += time.perf_counter() - t
            nxt, nxt_rows = submit(prepared.end) if prepared.end < count else (None, 0)
            num_dst = prepared.end - prepared.start
            try:
                outs = self._compute(block, prepared, out_row_bytes, lstats)
            except Exception as err:
                if not is_oom(err) or num_dst <= 1:
                    if isinstance(nxt, Future):
                        nxt.cancel()
                    raise
                edges = prepared.batch.num_edges
                del prepared
                if isinstance(nxt, Future):  # let the prefetch finish (or fail), then drop it
                    with contextlib.suppress(Exception):
                        nxt.result()
                del nxt
                shrink(num_dst, "while computing", err, edges)
                t = time.perf_counter()
                job, rows = submit(start)
                continue
            out_bytes = self._write(block, prepared, outs, outputs, positions, out_rows)
            out_row_bytes = sizer.out_row_bytes = out_bytes // max(1, num_dst)
            used = self.peak.stop(prepared.bytes_in + OUTPUT_FACTOR * out_bytes)
            sizer.observe(used, at_thresholds=prepared.end < count)
            lstats.peak_bytes = max(lstats.peak_bytes, used)
            lstats.batches += 1
            lstats.input_nodes += prepared.batch.num_dst if gather_free else prepared.batch.num_src
            lstats.edges += prepared.batch.num_edges
            if bar is not None:
                bar.update(num_dst)
            start = prepared.end
            job, rows = nxt, nxt_rows
            t = time.perf_counter()

    def _compute(
        self, block: ConvBlock, prepared: PreparedBatch, out_row_bytes: int, lstats: LayerStats
    ) -> tuple[Tensor, ...]:
        """Wait for the batch's copies, check the CPU budget, run the block module."""
        ctx, stats = self.ctx, self.stats
        t = time.perf_counter()
        if prepared.event is not None:
            stream = torch.cuda.current_stream(ctx.device)
            stream.wait_event(prepared.event)
            batch = prepared.batch
            for x in (
                *prepared.inputs,
                batch.src_nodes,
                batch.indptr,
                batch.src_index,
                batch.edge_ids,
            ):
                x.record_stream(stream)
        stats.transfer_s += time.perf_counter() - t
        num_dst = prepared.end - prepared.start
        predicted = prepared.bytes_in + OUTPUT_FACTOR * out_row_bytes * num_dst
        budget = self.peak.budget(ctx.memory_budget_bytes)
        if ctx.device.type != "cuda" and num_dst > 1 and predicted > budget:
            raise BatchOutOfMemory(
                f"batch of {num_dst} rows needs ~{predicted} bytes > budget {budget}",
                predicted=predicted,
            )
        t = time.perf_counter()
        self.peak.start()
        with torch.no_grad():
            outs = block.module(prepared.batch, *prepared.inputs)
        if ctx.device.type == "cuda":
            torch.cuda.current_stream(ctx.device).synchronize()
        dt = time.perf_counter() - t
        stats.compute_s += dt
        lstats.compute_s += dt
        return outs

    def _write(
        self,
        block: ConvBlock,
        prepared: PreparedBatch,
        outs: tuple[Tensor, ...],
        outputs: dict[str, Tensor],
        positions: dict[str, Tensor],
        count: int,
    ) -> int:
        """Store the batch's outputs in their layer tensors; the bytes written."""
        t = time.perf_counter()
        out_bytes = 0
        whole = prepared.start == 0 and prepared.end == count  # the layer in one batch
        whole = whole and not any(name in outputs for name in block.outputs)
        for name, out in zip(block.outputs, outs, strict=True):
            out_bytes += out.numel() * out.element_size()
            kept = self._adopt(name, out, prepared, positions, outputs) if whole else None
            if kept is not None:
                outputs[name] = kept
                continue
            if name not in outputs:
                shape = (count, *out.shape[1:])
                outputs[name] = self.allocator.allocate(name, shape, out.dtype)
                if self._gathers_final(name, positions, outputs[name]):
                    self._final_storage_order = True  # storage order now, one gather after
            dest = outputs[name]
            in_order = self._final_storage_order and self._is_final(name)
            scatter = None if in_order else self._positions(name, positions)
            if scatter is not None:
                rows_out = scatter[prepared.start : prepared.end]
                dest.index_copy_(0, rows_out.to(dest.device), out.to(dest.device))
            else:
                dest[prepared.start : prepared.end].copy_(
                    out, non_blocking=dest.device.type == "cpu" and dest.is_pinned()
                )
        self.stats.write_out_s += time.perf_counter() - t
        return out_bytes

    def _gathers_final(self, name: str, positions: dict[str, Tensor], dest: Tensor) -> bool:
        """Whether the final output is written in storage order and gathered into output
        order once after its layer (:meth:`_order_final`) instead of scattered batch by
        batch: on the host tier of a CPU run, where a gather is parallel and a scatter
        (``index_copy_``) is not, and only while the host budget has room for the gather's
        second buffer beside everything held now (the layer's inputs are freed before it)."""
        allocator = self.allocator
        nbytes = dest.numel() * dest.element_size()
        return (
            self._is_final(name)
            and name not in positions
            and self.ctx.device.type == "cpu"
            and dest.device.type == "cpu"
            and allocator.tiers.get(name) == "host"
            and allocator.host_used + nbytes <= allocator.host_budget_bytes
        )

    def _order_final(self) -> None:
        """The final output, written in storage order, gathered into output order."""
        if not self._final_storage_order:
            return
        t = time.perf_counter()
        name = self.ctx.split.output
        table, rows = self.stored.pop(name)
        ordered = table.index_select(0, self.final_order)
        # Both held for a moment, both accounted: room was checked when the layer began.
        self.allocator.adopt(name, ordered)
        self.allocator.release(name, table)
        del table
        self.stored[name] = (ordered, rows)
        self._final_storage_order = False
        self.stats.write_out_s += time.perf_counter() - t

    def _is_final(self, name: str) -> bool:
        return self.final_order is not None and name == self.ctx.split.output

    def _positions(self, name: str, positions: dict[str, Tensor]) -> Tensor | None:
        """The output row of each computed row of ``name``, or ``None`` (rows in order)."""
        if name in positions:
            return positions[name]
        if not self._is_final(name):
            return None
        if self._final_positions is None:
            order = self.final_order
            self._final_positions = torch.empty_like(order)
            self._final_positions[order] = torch.arange(order.numel())
        return self._final_positions

    def _adopt(
        self,
        name: str,
        out: Tensor,
        prepared: PreparedBatch,
        positions: dict[str, Tensor],
        outputs: dict[str, Tensor],
    ) -> Tensor | None:
        """A layer computed in one batch keeps its output tensor as the layer's value (in
        storage order), or one gather of it (``positions``: in output order), where the
        allocator would put a new tensor on the host tier: no second layer-sized buffer,
        no copy (a gather is parallel, a scatter is not). ``None``: allocate and copy."""
        if self.ctx.device.type != "cpu" or out.device.type != "cpu":
            return None
        if name in positions:
            return None  # rows between reused ones: not the layer's every row
        if self._is_final(name):
            candidate = out.index_select(0, self.final_order.to(out.device))
        elif _owns_storage(
            out, (*prepared.inputs, *(v[0] for v in self.stored.values()), *outputs.values())
        ):
            candidate = out
        else:
            return None
        return candidate if self.allocator.adopt(name, candidate) else None


def evaluate_plan(
    ctx: RunContext,
    plan: Plan,
    storage_targets: Tensor | None,
    stats: RunStats,
    started: float,
    *,
    show_progress: bool = False,
) -> Tensor:
    """Run ``plan`` and gather the rows of ``storage_targets`` (in that order; ``None``:
    every node in ascending external-ID order). CPU tensor ``[len, d_out]``."""
    from hopserve.worker.engine.batch import row_positions

    graph = ctx.graph
    order = None  # full evaluation: the last layer writes rows in external-ID order
    if storage_targets is None and graph.node_ids is not None:
        order = graph.sorted_external_order()
    run = LayerwiseRun(ctx, plan, stats, final_order=order, show_progress=show_progress)
    final, final_rows = run.execute()
    t = time.perf_counter()
    if storage_targets is None:
        out = final
    else:
        pos = row_positions(final_rows, storage_targets, "the last layer's frontier V^L")
        out = final.index_select(0, pos.to(final.device))
    if out.device.type != "cpu":  # one DMA into page-locked memory, not a staged copy
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        out = host.copy_(out)
    stats.write_out_s += time.perf_counter() - t
    stats.total_s = time.perf_counter() - started
    stats.device = str(ctx.device)
    return out


def _owns_storage(t: Tensor, others: tuple[Tensor, ...]) -> bool:
    """Whether ``t`` is the whole of a storage no tensor in ``others`` shares (a conv's
    fresh output, not a view of its input or of a stored layer)."""
    if t._base is not None or not t.is_contiguous() or t.storage_offset() != 0:
        return False
    storage = t.untyped_storage()
    if storage.nbytes() != t.numel() * t.element_size():
        return False
    ptr = storage.data_ptr()
    return all(o.untyped_storage().data_ptr() != ptr for o in others if o.numel())
