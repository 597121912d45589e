from google.protobuf import empty_pb2 as _empty_pb2
from hopserve.proto.v1 import embedding_pb2 as _embedding_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobRequest(_message.Message):
    __slots__ = ("job_id", "model", "model_version", "graph_version", "targets", "frontiers", "fanouts", "seed", "deadline_unix_s", "graph_seq", "delta", "updates")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    FRONTIERS_FIELD_NUMBER: _ClassVar[int]
    FANOUTS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    model_version: str
    graph_version: str
    targets: bytes
    frontiers: _containers.RepeatedScalarFieldContainer[bytes]
    fanouts: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    deadline_unix_s: float
    graph_seq: int
    delta: bytes
    updates: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., graph_version: _Optional[str] = ..., targets: _Optional[bytes] = ..., frontiers: _Optional[_Iterable[bytes]] = ..., fanouts: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., deadline_unix_s: _Optional[float] = ..., graph_seq: _Optional[int] = ..., delta: _Optional[bytes] = ..., updates: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LayerStats(_message.Message):
    __slots__ = ("layer", "rows", "batches", "input_nodes", "edges", "oom_halvings", "compute_s", "peak_bytes", "gather_free", "reused_rows", "freed_inputs")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    INPUT_NODES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    OOM_HALVINGS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    GATHER_FREE_FIELD_NUMBER: _ClassVar[int]
    REUSED_ROWS_FIELD_NUMBER: _ClassVar[int]
    FREED_INPUTS_FIELD_NUMBER: _ClassVar[int]
    layer: int
    rows: int
    batches: int
    input_nodes: int
    edges: int
    oom_halvings: int
    compute_s: float
    peak_bytes: int
    gather_free: bool
    reused_rows: int
    freed_inputs: int
    def __init__(self, layer: _Optional[int] = ..., rows: _Optional[int] = ..., batches: _Optional[int] = ..., input_nodes: _Optional[int] = ..., edges: _Optional[int] = ..., oom_halvings: _Optional[int] = ..., compute_s: _Optional[float] = ..., peak_bytes: _Optional[int] = ..., gather_free: _Optional[bool] = ..., reused_rows: _Optional[int] = ..., freed_inputs: _Optional[int] = ...) -> None: ...

class JobStats(_message.Message):
    __slots__ = ("planning_s", "prepare_s", "transfer_s", "compute_s", "write_out_s", "total_s", "frontier_sizes", "layers", "tiers", "device")
    class TiersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PLANNING_S_FIELD_NUMBER: _ClassVar[int]
    PREPARE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_OUT_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    FRONTIER_SIZES_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    planning_s: float
    prepare_s: float
    transfer_s: float
    compute_s: float
    write_out_s: float
    total_s: float
    frontier_sizes: _containers.RepeatedScalarFieldContainer[int]
    layers: _containers.RepeatedCompositeFieldContainer[LayerStats]
    tiers: _containers.ScalarMap[str, str]
    device: str
    def __init__(self, planning_s: _Optional[float] = ..., prepare_s: _Optional[float] = ..., transfer_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., write_out_s: _Optional[float] = ..., total_s: _Optional[float] = ..., frontier_sizes: _Optional[_Iterable[int]] = ..., layers: _Optional[_Iterable[_Union[LayerStats, _Mapping]]] = ..., tiers: _Optional[_Mapping[str, str]] = ..., device: _Optional[str] = ...) -> None: ...

class JobResult(_message.Message):
    __slots__ = ("job_id", "dim", "dtype", "embeddings", "num_rows", "model_version", "graph_version", "stats", "graph_seq")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    dim: int
    dtype: _embedding_pb2.DType
    embeddings: bytes
    num_rows: int
    model_version: str
    graph_version: str
    stats: JobStats
    graph_seq: int
    def __init__(self, job_id: _Optional[str] = ..., dim: _Optional[int] = ..., dtype: _Optional[_Union[_embedding_pb2.DType, str]] = ..., embeddings: _Optional[bytes] = ..., num_rows: _Optional[int] = ..., model_version: _Optional[str] = ..., graph_version: _Optional[str] = ..., stats: _Optional[_Union[JobStats, _Mapping]] = ..., graph_seq: _Optional[int] = ...) -> None: ...

class LoadedModel(_message.Message):
    __slots__ = ("name", "version", "dim", "num_layers", "graph_version", "graph_num_nodes", "reads_input_frontier", "mode", "blocks", "description", "graph_seq", "degree_normalized", "reads_source_degrees", "layer_cache_rows", "output_types", "output_dims", "reads_out_edges")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    READS_INPUT_FRONTIER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    DEGREE_NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    READS_SOURCE_DEGREES_FIELD_NUMBER: _ClassVar[int]
    LAYER_CACHE_ROWS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIMS_FIELD_NUMBER: _ClassVar[int]
    READS_OUT_EDGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    dim: int
    num_layers: int
    graph_version: str
    graph_num_nodes: int
    reads_input_frontier: bool
    mode: str
    blocks: _containers.RepeatedCompositeFieldContainer[_embedding_pb2.BlockInfo]
    description: str
    graph_seq: int
    degree_normalized: bool
    reads_source_degrees: bool
    layer_cache_rows: int
    output_types: _containers.RepeatedScalarFieldContainer[str]
    output_dims: _containers.RepeatedScalarFieldContainer[int]
    reads_out_edges: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., dim: _Optional[int] = ..., num_layers: _Optional[int] = ..., graph_version: _Optional[str] = ..., graph_num_nodes: _Optional[int] = ..., reads_input_frontier: _Optional[bool] = ..., mode: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[_embedding_pb2.BlockInfo, _Mapping]]] = ..., description: _Optional[str] = ..., graph_seq: _Optional[int] = ..., degree_normalized: _Optional[bool] = ..., reads_source_degrees: _Optional[bool] = ..., layer_cache_rows: _Optional[int] = ..., output_types: _Optional[_Iterable[str]] = ..., output_dims: _Optional[_Iterable[int]] = ..., reads_out_edges: _Optional[bool] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "device", "models", "inflight_jobs", "queued_jobs", "device_memory_used_bytes", "device_memory_total_bytes", "device_memory_peak_bytes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_JOBS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_JOBS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    device: str
    models: _containers.RepeatedCompositeFieldContainer[LoadedModel]
    inflight_jobs: int
    queued_jobs: int
    device_memory_used_bytes: int
    device_memory_total_bytes: int
    device_memory_peak_bytes: int
    def __init__(self, worker_id: _Optional[str] = ..., device: _Optional[str] = ..., models: _Optional[_Iterable[_Union[LoadedModel, _Mapping]]] = ..., inflight_jobs: _Optional[int] = ..., queued_jobs: _Optional[int] = ..., device_memory_used_bytes: _Optional[int] = ..., device_memory_total_bytes: _Optional[int] = ..., device_memory_peak_bytes: _Optional[int] = ...) -> None: ...

class WorkerLoadModelRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: str
    def __init__(self, config: _Optional[str] = ...) -> None: ...

class WorkerUnloadModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...
