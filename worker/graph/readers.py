"""Readers for ingest input files, each validating its input (errors name file and row).

- edges: text (CSV/TSV/whitespace; integer columns ``src dst``, optionally followed by
  edge data columns (below); ``#`` comments and blank lines allowed; parsed in 16 MiB
  chunks with np.loadtxt and a progress bar by bytes; a rejected chunk is re-scanned line
  by line only to name the bad row), ``.npy`` of shape ``[E, 2]`` or ``[2, E]``
  (``[2, 2]`` is read as ``[E, 2]``) or ``[E, 2 + k]`` (edge data columns after src,
  dst; src/dst must be whole numbers), or ``.npz`` with arrays ``src`` and ``dst`` (or
  ``edge_index`` ``[2, E]``) and optionally ``edge_weight`` (or ``weight``) ``[E]`` and
  ``edge_features`` (or ``edge_attr``) ``[E, d_e]``. Delimiter: ``.csv`` -> comma,
  ``.tsv`` -> tab, anything else -> comma if the first data line has one, else whitespace.
  ``.parquet``: integer columns ``src`` and ``dst`` (by name, else the first two columns),
  every other column, in the file's order, an edge data column (numbers; a list column
  of numbers is several feature columns).
- edge data columns (text, ``.npy`` and ``.parquet``): every row has the same number of columns. With
  ``edge_data="weight"`` (the default) the third column is the edge weight and any
  further columns are edge features (``src,dst,weight,f1,...,fk``); with
  ``edge_data="features"`` every column after ``dst`` is an edge feature
  (``src,dst,f1,...,fk``). Values must be finite numbers (NaN/Inf name the row).
- typed edges (relation ids, what ``RGCNConv``'s ``edge_type`` takes): with
  ``relation_column=True`` the third column of a text or ``.npy`` file is the integer
  relation id and the edge data columns follow it (``src,dst,relation,weight,...``).
  ``.npz``: an integer array ``edge_type`` or a string array ``relation`` ``[E]``, and
  optionally ``relations`` (the names by id). ``.parquet``: a column named ``relation``,
  ``edge_type`` or ``etype`` (integer ids, or strings: names, numbered in sorted order).
- features: ``.npy`` ``[N, F]`` float32/float16 (float64 is converted to float32),
  memory-mapped read-only and scanned in chunks for NaN/Inf.
- node IDs: ``.npy`` ``[N]`` distinct integers. labels: ``.npy`` ``[N]`` integers ``>= -1``.

Rows are 1-based: the line number for text, the array row (or edge number for
``[2, E]``) for arrays.
"""

from __future__ import annotations

import bisect
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hopserve.worker.graph.errors import IngestError
from hopserve.worker.graph.ids import first_duplicate
from hopserve.worker.graph.progress import progress_bar

__all__ = [
    "EdgeList",
    "read_edges",
    "detect_delimiter",
    "EDGE_DATA_MODES",
    "load_features",
    "check_features_finite",
    "load_node_ids",
    "load_labels",
]

_TEXT_CHUNK = 16 << 20  # bytes parsed per np.loadtxt call
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT_EXACT_INT = 2**53  # whole numbers a float64 holds exactly
EDGE_DATA_MODES = ("weight", "features")


@dataclass
class EdgeList:
    """Edges as read from a file: raw endpoint values and a way back to file rows."""

    file: Path
    src: np.ndarray  # int64 [E]
    dst: np.ndarray  # int64 [E]
    row_of: Callable[[int], int]  # edge number (0-based) -> 1-based file row
    weight: np.ndarray | None = None  # float32 [E]
    features: np.ndarray | None = None  # float32 [E, d_e]
    edge_type: np.ndarray | None = None  # int16 [E] relation ids
    relations: list[str] | None = None  # relation names by id (with edge_type)

    def __len__(self) -> int:
        return self.src.size


