"""The type layout a dict model is split against: node types as storage-id ranges.

A typed store (:mod:`hopserve.worker.graph.node_types`) gives node type ``t`` the storage
ids ``[offset_t, offset_t + count_t)``, then the runs live updates appended to it, and each
relation ``src__name__dst`` an id in the ``edge_type`` column. A :class:`TypeLayout` is that, read once from the graph, with the
lookup every typed module needs: the type of a row from its storage id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hopserve.worker.graph.node_types import relation_triple, type_bounds

__all__ = ["TypeLayout"]


@dataclass(frozen=True)
class TypeLayout:
    """Node types (id order) with their storage ranges and widths, and the relations.

    Attributes:
        names: node type names, in storage-id order of their base ranges.
        range_starts: first storage id of every non-empty range (base ranges and added
            runs), ascending.
        range_types: the type index of each of those ranges.
        feature_dims: feature columns each type uses (the table is zero-padded).
        relations: ``(src, name, dst)`` by relation id (the ``edge_type`` values).
    """

    names: tuple[str, ...]
    range_starts: tuple[int, ...]
    range_types: tuple[int, ...]
    feature_dims: tuple[int, ...]
    relations: tuple[tuple[str, str, str], ...]

    @classmethod
    def from_graph(cls, graph: Any) -> TypeLayout | None:
        """The layout of a typed store (``None`` for an untyped one)."""
        types = getattr(graph, "node_types", None)
        if not types:
            return None
        starts, kinds = type_bounds(types)
        return cls(
            names=tuple(t.name for t in types),
            range_starts=tuple(starts.tolist()),
            range_types=tuple(kinds.tolist()),
            feature_dims=tuple(int(t.feature_dim) for t in types),
            relations=tuple(relation_triple(r) for r in graph.relations or ()),
        )

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
        bounds = torch.tensor(self.range_starts[1:], dtype=ids.dtype, device=device)
        kinds = torch.tensor(self.range_types, dtype=torch.long, device=device)
        return kinds[torch.searchsorted(bounds, ids, right=True)]

    def rows_of(
        self, node_ids: Tensor | None, num_rows: int, t: int, device: torch.device
    ) -> Tensor:
        """Positions of the rows of type ``t`` (see :meth:`types_of`)."""
        return (self.types_of(node_ids, num_rows, device) == t).nonzero().squeeze(1)
