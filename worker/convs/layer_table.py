"""Full layers read in place: a whole-table tensor derived once per layer.

On a full gather-free layer (every node a destination, sources the stored node table
indexed by storage id) every batch reads the same ``N``-row table; an adapter that
transforms sources before aggregating (``x W``, ``c_out ⊙ x``) does it once per layer,
as the model's whole-graph forward does, instead of once per batch.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from hopserve.worker.convs.base import LayerBatch

__all__ = [
    "FullLayerPath", "LayerTableCache", "REDUCE_KERNEL_MIN_WIDTH", "csr_weighted_sum",
    "full_layer", "is_stand_in", "per_head_table", "stand_in", "whole_layer",
]  # fmt: skip


def full_layer(batch: LayerBatch) -> bool:
    """Whether ``batch`` belongs to a full gather-free layer (all nodes, storage order)."""
    return batch.global_src_size is not None and batch.dst_start is not None


def whole_layer(batch: LayerBatch) -> bool:
    """Whether ``batch`` is a full gather-free layer in one batch (every node at once)."""
    return full_layer(batch) and batch.dst_start == 0 and batch.num_dst == batch.global_src_size


def stand_in(x: Tensor) -> Tensor:
    """A data-free tensor with ``x``'s shape, dtype and device (one element, zero strides):
    what a full layer's batches are given in place of an input the engine freed once
    every reader derived its table from it (:meth:`ConvAdapter.derive_full_layer_table`).
    Reading its values is a bug; :class:`LayerTableCache` refuses to derive from it."""
    s = torch.empty((), dtype=x.dtype, device=x.device).expand(x.shape)
    s._hopserve_stand_in = True
    return s


def is_stand_in(x: Tensor) -> bool:
    return getattr(x, "_hopserve_stand_in", False)


REDUCE_KERNEL_MIN_WIDTH = 64
"""From this many columns on, a weighted sum on the CPU runs torch's row-parallel
``spmm_reduce`` kernel (``torch.sparse.mm(adj, x, "sum")``): 1.2× the speed of the
``adj @ x`` kernel at 64 columns, 1.4× at 128, even at 48 and slower below (2 threads,
200K nodes / 4M edges, torch 2.2 and 2.13)."""


def csr_weighted_sum(
    indptr: Tensor, indices: Tensor, values: Tensor, dense: Tensor, size: tuple[int, int]
) -> Tensor:
    """``out[v] = sum_{k in indptr[v]:indptr[v+1]} values[k] * dense[indices[k]]``: one
    torch CSR SpMM reading ``dense`` (a layer's table) in place. DGL's ``u_mul_e_sum`` on
    a CSC block (DGL 2.1's CPU ``u_mul_e`` kernel is several times slower than its
    ``copy_u`` one, and converts each new block first), and an attention conv's weighted
    sum of one head. Wide rows on the CPU take the reduce kernel
    (:data:`REDUCE_KERNEL_MIN_WIDTH`); both kernels sum each row's products."""
    adj = torch.sparse_csr_tensor(
        indptr, indices, values.contiguous(), size=size, check_invariants=False
    )
    if (
        dense.device.type == "cpu"
        and dense.dim() == 2
        and dense.shape[1] >= REDUCE_KERNEL_MIN_WIDTH
    ):
        return torch.sparse.mm(adj, dense.contiguous(), "sum")
    return adj @ dense


def per_head_table(
    x: Tensor, weight: Tensor, bias: Tensor | None, att: Tensor, heads: int, width: int
) -> tuple[Tensor, Tensor]:
    """An attention conv's source table: ``W^h x`` per head ``[H, N, C]`` and its logits
    ``a^h · W^h x`` ``[H, N, 1]`` (``weight`` ``[H·C, in]``, ``att`` ``H·C`` values). One
    GEMM per head straight into its contiguous slice: no ``[N, H·C]`` projection and
    transposed copy of it at once (the table is the peak)."""
    per_head = weight.view(heads, width, -1)
    table = x.new_empty((heads, x.shape[0], width))
    for h in range(heads):
        torch.matmul(x, per_head[h].t(), out=table[h])
    if bias is not None:
        table += bias.view(heads, 1, width)
    return table, torch.bmm(table, att.reshape(heads, width, 1))


class FullLayerPath:
    """Mixin of an adapter with a second path for full layers (reading a once-per-layer
    table in place) next to its base class's ``run``: the subclass says when the path
    applies (``_full_layer_path``) and runs it (``_run_full_layer``); partial frontiers
    always take the base path (a few rows must not pay for the whole table)."""

    _full_layer_path: bool

    @property
    def supports_global_src(self) -> bool:
        return self._full_layer_path

    @property
    def global_src_full_layers_only(self) -> bool:
        return True

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        if full_layer(batch) and self._full_layer_path:
            return self._run_full_layer(x, batch)
        return super().run(x, batch)

    def _run_full_layer(self, x: Tensor, batch: LayerBatch) -> Tensor:
        raise NotImplementedError

    # A full layer's source table derived up front, so the engine can free the input.
    _source: LayerTableCache

    @property
    def full_layer_table_only(self) -> bool:
        return self._full_layer_path and self._table_only

    @property
    def _table_only(self) -> bool:
        """Whether full-layer batches read only the source table (not ``x``'s rows)."""
        return False

    def derive_full_layer_table(self, x: Tensor, stand_in: Tensor, layer: int) -> None:
        self._source.put(stand_in, self._table_key(layer), self._make_table(x))

    def drop_full_layer_table(self) -> None:
        self._source.clear()

    def _table_key(self, layer: int) -> Hashable:
        raise NotImplementedError

    def _make_table(self, x: Tensor) -> Any:
        raise NotImplementedError


def _last_of_layer(batch: LayerBatch) -> bool:
    return batch.dst_start + batch.num_dst >= batch.global_src_size


class LayerTableCache:
    """A whole-table tensor derived from a layer's source table, kept for that layer.

    On a full layer every batch reads the same stored table ``x`` (all ``N`` rows); a
    derived table (``x W``, ``c_out ⊙ x``) is computed on the first batch that asks and
    dropped after the layer's last batch, so it lives as long as one layer runs (at most
    ``N × min(in, out)`` values). The entry is keyed by ``x`` itself (a weak reference, its
    in-place version counter), the caller's key (layer, weight versions, sampling …), and
    is only ever returned for the very tensor it was derived from.

    A table derived up front (:meth:`put`, keyed by the :func:`stand_in` the batches get
    instead of the freed input) stays until :meth:`clear`: the engine clears it after the
    layer, so a batch redone after running out of memory still finds it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entry: tuple[weakref.ref, int, Hashable, Any] | None = None
        self._pinned = False

    def get(self, x: Tensor, key: Hashable, batch: LayerBatch, make: Callable[[], Any]) -> Any:
        """The table for ``(x, key)``, made by ``make()`` on a miss (a tensor, or a tuple of
        tensors derived together)."""
        with self._lock:
            e = self._entry
            hit = e is not None and e[0]() is x and e[1] == x._version and e[2] == key
            value = e[3] if hit else None
            pinned = hit and self._pinned
        if value is None:
            if is_stand_in(x):
                raise RuntimeError(
                    f"layer {batch.layer}: no table derived for this layer's freed input "
                    "(the engine derives it before the layer's first batch)"
                )
            value = make()
            with self._lock:
                self._entry, self._pinned = (weakref.ref(x), x._version, key, value), False
        if _last_of_layer(batch) and not pinned:
            with self._lock:
                if self._entry is not None and self._entry[3] is value:
                    self._entry = None
        return value

    def derived(self, x: Tensor, key: Hashable) -> Any | None:
        """The table kept for ``(x, key)`` by :meth:`put`, or ``None`` (never made here)."""
        with self._lock:
            e = self._entry
            hit = e is not None and self._pinned and e[0]() is x and e[1] == x._version
            return e[3] if hit and e[2] == key else None

    def release(self, value: Any) -> None:
        """Drop the entry if it holds ``value`` and was made by :meth:`get` (its readers
        are done before the layer's last batch: the caller knows, the cache does not)."""
        with self._lock:
            if self._entry is not None and self._entry[3] is value and not self._pinned:
                self._entry = None

    def put(self, x: Tensor, key: Hashable, value: Any) -> None:
        """Keep ``value`` as the table for ``(x, key)`` until :meth:`clear`."""
        with self._lock:
            self._entry, self._pinned = (weakref.ref(x), x._version, key, value), True

    def clear(self) -> None:
        with self._lock:
            self._entry, self._pinned = None, False