# ---------------------------------------------------------------------------- edges: text
def detect_delimiter(path: Path, skip_header: bool = False) -> str | None:
    """``","`` for .csv, ``"\\t"`` for .tsv; otherwise sniff the first data line."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return ","
    if suffix == ".tsv":
        return "\t"
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            if i > 1000:
                break
            if skip_header and i == 0:
                continue
            line = raw.split(b"#", 1)[0].strip()
            if line:
                return "," if b"," in line else None
    return None


def _data_lines(text: str) -> list[tuple[int, str]]:
    """``(line offset, content)`` of the non-blank, comment-stripped lines of ``text``."""
    out = []
    for i, line in enumerate(text.split("\n")):
        content = line.split("#", 1)[0].strip()
        if content:
            out.append((i, content))
    return out


def _split(content: str, delimiter: str | None) -> list[str]:
    return [t.strip() for t in (content.split(delimiter) if delimiter else content.split())]


def _column_names(columns: int) -> str:
    return "src, dst" if columns == 2 else f"src, dst and {columns - 2} edge data columns"


def _diagnose(
    text: str,
    first_line: int,
    delimiter: str | None,
    path: Path,
    cause: str,
    header_hint: bool,
    columns: int = 2,
) -> IngestError:
    """Find the first bad line of a chunk the fast parser rejected (slow path, errors only)."""
    for i, content in _data_lines(text):
        row = first_line + i
        fields = _split(content, delimiter)
        if len(fields) != columns:
            return IngestError(
                path,
                row,
                f"expected {columns} columns ({_column_names(columns)}), got {len(fields)}: "
                f"{content!r}",
            )
        hint = " (a header line? use --skip-header)" if header_hint and row <= 2 else ""
        for col, tok in enumerate(fields):
            if col >= 2:  # edge data: any float
                try:
                    float(tok)
                except ValueError:
                    return IngestError(
                        path, row, f"non-numeric edge data {tok!r} (column {col + 1}){hint}"
                    )
                continue
            try:
                value = int(tok)
            except ValueError:
                return IngestError(path, row, f"non-numeric value {tok!r}{hint}")
            if not _INT64_MIN <= value <= _INT64_MAX:
                return IngestError(path, row, f"value {tok} outside the int64 range")
    return IngestError(path, None, f"cannot parse edges: {cause}")


def _parse_text(
    text: str,
    first_line: int,
    delimiter: str | None,
    path: Path,
    header_hint: bool,
    columns: int = 2,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(int64 [n, 2] endpoints, float64 [n, columns - 2] edge data or None)``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data"
            kw = {"delimiter": delimiter, "comments": "#", "ndmin": 2}
            extra = None
            if columns > 2:  # every column as a float first: the count, and numbers
                extra = np.loadtxt(io.StringIO(text), dtype=np.float64, **kw)
                if extra.size and extra.shape[1] != columns:
                    raise ValueError(f"{extra.shape[1]} columns")
                arr = np.loadtxt(io.StringIO(text), dtype=np.int64, usecols=(0, 1), **kw)
            else:
                arr = np.loadtxt(io.StringIO(text), dtype=np.int64, **kw)
    except ValueError as e:
        raise _diagnose(text, first_line, delimiter, path, str(e), header_hint, columns) from None
    if arr.size == 0:
        return np.zeros((0, 2), dtype=np.int64), (
            None if columns == 2 else np.zeros((0, columns - 2))
        )
    if arr.shape[1] != 2:
        raise _diagnose(
            text, first_line, delimiter, path, f"{arr.shape[1]} columns", header_hint, columns
        )
    return arr, None if extra is None else extra[:, 2:]


def count_columns(path: Path, delimiter: str | None, skip_header: bool) -> int:
    """Columns of the first data line of a text edge file (2 when it has none)."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            if skip_header and i == 0:
                continue
            line = raw.decode("utf-8", errors="replace").split("#", 1)[0].strip()
            if line:
                return len(_split(line, delimiter))
    return 2


@dataclass
class _Chunk:
    offset: int  # byte offset in the file
    length: int
    first_line: int  # 1-based line number of the chunk's first line
    first_edge: int


