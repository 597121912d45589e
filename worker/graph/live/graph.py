"""LiveGraph: a graph store that takes updates — base store + update log + current snapshot.

::

    <graph>/                  the base store as built (never modified)
    <graph>/updates/log       the update log (log.py): every acknowledged batch
    <graph>/updates/BASE      {"dir", "seq"}: the compacted base in use, if any
    <graph>/updates/LINEAGE   the lineage version (content hash + a token per folder)
    <graph>/updates/base-<seq>/   a compacted base store (sequence <seq> folded in)

``apply(batch)``: check it whole (``mutations.resolve``), append it to the log and fsync,
compute the rows it can change for every tracked model kind, then under the write lock mark
them stale, swap in the next snapshot and replace features in place — all before
returning (a reader never sees the new sequence without its stale marks). Jobs read
under :meth:`LiveGraph.reading`, which waits for a batch being applied and catches a
process that is behind up from the log; a job planned at another sequence is refused.

Every process opening the same folder replays the same log in sequence order: the
front-end's planner, in-process workers (which share one object per folder through
:func:`open_live`) and worker processes (which catch up from the file when a job names a
later sequence). ``version`` of a snapshot is unique per sequence; the *lineage* version
(the original base store's) names the graph in cache keys and jobs, and survives compaction.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hopserve.worker.graph.live.invalidation import affected_nodes
from hopserve.worker.graph.live.log import UpdateLog
from hopserve.worker.graph.live.mutations import (
    InvalidUpdateError,
    MutationBatch,
    ResolvedBatch,
    decode,
    encode,
    resolve,
)
from hopserve.worker.graph.live.snapshot import GraphSnapshot, apply_batch
from hopserve.worker.graph.topology import GraphTopology

__all__ = ["ApplyResult", "GraphSeqError", "LiveGraph", "ModelKind", "open_live"]

log = logging.getLogger(__name__)

UPDATES_DIR = "updates"
LOG_FILE = "log"
BASE_FILE = "BASE"
LINEAGE_FILE = "LINEAGE"
KEYS_REMEMBERED = 100_000  # idempotency keys kept in memory (those in the log are kept too)
MAX_SHIPPED = 10_000  # update records one job may carry to a worker behind
RECENT_SNAPSHOTS = 4  # earlier versions a job planned before an update may still run on

ModelKind = tuple[int, bool, bool, bool]
"""``(num_layers, degree_normalized, reads_source_degrees, reads_out_edges)``: what decides
a model's invalidation set (:func:`~.invalidation.affected_nodes`)."""


class GraphSeqError(RuntimeError):
    """A job names a graph sequence this process cannot evaluate at (it moved past it)."""


@dataclass(frozen=True)
class ApplyResult:
    """Outcome of one batch."""

    seq: int
    nodes_added: int
    edges_added: int
    edges_removed: int
    features_set: int
    rows_invalidated: int
    """Affected rows summed over the tracked model kinds."""
    num_nodes: int
    num_edges: int
    replayed: bool = False
    apply_s: float = 0.0
    """Seconds from the start of the apply to the answer (fsync and invalidation included)."""
    affected: dict = field(default_factory=dict, repr=False, compare=False)
    """Per tracked model kind, the storage ids whose rows the batch can change."""


