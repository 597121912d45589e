"""The front-end's view of its served models: config + graph + what the worker reported.

A :class:`ServedModel` is created from its :class:`~hopserve.config.ModelConfig`
with the model's graph store opened by the front-end (it maps external IDs and plans
frontiers on it). It starts *loading*; once a worker has the model, :meth:`mark_ready`
records the embedding width, the number of layers and the block schema (from the
worker's ``LoadedModel`` in process, or its status report over gRPC). The
:class:`ModelRegistry` resolves request names and versions to models and raises the
errors the front-end answers with.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hopserve.config import ModelConfig
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.server.errors import ModelNotFoundError, ModelNotReadyError, quote

__all__ = ["BlockSpec", "ModelRegistry", "ServedModel", "blocks_of"]

logger = logging.getLogger(__name__)

ModelState = Literal["loading", "ready", "failed"]


@dataclass(frozen=True)
class BlockSpec:
    """One layer (ConvBlock) as listed in ``ModelInfo.blocks``."""

    layer: int  # 1-based
    kind: str  # conv class name(s)
    in_dim: int = 0  # 0 = unknown
    out_dim: int = 0
    description: str = ""

    def to_proto(self) -> pb.BlockInfo:
        """As a ``hopserve.v1.BlockInfo``."""
        return pb.BlockInfo(
            layer=self.layer,
            kind=self.kind,
            in_dim=self.in_dim,
            out_dim=self.out_dim,
            description=self.description,
        )


@dataclass(eq=False)
class ServedModel:
    """A configured model, its graph and its readiness.

    Args:
        config: The model's configuration.
        graph: The model's :class:`~hopserve.worker.graph.GraphStore`.
    """

    config: ModelConfig
    graph: Any
    state: ModelState = "loading"
    dim: int = 0
    num_layers: int = 0
    input_frontier: bool = True  # whether plans need V^0 (the model has a node-wise block 0)
    blocks: tuple[BlockSpec, ...] = ()
    description: str = ""
    error: str = ""

    @property
    def name(self) -> str:
        """Model name."""
        return self.config.name

    @property
    def version(self) -> str:
        """Model version."""
        return self.config.version

    @property
    def graph_version(self) -> str:
        """Version of the graph snapshot served."""
        return str(self.graph.version)

    @property
    def ready(self) -> bool:
        """Whether requests are accepted."""
        return self.state == "ready"

    def mark_ready(
        self,
        *,
        dim: int,
        num_layers: int,
        blocks: tuple[BlockSpec, ...] = (),
        description: str = "",
    ) -> None:
        """Record what the worker loaded; requests are accepted from now on."""
        if dim < 1 or num_layers < 1:
            raise ValueError(f"model {self.name!r}: bad dim {dim} or num_layers {num_layers}")
        self.dim, self.num_layers = int(dim), int(num_layers)
        self.blocks, self.description = tuple(blocks), description
        self.state, self.error = "ready", ""

    def mark_failed(self, reason: str) -> None:
        """The model could not be loaded (or its worker lost it); requests get UNAVAILABLE."""
        self.state, self.error = "failed", reason

    def require_ready(self) -> None:
        """Raise :class:`ModelNotReadyError` unless the model accepts requests."""
        if self.state == "loading":
            raise ModelNotReadyError(f"model {self.name!r} is still loading; retry shortly")
        if self.state == "failed":
            raise ModelNotReadyError(f"model {self.name!r} is not available: {self.error}")

    def to_storage(self, external_ids: np.ndarray) -> np.ndarray:
        """External node IDs -> int64 storage ids (raises ``UnknownNodeError``)."""
        return self.graph.to_storage(external_ids).numpy()

    def to_proto(self) -> pb.ModelInfo:
        """As a ``hopserve.v1.ModelInfo``."""
        return pb.ModelInfo(
            name=self.name,
            version=self.version,
            dim=self.dim,
            num_layers=self.num_layers,
            graph_num_nodes=int(self.graph.num_nodes),
            graph_num_edges=int(self.graph.num_edges),
            graph_version=self.graph_version,
            ready=self.ready,
            blocks=[b.to_proto() for b in self.blocks],
            description=self.description or (self.error and f"not available: {self.error}"),
            dtype=pb.DTYPE_FLOAT32,
        )

    def adopt(self, info: dict[str, Any], evaluator: Any | None = None) -> None:
        """Mark ready from a worker's model description (``LoadedModel.describe()`` or a
        ``models`` entry of ``Worker.info()``), checking it serves the same graph.

        Args:
            info: ``dim``, ``num_layers`` and optionally ``graph_version``, ``mode``.
            evaluator: The in-process ``LayerwiseEvaluator``, for the block schema.
        """
        worker_graph = info.get("graph_version")
        if worker_graph and worker_graph != self.graph_version:
            self.mark_failed(
                f"the worker serves graph version {worker_graph}, the front-end "
                f"{self.graph_version}"
            )
            return
        blocks = blocks_of(evaluator) if evaluator is not None else ()
        text = "" if evaluator is None else evaluator.describe()
        mode = info.get("mode")
        description = f"{self.config.entrypoint} ({mode})" if mode else self.config.entrypoint
        self.input_frontier = bool(info.get("input_frontier", True))
        self.mark_ready(
            dim=int(info["dim"]),
            num_layers=int(info["num_layers"]),
            blocks=blocks,
            description=f"{description}\n{text}".strip(),
        )


def blocks_of(evaluator: Any) -> tuple[BlockSpec, ...]:
    """The conv blocks ``1..L`` of an in-process evaluator (best effort, never raises)."""
    split = getattr(evaluator, "split", None)
    if split is None:
        return ()
    try:
        lines = split.describe().splitlines()
        specs = []
        for block, line in zip(split.blocks, lines, strict=False):
            if block.index < 1:
                continue
            convs = [evaluator.model.get_submodule(name) for name in block.convs]
            kind = "+".join(type(c).__name__ for c in convs) or "-"
            in_dim = _channels(convs[0], "in_channels") if convs else 0
            out_dim = _out_channels(convs[-1]) if convs else 0
            specs.append(BlockSpec(block.index, kind, in_dim, out_dim, line))
        return tuple(specs)
    except Exception:  # the schema is informational only
        logger.debug("cannot describe the blocks of %r", evaluator, exc_info=True)
        return ()


def _channels(conv: Any, attr: str) -> int:
    value = getattr(conv, attr, 0)
    if isinstance(value, tuple | list):
        value = value[0]
    return int(value) if isinstance(value, int) and value > 0 else 0


def _out_channels(conv: Any) -> int:
    out = _channels(conv, "out_channels")
    heads = getattr(conv, "heads", 1)
    if out and isinstance(heads, int) and heads > 1 and getattr(conv, "concat", False):
        out *= heads
    return out


class ModelRegistry:
    """Served models by name (one version per name in this release)."""

    def __init__(self, models: list[ServedModel]) -> None:
        self._models = {m.name: m for m in models}

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(sorted(self._models.values(), key=lambda m: (m.name, m.version)))

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def get(self, name: str, version: str = "") -> ServedModel:
        """The model ``name`` (``version`` empty = the served one).

        Raises:
            ModelNotFoundError: unknown name, or a version other than the served one,
                naming what was asked for and what is served.
        """
        model = self._models.get(name)
        if model is None:
            served = ", ".join(repr(n) for n in sorted(self._models)) or "none"
            raise ModelNotFoundError(f"model {quote(name)} not found (served: {served})")
        if version and version != model.version:
            raise ModelNotFoundError(
                f"model {name!r} version {quote(version)} not found "
                f"(served: version {model.version!r})"
            )
        return model