def _read_text_edges(
    path: Path, delimiter: str | None, skip_header: bool, progress: bool
) -> tuple[EdgeList, np.ndarray | None]:
    size = path.stat().st_size
    columns = max(2, count_columns(path, delimiter, skip_header))
    chunks: list[_Chunk] = []
    parts: list[np.ndarray] = []
    extras: list[np.ndarray] = []
    line_no, edge_no, offset = 1, 0, 0
    with (
        open(path, "rb") as f,
        progress_bar(
            total=size, desc=f"read {path.name}", unit="B", enabled=progress, unit_scale=True
        ) as bar,
    ):
        if skip_header:
            header = f.readline()
            offset, line_no = len(header), 2
            bar.update(len(header))
        carry = b""
        while True:
            block = f.read(_TEXT_CHUNK)
            bar.update(len(block))
            data = carry + block
            if block:
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # one line longer than a chunk: keep reading
                    carry = data
                    continue
                piece, carry = data[:cut], data[cut:]
            else:
                piece, carry = data, b""
            if piece:
                text = piece.decode("utf-8", errors="replace")
                arr, extra = _parse_text(text, line_no, delimiter, path, not skip_header, columns)
                chunks.append(_Chunk(offset, len(piece), line_no, edge_no))
                parts.append(arr)
                if extra is not None:
                    extras.append(extra)
                line_no += piece.count(b"\n")
                offset += len(piece)
                edge_no += arr.shape[0]
            if not block:
                break
    edges = np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
    starts = [c.first_edge for c in chunks]

    def row_of(edge: int) -> int:
        chunk = chunks[bisect.bisect_right(starts, edge) - 1]
        with open(path, "rb") as f:
            f.seek(chunk.offset)
            text = f.read(chunk.length).decode("utf-8", errors="replace")
        line_offset, _ = _data_lines(text)[edge - chunk.first_edge]
        return chunk.first_line + line_offset

    edge_list = EdgeList(
        path, np.ascontiguousarray(edges[:, 0]), np.ascontiguousarray(edges[:, 1]), row_of
    )
    if columns == 2:
        return edge_list, None
    extra = np.concatenate(extras) if extras else np.zeros((0, columns - 2))
    return edge_list, extra


# ---------------------------------------------------------------------------- edges: arrays
def _int_edges(path: Path, arr: np.ndarray, what: str) -> np.ndarray:
    if arr.dtype.kind not in "iu":
        raise IngestError(path, None, f"{what}: dtype {arr.dtype}, expected an integer dtype")
    if arr.dtype == np.uint64 and arr.size:
        big = np.flatnonzero(arr.reshape(-1) > _INT64_MAX)
        if big.size:
            raise IngestError(path, None, f"{what}: value {arr.reshape(-1)[big[0]]} beyond int64")
    return arr.astype(np.int64, copy=False)


def _whole_numbers(path: Path, arr: np.ndarray) -> np.ndarray:
    """The src/dst columns of a float ``[E, 2 + k]`` array as int64 (whole numbers only)."""
    ends = np.asarray(arr[:, :2], dtype=np.float64)
    bad = ~((ends == np.round(ends)) & (np.abs(ends) < _FLOAT_EXACT_INT)).all(axis=1)
    if bad.any():
        row = int(np.argmax(bad))
        raise IngestError(
            path, row + 1, f"src/dst {ends[row].tolist()} are not whole node IDs (below 2**53)"
        )
    return ends.astype(np.int64)


def _read_npy_edges(path: Path) -> tuple[EdgeList, np.ndarray | None]:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise IngestError(path, None, f"cannot load .npy: {e}") from None
    if arr.ndim != 2 or (2 not in arr.shape and arr.shape[1] < 2):
        raise IngestError(
            path, None, f"shape {list(arr.shape)}, expected [E, 2], [2, E] or [E, 2 + k]"
        )
    extra = None
    if arr.shape[1] != 2 and arr.shape[0] != 2:  # [E, 2 + k]: edge data columns
        if arr.dtype.kind not in "fiu":
            raise IngestError(path, None, f"edges: dtype {arr.dtype}, expected numbers")
        ends = (
            _whole_numbers(path, arr)
            if arr.dtype.kind == "f"
            else _int_edges(path, np.asarray(arr[:, :2]), "edges")
        )
        src, dst = ends[:, 0], ends[:, 1]
        extra = np.asarray(arr[:, 2:], dtype=np.float64)
    else:
        arr = _int_edges(path, arr, "edges")
        if arr.shape[1] == 2:
            src, dst = arr[:, 0], arr[:, 1]
        else:
            src, dst = arr[0], arr[1]
    edge_list = EdgeList(
        path, np.ascontiguousarray(src), np.ascontiguousarray(dst), lambda e: e + 1
    )
    return edge_list, extra


_NPZ_WEIGHT = ("edge_weight", "weight")
_NPZ_FEATURES = ("edge_features", "edge_attr")
_NPZ_TYPES = ("edge_type", "relation")
_PARQUET_TYPES = ("relation", "edge_type", "etype")


