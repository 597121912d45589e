from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CachePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_POLICY_UNSPECIFIED: _ClassVar[CachePolicy]
    CACHE_USE: _ClassVar[CachePolicy]
    CACHE_REFRESH: _ClassVar[CachePolicy]
    CACHE_BYPASS: _ClassVar[CachePolicy]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
CACHE_POLICY_UNSPECIFIED: CachePolicy
CACHE_USE: CachePolicy
CACHE_REFRESH: CachePolicy
CACHE_BYPASS: CachePolicy
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType

class NodeRows(_message.Message):
    __slots__ = ("node_ids", "features", "dim", "dtype", "node_type")
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    features: bytes
    dim: int
    dtype: DType
    node_type: str
    def __init__(self, node_ids: _Optional[_Iterable[int]] = ..., features: _Optional[bytes] = ..., dim: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., node_type: _Optional[str] = ...) -> None: ...

class EdgeList(_message.Message):
    __slots__ = ("src", "dst", "weights", "features", "feature_dim", "dtype", "relations")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    RELATIONS_FIELD_NUMBER: _ClassVar[int]
    src: _containers.RepeatedScalarFieldContainer[int]
    dst: _containers.RepeatedScalarFieldContainer[int]
    weights: bytes
    features: bytes
    feature_dim: int
    dtype: DType
    relations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, src: _Optional[_Iterable[int]] = ..., dst: _Optional[_Iterable[int]] = ..., weights: _Optional[bytes] = ..., features: _Optional[bytes] = ..., feature_dim: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., relations: _Optional[_Iterable[str]] = ...) -> None: ...

class QueryOptions(_message.Message):
    __slots__ = ("fanouts", "cache_policy", "seed")
    FANOUTS_FIELD_NUMBER: _ClassVar[int]
    CACHE_POLICY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    fanouts: _containers.RepeatedScalarFieldContainer[int]
    cache_policy: CachePolicy
    seed: int
    def __init__(self, fanouts: _Optional[_Iterable[int]] = ..., cache_policy: _Optional[_Union[CachePolicy, str]] = ..., seed: _Optional[int] = ...) -> None: ...

class GetEmbeddingsRequest(_message.Message):
    __slots__ = ("model", "model_version", "node_ids", "options", "delta", "footprint", "node_type")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FOOTPRINT_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    model: str
    model_version: str
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    options: QueryOptions
    delta: GraphDelta
    footprint: bool
    node_type: str
    def __init__(self, model: _Optional[str] = ..., model_version: _Optional[str] = ..., node_ids: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[QueryOptions, _Mapping]] = ..., delta: _Optional[_Union[GraphDelta, _Mapping]] = ..., footprint: _Optional[bool] = ..., node_type: _Optional[str] = ...) -> None: ...

class GraphDelta(_message.Message):
    __slots__ = ("add_nodes", "add_edges")
    ADD_NODES_FIELD_NUMBER: _ClassVar[int]
    ADD_EDGES_FIELD_NUMBER: _ClassVar[int]
    add_nodes: NodeRows
    add_edges: EdgeList
    def __init__(self, add_nodes: _Optional[_Union[NodeRows, _Mapping]] = ..., add_edges: _Optional[_Union[EdgeList, _Mapping]] = ...) -> None: ...

