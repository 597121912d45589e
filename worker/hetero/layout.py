"""The type layout a dict model is split against: node types, widths and relations, and
where each type's rows are in the graph the model runs on.

A typed store (:mod:`hopserve.worker.graph.node_types`) gives node type ``t`` the storage
ids ``[offset_t, offset_t + count_t)``, then the runs live updates append to it, and each
relation ``src__name__dst`` an id in the ``edge_type`` column. A :class:`TypeLayout` holds
the types and relations the model was split for (fixed) and the type ranges of the graph
it runs on (:class:`TypeRanges`, shared by every typed module of the model and re-bound
to each run's graph by :meth:`TypeLayout.bind`: an update that adds typed nodes moves no
range, it appends one), with the lookup every typed module needs: the type of a row from
its storage id.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hopserve.worker.graph.node_types import relation_triple, type_bounds

__all__ = ["TypeLayout", "TypeRanges", "even_types", "probe_relation_ids", "probe_type_ranges"]


class TypeRanges:
    """The type ranges of one graph: ``(starts, kinds)``, the first storage id of every
    non-empty range (base ranges and added runs), ascending, and the type index of each
    (:func:`~hopserve.worker.graph.node_types.type_bounds`). Mutable: :meth:`set` swaps
    both at once."""

    def __init__(self, types: Any) -> None:
        self.set(types)

    def set(self, types: Any) -> None:
        """Take the ranges of node types ``types`` (a graph's ``node_types``)."""
        starts, kinds = type_bounds(types)
        self.bounds = (tuple(starts.tolist()), tuple(kinds.tolist()))  # one assignment
        self.source = types  # the list they were read from (a snapshot's meta keeps it)

    def even(self, num_types: int, num_rows: int) -> None:
        """Rows ``0..num_rows-1`` split into ``num_types`` runs as even as they come, row
        ``r`` of type ``r * num_types // num_rows`` (a type gets no row only when there are
        fewer rows than types)."""
        kinds = even_types(num_types, num_rows)
        change = torch.ones(num_rows, dtype=torch.bool)
        change[1:] = kinds[1:] != kinds[:-1]
        starts = change.nonzero().squeeze(1)
        self.bounds = (tuple(starts.tolist()) or (0,), tuple(kinds[starts].tolist()) or (0,))
        self.source = None


def even_types(num_types: int, num_rows: int) -> Tensor:
    """Type index of each of ``num_rows`` rows split evenly into ``num_types`` runs."""
    return torch.arange(num_rows) * num_types // max(num_rows, 1)


@contextmanager
def probe_type_ranges(model: Any, num_rows: int) -> Iterator[None]:
    """While the load-time checks run a dict model on a probe graph of ``num_rows`` rows:
    the probe's rows split evenly among the model's node types, so every type and relation
    is exercised (the graph's own ranges would give the probe's few rows to its first type
    or two), then the graph's ranges back. A model without a type layout: nothing."""
    layout = getattr(model, "layout", None)
    if not isinstance(layout, TypeLayout):
        yield
        return
    ranges = layout.ranges
    saved = ranges.bounds, ranges.source
    ranges.even(len(layout.names), num_rows)
    try:
        yield
    finally:
        ranges.bounds, ranges.source = saved


def probe_relation_ids(model: Any, edge_index: Tensor, num_rows: int) -> Tensor | None:
    """For a dict model: a relation id per probe edge whose relation's end types are the
    edge's under :func:`probe_type_ranges`, so each relation gets probe edges (random ids
    would give it about ``1/T^2`` of its share). An edge between types no relation joins
    gets id 0 (a module typing edges by their relation's ends leaves it out; one typing
    them by destination reads it, in the model's forward and in hopserve alike). Parallel
    edges and a node's self-loops get the same id. ``None`` for a model without a type
    layout."""
    layout = getattr(model, "layout", None)
    if not isinstance(layout, TypeLayout):
        return None
    kinds = even_types(len(layout.names), num_rows)
    by_ends: dict[tuple[int, int], list[int]] = {}
    for rel, (s, _, d) in enumerate(layout.relations):
        by_ends.setdefault((layout.index(s), layout.index(d)), []).append(rel)
    src, dst = edge_index[0].tolist(), edge_index[1].tolist()
    ids = []
    for u, v in zip(src, dst, strict=True):
        options = by_ends.get((int(kinds[u]), int(kinds[v])))
        ids.append(options[(7 * u + 13 * v) % len(options)] if options else 0)
    return torch.tensor(ids, dtype=torch.long)


@dataclass(frozen=True)
class TypeLayout:
    """Node types (id order) with their widths, the relations, and the type ranges of the
    graph the model runs on.

    Attributes:
        names: node type names, in storage-id order of their base ranges.
        feature_dims: feature columns each type uses (the table is zero-padded).
        relations: ``(src, name, dst)`` by relation id (the ``edge_type`` values).
        ranges: where each type's rows are (not part of equality: two graphs with the same
            types and relations take the same model).
    """

    names: tuple[str, ...]
    feature_dims: tuple[int, ...]
    relations: tuple[tuple[str, str, str], ...]
    ranges: TypeRanges = field(compare=False, repr=False)

    @classmethod
    def from_graph(cls, graph: Any) -> TypeLayout | None:
        """The layout of a typed store (``None`` for an untyped one)."""
        types = getattr(graph, "node_types", None)
        if not types:
            return None
        return cls(
            names=tuple(t.name for t in types),
            feature_dims=tuple(int(t.feature_dim) for t in types),
            relations=tuple(relation_triple(r) for r in graph.relations or ()),
            ranges=TypeRanges(types),
        )

    def bind(self, graph: Any) -> None:
        """Follow ``graph``'s type ranges (every module sharing this layout then types its
        rows by them).

        Raises:
            ModelTraceError: ``graph``'s node types or relations are not this layout's.
        """
        if getattr(graph, "node_types", None) is self.ranges.source:
            return  # bound already (every typed adapter of a run binds it)
        other = TypeLayout.from_graph(graph)
        if other is None:
            return
        if other != self:
            from hopserve.worker.trace.tracer import ModelTraceError

            raise ModelTraceError(
                f"the graph's node types and relations ({list(other.names)}, "
                f"{len(other.relations)} relations) are not those the model was split for "
                f"({list(self.names)}, {len(self.relations)}); reload the model against "
                "this graph"
            )
        self.ranges.set(graph.node_types)

    def index(self, name: str) -> int:
        """Position of node type ``name``.

        Raises:
            KeyError: no such type, naming the types there are.
        """
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no node type {name!r}; the graph has {list(self.names)}") from None

    def relation_id(self, triple: tuple[str, str, str]) -> int | None:
        """Id of relation ``(src, name, dst)``, or ``None`` when the graph lacks it."""
        try:
            return self.relations.index(tuple(triple))
        except ValueError:
            return None

    def types_of(self, node_ids: Tensor | None, num_rows: int, device: torch.device) -> Tensor:
        """Type index of each row: of storage ids ``node_ids``, or of rows ``0..num_rows-1``
        (storage order) when ``None``. Ids past the last range count as its type."""
        ids = torch.arange(num_rows, device=device) if node_ids is None else node_ids.to(device)
        starts, types = self.ranges.bounds
        bounds = torch.tensor(starts[1:], dtype=ids.dtype, device=device)
        kinds = torch.tensor(types, dtype=torch.long, device=device)
        return kinds[torch.searchsorted(bounds, ids, right=True)]

    def is_type(self, node_ids: Tensor, t: int) -> Tensor:
        """Whether each storage id is of type ``t``: a range test per run of ``t``
        (cheaper than :meth:`types_of` for one type; ids past the last range count as its
        type)."""
        starts, types = self.ranges.bounds
        mask = torch.zeros(node_ids.shape, dtype=torch.bool, device=node_ids.device)
        for k, kind in enumerate(types):
            if kind == t:
                inside = node_ids >= starts[k]
                if k + 1 < len(starts):
                    inside &= node_ids < starts[k + 1]
                mask |= inside
        return mask

    def last_row(self, t: int, num_rows: int) -> int:
        """The last storage id of type ``t`` among rows ``0..num_rows-1`` (``-1``: none),
        from the ranges alone (no pass over the rows, no device sync)."""
        starts, kinds = self.ranges.bounds
        for k in range(len(starts) - 1, -1, -1):
            if kinds[k] == t and starts[k] < num_rows:
                end = starts[k + 1] if k + 1 < len(starts) else num_rows
                return min(end, num_rows) - 1
        return -1

    def rows_of(
        self, node_ids: Tensor | None, num_rows: int, t: int, device: torch.device
    ) -> Tensor:
        """Positions of the rows of type ``t`` (see :meth:`types_of`)."""
        return (self.types_of(node_ids, num_rows, device) == t).nonzero().squeeze(1)
