"""Regenerate the committed Python stubs of the ``hopserve.v1`` protos.

Usage::

    python -m hopserve.proto.generate          # rewrite stale stubs in proto/v1/
    python -m hopserve.proto.generate --check  # exit 1 if any stub is stale

Sources live in ``proto/v1/*.proto``. protoc sees the folder ``proto/`` mounted at the
virtual path ``hopserve/proto`` (``-Ihopserve/proto=<proto dir>``), so each file's
import path is ``hopserve/proto/v1/<name>.proto`` and the generated modules import each
other as ``hopserve.proto.v1.<name>_pb2``, which is where setup.py installs them. No
post-processing of generated code is needed. See proto/README.md.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

logger = logging.getLogger(__name__)

#: Folder holding this file: mounted as ``hopserve/proto`` for protoc.
PROTO_ROOT = Path(__file__).resolve().parent
#: Import-path prefix of every hopserve proto (mirrors the Python package).
VIRTUAL_ROOT = "hopserve/proto"
#: Proto sources, relative to :data:`PROTO_ROOT`, in generation order.
SOURCES = ("v1/embedding.proto", "v1/worker.proto", "v1/admin.proto")
#: Suffixes protoc writes per source: messages, type stubs, gRPC service stubs.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_names() -> list[str]:
    """Paths (relative to :data:`PROTO_ROOT`) of every generated stub file."""
    return [src.removesuffix(".proto") + sfx for src in SOURCES for sfx in GENERATED_SUFFIXES]


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> dict[str, bytes]:
    """Run protoc (grpcio-tools) on :data:`SOURCES` and return the stubs' contents.

    Args:
        out_dir: Scratch folder for protoc's output; created if missing.
        proto_root: Folder holding ``v1/*.proto`` (mounted as ``hopserve/proto``).

    Returns:
        Generated file contents keyed by path relative to ``proto_root``
        (``"v1/embedding_pb2.py"``, ...).

    Raises:
        RuntimeError: If protoc fails or does not write an expected file.
    """
    from grpc_tools import protoc  # dev-only dependency: keep it out of import time

    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={VIRTUAL_ROOT}={proto_root}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(f"{VIRTUAL_ROOT}/{src}" for src in SOURCES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    result: dict[str, bytes] = {}
    for name in generated_names():
        path = out_dir / VIRTUAL_ROOT / name
        if not path.is_file():
            raise RuntimeError(f"protoc did not write {VIRTUAL_ROOT}/{name}")
        result[name] = path.read_bytes()
    return result


def stale_files(proto_root: Path = PROTO_ROOT) -> dict[str, bytes]:
    """Stubs under ``proto_root`` whose committed bytes differ from a fresh generation.

    Returns:
        Fresh contents of each stale (or missing) stub, keyed like :func:`generate`.
    """
    with tempfile.TemporaryDirectory(prefix="hopserve-proto-") as tmp:
        fresh = generate(Path(tmp), proto_root)
    stale = {}
    for name, content in fresh.items():
        target = proto_root / name
        if not target.is_file() or target.read_bytes() != content:
            stale[name] = content
    return stale


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale stubs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    stale = stale_files()
    if args.check:
        for name in stale:
            logger.error("stale: proto/%s (run `make proto`)", name)
        return 1 if stale else 0
    for name, content in stale.items():
        target = PROTO_ROOT / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_bytes(content)
        shutil.move(tmp, target)
        logger.info("wrote proto/%s", name)
    if not stale:
        logger.info("stubs up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
