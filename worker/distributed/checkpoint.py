"""Layer-level checkpoints: each rank's layer outputs, so a failed job resumes.

After every layer a rank writes the values that layer produced for its own rows, one
``.npy`` per value, then a small JSON manifest naming them and the last completed layer;
every file is written to a temporary name, fsync'ed and renamed over the old one, so a
crash leaves the previous manifest and files intact. The manifest carries the job's
identity (model name, version and weights fingerprint, graph version, world size, the
rank's rows, the model's block schema): a checkpoint written by another job is refused
with :class:`CheckpointMismatchError`, never mixed into this one.

Layout::

    CHECKPOINT_DIR/rank-00002/manifest.json
    CHECKPOINT_DIR/rank-00002/block-1.relu.npy     (block index, value name)
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["FORMAT", "CheckpointMismatchError", "RankCheckpoint"]

FORMAT = "hopserve-embed-all-checkpoint/1"
MANIFEST = "manifest.json"


class CheckpointMismatchError(ValueError):
    """A checkpoint directory holds another job's layers (other model, graph, ranks)."""


class RankCheckpoint:
    """One rank's checkpoint directory.

    Args:
        root: the job's checkpoint directory (shared by all ranks).
        rank: this rank.
        identity: what must match to resume (JSON-serializable); see
            :meth:`~.job.JobIdentity.checkpoint_identity`.
    """

    def __init__(self, root: str | Path, rank: int, identity: dict[str, Any]) -> None:
        self.dir = Path(root) / f"rank-{rank:05d}"
        self.identity = json.loads(json.dumps(identity))  # as the manifest will hold it
        self._values: dict[str, dict[str, Any]] = {}
        self._completed = -1

    def completed(self) -> int:
        """The position (in the split's block order) of the last completed layer, ``-1``
        for none.

        Raises:
            CheckpointMismatchError: the directory was written by another job (the message
                names each differing field).
        """
        path = self.dir / MANIFEST
        if not path.is_file():
            return -1
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise CheckpointMismatchError(
                f"{path}: unreadable checkpoint manifest ({err})"
            ) from None
        if manifest.get("format") != FORMAT:
            raise CheckpointMismatchError(
                f"{path}: not a {FORMAT} manifest (format {manifest.get('format')!r})"
            )
        theirs = manifest.get("identity", {})
        diffs = [
            f"{key} {theirs.get(key)!r} (this job: {mine!r})"
            for key, mine in self.identity.items()
            if theirs.get(key) != mine
        ]
        if diffs:
            raise CheckpointMismatchError(
                f"checkpoint {self.dir} was written by another job: "
                + "; ".join(_short(d) for d in diffs)
                + ". Use a fresh --checkpoint-dir (or delete this one) to start over"
            )
        self._values = dict(manifest.get("values", {}))
        self._completed = int(manifest["completed"])
        return self._completed

    def save(self, position: int, block_index: int, values: dict[str, Tensor]) -> None:
        """Record layer ``position`` (block ``block_index``) done, with its outputs.

        ``values``: each value the block produced, this rank's rows only.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        for name, tensor in values.items():
            file = f"block-{block_index}.{name}.npy"
            arr, dtype = _to_numpy(tensor)
            _atomic_write(self.dir / file, lambda f, a=arr: np.save(f, a, allow_pickle=False))
            self._values[name] = {
                "file": file,
                "block": block_index,
                "dtype": dtype,
                "shape": list(tensor.shape),
            }
        self._completed = position
        manifest = {
            "format": FORMAT,
            "identity": self.identity,
            "completed": position,
            "completed_block": block_index,
            "values": self._values,
        }
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        _atomic_write(self.dir / MANIFEST, lambda f: f.write(text))

    def load(self, name: str) -> Tensor:
        """A value saved by :meth:`save` (this rank's rows, on the CPU)."""
        entry = self._values.get(name)
        if entry is None:
            raise CheckpointMismatchError(f"checkpoint {self.dir} has no value {name!r}")
        path = self.dir / entry["file"]
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise CheckpointMismatchError(f"{path}: unreadable ({err})") from None
        t = torch.from_numpy(arr)
        if entry["dtype"] == "bfloat16":
            t = t.view(torch.bfloat16)
        if list(t.shape) != entry["shape"]:
            raise CheckpointMismatchError(
                f"{path}: shape {list(t.shape)}, the manifest says {entry['shape']}"
            )
        return t

    def block_of(self, name: str) -> int | None:
        """The block whose checkpoint holds ``name`` (``None``: not saved)."""
        entry = self._values.get(name)
        return None if entry is None else int(entry["block"])


def _to_numpy(t: Tensor) -> tuple[np.ndarray, str]:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
        return t.view(torch.int16).numpy(), "bfloat16"
    return t.numpy(), str(t.dtype).removeprefix("torch.")


def _atomic_write(path: Path, write) -> None:  # noqa: ANN001 - callable(file)
    """Write ``path`` via a temporary file in the same folder: fsync, rename, fsync folder."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
