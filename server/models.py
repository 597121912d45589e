"""The front-end's view of its served models: config + graph topology + what a worker reported.

A :class:`ServedModel` is one *version* of a model name, created from its
:class:`~hopserve.config.ModelConfig` with the topology of its graph store opened by the
front-end (it maps external IDs and plans frontiers on it; features stay with the
workers). It starts *loading*; once a worker reports the model (a
:class:`~hopserve.proto.contract.ModelStatus`, the same from an in-process worker as
over gRPC), :meth:`ServedModel.adopt` records its width, layers, mode and block schema.
States::

    loading ──adopt──▶ ready ──unload──▶ draining ──(no request in flight)──▶ removed
       └──────────────▶ failed

The :class:`ModelRegistry` holds every version of every name, which version of a name is
its *default* (served to requests that name no version) and an optional *canary* split
(a percentage of those requests sent to another version). It resolves requests and
raises the errors the front-end answers with. Its methods are synchronous and meant to
run on the event loop, so a change of default is atomic for every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import numpy as np

from hopserve.config import ModelConfig
from hopserve.proto.contract import ModelStatus
from hopserve.proto.fields import to_message
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.server.errors import ModelNotFoundError, ModelNotReadyError, quote
from hopserve.worker.graph.live import LiveGraph
from hopserve.worker.graph.topology import GraphTopology

__all__ = ["ModelRegistry", "ModelState", "ServedModel"]

logger = logging.getLogger(__name__)

ModelState = Literal["loading", "ready", "failed", "draining"]


class ServedModel:
    """One version of a configured model, its graph topology, readiness and load.

    Args:
        config: The model's configuration.
        topology: The structure and ID map of the model's graph store.

    Attributes:
        dispatcher: Reaches the workers that have this version (set by the front-end;
            ``None``: the edge's per-name dispatcher).
        inflight: Requests resolved to this version and not yet answered.
    """

    def __init__(self, config: ModelConfig, topology: GraphTopology | LiveGraph) -> None:
        self.config = config
        self.graph = topology  # what versions on the same graph share
        self.live: LiveGraph | None = topology if isinstance(topology, LiveGraph) else None
        self.state: ModelState = "loading"
        self.status: ModelStatus | None = None  # what the worker reported
        self.error = ""
        self.dispatcher: Any = None
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def name(self) -> str:
        """Model name."""
        return self.config.name

    @property
    def version(self) -> str:
        """Model version."""
        return self.config.version

    @property
    def key(self) -> tuple[str, str]:
        """``(name, version)``."""
        return self.config.name, self.config.version

    @property
    def topology(self) -> GraphTopology:
        """The graph now (a living graph's current snapshot: hold it for a consistent view)."""
        return self.live.topology if self.live is not None else self.graph

    @property
    def graph_seq(self) -> int:
        """Graph sequence now (0 for a graph without updates)."""
        return self.live.seq if self.live is not None else 0

    @property
    def cache_graph_version(self) -> str:
        """The graph component of cache keys: the folder's history (content hash + a token
        per folder), so copies of one store that take other updates never share rows."""
        return self.live.cache_version if self.live is not None else self.graph.version

    @property
    def graph_version(self) -> str:
        """Version of the graph served: the content hash of its original base store, the
        same at every sequence (``graph_seq`` counts the updates on top)."""
        return self.live.lineage_version if self.live is not None else self.graph.version

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
    def output_types(self) -> tuple[str, ...]:
        """Node types the model outputs embeddings for (empty: every node)."""
        return tuple(getattr(self.status, "output_types", ()) or ()) if self.status else ()

    def output_dim(self, node_type: str) -> int:
        """Width of the model's embeddings of ``node_type`` (0: it outputs none of it)."""
        types = self.output_types
        if not types:
            return self.dim
        dims = tuple(getattr(self.status, "output_dims", ()) or ())
        if node_type not in types:
            return 0
        return int(dims[types.index(node_type)]) if len(dims) == len(types) else self.dim

    @property
    def plans_frontiers(self) -> bool:
        """Whether exact jobs carry planned frontiers: not for the node-wise fallback, nor
        for workers with a layer cache (they plan around their cached rows)."""
        status = self.status
        return (
            status is not None
            and status.mode == "layerwise"
            and not getattr(status, "layer_cache_rows", 0)
        )

    @property
    def reads_input_frontier(self) -> bool:
        """Whether plans annotate ``V^0`` (the model has node-wise ops before its first conv)."""
        return self.status is None or self.status.reads_input_frontier

    def adopt(self, status: ModelStatus, *, ready: bool = True) -> None:
        """Mark ready from a worker's report, unless it serves another graph or is malformed
        (``ready=False``: record the report, stay *loading* until a self-check passed)."""
        if status.graph_version != self.graph_version:
            self.mark_failed(
                f"the worker serves graph version {status.graph_version}, the front-end "
                f"{self.graph_version}"
            )
            return
        if status.dim < 1 or status.num_layers < 1:
            self.mark_failed(f"bad dim {status.dim} or num_layers {status.num_layers}")
            return
        self.status, self.error = status, ""
        self.state = "ready" if ready else "loading"

    def mark_failed(self, reason: str) -> None:
        """The model could not be loaded (or its worker lost it); requests get UNAVAILABLE."""
        self.state, self.error = "failed", reason

    def require_ready(self) -> None:
        """Raise :class:`ModelNotReadyError` unless the model accepts requests."""
        if self.state == "loading":
            raise ModelNotReadyError(f"model {self.name!r} is still loading; retry shortly")
        if self.state == "failed":
            raise ModelNotReadyError(f"model {self.name!r} is not available: {self.error}")

    # ------------------------------------------------------------------ load (drain)

    def enter(self) -> None:
        """Count a request resolved to this version (call on the event loop)."""
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        """The request counted by :meth:`enter` has its answer."""
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            self._idle.set()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no request is in flight (up to ``timeout`` s); True if none is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self._idle.is_set()

    def to_storage(self, external_ids: np.ndarray) -> np.ndarray:
        """External node IDs -> int64 storage ids (raises ``UnknownNodeError``)."""
        return self.topology.to_storage(external_ids)

    def to_proto(self, *, is_default: bool = True, traffic_percent: int = 100) -> pb.ModelInfo:
        """As a ``hopserve.v1.ModelInfo`` (routing fields as given; see
        :meth:`ModelRegistry.info`)."""
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
            graph_seq=self.graph_seq,
            state=self.state,
            is_default=is_default,
            traffic_percent=traffic_percent,
            node_types=[
                pb.NodeTypeInfo(
                    name=t.name,
                    count=t.total,
                    offset=t.offset,
                    feature_dim=t.feature_dim,
                    own_ids=self.topology.type_node_ids is not None,
                    output_dim=self.output_dim(t.name),
                )
                for t in self.topology.meta.node_types or ()
            ],
            relations=list(self.topology.meta.relations or ()),
            output_types=list(self.output_types),
        )

    def __repr__(self) -> str:
        return f"ServedModel({self.name!r}, version={self.version!r}, state={self.state!r})"


class ModelRegistry:
    """Every served version of every model name, and how unversioned requests are routed.

    Per name: one *default* version, and optionally a *canary* version that gets
    ``percent`` percent of the requests naming no version (an exact share: of every 100
    consecutive such requests, ``percent`` go to the canary). The first version of a
    name (or the one whose config says ``default: true``) is its default.
    """

    def __init__(self, models: Iterable[ServedModel] = ()) -> None:
        self._versions: dict[str, dict[str, ServedModel]] = {}
        self._default: dict[str, str] = {}
        self._canary: dict[str, tuple[str, int]] = {}
        self._turn: dict[str, int] = {}  # unversioned requests routed so far, per name
        models = list(models)
        for model in models:
            self.add(model)
        for model in models:
            if model.config.default:
                self._default[model.name] = model.version

    def __iter__(self) -> Iterator[ServedModel]:
        every = (m for versions in self._versions.values() for m in versions.values())
        return iter(sorted(every, key=lambda m: m.key))

    def __len__(self) -> int:
        return sum(len(v) for v in self._versions.values())

    def __contains__(self, name: object) -> bool:
        return name in self._versions

    def names(self) -> list[str]:
        """Model names, sorted."""
        return sorted(self._versions)

    def versions(self, name: str) -> list[ServedModel]:
        """Every version of ``name`` (any state), sorted by version; [] for an unknown name."""
        return sorted(self._versions.get(name, {}).values(), key=lambda m: m.version)

    def find(self, name: str, version: str) -> ServedModel | None:
        """The version ``(name, version)``, or None."""
        return self._versions.get(name, {}).get(version)

    def default(self, name: str) -> ServedModel:
        """The default version of ``name`` (raises :class:`ModelNotFoundError`)."""
        return self._versions[self._known(name)][self._default[name]]

    def canary(self, name: str) -> tuple[ServedModel, int] | None:
        """``(canary version, percent)`` of ``name``, or None."""
        split = self._canary.get(name)
        return None if split is None else (self._versions[name][split[0]], split[1])

    def routed(self) -> list[ServedModel]:
        """The versions unversioned requests reach: every default and canary."""
        out = [self.default(name) for name in self.names()]
        out += [c[0] for name in self.names() if (c := self.canary(name)) is not None]
        return out

    def is_default(self, model: ServedModel) -> bool:
        """Whether ``model`` is its name's default version."""
        return self._default.get(model.name) == model.version and self.find(*model.key) is model

    def traffic_percent(self, model: ServedModel) -> int:
        """Share (0..100) of its name's unversioned requests ``model`` gets."""
        split = self._canary.get(model.name)
        if self.is_default(model):
            return 100 - (split[1] if split else 0)
        return split[1] if split and split[0] == model.version else 0

    def info(self, model: ServedModel) -> pb.ModelInfo:
        """``model`` as a ``hopserve.v1.ModelInfo`` with its state and routing."""
        return model.to_proto(
            is_default=self.is_default(model), traffic_percent=self.traffic_percent(model)
        )

    def get(self, name: str, version: str = "") -> ServedModel:
        """The version ``version`` of ``name`` in any state (empty: the default).

        Raises:
            ModelNotFoundError: unknown name or version, naming what was asked for (cut
                to a bounded length) and what is served.
        """
        self._known(name)
        if not version:
            return self.default(name)
        model = self._versions[name].get(version)
        if model is None:
            served = ", ".join(repr(v) for v in sorted(self._versions[name]))
            raise ModelNotFoundError(
                f"model {quote(name)} version {quote(version)} not found (served: version {served})"
            )
        return model

    def route(self, name: str, version: str = "") -> ServedModel:
        """The version a request for ``(name, version)`` is served by.

        An empty ``version`` gets the default, or the canary for its share of requests.
        A named version being unloaded (draining) is not found any more.

        Raises:
            ModelNotFoundError: unknown name or version, or a draining version.
        """
        model = self.get(name, version)
        split = self._canary.get(name)
        if not version and split is not None:
            turn = self._turn[name] = self._turn.get(name, 0) + 1
            percent = split[1]
            if turn * percent // 100 > (turn - 1) * percent // 100:  # exactly percent of 100
                model = self._versions[name][split[0]]
        if model.state == "draining":
            raise ModelNotFoundError(
                f"model {quote(name)} version {quote(model.version)} is being unloaded"
            )
        return model

    # ------------------------------------------------------------------ changes

    def add(self, model: ServedModel) -> None:
        """Add a version; the first version of a name becomes its default.

        Raises:
            ValueError: the version is already there.
        """
        versions = self._versions.setdefault(model.name, {})
        if model.version in versions:
            raise ValueError(f"model {model.name!r} version {model.version!r} exists")
        versions[model.version] = model
        self._default.setdefault(model.name, model.version)

    def set_default(self, name: str, version: str, canary: str = "", percent: int = 0) -> None:
        """Route ``name``'s unversioned requests to ``version`` (and ``percent`` percent of
        them to ``canary``, when given). Checks are the caller's; versions must exist."""
        versions = self._versions[name]
        if version not in versions or (canary and canary not in versions):
            raise KeyError(f"{name}: {version!r} / {canary!r}")
        self._default[name] = version
        if canary and percent > 0:
            self._canary[name] = (canary, int(percent))
        else:
            self._canary.pop(name, None)
        self._turn[name] = 0

    def drain(self, model: ServedModel) -> None:
        """Mark ``model`` draining and take it out of the canary split (not the default:
        the caller moves the default first, or unloads the name's last version)."""
        split = self._canary.get(model.name)
        if split is not None and split[0] == model.version:
            del self._canary[model.name]
        model.state = "draining"

    def remove(self, model: ServedModel) -> None:
        """Forget ``model``; a name whose last version goes is forgotten too."""
        versions = self._versions.get(model.name, {})
        if versions.get(model.version) is not model:
            return
        del versions[model.version]
        split = self._canary.get(model.name)
        if split is not None and split[0] == model.version:
            del self._canary[model.name]
        if not versions:
            del self._versions[model.name]
            self._default.pop(model.name, None)
            self._turn.pop(model.name, None)
        elif self._default.get(model.name) == model.version:
            self._default[model.name] = min(versions)  # only after a failed load

    def _known(self, name: str) -> str:
        if name not in self._versions:
            served = ", ".join(repr(n) for n in sorted(self._versions)) or "none"
            raise ModelNotFoundError(f"model {quote(name)} not found (served: {served})")
        return name
