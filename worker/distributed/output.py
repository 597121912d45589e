"""Parquet shards: each rank writes its rows, with the job's identity in the metadata.

One file per rank, ``part-00002-of-00004.parquet``, columns ``node_id`` (int64, the
graph's external ID) and ``embedding`` (``fixed_size_list<float32>[d]``), rows in
storage order of the rank's range. The file's key-value metadata holds
``hopserve.model_name``, ``hopserve.model_version``, ``hopserve.model_fingerprint``,
``hopserve.graph_version``, ``hopserve.rank``, ``hopserve.world_size``,
``hopserve.storage_range``. Each shard is written to a temporary name and renamed; once
every rank has written, rank 0 writes ``_SUCCESS.json`` listing the shards, so a reader
can tell a finished job from one in progress.

Read them back with ``pyarrow.parquet.read_table(out_dir)`` or :func:`read_embeddings`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

__all__ = ["SUCCESS", "check_out_dir", "read_embeddings", "shard_name", "write_shard"]

SUCCESS = "_SUCCESS.json"
_SHARD = re.compile(r"^part-(\d{5})-of-(\d{5})\.parquet$")


def shard_name(rank: int, world_size: int) -> str:
    return f"part-{rank:05d}-of-{world_size:05d}.parquet"


def check_out_dir(out: str | Path, world_size: int) -> Path:
    """Create ``out`` if needed; refuse one holding shards of a job with another world size.

    Raises:
        FileExistsError: ``out`` is a file, or holds ``part-*-of-M`` shards with
            ``M != world_size`` (readers would mix two jobs' rows).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    other = sorted(
        p.name
        for p in out.iterdir()
        if (m := _SHARD.match(p.name)) and int(m.group(2)) != world_size
    )
    if other:
        raise FileExistsError(
            f"--out {out} holds shards of a job with another number of ranks ({other[0]}, …); "
            f"this job has {world_size}: use an empty directory"
        )
    return out


def write_shard(
    out: str | Path,
    rank: int,
    world_size: int,
    node_ids: np.ndarray,
    embeddings: np.ndarray,
    metadata: dict[str, str],
) -> Path:
    """Write one rank's rows as ``out/part-RANK-of-WORLD.parquet`` (atomic rename).

    Args:
        node_ids: int64 ``[n]`` external IDs.
        embeddings: float32 ``[n, d]``.
        metadata: ``hopserve.*`` keys (strings) for the file's key-value metadata.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    n, d = emb.shape
    values = pa.array(emb.reshape(-1), type=pa.float32())
    column = pa.FixedSizeListArray.from_arrays(values, d)
    table = pa.table(
        {"node_id": pa.array(np.asarray(node_ids, dtype=np.int64)), "embedding": column}
    )
    table = table.replace_schema_metadata(
        {k.encode(): str(v).encode() for k, v in metadata.items()}
    )
    path = Path(out) / shard_name(rank, world_size)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_success(out: str | Path, world_size: int, metadata: dict[str, str]) -> Path:
    """Rank 0, after every shard is written: ``_SUCCESS.json`` with the shards and identity."""
    path = Path(out) / SUCCESS
    body = {"shards": [shard_name(r, world_size) for r in range(world_size)], **metadata}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def read_embeddings(out: str | Path) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """Every shard of a finished job: ``(node_ids, embeddings [n, d], metadata)``, rows in
    ascending node ID; ``metadata`` is the first shard's (without the rank keys)."""
    import pyarrow.parquet as pq

    out = Path(out)
    done = json.loads((out / SUCCESS).read_text())
    ids, rows, meta = [], [], {}
    for name in done["shards"]:
        table = pq.read_table(out / name)
        if not meta:
            raw = table.schema.metadata or {}
            meta = {k.decode(): v.decode() for k, v in raw.items() if k.startswith(b"hopserve.")}
        ids.append(table.column("node_id").to_numpy())
        col = table.column("embedding").combine_chunks()
        d = col.type.list_size
        rows.append(col.values.to_numpy(zero_copy_only=False).reshape(-1, d))
    node_ids = np.concatenate(ids)
    emb = np.concatenate(rows)
    order = np.argsort(node_ids, kind="stable")
    for key in ("hopserve.rank", "hopserve.storage_range"):
        meta.pop(key, None)
    return node_ids[order], emb[order], meta