def _attach_relations(
    edges: EdgeList, values: np.ndarray, name: str, names: list[str] | None = None
) -> None:
    """Relation ids or names ``[E]`` of the edges (see :func:`~.relations.relation_ids`)."""
    from hopserve.worker.graph.relations import MAX_RELATIONS, relation_ids

    if values.ndim != 1 or values.shape[0] != len(edges):
        raise IngestError(
            edges.file, None, f"{name} shape {list(values.shape)}, expected [{len(edges)}]"
        )
    if values.dtype.kind in "fiu":
        limit = MAX_RELATIONS if names is None else len(names)
        ok = np.isfinite(values) & (values == np.round(values)) & (values >= 0) & (values < limit)
        if not ok.all():
            e = int(np.argmax(~ok))
            raise IngestError(
                edges.file,
                edges.row_of(e),
                f"{name} {values[e]} is not a relation id (an integer in 0..{limit - 1})",
            )
        values = values.astype(np.int64)
    try:
        edges.edge_type, edges.relations = relation_ids(values, names)
    except ValueError as err:
        raise IngestError(edges.file, None, f"{name}: {err}") from None


def _read_npz_edges(path: Path) -> EdgeList:
    keys = ("src", "dst", "edge_index", *_NPZ_WEIGHT, *_NPZ_FEATURES, *_NPZ_TYPES, "relations")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k in keys}
            names = list(z.files)
    except (OSError, ValueError) as e:
        raise IngestError(path, None, f"cannot load .npz: {e}") from None
    if "src" in arrays and "dst" in arrays:
        src, dst = (_int_edges(path, arrays[k], k) for k in ("src", "dst"))
        if src.ndim != 1 or src.shape != dst.shape:
            raise IngestError(
                path,
                None,
                f"src/dst must be 1-D of equal length, got {list(src.shape)} and {list(dst.shape)}",
            )
    elif "edge_index" in arrays:
        ei = _int_edges(path, arrays["edge_index"], "edge_index")
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise IngestError(path, None, f"edge_index shape {list(ei.shape)}, expected [2, E]")
        src, dst = ei[0], ei[1]
    else:
        raise IngestError(
            path, None, f"expected arrays 'src' and 'dst' or 'edge_index', found {names}"
        )
    edge_list = EdgeList(
        path, np.ascontiguousarray(src), np.ascontiguousarray(dst), lambda e: e + 1
    )
    for names_, ndim, attr in ((_NPZ_WEIGHT, 1, "weight"), (_NPZ_FEATURES, 2, "features")):
        name = next((k for k in names_ if k in arrays), None)
        if name is None:
            continue
        value = arrays[name]
        if value.dtype.kind not in "fiu":
            raise IngestError(path, None, f"{name}: dtype {value.dtype}, expected numbers")
        if value.ndim != ndim or value.shape[0] != src.size:
            want = f"[{src.size}]" if ndim == 1 else f"[{src.size}, d_e]"
            raise IngestError(
                path, None, f"{name} shape {list(value.shape)}, expected {want} (one per edge)"
            )
        setattr(edge_list, attr, _finite_edge_data(edge_list, value, name))
    name = next((k for k in _NPZ_TYPES if k in arrays), None)
    if name is not None:
        names = arrays.get("relations")
        names = None if names is None else [str(v) for v in names.reshape(-1).tolist()]
        _attach_relations(edge_list, arrays[name], name, names)
    elif "relations" in arrays:
        raise IngestError(path, None, "has 'relations' but no 'edge_type' array to name")
    return edge_list


def _parquet_column(path: Path, table, name: str, integer: bool) -> np.ndarray:  # noqa: ANN001
    """One column of a pyarrow table as numpy (``[E]``, or ``[E, k]`` for list columns)."""
    import pyarrow as pa

    col = table.column(name)
    if col.null_count:
        mask = np.asarray(col.is_null().to_numpy(zero_copy_only=False))
        row = int(np.argmax(mask))
        raise IngestError(path, row + 1, f"column {name!r} is null")
    kind = col.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        if integer:
            raise IngestError(path, None, f"column {name!r}: {kind}, expected integers")
        rows = col.to_pylist()
        width = len(rows[0]) if rows else 0
        for i, r in enumerate(rows):
            if len(r) != width:
                raise IngestError(
                    path, i + 1, f"column {name!r} has {len(r)} values, row 1 has {width}"
                )
        try:
            return np.asarray(rows, dtype=np.float64).reshape(len(rows), width)
        except (TypeError, ValueError):
            raise IngestError(path, None, f"column {name!r}: non-numeric values") from None
    ok = (
        pa.types.is_integer(kind)
        if integer
        else (pa.types.is_integer(kind) or pa.types.is_floating(kind))
    )
    if not ok:
        want = "integers" if integer else "numbers"
        raise IngestError(path, None, f"column {name!r}: {kind}, expected {want}")
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _parquet_relations(path: Path, table, name: str) -> np.ndarray:  # noqa: ANN001
    """A relation column: integer ids, or names (string or dictionary-encoded strings)."""
    import pyarrow as pa

    col = table.column(name)
    if col.null_count:
        mask = np.asarray(col.is_null().to_numpy(zero_copy_only=False))
        raise IngestError(path, int(np.argmax(mask)) + 1, f"column {name!r} is null")
    kind = col.type
    if pa.types.is_dictionary(kind):
        col, kind = col.cast(kind.value_type), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.asarray(col.to_pylist(), dtype=str)
    return _parquet_column(path, table, name, integer=True)


