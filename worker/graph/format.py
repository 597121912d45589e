"""On-disk format of a graph-store directory (format version 1) and its ``meta.json`` schema.

A graph store is a directory holding ``meta.json`` plus ``.npy`` arrays, all in STORAGE order
(the order nodes are stored in, e.g. RCMK):

- ``indptr.npy``   int64 ``[N+1]``
- ``indices.npy``  int32 when ``N < 2**31`` else int64 ``[E]``. CSC: the in-neighbours (message
  sources) of storage node ``v`` are ``indices[indptr[v]:indptr[v+1]]``, ascending. Edge
  ``(s, d)`` follows the PyG convention: a message flows from ``s`` to ``d``.
- ``features.npy`` float32 or float16 ``[N, F]``
- ``node_ids.npy`` int64 ``[N]`` (optional): external ID of each storage node; absent means
  identity (external ID == storage index).
- ``labels.npy``   int64 ``[N]`` (optional): class per node, ``-1`` = unlabeled.
- ``edge_weight.npy``   float32 ``[E]`` (optional): one weight per edge, in CSC order (entry
  ``k`` belongs to the edge ``indices[k]`` of the destination whose segment holds ``k``).
- ``edge_features.npy`` float32 ``[E, d_e]`` (optional): edge feature rows, in CSC order.
- ``edge_type.npy``     int16 ``[E]`` (optional): the relation id of each edge, in CSC order;
  ``relations`` in the meta names them (id ``r`` is ``relations[r]``).
- ``type_node_ids.npy`` int64 ``[N]`` (optional, typed stores): each storage node's ID in
  its own type's ID space (distinct within a type, repeats across types allowed); absent
  means a type's IDs are ``0..count-1``.

A store with typed node sets (``node_types`` in the meta: name, offset, count and feature
width of each type, see :mod:`~.node_types`) is format version 3; without them a store
holding edge columns is written as format version 2 (``has_edge_weight`` /
``edge_feature_dim`` / ``relations`` in the meta), so a hopserve that predates them refuses it instead of
serving the graph without its edge data; a store without them stays version 1, with the
same meta and content hash as before. A typed store whose types have their own external ID
spaces (``has_type_node_ids``) is format version 4, so a hopserve that predates them refuses
it instead of reading its IDs as ``0..count-1``. A compacted typed store holding nodes that
live updates added (a type with ``added`` runs) is format version 5, so a hopserve that
predates them refuses it instead of typing those nodes as the last type.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hopserve.worker.graph.errors import GraphFormatError
from hopserve.worker.graph.node_types import NodeTypeInfo

__all__ = [
    "FORMAT_VERSION",
    "META_FILE",
    "INDPTR_FILE",
    "INDICES_FILE",
    "FEATURES_FILE",
    "NODE_IDS_FILE",
    "LABELS_FILE",
    "EDGE_WEIGHT_FILE",
    "EDGE_FEATURES_FILE",
    "EDGE_TYPE_FILE",
    "TYPE_NODE_IDS_FILE",
    "GraphFlags",
    "GraphMeta",
    "indices_dtype_for",
    "read_meta",
    "write_meta",
    "load_array",
    "utc_now",
]

FORMAT_VERSION = 1
META_FILE = "meta.json"
INDPTR_FILE = "indptr.npy"
INDICES_FILE = "indices.npy"
FEATURES_FILE = "features.npy"
NODE_IDS_FILE = "node_ids.npy"
LABELS_FILE = "labels.npy"
EDGE_WEIGHT_FILE = "edge_weight.npy"
EDGE_FEATURES_FILE = "edge_features.npy"
EDGE_TYPE_FILE = "edge_type.npy"
TYPE_NODE_IDS_FILE = "type_node_ids.npy"
EDGE_FORMAT_VERSION = 2  # a store with edge columns; 1 without (unchanged)
TYPED_FORMAT_VERSION = 3  # a store with node types (and its relations)
TYPE_IDS_FORMAT_VERSION = 4  # a typed store whose types have their own ID spaces
NODES_ADDED_FORMAT_VERSION = 5  # ... holding nodes that live updates added (type runs)

Ordering = Literal["rcmk", "identity"]
FeatureDtype = Literal["float32", "float16"]
IndicesDtype = Literal["int32", "int64"]


def indices_dtype_for(num_nodes: int) -> np.dtype:
    """``int32`` when every node index fits (``N < 2**31``), else ``int64``."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


def utc_now() -> str:
    """Current time as an ISO-8601 UTC string (``created_at``)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class GraphFlags(BaseModel):
    """How the edge list was transformed when the store was built."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    symmetrized: bool = False
    self_loops: bool = False
    dedup: bool = False


