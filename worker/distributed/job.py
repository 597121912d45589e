"""The all-node job: every layer on this rank's rows, halo rows exchanged in between.

Call order of :func:`embed_all` (one process per rank; a world of one without torchrun)::

    embed_all(model, graph, out)
      ├─ LayerwiseEvaluator(model, graph)     the split into ConvBlocks, adapters prepared
      │                                        on the whole graph (e.g. GCN's degrees)
      ├─ partition_by_edges, Comm.plan_halo   own rows [a, b), halo ids, who sends what
      ├─ RankCheckpoint.completed             agree (min over ranks) on the resume point;
      │                                        load the values still read after it
      └─ for each ConvBlock not done:
            engine: the block over rows [a, b) in batches (LayerwiseRun, frontiers = [a, b))
            checkpoint its outputs (rank rows) → exchange the outputs that later blocks read
            over source rows (all_to_all of the halo rows) → free values no block reads
      write_shard (Parquet), barrier, rank 0 writes _SUCCESS.json

Values: every value a block reads is in the run's stored table as (rows, their storage
ids), as the engine expects. A value read over *source* rows by a later block holds the
rank's rows plus its halo rows (ascending ids); one read only over destination rows, the
rank's rows. So models whose later blocks read earlier values (residuals, jumping
knowledge) are handled like any other: every value lives until its last reader.

Exactness: a block's destination row depends only on its in-edges' source rows and its
own rows; each rank computes rows ``[a, b)`` with every in-edge (the CSC slice) and the
true source rows (own or received from their owner), and whole-graph statistics come
from each rank's full view of the graph store (``adapter.prepare``), so every row equals
single-process evaluation.

Test hook: ``HOPSERVE_EMBED_ALL_CRASH=RANK:BLOCK`` makes rank RANK exit (code 3, no
clean-up) once it has checkpointed block BLOCK and exchanged its halo rows, when it
computed that block in this attempt (a resumed run, which loads it, goes on). Every
other rank has then checkpointed BLOCK too (it saves before the exchange), and RANK has
nothing later, so the restarted job resumes after exactly BLOCK.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch import Tensor, nn

from hopserve.proto.contract import RunStats
from hopserve.worker.distributed.checkpoint import CheckpointMismatchError, RankCheckpoint
from hopserve.worker.distributed.exchange import Comm, ExchangeStats
from hopserve.worker.distributed.halo import HaloPlan
from hopserve.worker.distributed.output import check_out_dir, write_shard, write_success
from hopserve.worker.distributed.partition import partition_by_edges
from hopserve.worker.engine.batch import row_positions
from hopserve.worker.engine.evaluator import LayerwiseEvaluator
from hopserve.worker.engine.run import LayerwiseRun
from hopserve.worker.graph.planner import LayerFrontier, Plan
from hopserve.worker.trace.blocks import ModelSplit
from hopserve.worker.trace.splitter import SRC

__all__ = ["EmbedAllResult", "JobIdentity", "LayerReport", "embed_all", "model_fingerprint"]

log = logging.getLogger(__name__)

CRASH_ENV = "HOPSERVE_EMBED_ALL_CRASH"
CRASH_EXIT_CODE = 3


def model_fingerprint(model: nn.Module, entrypoint: str = "", kwargs: Any = None) -> str:
    """A content hash of the model: its class (or entrypoint), kwargs and every
    ``state_dict`` entry (name, dtype, shape, bytes). Same weights, same fingerprint."""
    h = hashlib.blake2b(digest_size=16)
    cls = type(model)
    h.update((entrypoint or f"{cls.__module__}:{cls.__qualname__}").encode())
    h.update(json.dumps(kwargs or {}, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"\0{name}:{t.dtype}:{list(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass(frozen=True)
class JobIdentity:
    """Who computed the embeddings: in every checkpoint manifest and shard's metadata."""

    model_name: str
    model_version: str
    model_fingerprint: str  # :func:`model_fingerprint`
    graph_version: str  # the graph store's content-hash version

    @classmethod
    def of(
        cls,
        model: nn.Module,
        graph,  # noqa: ANN001 - GraphStore
        name: str | None = None,
        version: str = "1",
        *,
        entrypoint: str = "",
        kwargs: Any = None,
    ) -> JobIdentity:
        return cls(
            name or type(model).__name__,
            str(version),
            model_fingerprint(model, entrypoint, kwargs),
            graph.version,
        )

    def metadata(self) -> dict[str, str]:
        """``hopserve.*`` keys for the Parquet metadata."""
        return {
            "hopserve.model_name": self.model_name,
            "hopserve.model_version": self.model_version,
            "hopserve.model_fingerprint": self.model_fingerprint,
            "hopserve.graph_version": self.graph_version,
        }


