"""The front-end's view of its served models: config + graph topology + what a worker reported.

A :class:`ServedModel` is created from its :class:`~hopserve.config.ModelConfig` with the
topology of its graph store opened by the front-end (it maps external IDs and plans
frontiers on it; features stay with the workers). It starts *loading*; once a worker
reports the model (a :class:`~hopserve.proto.contract.ModelStatus`, the same from an
in-process worker as over gRPC), :meth:`ServedModel.adopt` records its width, layers,
mode and block schema. The :class:`ModelRegistry` resolves request names and versions
and raises the errors the front-end answers with.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Literal

import numpy as np

from hopserve.config import ModelConfig
from hopserve.proto.contract import ModelStatus
from hopserve.proto.fields import to_message
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.server.errors import ModelNotFoundError, ModelNotReadyError, quote
from hopserve.worker.graph.topology import GraphTopology

__all__ = ["ModelRegistry", "ServedModel"]

logger = logging.getLogger(__name__)

ModelState = Literal["loading", "ready", "failed"]


class ServedModel:
    """A configured model, its graph topology and its readiness.

    Args:
        config: The model's configuration.
        topology: The structure and ID map of the model's graph store.
    """

    def __init__(self, config: ModelConfig, topology: GraphTopology) -> None:
        self.config = config
        self.topology = topology
        self.state: ModelState = "loading"
        self.status: ModelStatus | None = None  # what the worker reported
        self.error = ""

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
        """Version of the graph served."""
        return self.topology.version

    @property
    def ready(self) -> bool:
        """Whether requests are accepted."""
        return self.state == "ready"

    @property
    def dim(self) -> int:
        """Embedding width (0 until ready)."""
        return self.status.dim if self.status else 0

    @property
    def num_layers(self) -> int:
        """Layers L (0 until ready)."""
        return self.status.num_layers if self.status else 0

    @property
    def plans_frontiers(self) -> bool:
        """Whether exact jobs carry planned frontiers (not for the node-wise fallback)."""
        return self.status is not None and self.status.mode == "layerwise"

    @property
    def reads_input_frontier(self) -> bool:
        """Whether plans annotate ``V^0`` (the model has node-wise ops before its first conv)."""
        return self.status is None or self.status.reads_input_frontier

    def adopt(self, status: ModelStatus) -> None:
        """Mark ready from a worker's report, unless it serves another graph or is malformed."""
        if status.graph_version != self.graph_version:
            self.mark_failed(
                f"the worker serves graph version {status.graph_version}, the front-end "
                f"{self.graph_version}"
            )
            return
        if status.dim < 1 or status.num_layers < 1:
            self.mark_failed(f"bad dim {status.dim} or num_layers {status.num_layers}")
            return
        self.status, self.state, self.error = status, "ready", ""

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
        return self.topology.to_storage(external_ids)

    def to_proto(self) -> pb.ModelInfo:
        """As a ``hopserve.v1.ModelInfo``."""
        s = self.status
        return pb.ModelInfo(
            name=self.name,
            version=self.version,
            dim=self.dim,
            num_layers=self.num_layers,
            graph_num_nodes=int(self.topology.num_nodes),
            graph_num_edges=int(self.topology.num_edges),
            graph_version=self.graph_version,
            ready=self.ready,
            blocks=[to_message(b, pb.BlockInfo) for b in (s.blocks if s else ())],
            description=(s.description if s else "")
            or (self.error and f"not available: {self.error}"),
            dtype=pb.DTYPE_FLOAT32,
        )


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
                naming what was asked for (cut to a bounded length) and what is served.
        """
        model = self._models.get(name)
        if model is None:
            served = ", ".join(repr(n) for n in sorted(self._models)) or "none"
            raise ModelNotFoundError(f"model {quote(name)} not found (served: {served})")
        if version and version != model.version:
            raise ModelNotFoundError(
                f"model {quote(name)} version {quote(version)} not found (served: version "
                f"{model.version!r})"
            )
        return model