class TargetFootprint(_message.Message):
    __slots__ = ("frontier_sizes", "max_degree", "hub")
    FRONTIER_SIZES_FIELD_NUMBER: _ClassVar[int]
    MAX_DEGREE_FIELD_NUMBER: _ClassVar[int]
    HUB_FIELD_NUMBER: _ClassVar[int]
    frontier_sizes: _containers.RepeatedScalarFieldContainer[int]
    max_degree: int
    hub: bool
    def __init__(self, frontier_sizes: _Optional[_Iterable[int]] = ..., max_degree: _Optional[int] = ..., hub: _Optional[bool] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("cache_lookup", "queue_wait", "planning", "compute", "transfer", "write_back", "total", "layer_compute", "prepare")
    CACHE_LOOKUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_FIELD_NUMBER: _ClassVar[int]
    PLANNING_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    WRITE_BACK_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAYER_COMPUTE_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FIELD_NUMBER: _ClassVar[int]
    cache_lookup: float
    queue_wait: float
    planning: float
    compute: float
    transfer: float
    write_back: float
    total: float
    layer_compute: _containers.RepeatedScalarFieldContainer[float]
    prepare: float
    def __init__(self, cache_lookup: _Optional[float] = ..., queue_wait: _Optional[float] = ..., planning: _Optional[float] = ..., compute: _Optional[float] = ..., transfer: _Optional[float] = ..., write_back: _Optional[float] = ..., total: _Optional[float] = ..., layer_compute: _Optional[_Iterable[float]] = ..., prepare: _Optional[float] = ...) -> None: ...

class GetEmbeddingsResponse(_message.Message):
    __slots__ = ("dim", "dtype", "embeddings", "num_nodes", "model", "model_version", "graph_version", "timing", "cache_hits", "graph_seq", "footprints")
    DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    FOOTPRINTS_FIELD_NUMBER: _ClassVar[int]
    dim: int
    dtype: DType
    embeddings: bytes
    num_nodes: int
    model: str
    model_version: str
    graph_version: str
    timing: StageTiming
    cache_hits: int
    graph_seq: int
    footprints: _containers.RepeatedCompositeFieldContainer[TargetFootprint]
    def __init__(self, dim: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., embeddings: _Optional[bytes] = ..., num_nodes: _Optional[int] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., graph_version: _Optional[str] = ..., timing: _Optional[_Union[StageTiming, _Mapping]] = ..., cache_hits: _Optional[int] = ..., graph_seq: _Optional[int] = ..., footprints: _Optional[_Iterable[_Union[TargetFootprint, _Mapping]]] = ...) -> None: ...

class EmbeddingChunk(_message.Message):
    __slots__ = ("offset", "num_rows", "embeddings", "dim", "dtype", "num_nodes", "model", "model_version", "graph_version", "cache_hits", "timing", "graph_seq")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    offset: int
    num_rows: int
    embeddings: bytes
    dim: int
    dtype: DType
    num_nodes: int
    model: str
    model_version: str
    graph_version: str
    cache_hits: int
    timing: StageTiming
    graph_seq: int
    def __init__(self, offset: _Optional[int] = ..., num_rows: _Optional[int] = ..., embeddings: _Optional[bytes] = ..., dim: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., num_nodes: _Optional[int] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., graph_version: _Optional[str] = ..., cache_hits: _Optional[int] = ..., timing: _Optional[_Union[StageTiming, _Mapping]] = ..., graph_seq: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class BlockInfo(_message.Message):
    __slots__ = ("layer", "kind", "in_dim", "out_dim", "description")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    IN_DIM_FIELD_NUMBER: _ClassVar[int]
    OUT_DIM_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    layer: int
    kind: str
    in_dim: int
    out_dim: int
    description: str
    def __init__(self, layer: _Optional[int] = ..., kind: _Optional[str] = ..., in_dim: _Optional[int] = ..., out_dim: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "dim", "num_layers", "graph_num_nodes", "graph_num_edges", "graph_version", "ready", "blocks", "description", "dtype", "graph_seq", "state", "is_default", "traffic_percent", "node_types", "relations", "output_types")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NUM_EDGES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_PERCENT_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPES_FIELD_NUMBER: _ClassVar[int]
    RELATIONS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    dim: int
    num_layers: int
    graph_num_nodes: int
    graph_num_edges: int
    graph_version: str
    ready: bool
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    description: str
    dtype: DType
    graph_seq: int
    state: str
    is_default: bool
    traffic_percent: int
    node_types: _containers.RepeatedCompositeFieldContainer[NodeTypeInfo]
    relations: _containers.RepeatedScalarFieldContainer[str]
    output_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., dim: _Optional[int] = ..., num_layers: _Optional[int] = ..., graph_num_nodes: _Optional[int] = ..., graph_num_edges: _Optional[int] = ..., graph_version: _Optional[str] = ..., ready: _Optional[bool] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., description: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., graph_seq: _Optional[int] = ..., state: _Optional[str] = ..., is_default: _Optional[bool] = ..., traffic_percent: _Optional[int] = ..., node_types: _Optional[_Iterable[_Union[NodeTypeInfo, _Mapping]]] = ..., relations: _Optional[_Iterable[str]] = ..., output_types: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeTypeInfo(_message.Message):
    __slots__ = ("name", "count", "offset", "feature_dim", "own_ids", "output_dim")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FEATURE_DIM_FIELD_NUMBER: _ClassVar[int]
    OWN_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIM_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    offset: int
    feature_dim: int
    own_ids: bool
    output_dim: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., offset: _Optional[int] = ..., feature_dim: _Optional[int] = ..., own_ids: _Optional[bool] = ..., output_dim: _Optional[int] = ...) -> None: ...