class _RWLock:
    """Many readers or one writer; a waiting writer blocks new readers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class LiveGraph:
    """See the module docstring. Open with :func:`open_live` (one object per folder)."""

    def __init__(self, path: str | Path, *, with_features: bool = False) -> None:
        self.path = Path(path)
        self.updates_dir = self.path / UPDATES_DIR
        self.with_features = with_features
        self._lock = _RWLock()
        self._mutex = threading.Lock()  # serializes writers' bookkeeping (apply, compact)
        self._stale: dict[ModelKind, np.ndarray] = {}
        self._keys: OrderedDict[str, ApplyResult] = OrderedDict()
        self._stores: dict[int, object] = {}  # seq -> GraphStore (worker view), recent ones
        self._recent: OrderedDict[int, GraphSnapshot] = OrderedDict()  # before the current
        self._features_overwritten = 0  # seq of the last batch that set feature rows
        self._features = None  # torch tensor [capacity, F] once copied, else the base's
        self.compacting = False
        self._open_base()

    # ------------------------------------------------------------------ opening
    def _open_base(self) -> None:
        """Open the base in use (compacted or original) and replay the log on top."""
        self._recent.clear()
        self._stores.clear()
        self._features_overwritten = 0
        base_dir, base_seq = self.path, 0
        pointer = self.updates_dir / BASE_FILE
        lineage = GraphTopology.open(self.path).version
        self.cache_version = self._history(lineage)
        if pointer.is_file():
            info = json.loads(pointer.read_text())
            base_dir, base_seq = self.updates_dir / info["dir"], int(info["seq"])
        topo = GraphTopology.open(base_dir)
        self.lineage_version = lineage  # the original base's content hash
        self.base_dir, self.base_seq = base_dir, base_seq
        snap = GraphSnapshot(
            topo.meta, topo.indptr, topo.indices, topo.node_ids, base_dir,
            seq=base_seq, base_version=lineage, type_node_ids=topo.type_node_ids,
        )  # fmt: skip
        if base_seq:  # a compacted base: its version must differ per sequence
            snap.meta = snap.meta.model_copy(update={"version": f"{lineage}+{base_seq}"})
        snap.build_type_indexes()  # here (a loading thread), not on a request's path
        self._base_store = None
        self._features = None
        self.snapshot = snap
        if self.with_features:  # map its files now: a later compaction deletes the folder
            self._base()
        self.log = UpdateLog(self.updates_dir / LOG_FILE)
        self._replay(self.log.last_seq or base_seq)
        for kind in list(self._stale):  # reopened: nothing cached before is trusted
            self._stale[kind] = np.full(self.snapshot.num_nodes, self.seq, np.int64)

    def _history(self, content_version: str) -> str:
        """The version naming this folder's history in cache keys.

        ``"{content hash}.{random token}"``, the token created once per folder (in
        ``updates/LINEAGE``, exclusively: every process of the service reads the same), so
        two folders built from the same data that then take different updates never share
        cached rows. A folder that cannot be written (it takes no updates) keeps the
        content hash. Jobs and answers name the content hash (:attr:`lineage_version`):
        a worker holding its own copy of the base store serves the same graph.
        """
        path = self.updates_dir / LINEAGE_FILE
        if not path.is_file():
            # Written whole to a private file, then linked in (exclusive, atomic): a crash
            # mid-way leaves no LINEAGE rather than an empty one no process could open.
            token = uuid.uuid4().hex
            tmp = self.updates_dir / f".{LINEAGE_FILE}.{token}"
            try:
                self.updates_dir.mkdir(exist_ok=True)
                with open(tmp, "w") as f:
                    f.write(f"{content_version}.{token[:12]}\n")
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass  # another process was first: every process reads its token
                finally:
                    tmp.unlink()
                _fsync_dir(self.updates_dir)
            except OSError:
                return content_version
        for _ in range(100):  # another process may be writing it this instant
            text = path.read_text().strip()
            if text:
                return text
            time.sleep(0.01)
        raise RuntimeError(f"{path}: empty")

    def _replay(self, upto: int) -> None:
        """Apply the log's records up to ``upto`` (caller holds the write lock, or is
        opening), marking tracked rows stale as :meth:`apply` does."""
        for seq, payload in self.log.read(self.snapshot.seq, upto):
            batch = decode(payload, self.snapshot.feature_dim)
            if batch.seq != seq:
                raise RuntimeError(f"{self.log.path}: record {seq} holds batch {batch.seq}")
            if self._stale:
                nxt = apply_batch(self.snapshot, batch)
                self._mark_stale(self._affected(batch, nxt), batch.seq, nxt.num_nodes)
                self._apply_resolved(batch, nxt)
            else:
                self._apply_resolved(batch)
            if batch.idempotency_key:
                self._remember(batch.idempotency_key, _result_of(batch, self.snapshot, 0))

    # ------------------------------------------------------------------ state
    @property
    def seq(self) -> int:
        """Current graph sequence."""
        return self.snapshot.seq

    @property
    def topology(self) -> GraphSnapshot:
        """The current snapshot (immutable: hold it for a consistent view)."""
        return self.snapshot

    def prepare_updates(self) -> None:
        """Build the out-edge index invalidation walks in a background thread now, so
        the first update does not pay for it (``O(E log E)`` once; later snapshots
        splice it)."""
        snapshot = self.snapshot
        threading.Thread(target=snapshot.ensure_out_edges, name="hopserve-csr", daemon=True).start()

    def track(self, kind: ModelKind) -> None:
        """Keep stale-since sequences for models of ``kind`` (see :meth:`stale_since`).

        Rows computed before tracking began are stale (their invalidations were not
        recorded): every node starts at the current sequence.
        """
        if kind in self._stale:
            return
        with self._mutex:
            if kind not in self._stale:
                self._stale[kind] = np.full(self.snapshot.num_nodes, self.seq, np.int64)

    def stale_since(self, kind: ModelKind, nodes: np.ndarray) -> np.ndarray:
        """Per storage node: the sequence of the last batch that could change its row
        (a row computed at an earlier sequence is stale). Untracked kinds: the current
        sequence (nothing cached before now is trusted)."""
        stale = self._stale.get(kind)
        if stale is None:
            return np.full(nodes.shape, self.seq, dtype=np.int64)
        out = np.full(nodes.shape, self.seq, dtype=np.int64)
        known = nodes < stale.size
        out[known] = stale[nodes[known]]
        return out

    # ------------------------------------------------------------------ updates
    def apply(self, batch: MutationBatch) -> ApplyResult:
        """Apply one batch durably and atomically (see the module docstring).

        Raises:
            InvalidUpdateError: the batch is refused as a whole (names the mutation).
            OSError: the log could not be written (nothing applied).
        """
        start = time.perf_counter()
        with self._mutex:
            if batch.idempotency_key and batch.idempotency_key in self._keys:
                done = self._keys[batch.idempotency_key]
                return replace(done, replayed=True, apply_s=time.perf_counter() - start)
            self._catch_up_locked(None)
            resolved = resolve(batch, self.snapshot, self.seq + 1)
            if batch.empty:
                raise InvalidUpdateError("the batch holds no mutation")
            nxt = apply_batch(self.snapshot, resolved)  # a failure here writes nothing
            affected = self._affected(resolved, nxt)
            self.log.append(resolved.seq, encode(resolved))
            with self._lock.write():
                self._mark_stale(affected, resolved.seq, nxt.num_nodes)
                self._apply_resolved(resolved, nxt)
            result = _result_of(resolved, self.snapshot, sum(a.size for a in affected.values()))
            result = replace(result, apply_s=time.perf_counter() - start, affected=affected)
            if resolved.idempotency_key:
                self._remember(resolved.idempotency_key, replace(result, affected={}))
            return result

    def _apply_resolved(self, batch: ResolvedBatch, nxt: GraphSnapshot | None = None) -> None:
        """Next snapshot and features (caller holds the write lock, or is opening)."""
        self._recent[self.snapshot.seq] = self.snapshot
        while len(self._recent) > RECENT_SNAPSHOTS:
            self._recent.popitem(last=False)
        self.snapshot = apply_batch(self.snapshot, batch) if nxt is None else nxt
        if batch.set_nodes.size:  # rows overwritten in place: older versions cannot run
            self._features_overwritten = batch.seq
        if self.with_features:
            self._write_features(batch)
        for seq in [s for s in self._stores if s not in self._recent]:
            del self._stores[seq]

    def _affected(self, batch: ResolvedBatch, after: GraphSnapshot) -> dict[ModelKind, np.ndarray]:
        """Per tracked model kind, the rows ``batch`` can change (``after``: the snapshot
        it makes). Computed before the swap, outside the lock."""
        return {kind: affected_nodes(after, batch, *kind) for kind in list(self._stale)}

    def _mark_stale(self, affected: dict[ModelKind, np.ndarray], seq: int, num_nodes: int) -> None:
        """Mark ``affected`` stale since ``seq``. Under the write lock and *before* the new
        snapshot is swapped in: a reader that sees sequence ``seq`` sees its stale marks
        (early marks only make rows miss, never hit)."""
        for kind, stale in list(self._stale.items()):
            if stale.size < num_nodes:
                grown = np.full(num_nodes, seq, np.int64)
                grown[: stale.size] = stale
                self._stale[kind] = stale = grown
            nodes = affected.get(kind)
            if nodes is None:  # tracking began after the batch was resolved
                stale[:] = seq
            else:
                stale[nodes] = seq

    def _remember(self, key: str, result: ApplyResult) -> None:
        self._keys[key] = result
        while len(self._keys) > KEYS_REMEMBERED:
            self._keys.popitem(last=False)

    def catch_up(self, seq: int | None = None) -> None:
        """Apply log records another process appended, up to ``seq`` (``None`` = all)."""
        with self._mutex:
            self._catch_up_locked(seq)

    def _catch_up_locked(self, seq: int | None) -> None:
        if seq is not None and seq <= self.seq:
            return
        self.log._refresh()
        first = self.log.first_seq
        if first is not None and first > self.seq + 1 or self._base_moved():
            log.info("%s: the base was compacted past sequence %d; reopening", self.path, self.seq)
            with self._lock.write():
                self._open_base()
            return
        with self._lock.write():
            self._replay(seq if seq is not None else (self.log.last_seq or self.seq))

    def records(self, upto: int, limit: int = MAX_SHIPPED) -> tuple[bytes, ...]:
        """The log's records ``base_seq < seq <= upto`` (at most the last ``limit``), to
        ship to a worker with its own copy of the folder."""
        self.log._refresh()
        first = max(self.base_seq, upto - limit)
        return tuple(payload for _, payload in self.log.read(first, upto))

    def ingest(self, records: tuple[bytes, ...]) -> None:
        """Append shipped records this folder lacks to its own log and apply them (a
        worker whose graph folder is a copy of the front-end's). Records it has are
        skipped; one beyond a gap is refused.

        Raises:
            GraphSeqError: the records start after this graph's sequence (it is behind
                the front-end's compacted base: restart it on the compacted store).
        """
        with self._mutex:
            self._catch_up_locked(None)
            dim = self.snapshot.feature_dim
            for payload in records:
                batch = decode(payload, dim)
                if batch.seq <= self.seq:
                    continue
                if batch.seq != self.seq + 1 or batch.num_nodes_before != self.snapshot.num_nodes:
                    raise GraphSeqError(
                        f"graph {self.path.name}: shipped update {batch.seq} does not follow "
                        f"this copy's sequence {self.seq}; restart this worker on the "
                        "front-end's (compacted) graph store"
                    )
                nxt = apply_batch(self.snapshot, batch)
                affected = self._affected(batch, nxt)
                self.log.append(batch.seq, payload)
                with self._lock.write():
                    self._mark_stale(affected, batch.seq, nxt.num_nodes)
                    self._apply_resolved(batch, nxt)

    def _base_moved(self) -> bool:
        pointer = self.updates_dir / BASE_FILE
        if not pointer.is_file():
            return False
        return int(json.loads(pointer.read_text())["seq"]) > self.base_seq and (
            self.log.first_seq is None or self.log.first_seq > self.seq + 1
        )

    @contextmanager
    def reading(self, seq: int | None = None) -> Iterator[GraphSnapshot]:
        """Hold the graph at sequence ``seq`` (``None`` = the current one) for a job.

        A process behind ``seq`` catches up from the log first. Raises
        :class:`GraphSeqError` when the graph has moved past ``seq`` (plan again).
        """
        if seq is not None and seq > self.seq:
            self.catch_up(seq)
        with self._lock.read():
            if seq is None or seq == self.seq:
                yield self.snapshot
                return
            older = self._recent.get(seq)
            if older is None or seq < self._features_overwritten:
                raise GraphSeqError(
                    f"graph {self.path.name}: the job was planned at sequence {seq}, this "
                    f"process is at {self.seq}"
                )
            # A recent version whose feature rows no batch overwrote since: exact there
            # (later nodes' rows lie past its own, its arrays are untouched).
            yield older

    @contextmanager
    def with_delta(self, seq: int, delta: ResolvedBatch) -> Iterator:  # -> GraphStore
        """A store of the graph at ``seq`` plus a request-scoped ``delta`` (cold start).

        Held exclusively (no job or update runs on this graph meanwhile): the delta's
        snapshot is spliced like an update's but never logged or kept, and its new
        nodes' features go to spare rows past the graph's own (the graph's snapshot
        never reads them). Cost: one splice of the CSC, ``O(N + E)``.

        Raises:
            GraphSeqError: the graph moved past ``seq`` (plan again).
        """
        from hopserve.worker.graph.store import GraphStore

        if seq > self.seq:
            self.catch_up(seq)
        with self._mutex, self._lock.write():
            if seq != self.seq:
                raise GraphSeqError(
                    f"graph {self.path.name}: the request was planned at sequence {seq}, "
                    f"this process is at {self.seq}"
                )
            if delta.num_nodes_before != self.snapshot.num_nodes:
                raise GraphSeqError(f"graph {self.path.name}: the delta was resolved elsewhere")
            snap = apply_batch(self.snapshot, delta)
            if delta.new_node_ids.size:  # spare rows past the graph's: its snapshot ignores them
                self._write_features(delta)  # a delta sets no existing rows
            features = self._features if self._features is not None else self._base().features
            snap.meta = snap.meta.model_copy(
                update={"version": f"{snap.meta.version}.delta{next(_DELTAS)}"}
            )
            yield GraphStore(
                meta=snap.meta,
                indptr=snap.indptr,
                indices=snap.indices,
                features=features[: snap.num_nodes],
                node_ids=snap.node_ids,
                path=snap.path,
                topology=snap,
                per_request=True,
            )

    # ------------------------------------------------------------------ features (worker)
    def store(self, snap: GraphSnapshot | None = None):  # -> GraphStore
        """The worker's :class:`~hopserve.worker.graph.store.GraphStore` of ``snap`` (the
        one :meth:`reading` yielded; default the current snapshot), features included.
        Call while holding :meth:`reading`."""
        from hopserve.worker.graph.store import GraphStore

        snap = self.snapshot if snap is None else snap
        cached = self._stores.get(snap.seq)
        if cached is not None:
            return cached
        base = self._base()
        if snap.seq == self.base_seq and self._features is None:
            store = base
        else:
            features = self._features if self._features is not None else base.features
            store = GraphStore(
                meta=snap.meta,
                indptr=snap.indptr,
                indices=snap.indices,
                features=features[: snap.num_nodes],
                node_ids=snap.node_ids,
                path=snap.path,
                topology=snap,
            )
        self._stores[snap.seq] = store
        return store

    def _base(self):  # -> GraphStore
        from hopserve.worker.graph.store import GraphStore

        if self._base_store is None:
            self._base_store = GraphStore.open(self.base_dir)
            if self.snapshot.seq == self.base_seq:
                self._base_store.topology = self.snapshot
        return self._base_store

    def enable_features(self) -> None:
        """Keep features (a worker shares this object): replays the log's feature rows."""
        with self._mutex, self._lock.write():
            if self.with_features:
                return
            self.with_features = True
            if self.seq != self.base_seq:  # rebuild from the base with features on
                self._open_base()

    def _write_features(self, batch: ResolvedBatch) -> None:
        import torch

        base = self._base()
        n_before, k = batch.num_nodes_before, batch.new_node_ids.size
        feats = self._features if self._features is not None else base.features
        if k and feats.shape[0] < n_before + k:
            cap = max(n_before + k, int(n_before * 1.25) + 1024)
            grown = torch.empty((cap, feats.shape[1]), dtype=feats.dtype)
            grown[:n_before] = feats[:n_before]
            feats = grown
        elif self._features is None:  # first change: a private copy of the base rows
            feats = feats.clone()
        if k:
            feats[n_before : n_before + k] = torch.from_numpy(batch.new_features).to(feats.dtype)
        if batch.set_nodes.size:
            rows = torch.from_numpy(batch.set_nodes)
            feats[rows] = torch.from_numpy(batch.set_features).to(feats.dtype)
        self._features = feats

    # ------------------------------------------------------------------ compaction
    def compact(self, progress: bool = False) -> int:
        """Fold the log into a new base store; returns the sequence folded in.

        Written to a temporary folder and swapped in atomically (``BASE`` is replaced by
        rename) while serving continues; readers keep their snapshot throughout. A crash
        at any point leaves the old base + whole log or the new base + the log's rest.
        """
        from hopserve.worker.graph.contents import ArrayFeatures, StoreContents, write_contents

        with self._mutex:
            if self.compacting:
                raise RuntimeError(f"graph {self.path}: a compaction is already running")
            self.compacting = True
        try:
            with self._lock.read():
                snap = self.snapshot
                features = None
                if self.with_features:  # kept up to date by this process
                    feats = self._features if self._features is not None else self._base().features
                    features = feats[: snap.num_nodes].numpy().copy()
            if snap.seq == self.base_seq:  # folded already (maybe by a run a crash cut)
                with self._mutex:  # a crash between BASE and the log's rewrite kept them
                    if len(self.log):
                        self.log.rewrite(after=snap.seq)
                self._remove_stray_bases(keep=self.base_dir)
                return snap.seq
            if features is None:  # a process that keeps none (the front-end): base + log
                features = self._features_at(snap)
            name = f"base-{snap.seq:012d}"
            target = self.updates_dir / name
            contents = StoreContents(
                indptr=snap.indptr,
                indices=snap.indices,
                features=ArrayFeatures(features),
                feature_perm=None,
                node_ids=snap.to_external(np.arange(snap.num_nodes)),
                labels=None,
                ordering=snap.meta.ordering,
                flags=snap.meta.flags,
                edge_weight=snap.edge_weight,  # CSC order, as the snapshot keeps them
                edge_features=snap.edge_features,
                edge_type=snap.edge_type,
                relations=snap.meta.relations,
                node_types=snap.meta.node_types,  # with the runs updates appended
                type_node_ids=snap.type_node_ids,
            )
            write_contents(target, contents, overwrite=True, progress=progress)
            info = {"dir": name, "seq": snap.seq}
            tmp = self.updates_dir / (BASE_FILE + ".tmp")
            with open(tmp, "w") as f:
                f.write(json.dumps(info) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.updates_dir / BASE_FILE)
            _fsync_dir(self.updates_dir)
            with self._mutex:
                self.log.rewrite(after=snap.seq)
                self.base_dir, self.base_seq = target, snap.seq
                self._base_store = None
            self._remove_stray_bases(keep=target)
            log.info("compacted %s at sequence %d into %s", self.path, snap.seq, target)
            return snap.seq
        finally:
            self.compacting = False

    def _features_at(self, snap: GraphSnapshot) -> np.ndarray:
        """The feature rows at ``snap``: the base's, then each logged batch's new and set
        rows (numpy only). Without this a process that keeps no features compacted the
        base's old rows, losing every acknowledged feature update."""
        from hopserve.worker.graph.format import FEATURES_FILE, load_array, read_meta

        meta = read_meta(self.base_dir)
        n, dim = meta.num_nodes, meta.feature_dim
        dtype = np.dtype(meta.feature_dtype)
        out = np.empty((snap.num_nodes, dim), dtype=dtype)
        out[:n] = load_array(self.base_dir, FEATURES_FILE, dtype=dtype, shape=(n, dim))
        for _, payload in self.log.read(self.base_seq, snap.seq):
            batch = decode(payload, dim)
            first, k = batch.num_nodes_before, batch.new_node_ids.size
            out[first : first + k] = batch.new_features
            out[batch.set_nodes] = batch.set_features
        return out

    def _remove_stray_bases(self, keep: Path) -> None:
        """Delete every base folder but ``keep``: the old base, and any a crash left
        (``.base-<seq>.tmp-*``: a write cut short; ``base-<seq>`` not switched to)."""
        if not self.updates_dir.is_dir():
            return
        for stray in self.updates_dir.iterdir():
            name = stray.name.lstrip(".")
            if stray.is_dir() and stray != keep and name.startswith("base-"):
                shutil.rmtree(stray, ignore_errors=True)

    def info(self) -> dict:
        """State for ``GetGraph`` and metrics."""
        snap = self.snapshot
        return {
            "path": str(self.path),
            "graph_version": self.lineage_version,
            "graph_seq": snap.seq,
            "base_seq": self.base_seq,
            "log_batches": len(self.log),
            "log_bytes": self.log.size_bytes,
            "num_nodes": snap.num_nodes,
            "num_edges": snap.num_edges,
            "compacting": self.compacting,
            "relations": list(snap.meta.relations or []),
        }