@dataclass
class LayerReport:
    """One block on one rank."""

    block: int  # the block's index (0 = node-wise pre-block)
    rows: int  # destination rows (the rank's range)
    computed: bool  # False: loaded from the checkpoint
    seconds: float = 0.0  # compute (engine) time
    halo_rows_received: int = 0
    halo_bytes_sent: int = 0
    halo_bytes_received: int = 0


@dataclass
class EmbedAllResult:
    """What :func:`embed_all` did on this rank."""

    rank: int
    world_size: int
    start: int  # first storage id of the rank's rows
    end: int  # one past the last
    shard: Path  # the Parquet file written
    resumed_after: int | None  # the block index resumed after (None: started fresh)
    layers: list[LayerReport] = field(default_factory=list)
    total_s: float = 0.0


@dataclass(frozen=True)
class _Schema:
    """Who reads each value, by block position."""

    producer: dict[str, int]  # value -> position of the block producing it
    last_read: dict[str, int]  # value -> last position reading it (any rows)
    last_src_read: dict[str, int]  # value -> last position reading it over source rows

    @classmethod
    def of(cls, split: ModelSplit) -> _Schema:
        producer, last_read, last_src = {}, {}, {}
        for pos, block in enumerate(split.blocks):
            for spec in block.inputs:
                last_read[spec.name] = pos
                if spec.rows == SRC:
                    last_src[spec.name] = pos
            for name in block.outputs:
                producer[name] = pos
        return cls(producer, last_read, last_src)

    def live_after(self, pos: int, output: str) -> list[str]:
        """Values produced at or before ``pos`` that a later block (or the result) reads,
        in production order (the same on every rank, so exchanges pair up)."""
        names = [
            v
            for v, p in self.producer.items()
            if p <= pos and (self.last_read.get(v, -1) > pos or v == output)
        ]
        return sorted(names, key=lambda v: (self.producer[v], v))

    def describe(self, split: ModelSplit) -> list[Any]:
        """The block schema as JSON (a checkpoint is only valid for the same split)."""
        return [
            [b.index, list(b.outputs), [[i.name, i.producer, i.rows] for i in b.inputs]]
            for b in split.blocks
        ]


def embed_all(
    model: nn.Module,
    graph,  # noqa: ANN001 - GraphStore
    out: str | Path,
    *,
    identity: JobIdentity | None = None,
    checkpoint_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    comm: Comm | None = None,
    progress: bool | None = None,
    self_check: bool = True,
    **engine: Any,
) -> EmbedAllResult:
    """Compute every node's embedding and write this rank's rows as a Parquet shard.

    Run it in every process of a ``torchrun`` job (the process group comes from the
    environment) or alone (a world of one).

    Args:
        model: the user's model (weights loaded).
        graph: the :class:`~hopserve.worker.graph.GraphStore` (each rank opens all of it,
            memory-mapped; it reads its CSC slice, features and whole-graph statistics).
        out: the output directory (shards and ``_SUCCESS.json``).
        identity: names and versions for the metadata (default: the model's class name,
            version ``"1"``, its fingerprint, the graph's version).
        checkpoint_dir: where layer checkpoints go; ``None`` for none (no resume).
        device: ``"cpu"`` (gloo between ranks) or ``"cuda"`` (rank ``LOCAL_RANK``'s GPU,
            NCCL).
        comm: the process group (default: :meth:`Comm.from_env`).
        progress: a progress bar per layer on rank 0 (default: when stderr is a TTY).
        self_check: the engine's load-time probe of the split.
        engine: further :class:`~hopserve.worker.engine.evaluator.LayerwiseEvaluator`
            keywords (``memory_budget_bytes``, ``init_batch_nodes``, …).

    Raises:
        CheckpointMismatchError: ``checkpoint_dir`` holds another job's checkpoint (on
            any rank: every rank raises).
        ModelTraceError: the model cannot be split into ConvBlocks (the node-wise fallback
            has no all-node mode).
        FileExistsError: ``out`` holds shards of a job with another world size.
    """
    t_start = time.perf_counter()
    own_comm = comm is None
    comm = Comm.from_env(device) if comm is None else comm
    try:
        return _Job(model, graph, Path(out), identity, checkpoint_dir, device, comm,
                    progress, self_check, engine).run(t_start)  # fmt: skip
    finally:
        if own_comm:
            comm.close()