def _read_parquet_edges(path: Path) -> tuple[EdgeList, np.ndarray | None]:
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    except ImportError:  # pragma: no cover - pyarrow is an engine dependency
        raise IngestError(path, None, "reading Parquet needs pyarrow") from None
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types
        raise IngestError(path, None, f"cannot read Parquet: {e}") from None
    names = list(table.column_names)
    if len(names) < 2:
        raise IngestError(path, None, f"expected columns src, dst (found {names})")
    ends = ["src", "dst"] if {"src", "dst"} <= set(names) else names[:2]
    src, dst = (
        _int_edges(path, _parquet_column(path, table, n, integer=True), n).reshape(-1) for n in ends
    )
    typed = next((n for n in _PARQUET_TYPES if n in names and n not in ends), None)
    extra_cols = [
        c.reshape(-1, 1) if c.ndim == 1 else c
        for c in (
            _parquet_column(path, table, n, integer=False)
            for n in names
            if n not in ends and n != typed
        )
    ]
    edges = EdgeList(path, np.ascontiguousarray(src), np.ascontiguousarray(dst), lambda e: e + 1)
    if typed is not None:
        _attach_relations(edges, _parquet_relations(path, table, typed), typed)
    extra = np.concatenate(extra_cols, axis=1).astype(np.float64) if extra_cols else None
    return edges, extra