class GraphMeta(BaseModel):
    """Schema of ``meta.json``. Unknown keys are ignored; ``format_version`` gates changes."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    format_version: Literal[1, 2, 3, 4, 5] = FORMAT_VERSION
    num_nodes: int = Field(ge=0)
    num_edges: int = Field(ge=0)
    feature_dim: int = Field(ge=0)
    feature_dtype: FeatureDtype
    indices_dtype: IndicesDtype
    version: str = Field(min_length=1, description="content hash; changes with the data")
    ordering: Ordering
    flags: GraphFlags = GraphFlags()
    has_node_ids: bool
    has_labels: bool
    num_classes: int | None = Field(default=None, ge=0)
    created_at: str
    has_edge_weight: bool = Field(default=False, description="edge_weight.npy [E] (v2)")
    edge_feature_dim: int | None = Field(
        default=None, ge=0, description="width of edge_features.npy [E, d_e] (v2); None: absent"
    )
    relations: list[str] | None = Field(
        default=None,
        min_length=1,
        description="relation names by id, the values of edge_type.npy [E] (v2); None: absent",
    )
    node_types: list[NodeTypeInfo] | None = Field(
        default=None,
        min_length=1,
        description="typed node sets as storage-id ranges (v3); None: one untyped set",
    )
    has_type_node_ids: bool = Field(
        default=False, description="type_node_ids.npy [N]: each type's own IDs (v4)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> GraphMeta:
        if self.indices_dtype != indices_dtype_for(self.num_nodes).name:
            raise ValueError(
                f"indices_dtype {self.indices_dtype} does not match num_nodes={self.num_nodes}"
            )
        if self.has_labels and self.num_classes is None:
            raise ValueError("num_classes is required when has_labels is true")
        has_edge_data = (
            self.has_edge_weight or self.edge_feature_dim is not None or self.relations is not None
        )
        if self.node_types is not None:
            from hopserve.worker.graph.node_types import (
                check_node_types,
                check_typed_relations,
            )

            want = TYPE_IDS_FORMAT_VERSION if self.has_type_node_ids else TYPED_FORMAT_VERSION
            if any(t.added for t in self.node_types):
                want = NODES_ADDED_FORMAT_VERSION
            if self.format_version != want or (want == 5 and not self.has_type_node_ids):
                raise ValueError(
                    f"format_version {self.format_version} with node_types: version 3 "
                    "exactly when node types are present, 4 when they have their own IDs "
                    f"(has_type_node_ids={self.has_type_node_ids}), 5 when they also hold "
                    "added nodes"
                )
            check_node_types(self.node_types, self.num_nodes, self.feature_dim)
            if self.relations is None:
                raise ValueError("a store with node_types needs relations (typed edges)")
            check_typed_relations(self.relations, [t.name for t in self.node_types])
        elif self.format_version in (
            TYPED_FORMAT_VERSION,
            TYPE_IDS_FORMAT_VERSION,
            NODES_ADDED_FORMAT_VERSION,
        ):
            raise ValueError(
                f"format_version {self.format_version} is a store with node_types, which is missing"
            )
        elif self.has_type_node_ids:
            raise ValueError("has_type_node_ids needs node_types (each type's own IDs)")
        elif has_edge_data != (self.format_version == EDGE_FORMAT_VERSION):
            raise ValueError(
                f"format_version {self.format_version} does not match the edge columns "
                f"(has_edge_weight={self.has_edge_weight}, "
                f"edge_feature_dim={self.edge_feature_dim}, relations={self.relations}): "
                "version 2 exactly when present"
            )
        if self.relations is not None:
            from hopserve.worker.graph.relations import check_relation_names

            check_relation_names(self.relations)
        return self


def read_meta(directory: str | Path) -> GraphMeta:
    """Read and validate ``<directory>/meta.json``.

    Raises:
        GraphFormatError: missing/unreadable file, bad JSON, or a field that fails validation
            (the message names the file and the field).
    """
    path = Path(directory) / META_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise GraphFormatError(
            f"{path}: missing (is {directory} a hopserve graph store?)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphFormatError(f"{path}: cannot read: {e}") from None
    if not isinstance(raw, dict):
        raise GraphFormatError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    try:
        return GraphMeta.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"field '{'.'.join(str(p) for p in err['loc']) or '<root>'}': {err['msg']}"
            for err in e.errors()
        )
        raise GraphFormatError(f"{path}: invalid meta: {problems}") from None


def write_meta(directory: str | Path, meta: GraphMeta) -> Path:
    """Write ``meta.json`` (pretty-printed) into ``directory``; return its path."""
    path = Path(directory) / META_FILE
    fields = meta.model_dump(mode="json")
    if meta.format_version < EDGE_FORMAT_VERSION:  # a v1 meta stays as it always was
        fields.pop("has_edge_weight")
        fields.pop("edge_feature_dim")
    if meta.relations is None:  # stores without typed edges keep their v2 meta unchanged
        fields.pop("relations")
    if meta.node_types is None:
        fields.pop("node_types")
    if not meta.has_type_node_ids:  # stores without them keep their v3 meta unchanged
        fields.pop("has_type_node_ids")
    path.write_text(json.dumps(fields, indent=2) + "\n")
    return path


def load_array(
    directory: str | Path,
    name: str,
    *,
    mmap: bool = True,
    dtype: np.dtype | tuple[np.dtype, ...] | None = None,
    shape: tuple[int | None, ...] | None = None,
) -> np.ndarray:
    """Load ``<directory>/<name>``; memory-map copy-on-write (``mmap_mode="c"``) when ``mmap``.

    ``dtype`` (one or several allowed) and ``shape`` (``None`` = any size on that axis) are
    checked from the header only; nothing is read. Raises :class:`GraphFormatError`.
    """
    path = Path(directory) / name
    if not path.is_file():
        raise GraphFormatError(f"{path}: missing")
    try:
        arr = np.load(path, mmap_mode="c" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise GraphFormatError(f"{path}: cannot load: {e}") from None
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if arr.dtype not in [np.dtype(d) for d in allowed]:
            want = " or ".join(np.dtype(d).name for d in allowed)
            raise GraphFormatError(f"{path}: dtype {arr.dtype}, expected {want}")
    if shape is not None and (
        arr.ndim != len(shape)
        or any(w is not None and w != s for w, s in zip(shape, arr.shape, strict=True))
    ):
        want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        raise GraphFormatError(f"{path}: shape {list(arr.shape)}, expected {want}")
    return arr