class _Job:
    """One rank's state for :func:`embed_all`."""

    def __init__(
        self,
        model: nn.Module,
        graph,  # noqa: ANN001 - GraphStore
        out: Path,
        identity: JobIdentity | None,
        checkpoint_dir: str | Path | None,
        device: str | torch.device,
        comm: Comm,
        progress: bool | None,
        self_check: bool,
        engine: dict[str, Any],
    ) -> None:
        self.graph = graph
        self.comm = comm
        self.rank, self.world = comm.rank, comm.world_size
        self.out = check_out_dir(out, self.world)
        self.identity = identity or JobIdentity.of(model, graph)
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())  # Comm.from_env set it
        self.progress = progress
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if "host_memory_budget_bytes" not in engine and local_ranks > 1:
            # The engine's default (half the available memory) is per process: share it.
            available = psutil.virtual_memory().available
            engine = engine | {"host_memory_budget_bytes": available // (2 * local_ranks)}
        self.evaluator = LayerwiseEvaluator(
            model, graph, dev, progress=False, self_check=self_check, **engine
        )
        self.split = self.evaluator.split
        self.schema = _Schema.of(self.split)
        topo = graph.topology
        self.partition = partition_by_edges(topo.indptr, self.world)
        self.start, self.end = self.partition.range(self.rank)
        self.own = np.arange(self.start, self.end, dtype=np.int64)
        self.halo: HaloPlan = comm.plan_halo(self.partition, topo.indptr, topo.indices)
        self.halo_rows = torch.from_numpy(self.halo.rows)
        self.checkpoint = None
        if checkpoint_dir is not None:
            self.checkpoint = RankCheckpoint(checkpoint_dir, self.rank, self._checkpoint_identity())
        self.reports: list[LayerReport] = []

    def _checkpoint_identity(self) -> dict[str, Any]:
        return {
            "model_name": self.identity.model_name,
            "model_version": self.identity.model_version,
            "model_fingerprint": self.identity.model_fingerprint,
            "graph_version": self.identity.graph_version,
            "world_size": self.world,
            "rank": self.rank,
            "rows": [self.start, self.end],
            "blocks": self.schema.describe(self.split),
        }

    # ------------------------------------------------------------------ the job
    def run(self, t_start: float) -> EmbedAllResult:
        blocks = self.split.blocks
        resume = self._agree_on_resume()
        frontier = LayerFrontier(self.own)
        plan = Plan([frontier] * (self.split.num_layers + 1), None)
        # The engine's per-run state (batch sizing, tiers, stored values); its block loop
        # is ours, so exchanges and checkpoints fit between blocks.
        run = LayerwiseRun(self.evaluator._context(), plan, RunStats())
        try:
            if resume >= 0:
                self._restore(run, resume)
            for pos, block in enumerate(blocks):
                if pos <= resume:
                    self.reports.append(LayerReport(block.index, self.end - self.start, False))
                    continue
                self._compute(run, pos)
            shard = self._write(run)
        finally:
            run.allocator.close()
            self.evaluator.close()
        resumed = blocks[resume].index if resume >= 0 else None
        total = time.perf_counter() - t_start
        if self.rank == 0:
            log.info(
                "embed-all: %d rows on %d rank(s) in %.2fs -> %s",
                self.graph.num_nodes, self.world, total, self.out,
            )  # fmt: skip
        return EmbedAllResult(
            self.rank, self.world, self.start, self.end, shard, resumed, self.reports, total
        )

    def _agree_on_resume(self) -> int:
        """The position of the last block every rank has checkpointed (``-1``: none);
        every rank raises if any rank's checkpoint is refused."""
        done, refused = -1, None
        if self.checkpoint is not None:
            try:
                done = self.checkpoint.completed()
            except CheckpointMismatchError as err:
                refused = err
        if self.comm.max(refused is not None):
            if refused is not None:
                raise refused
            raise CheckpointMismatchError(
                f"rank {self.rank}: another rank's checkpoint was refused (see its error)"
            )
        resume = self.comm.min(done)
        if resume >= 0 and self.rank == 0:
            block = self.split.blocks[resume]
            log.info(
                "embed-all: resuming after block %d (%d of %d blocks done) from %s",
                block.index, resume + 1, len(self.split.blocks), self.checkpoint.dir.parent,
            )  # fmt: skip
        return resume

    def _restore(self, run: LayerwiseRun, resume: int) -> None:
        """Load the values read after block position ``resume`` and exchange their halos."""
        for name in self.schema.live_after(resume, self.split.output):
            local = self.checkpoint.load(name)
            if local.shape[0] != self.end - self.start:
                raise CheckpointMismatchError(
                    f"checkpoint {self.checkpoint.dir}: {name} has {local.shape[0]} rows, "
                    f"this rank owns {self.end - self.start}"
                )
            self._publish(run, name, local, resume)

    def _compute(self, run: LayerwiseRun, pos: int) -> None:
        block = self.split.blocks[pos]
        report = LayerReport(block.index, self.end - self.start, True)
        bar = self._bar(pos)
        t = time.perf_counter()
        try:
            run._run_block(block, bar)  # the engine's batches over rows [a, b)
        finally:
            if bar is not None:
                bar.close()
        if run.ctx.device.type == "cuda":
            torch.cuda.synchronize(run.ctx.device)
        report.seconds = time.perf_counter() - t
        outputs = {name: run.stored[name][0] for name in block.outputs}
        if self.checkpoint is not None:
            self.checkpoint.save(pos, block.index, outputs)
        for name in block.outputs:
            if name in self.schema.live_after(pos, self.split.output):
                stats = self._publish(run, name, outputs[name], pos)
                report.halo_rows_received += stats.rows_received
                report.halo_bytes_sent += stats.bytes_sent
                report.halo_bytes_received += stats.bytes_received
        if self.checkpoint is not None:
            self._maybe_crash(block.index)
        for name in list(run.stored):  # free what no later block reads
            if name not in self.schema.live_after(pos, self.split.output):
                run.allocator.release(name, run.stored.pop(name)[0])
        self.reports.append(report)
        level = logging.INFO if self.rank == 0 else logging.DEBUG
        log.log(
            level,
            "rank %d block %d: %d rows in %.2fs; halo %d rows in (%d bytes), %d bytes out",
            self.rank, block.index, report.rows, report.seconds, report.halo_rows_received,
            report.halo_bytes_received, report.halo_bytes_sent,
        )  # fmt: skip

    def _publish(self, run: LayerwiseRun, name: str, local: Tensor, pos: int) -> ExchangeStats:
        """Store ``name`` for later blocks: with its halo rows when one reads it over
        source rows, else the rank's rows. Returns the exchange's stats."""
        if self.schema.last_src_read.get(name, -1) > pos:
            table, stats = self.comm.exchange(self.halo, local)
            rows = self.halo_rows
            if table is not local and name in run.stored:
                run.allocator.release(name, run.stored[name][0])
        else:
            table, stats, rows = local, ExchangeStats(), torch.from_numpy(self.own)
        run.stored[name] = (table, rows)
        return stats

    def _bar(self, pos: int):  # noqa: ANN202 - tqdm or None
        """Rank 0's progress bar for block position ``pos`` (its own rows)."""
        if self.rank != 0 or self.progress is False:
            return None
        from tqdm.auto import tqdm

        block = self.split.blocks[pos]
        who = f" (rank 0 of {self.world})" if self.world > 1 else ""
        return tqdm(
            total=self.end - self.start,
            unit="row",
            desc=f"layer {block.index} [{pos + 1}/{len(self.split.blocks)}]{who}",
            disable=not sys.stderr.isatty() if self.progress is None else False,
        )

    def _maybe_crash(self, block_index: int) -> None:
        spec = os.environ.get(CRASH_ENV, "")
        if spec and spec == f"{self.rank}:{block_index}":
            log.warning("rank %d: %s=%s: exiting after block %d", self.rank, CRASH_ENV, spec,
                        block_index)  # fmt: skip
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)

    def _write(self, run: LayerwiseRun) -> Path:
        table, rows = run.stored[self.split.output]
        own = torch.from_numpy(self.own)
        pos = row_positions(rows, own, "the model output")
        emb = table.index_select(0, pos.to(table.device)).detach().cpu()
        emb = emb.reshape(emb.shape[0], -1).to(torch.float32).numpy()
        ids = self.graph.to_external(own).numpy()
        meta = self.identity.metadata() | {
            "hopserve.rank": str(self.rank),
            "hopserve.world_size": str(self.world),
            "hopserve.storage_range": f"{self.start}:{self.end}",
            "hopserve.num_nodes": str(self.graph.num_nodes),
        }
        path = write_shard(self.out, self.rank, self.world, ids, emb, meta)
        self.comm.barrier()  # every shard is in place
        if self.rank == 0:
            success = {k: v for k, v in meta.items() if k not in ("hopserve.rank",
                       "hopserve.storage_range")}  # fmt: skip
            write_success(self.out, self.world, success)
        return path