def _finite_edge_data(edges: EdgeList, values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as float32, refusing NaN/Inf (also float64 overflow) naming the row."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(values, dtype=np.float32)
    finite = np.isfinite(out) if out.ndim == 1 else np.isfinite(out).all(axis=1)
    if not finite.all():
        e = int(np.argmax(~finite))
        bad = np.asarray(values[e]).tolist()
        raise IngestError(
            edges.file, edges.row_of(e), f"{what} {bad} is not a finite float32 number"
        )
    return out


def _attach_columns(
    edges: EdgeList, extra: np.ndarray, edge_data: str, relation_column: bool = False
) -> EdgeList:
    """Edge data columns after src, dst: the relation id (``relation_column``), then the
    weight first (``"weight"``) or all features."""
    if relation_column:
        if extra.shape[1] == 0:
            raise IngestError(edges.file, None, "has no relation column after src, dst")
        _attach_relations(edges, extra[:, 0], "relation")
        extra = extra[:, 1:]
    if extra.shape[1] == 0:
        return edges
    if edge_data == "weight":
        edges.weight = _finite_edge_data(edges, extra[:, 0], "edge weight")
        extra = extra[:, 1:]
    if extra.shape[1]:
        edges.features = _finite_edge_data(edges, extra, "edge features")
    return edges


def read_edges(
    path: str | Path,
    *,
    delimiter: str | None = None,
    skip_header: bool = False,
    progress: bool = True,
    edge_data: str = "weight",
    relation_column: bool = False,
) -> EdgeList:
    """Read an edge file (text, ``.npy``, ``.npz`` or ``.parquet``; see module doc) into raw
    int64 arrays.

    Args:
        edge_data: what the columns after ``src, dst`` hold: ``"weight"`` (the third is
            the edge weight, further ones edge features) or ``"features"`` (all edge
            features). ``.npz`` files name their arrays instead.
        relation_column: the third column of a text or ``.npy`` file is the relation id
            of the edge (edge data columns follow it); ``.npz`` and ``.parquet`` files
            name their relation array / column instead.

    Raises:
        IngestError: unreadable file, non-numeric value, wrong column count, bad
            shape/dtype, NaN/Inf edge data (naming the file and row).
    """
    if edge_data not in EDGE_DATA_MODES:
        raise ValueError(f"edge_data must be one of {EDGE_DATA_MODES}, got {edge_data!r}")
    path = Path(path)
    if not path.is_file():
        raise IngestError(path, None, "no such file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz_edges(path)
    if relation_column and suffix == ".parquet":
        raise IngestError(
            path, None, f"Parquet names its relation column ({', '.join(_PARQUET_TYPES)})"
        )
    if suffix == ".npy":
        edges, extra = _read_npy_edges(path)
    elif suffix == ".parquet":
        edges, extra = _read_parquet_edges(path)
    else:
        if delimiter is None:
            delimiter = detect_delimiter(path, skip_header)
        edges, extra = _read_text_edges(path, delimiter, skip_header, progress)
    if extra is None:
        if relation_column:
            raise IngestError(path, None, "has no relation column after src, dst")
        return edges
    return _attach_columns(edges, extra, edge_data, relation_column)


# ---------------------------------------------------------------------------- node files
def _load_npy(path: str | Path, what: str) -> tuple[Path, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise IngestError(path, None, f"{what}: no such file")
    if path.suffix.lower() != ".npy":
        raise IngestError(path, None, f"{what}: expected a .npy file")
    try:
        return path, np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise IngestError(path, None, f"{what}: cannot load .npy: {e}") from None


def load_features(path: str | Path) -> np.ndarray:
    """Memory-map a features ``.npy`` (``[N, F]``, float32/float16/float64) read-only."""
    path, arr = _load_npy(path, "features")
    if arr.ndim != 2:
        raise IngestError(path, None, f"features shape {list(arr.shape)}, expected [N, F]")
    if arr.dtype not in (np.float32, np.float16, np.float64):
        raise IngestError(
            path, None, f"features dtype {arr.dtype}, expected float32 or float16 (or float64)"
        )
    return arr


def check_features_finite(path: str | Path, features: np.ndarray, *, progress: bool = True) -> None:
    """Scan features in chunks; raise naming the first row holding NaN/Inf.

    float64 rows are checked after conversion to float32 (overflow to Inf is caught).
    """
    n, f = features.shape
    step = max(1, (32 << 20) // max(1, f * features.itemsize))
    with progress_bar(total=n, desc="check features", unit="row", enabled=progress) as bar:
        for start in range(0, n, step):
            chunk = features[start : start + step]
            if chunk.dtype == np.float64:
                with np.errstate(over="ignore"):
                    chunk = chunk.astype(np.float32)
            bad = ~np.isfinite(chunk).all(axis=1)
            if bad.any():
                row = start + int(np.argmax(bad))
                raise IngestError(path, row + 1, "feature row has NaN or Inf")
            bar.update(chunk.shape[0])


def _int_vector(path: Path, arr: np.ndarray, what: str, n: int | None) -> np.ndarray:
    if arr.ndim != 1:
        raise IngestError(path, None, f"{what} shape {list(arr.shape)}, expected [N]")
    if arr.dtype.kind not in "iu":
        raise IngestError(path, None, f"{what} dtype {arr.dtype}, expected integers")
    if n is not None and arr.shape[0] != n:
        raise IngestError(
            path, None, f"{what} has {arr.shape[0]} rows, expected {n} (one per node)"
        )
    if arr.dtype == np.uint64 and arr.size and arr.max() > _INT64_MAX:
        row = int(np.argmax(arr > _INT64_MAX))
        raise IngestError(path, row + 1, f"{what} value {arr[row]} beyond int64")
    return np.asarray(arr, dtype=np.int64)


def load_node_ids(path: str | Path) -> np.ndarray:
    """Load external node IDs (``.npy`` ``[N]`` integers, distinct) as int64."""
    path, arr = _load_npy(path, "node IDs")
    ids = _int_vector(path, arr, "node IDs", None)
    dup = first_duplicate(ids)
    if dup is not None:
        row, first = dup
        raise IngestError(
            path, row + 1, f"duplicate node ID {int(ids[row])} (first at row {first + 1})"
        )
    return ids


def load_labels(path: str | Path, num_nodes: int) -> np.ndarray:
    """Load labels (``.npy`` ``[N]`` integers ``>= -1``) as int64."""
    path, arr = _load_npy(path, "labels")
    labels = _int_vector(path, arr, "labels", num_nodes)
    if labels.size and labels.min() < -1:
        row = int(np.argmax(labels < -1))
        raise IngestError(path, row + 1, f"label {int(labels[row])} < -1 (-1 means unlabeled)")
    return labels
