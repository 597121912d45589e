"""One client call: its deadline and the reassembly of its answers (:class:`Query`)."""

from __future__ import annotations

import time
from typing import NoReturn

import grpc
import numpy as np

from hopserve.client.errors import DeadlineExceededError, MalformedResponseError
from hopserve.client.results import TIMING_STAGES, EmbeddingResult, Footprint
from hopserve.proto.tensors import decode_embeddings
from hopserve.proto.v1 import embedding_pb2 as pb


class Deadline:
    """Absolute monotonic deadline shared by every RPC and sleep of one client call."""

    __slots__ = ("at", "timeout")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        """Seconds left (may be <= 0), or None without a deadline."""
        return None if self.at is None else self.at - time.monotonic()

    def rpc_timeout(self) -> float | None:
        """Timeout for the next RPC; raises :class:`DeadlineExceededError` if none is left."""
        left = self.remaining()
        if left is not None and left <= 0:
            raise DeadlineExceededError(f"deadline of {self.timeout:g}s exceeded")
        return left


class Query:
    """One validated embedding call: its rows, request template, deadline and results.

    The call is served by successive RPCs, each covering ``ids[done : done + block]`` (a unary GetEmbeddings, or a StreamEmbeddings that may break and be
    resumed from ``done``). The first answer pins the model version for the rest, and
    every answer is checked against the contract before its rows are accepted.
    """

    def __init__(
        self, ids: np.ndarray, template: pb.GetEmbeddingsRequest, deadline: Deadline, block: int
    ) -> None:
        self.ids = ids
        self.template = template
        self.deadline = deadline
        self.block = block
        self.done = 0  # rows accepted so far (a prefix of ids)
        self._start = 0  # first row of the RPC in flight
        self._stop = 0  # one past its last row
        self._meta: tuple[str, str, str, int] | None = None  # model, version, graph, dim
        self._out: np.ndarray | None = None
        self._timing = dict.fromkeys(TIMING_STAGES, 0.0)
        self._layers: list[float] = []
        self._cache_hits = 0
        self._graph_seq = 0
        self._footprints: list[Footprint] = []

    @property
    def n(self) -> int:
        """Number of requested rows."""
        return len(self.ids)

    @property
    def finished(self) -> bool:
        """Whether every row has been accepted."""
        return self.done >= self.n

    def describe(self) -> str:
        """Short call description for error messages."""
        return f"model={self.template.model!r}, rows {self._start}..{self._stop} of {self.n}"

    def next_request(self) -> pb.GetEmbeddingsRequest:
        """Request for the next ``block`` rows not yet accepted."""
        self._start, self._stop = self.done, min(self.done + self.block, self.n)
        request = pb.GetEmbeddingsRequest()
        request.CopyFrom(self.template)
        request.node_ids.extend(self.ids[self._start : self._stop].tolist())
        return request

    # -- unary ------------------------------------------------------------------------

    def add_response(self, resp: pb.GetEmbeddingsResponse) -> None:
        """Accept a GetEmbeddings answer for the rows of the last :meth:`next_request`."""
        rows = self._stop - self._start
        if resp.num_nodes != rows:
            self._malformed(f"response has num_nodes={resp.num_nodes}, expected {rows}")
        self._check_meta(resp.model, resp.model_version, resp.graph_version, resp.dim)
        block = self._decode(resp.embeddings, resp.dtype, rows, resp.dim)
        if self._out is None:
            self._out = np.empty((self.n, resp.dim), dtype=np.float32)
        self._out[self._start : self._stop] = block
        self._add_stats(resp.timing if resp.HasField("timing") else None, resp.cache_hits)
        self._graph_seq = max(self._graph_seq, int(resp.graph_seq))
        self._footprints.extend(
            Footprint(tuple(f.frontier_sizes), int(f.max_degree), bool(f.hub))
            for f in resp.footprints
        )
        self.done = self._stop

    def result(self) -> EmbeddingResult:
        """The assembled result once :attr:`finished` (unary path)."""
        assert self._out is not None and self._meta is not None and self.finished
        model, version, graph, _ = self._meta
        return EmbeddingResult(
            embeddings=self._out,
            model=model,
            model_version=version,
            graph_version=graph,
            timing=dict(self._timing),
            layer_compute=tuple(self._layers),
            cache_hits=self._cache_hits,
            graph_seq=self._graph_seq,
            footprints=tuple(self._footprints),
        )

    # -- streaming --------------------------------------------------------------------

    def add_chunk(self, chunk: pb.EmbeddingChunk) -> tuple[int, np.ndarray]:
        """Accept one stream chunk; returns ``(row offset into node_ids, rows)``."""
        rows = self._stop - self._start
        if chunk.num_nodes != rows:
            self._malformed(f"chunk has num_nodes={chunk.num_nodes}, expected {rows}")
        expected = self.done - self._start
        if chunk.offset != expected:
            self._malformed(f"chunk at offset {chunk.offset}, expected {expected} (in order)")
        if not 1 <= chunk.num_rows <= rows - expected:
            self._malformed(f"chunk has num_rows={chunk.num_rows}, {rows - expected} rows left")
        self._check_meta(chunk.model, chunk.model_version, chunk.graph_version, chunk.dim)
        block = self._decode(chunk.embeddings, chunk.dtype, chunk.num_rows, chunk.dim)
        self._add_stats(chunk.timing if chunk.HasField("timing") else None, chunk.cache_hits)
        offset = self.done
        self.done += chunk.num_rows
        return offset, block.astype(np.float32)  # a writable, native-order copy

    def end_stream(self) -> None:
        """Check that a stream that ended normally delivered all of its rows."""
        if self.done != self._stop:
            self._malformed(
                f"stream ended after {self.done - self._start} of {self._stop - self._start} rows"
            )

    # -- checks -----------------------------------------------------------------------

    def _malformed(self, what: str) -> NoReturn:
        raise MalformedResponseError(f"{self.describe()}: {what}")

    def _check_meta(self, model: str, version: str, graph: str, dim: int) -> None:
        meta = (model, version, graph, dim)
        if self._meta is None:
            self._meta = meta
            self.template.model_version = version  # pin the version for later RPCs
        elif meta != self._meta:
            raise MalformedResponseError(
                f"{self.describe()}: answer (model, model_version, graph_version, dim)="
                f"{meta} differs from the call's first answer {self._meta}; rows computed "
                "on different graph or model versions cannot be combined, retry the call",
                grpc.StatusCode.ABORTED,
            )

    def _decode(self, data: bytes, dtype: int, rows: int, dim: int) -> np.ndarray:
        if dtype != pb.DTYPE_FLOAT32:
            name = pb.DType.Name(dtype) if dtype in pb.DType.values() else str(dtype)
            self._malformed(f"unsupported dtype {name}")
        try:
            return decode_embeddings(data, rows, dim)
        except ValueError as exc:
            raise MalformedResponseError(f"{self.describe()}: {exc}") from None

    def _add_stats(self, timing: pb.StageTiming | None, cache_hits: int) -> None:
        self._cache_hits += cache_hits
        if timing is None:
            return
        for stage in TIMING_STAGES:
            self._timing[stage] += getattr(timing, stage)
        layers = list(timing.layer_compute)
        if len(layers) > len(self._layers):
            self._layers.extend([0.0] * (len(layers) - len(self._layers)))
        for i, t in enumerate(layers):
            self._layers[i] += t
