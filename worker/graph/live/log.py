"""The update log: an append-only, fsynced file of mutation batches (write-ahead log).

Record layout (little-endian)::

    magic   b"HSUL"  4 bytes
    seq     u64      graph sequence the batch creates
    length  u32      payload bytes
    crc     u32      CRC-32 of seq, length and payload
    payload          :func:`~.mutations.encode` of the batch; a batch carrying edge
                     data ends in an edge trailer (weights / feature rows of its added
                     edges), so records written before edge data existed decode unchanged

:meth:`UpdateLog.append` writes one record and ``fsync`` s before returning: a batch is
durable before it is acknowledged. A crash can leave at most one torn record at the end
(a short or CRC-failing tail); the first append of the next writer cuts it off, so replay
sees exactly the acknowledged batches, each whole. Sequences in the file are consecutive.
A damaged record followed by a whole one is not a torn write: every reader and the writer
refuse the file (:class:`LogCorruptError`) rather than silently drop the records after it.

Each :class:`UpdateLog` keeps the file it indexed open for reading: a compaction replaces
the file (a new inode), and while the old one is held open its inode number cannot be
reused by a later replacement, so comparing inode numbers is a reliable test of "rewritten"
(without the handle, ext4 hands the freed number to the very next rewrite, and a reader
two compactions behind read the new file at the old file's offsets).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LogCorruptError", "UpdateLog"]

log = logging.getLogger(__name__)

_HEAD = struct.Struct("<4sQII")
_MAGIC = b"HSUL"


class LogCorruptError(RuntimeError):
    """A record before the tail is damaged (not a torn write: refuse to guess)."""


def _crc(seq: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<QI", seq, len(payload))))


class UpdateLog:
    """One graph's update log file.

    Args:
        path: The log file (created on first append).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._records: list[tuple[int, int, int]] = []  # (seq, offset, length) of payloads
        self._size = 0
        self._fd: int | None = None  # appending
        self._rfd: int | None = None  # reading: the file _records indexes, held open
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of _rfd
        self._owned = False  # this object appends: it may cut a torn tail
        self._scan(cut=False)

    # ------------------------------------------------------------------ reading
    def _scan(self, cut: bool) -> None:
        """Index the records; with ``cut``, cut a torn tail (crash mid-append) off the file.

        Only the one process that appends cuts: a reader may be looking at a record being
        written, which is whole a moment later.
        """
        self._records, self._size = [], 0
        if not self._open_reader():
            return
        data = _read_from(self._rfd, 0)
        records, at = self._index(data, 0, None)
        self._records = records
        if at < len(data) and cut:
            rest = data[at:]
            log.warning("%s: cutting a torn record (%d bytes) off the end", self.path, len(rest))
            with open(self.path, "r+b") as f:
                f.truncate(at)
                f.flush()
                os.fsync(f.fileno())
        self._size = at

    def _open_reader(self) -> bool:
        """(Re)open the file for reading; False when there is no file."""
        self._close_reader()
        try:
            self._rfd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._ident = None
            return False
        st = os.fstat(self._rfd)
        self._ident = (st.st_dev, st.st_ino)
        return True

    def _index(
        self, data: bytes, base: int, prev: int | None
    ) -> tuple[list[tuple[int, int, int]], int]:
        """The whole records at the start of ``data`` (file offset ``base``) and where they
        end. A damaged record followed by a whole one raises :class:`LogCorruptError`."""
        records, at = [], 0
        while len(data) - at >= _HEAD.size:
            magic, seq, length, crc = _HEAD.unpack_from(data, at)
            end = at + _HEAD.size + length
            if magic != _MAGIC or end > len(data):
                break
            if _crc(seq, data[at + _HEAD.size : end]) != crc:
                break
            if prev is not None and seq != prev + 1:
                raise LogCorruptError(f"{self.path}: sequence {seq} follows {prev}")
            records.append((seq, base + at + _HEAD.size, length))
            prev, at = seq, end
        if at < len(data) and self._later_record(data[at:]):
            raise LogCorruptError(
                f"{self.path}: damaged record at byte {base + at} followed by more records"
            )
        return records, at

    @staticmethod
    def _later_record(rest: bytes) -> bool:
        """Whether a whole valid record starts somewhere after a damaged one."""
        start = rest.find(_MAGIC, 1)
        while start >= 0:
            if len(rest) - start >= _HEAD.size:
                magic, seq, length, crc = _HEAD.unpack_from(rest, start)
                end = start + _HEAD.size + length
                if end <= len(rest) and _crc(seq, rest[start + _HEAD.size : end]) == crc:
                    return True
            start = rest.find(_MAGIC, start + 1)
        return False

    @property
    def last_seq(self) -> int | None:
        """Sequence of the last record, ``None`` when empty."""
        return self._records[-1][0] if self._records else None

    @property
    def first_seq(self) -> int | None:
        """Sequence of the first record, ``None`` when empty."""
        return self._records[0][0] if self._records else None

    def __len__(self) -> int:
        return len(self._records)

    @property
    def size_bytes(self) -> int:
        """Bytes of the file."""
        return self._size

    def read(self, after: int, upto: int | None = None) -> Iterator[tuple[int, bytes]]:
        """``(seq, payload)`` of the records with ``after < seq <= upto``, in order.

        Records appended by another process since this object was made are found too.
        """
        if upto is not None and (self.last_seq or 0) < upto:
            self._refresh()
        if not self._records or self._rfd is None:
            return
        fd = os.dup(self._rfd)  # the indexed file, even if a compaction replaces it meanwhile
        try:
            for seq, offset, length in list(self._records):
                if seq <= after or (upto is not None and seq > upto):
                    continue
                yield seq, os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def _refresh(self) -> None:
        """Index records another process appended (never cuts: the writer owns the tail)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) != self._ident or self._rfd is None:  # rewritten
            self._scan(cut=False)
            return
        data = _read_from(self._rfd, self._size)
        records, at = self._index(data, self._size, self.last_seq)
        self._records.extend(records)
        self._size += at

    # ------------------------------------------------------------------ writing
    def append(self, seq: int, payload: bytes) -> None:
        """Write one record and fsync it (durable when this returns).

        Raises:
            ValueError: ``seq`` does not follow the last record.
            OSError: the write or fsync failed (the record is cut off again).
        """
        if not self._owned:  # first append of this process: own the tail
            self._scan(cut=True)
            self._owned = True
        last = self.last_seq
        if last is not None and seq != last + 1:
            raise ValueError(f"log sequence {seq} does not follow {last}")
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if new:
                _fsync_dir(self.path.parent)
            if self._rfd is None:  # this append creates the file: index it from here on
                self._open_reader()
        record = _HEAD.pack(_MAGIC, seq, len(payload), _crc(seq, payload)) + payload
        try:
            written = os.write(self._fd, record)
            if written != len(record):  # a short write (disk full): the record is torn
                raise OSError(f"{self.path}: wrote {written} of {len(record)} bytes")
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._size)
            raise
        self._records.append((seq, self._size + _HEAD.size, len(payload)))
        self._size += len(record)

    def rewrite(self, after: int) -> None:
        """Keep only the records with ``seq > after`` (after a compaction folded the rest
        into the base), atomically: a new file is written, fsynced and renamed over."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        kept = list(self.read(after))
        with open(tmp, "wb") as f:
            for seq, payload in kept:
                f.write(_HEAD.pack(_MAGIC, seq, len(payload), _crc(seq, payload)) + payload)
            f.flush()
            os.fsync(f.fileno())
        self.close()
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        self._scan(cut=True)

    def close(self) -> None:
        """Close the file for appending (a later append reopens it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _close_reader(self) -> None:
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None

    def __del__(self) -> None:
        try:
            self.close()
            self._close_reader()
        except (AttributeError, OSError):  # half-built, or at interpreter exit
            pass


def _read_from(fd: int, offset: int) -> bytes:
    """The file's bytes from ``offset`` to its end."""
    chunks = []
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
