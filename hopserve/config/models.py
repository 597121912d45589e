"""Configuration models: one pydantic model per area, gathered into :class:`HopserveConfig`.

Every field has a docstring (exported as its description) and bounds. Models forbid
unknown keys and are frozen; use ``model_copy(update=...)`` to derive a variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator, model_validator

from hopserve.config.errors import ConfigError
from hopserve.config.security import SecurityConfig
from hopserve.config.types import Address, Device, Entrypoint, Identifier, SecretUrl
from hopserve.worker.engine.settings import DEFAULT_LAYER_CACHE_ROWS, EngineSettings

__all__ = [
    "CacheConfig",
    "EngineConfig",
    "HopserveConfig",
    "LoggingConfig",
    "ModelConfig",
    "ServerConfig",
]

_GiB = 1 << 30
_MiB = 1 << 20


def _anchor(base: Path, path: Path) -> Path:
    """``path`` made absolute against ``base`` (``~`` expanded; absolute paths kept)."""
    path = path.expanduser()
    return path if path.is_absolute() else (base / path).resolve()


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
    )


class ModelConfig(_Section):
    """One served model: the user's class, its weights and the graph it runs on."""

    name: Identifier
    """Model name used in requests, cache keys and metric labels (letters, digits, ``_.-``)."""

    version: Identifier = "1"
    """Model version; part of every cache key, so bumping it never serves a stale embedding."""

    entrypoint: Entrypoint
    """Python entrypoint of the user's model class, ``"package.module:ClassName"``. The
    module is imported from ``python_path`` first (the config file's folder is on it), then
    from the installed packages."""

    python_path: list[Path] = Field(default_factory=list)
    """Extra folders to import ``entrypoint``'s module from, searched before the installed
    packages. The config file's own folder is always searched first."""

    config_dir: Path | None = Field(default=None, exclude=True)
    """The folder of the config file this model came from (set by the loader; not a key)."""

    @property
    def search_path(self) -> list[Path]:
        """Where ``entrypoint``'s module is imported from first: the config file's folder,
        then ``python_path``."""
        return list(dict.fromkeys([*([self.config_dir] if self.config_dir else []),
                                   *self.python_path]))  # fmt: skip

    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the model class constructor."""

    weights: Path | None = None
    """Path to a ``state_dict`` file, loaded with ``torch.load(weights_only=True)``.
    ``None`` keeps the constructor's initialisation (demos and tests only)."""

    weights_key: str | None = None
    """For a checkpoint that wraps the ``state_dict`` (``{"model_state_dict": ...,
    "optimizer": ...}``): the key holding it. ``None``: the file is the ``state_dict``."""

    graph: Path
    """Graph-store directory (CSC memmap, features, ID maps) the model runs on."""

    device: Device = "cpu"
    """Where the worker runs this model: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""

    fallback: Literal["error", "nodewise"] = "error"
    """What to do with a model the layer-wise engine refuses (a K-hop conv, an op that mixes
    nodes, untraceable control flow): ``"error"`` refuses to load it and says why;
    ``"nodewise"`` serves it exactly but slowly, node by node over its receptive field."""

    hops: Annotated[int, Field(ge=1, le=64)] | None = None
    """Receptive field (in hops) for ``fallback: nodewise`` when it cannot be inferred
    from the model (the refusal says so)."""

    fanouts_allowed: bool = True
    """Whether requests may ask for sampled (approximate) neighbourhoods via fanouts.
    Exact full-neighbour embeddings are always allowed."""

    max_targets: Annotated[int, Field(ge=1, le=10_000_000)] = 100_000
    """Largest number of target nodes one request may ask this model for."""

    default: bool = False
    """With several versions of one name listed: the version served to requests that name
    no version (exactly one of them says ``true``). A name listed once is its default."""

    @field_validator("version", mode="before")
    @classmethod
    def _version_to_str(cls, value: Any) -> Any:
        # YAML reads `version: 2` as an int; a version is a label, not a number.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    def validate_paths(self, where: str | None = None) -> None:
        """Check that ``weights`` is an existing file and ``graph`` an existing directory.

        Raises:
            ConfigError: naming the field (as ``<where>.<field>``, by default
                ``model '<name>'``) and the path for every missing one.
        """
        problems = self._path_problems(where or f"model {self.name!r}")
        if problems:
            raise ConfigError(problems)

    def anchored(self, base: Path) -> ModelConfig:
        """This model with relative paths resolved against ``base``, the config file's
        folder (also the first place its entrypoint is imported from)."""
        return self.model_copy(
            update={
                "weights": None if self.weights is None else _anchor(base, self.weights),
                "graph": _anchor(base, self.graph),
                "python_path": [_anchor(base, p) for p in self.python_path],
                "config_dir": base,
            }
        )

    def _path_problems(self, where: str) -> list[str]:
        problems = []
        if self.weights is not None and not self.weights.is_file():
            problems.append(f"{where}.weights: file not found (got '{self.weights}')")
        if not self.graph.is_dir():
            problems.append(f"{where}.graph: directory not found (got '{self.graph}')")
        return problems


def _unique_addresses(value: list[str], what: str) -> list[str]:
    """``value`` unchanged, or a ValueError naming every address listed twice."""
    duplicates = sorted({a for a in value if value.count(a) > 1})
    if duplicates:
        raise ValueError(f"duplicate {what} address(es): {', '.join(duplicates)}")
    return value


class ServerConfig(_Section):
    """The gRPC front-end: listening addresses, batching, queueing and deadlines."""

    host: str = "127.0.0.1"
    """Address the gRPC and metrics servers bind to: loopback by default; ``"0.0.0.0"``
    or ``"[::]"`` for all interfaces (then configure ``security``, or it warns)."""

    port: Annotated[int, Field(ge=1, le=65535)] = 50051
    """gRPC port."""

    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9090
    """Port of the Prometheus ``/metrics`` endpoint; 0 disables it."""

    max_batch_targets: Annotated[int, Field(ge=1, le=10_000_000)] = 4096
    """Most target nodes the batcher coalesces into one worker job."""

    max_wait_ms: Annotated[float, Field(ge=0.0, le=10_000.0)] = 2.0
    """How long the batcher waits for more requests before dispatching a partial batch."""

    max_batch_requests: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """Most requests coalesced into one job; 0 = no limit. ``1`` (with ``max_wait_ms: 0``)
    turns dynamic batching off: each request is computed as its own job."""

    max_queue: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Bounded queue length (requests per model); beyond it requests get RESOURCE_EXHAUSTED."""

    max_request_nodes: Annotated[int, Field(ge=1, le=100_000_000)] = 100_000
    """Most node ids a single request may carry (validated at the edge)."""

    default_deadline_s: Annotated[float, Field(gt=0.0, le=3600.0)] = 30.0
    """Deadline applied to requests that arrive without one."""

    stall_timeout_s: Annotated[float, Field(gt=0.0, le=3600.0)] = 10.0
    """A model whose batches stop finishing for this long while requests wait is reported
    stalled: health NOT_SERVING for it and ``hopserve_model_stalled`` 1, until a batch
    finishes again. Set it above your slowest expected batch."""

    hub_degree: Annotated[int, Field(ge=1)] = 1000
    """In-degree from which a node counts as a hub in a request's footprint
    (``GetEmbeddingsRequest.footprint``)."""

    grace_period_s: Annotated[float, Field(ge=0.0, le=600.0)] = 10.0
    """On shutdown, how long in-flight requests may finish before being cancelled."""

    workers: list[Address] = Field(default_factory=list)
    """Remote worker addresses ``"host:port"``; empty runs one embedded in-process worker.
    A comma-separated string is accepted too (handy in environment overrides)."""

    local_workers: Annotated[int, Field(ge=0, le=64)] = 0
    """Worker processes the front-end starts and supervises on this host (``hopserve serve
    --workers N``): each its own interpreter (compute leaves the front-end's GIL), reached
    over a Unix socket in a private directory, the graph store shared through the page
    cache; a crashed one is restarted. 0: one in-process worker per device."""

    @field_validator("workers", mode="before")
    @classmethod
    def _split_workers(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("workers")
    @classmethod
    def _unique_workers(cls, value: list[str]) -> list[str]:
        return _unique_addresses(value, "worker")

    @model_validator(mode="after")
    def _distinct_ports(self) -> ServerConfig:
        if self.metrics_port == self.port:
            raise ValueError(f"metrics_port must differ from port (both are {self.port})")
        if self.local_workers and self.workers:
            raise ValueError(
                f"local_workers ({self.local_workers}) and workers ({', '.join(self.workers)}) "
                "exclude each other: the front-end either starts its workers or connects to them"
            )
        return self


class CacheConfig(_Section):
    """The embedding cache in front of the workers."""

    backend: Literal["auto", "redis", "memory", "none", "redis-cluster"] = "auto"
    """``"redis"``: Redis at ``redis_url`` (keeps trying if it is down); ``"memory"``:
    in-process LRU; ``"none"``: no caching; ``"auto"``: Redis if it answers a PING at
    start-up, else the in-process LRU; ``"redis-cluster"``: the Redis Cluster that
    ``redis_url`` (one of its nodes) and ``redis_cluster_nodes`` belong to."""

    redis_url: SecretUrl = SecretUrl("redis://127.0.0.1:6379/0")
    """Redis URL (``redis://[[user]:password@]host:port/db``, ``rediss://`` or
    ``unix://``). Secret-bearing: shown with its password redacted everywhere. With
    ``backend: redis-cluster``: one node of the cluster, whose user, password and TLS
    (``rediss://``) apply to every node; no database but 0, no ``unix://``."""

    redis_cluster_nodes: list[Address] = Field(default_factory=list)
    """More nodes of the Redis Cluster (``host:port``), tried in turn when the node of
    ``redis_url`` does not answer while the cluster's layout is discovered; the client
    then learns every node from the cluster itself. Only with ``backend: redis-cluster``."""

    ttl_s: Annotated[int, Field(ge=0, le=365 * 24 * 3600)] = 3600
    """Expiry of each cached embedding in seconds; 0 means no expiry (then run Redis with
    ``maxmemory-policy allkeys-lru``)."""

    memory_max_entries: Annotated[int, Field(ge=1, le=1_000_000_000)] = 100_000
    """Capacity (rows) of the in-process LRU cache."""

    near_entries: Annotated[int, Field(ge=0, le=1_000_000_000)] = 0
    """With ``redis`` / ``redis-cluster``: an in-process LRU of this many rows in front of
    Redis, so hot rows are answered without a round trip (same freshness rule as Redis:
    rows carry their graph sequence). 0: off."""

    far_min_hit_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01
    """With a near tier: when Redis has found fewer than this share of a model's near-tier
    misses (over the last 1024 it was asked for), only one lookup in 16 asks it until the
    share recovers; the others are misses, computed and written to both tiers (exact as
    ever). Saves the round trip where no other front-end writes the rows. 0: always ask."""

    key_prefix: Identifier = "hopserve"
    """First component of every Redis key, to share one Redis between deployments."""

    redis_timeout_s: Annotated[float, Field(gt=0.0, le=10.0)] = 0.25
    """Socket connect/read timeout for Redis; keep it short so a sick Redis costs little."""

    redis_backoff_s: Annotated[float, Field(ge=0.0, le=300.0)] = 1.0
    """After a Redis failure, how long to skip Redis before probing it again."""

    redis_max_connections: Annotated[int, Field(ge=1, le=10_000)] = 64
    """Round trips to Redis at once (the connection pool's size); a lookup waits up to
    ``redis_timeout_s`` for a turn and is otherwise answered without the cache."""

    invalidation: Literal["exact", "flush"] = "exact"
    """What a graph update does to cached rows: ``exact`` stops serving only the rows it
    can change (the L-hop downstream set, per model); ``flush`` stops serving every row
    computed before it (the baseline the update benchmark compares against)."""

    refresh_hot_rows: Annotated[int, Field(ge=0, le=1_000_000)] = 1024
    """After an update, recompute in the background up to this many of the invalidated
    rows that were requested recently (their next lookup is a hit again); 0 = off."""

    integrity_key_file: Path | None = None
    """File holding a secret (at least 16 bytes) that keys the MAC of every cached value,
    so that whoever can write to Redis cannot forge a row; every front-end sharing the
    Redis needs the same key. ``None``: an unkeyed checksum, which still refuses corrupted,
    truncated, misplaced and non-finite values."""

    @field_validator("redis_cluster_nodes")
    @classmethod
    def _unique_nodes(cls, value: list[str]) -> list[str]:
        return _unique_addresses(value, "node")

    @model_validator(mode="after")
    def _cluster_settings(self) -> CacheConfig:
        if self.backend != "redis-cluster":
            if self.redis_cluster_nodes:
                raise ValueError(
                    "redis_cluster_nodes is only used with backend: redis-cluster "
                    f"(backend is {self.backend!r})"
                )
            return self
        url = urlsplit(self.redis_url.get_secret_value())
        if url.scheme not in ("redis", "rediss"):
            raise ValueError(
                "with backend: redis-cluster, redis_url must be redis:// or rediss:// "
                f"(a cluster node; got {str(self.redis_url)!r})"
            )
        if url.path.strip("/") not in ("", "0"):
            raise ValueError(
                "with backend: redis-cluster, redis_url must name database 0 or none "
                f"(a cluster has only database 0; got {str(self.redis_url)!r})"
            )
        return self


class EngineConfig(_Section):
    """The layer-wise evaluator run by the workers (sizes accept ``"512MiB"``, ``"8GiB"``).

    Defaults are the library's own (:class:`~hopserve.worker.engine.settings.EngineSettings`),
    so a worker and a notebook evaluate alike; ``null`` means "the device's default".
    """

    memory_budget_bytes: Annotated[ByteSize, Field(ge=16 * _MiB)] | None = None
    """Bytes one batch may use. CPU: the accounted per-batch budget (default 256 MiB).
    GPU: a cap on top of 90% of the free device memory (default: no cap)."""

    host_memory_budget_bytes: Annotated[ByteSize, Field(ge=16 * _MiB)] | None = None
    """Host memory for intermediate layer outputs before they spill to ``spill_dir``
    (default: half of the available RAM when the model loads)."""

    spill_dir: Path | None = None
    """Directory for layer outputs that exceed the host budget; ``None`` = system temp dir."""

    prefetch: bool | None = None
    """Overlap gathering the next batch's inputs with the current batch's compute
    (default: on for CUDA, off on CPU where the thread competes with compute)."""

    graph_on_device: bool | None = None
    """Keep the graph's CSC and features on the GPU, uploaded once per graph version
    (default: when they take at most 40% of the free device memory; CPU: ignored)."""

    device_tier_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    """Share of free device memory one stored layer output may take on the GPU before it
    goes to pinned host memory (0: every layer output on the host)."""

    layer_cache_rows: Annotated[int, Field(ge=0)] = DEFAULT_LAYER_CACHE_ROWS
    """Exact reuse of intermediate embeddings: each worker keeps the layer-l rows of this
    many hub nodes (most in-edges) per intermediate layer, tagged with the graph sequence
    and invalidated by the living graph's rule; request frontiers stop at them
    (0: off). Memory: rows x layer width x 4 bytes per layer."""

    def settings(self) -> EngineSettings:
        """As the evaluator's :class:`~hopserve.worker.engine.settings.EngineSettings`."""
        return EngineSettings(
            memory_budget_bytes=None
            if self.memory_budget_bytes is None
            else int(self.memory_budget_bytes),
            host_memory_budget_bytes=None
            if self.host_memory_budget_bytes is None
            else int(self.host_memory_budget_bytes),
            spill_dir=None if self.spill_dir is None else str(self.spill_dir),
            prefetch=self.prefetch,
            graph_on_device=self.graph_on_device,
            device_tier_fraction=self.device_tier_fraction,
        )


class LoggingConfig(_Section):
    """Process logging."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    """Root log level (case-insensitive)."""

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class HopserveConfig(_Section):
    """The whole configuration of one ``hopserve serve`` process."""

    models: list[ModelConfig] = Field(default_factory=list)
    """Models served by this process; each (name, version) once. A name listed with
    several versions has exactly one marked ``default: true``."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    """gRPC front-end settings."""

    cache: CacheConfig = Field(default_factory=CacheConfig)
    """Embedding cache settings."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    """Layer-wise evaluator settings."""

    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Logging settings."""

    security: SecurityConfig = Field(default_factory=SecurityConfig)
    """TLS, tokens and rate limits; the front-end ↔ worker credentials."""

    @field_validator("models")
    @classmethod
    def _unique_names(cls, value: list[ModelConfig]) -> list[ModelConfig]:
        keys = [(m.name, m.version) for m in value]
        duplicates = sorted({f"{n} (version {v!r})" for n, v in keys if keys.count((n, v)) > 1})
        if duplicates:
            raise ValueError(f"duplicate model name(s): {', '.join(duplicates)}")
        problems = []
        for name in sorted({n for n, _ in keys}):
            versions = [m for m in value if m.name == name]
            defaults = [m.version for m in versions if m.default]
            if len(versions) > 1 and len(defaults) != 1:
                listed = ", ".join(repr(m.version) for m in versions)
                problems.append(
                    f"model {name!r} is listed with versions {listed}: mark exactly one "
                    f"'default: true' (got {len(defaults)})"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return value

    def model(self, name: str) -> ModelConfig:
        """Return the model called ``name`` (its default version when several are listed).

        Raises:
            KeyError: no model has that name.
        """
        versions = [m for m in self.models if m.name == name]
        if not versions:
            raise KeyError(name)
        return next((m for m in versions if m.default), versions[0])

    def anchored(self, base: Path) -> HopserveConfig:
        """This config with every relative path (weights, graphs, python paths, the cache
        key file, the spill directory, certificates and token files) resolved against ``base``, the config file's folder,
        as docker compose and kustomize resolve theirs."""
        cache, engine = self.cache, self.engine
        return self.model_copy(
            update={
                "models": [m.anchored(base) for m in self.models],
                "cache": cache.model_copy(
                    update={
                        "integrity_key_file": None
                        if cache.integrity_key_file is None
                        else _anchor(base, cache.integrity_key_file)
                    }
                ),
                "engine": engine.model_copy(
                    update={
                        "spill_dir": None
                        if engine.spill_dir is None
                        else _anchor(base, engine.spill_dir)
                    }
                ),
                "security": self.security.anchored(base),
            }
        )

    def validate_paths(self) -> None:
        """Check every model's ``weights`` file and ``graph`` directory exist.

        Raises:
            ConfigError: listing every missing path with its key path.
        """
        problems: list[str] = []
        for index, model in enumerate(self.models):
            problems += model._path_problems(f"models[{index}]")
        if problems:
            raise ConfigError(problems)