def _result_of(batch: ResolvedBatch, snap: GraphSnapshot, invalidated: int) -> ApplyResult:
    return ApplyResult(
        seq=batch.seq,
        nodes_added=int(batch.new_node_ids.size),
        edges_added=int(batch.add_src.size),
        edges_removed=int(batch.remove_src.size),
        features_set=int(batch.set_nodes.size),
        rows_invalidated=invalidated,
        num_nodes=snap.num_nodes,
        num_edges=snap.num_edges,
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_DELTAS = itertools.count()  # makes each delta store's version unique (engine caches)

_OPEN: dict[str, LiveGraph] = {}
_OPEN_LOCK = threading.Lock()


def open_live(path: str | Path, *, with_features: bool = False) -> LiveGraph:
    """The process's :class:`LiveGraph` of the store at ``path`` (one per folder, shared
    by the front-end and in-process workers)."""
    key = os.path.realpath(path)
    with _OPEN_LOCK:
        live = _OPEN.get(key)
        if live is None:
            live = _OPEN[key] = LiveGraph(path, with_features=with_features)
            return live
    if with_features:
        live.enable_features()
    return live


def forget_live(path: str | Path | None = None) -> None:
    """Drop the shared object of ``path`` (all with ``None``): tests, reopening after a crash."""
    with _OPEN_LOCK:
        if path is None:
            _OPEN.clear()
        else:
            _OPEN.pop(os.path.realpath(path), None)
