from hopserve.proto.v1 import embedding_pb2 as _embedding_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateGraphRequest(_message.Message):
    __slots__ = ("model", "add_nodes", "add_edges", "remove_edges", "set_features", "idempotency_key")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADD_NODES_FIELD_NUMBER: _ClassVar[int]
    ADD_EDGES_FIELD_NUMBER: _ClassVar[int]
    REMOVE_EDGES_FIELD_NUMBER: _ClassVar[int]
    SET_FEATURES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    model: str
    add_nodes: _embedding_pb2.NodeRows
    add_edges: _embedding_pb2.EdgeList
    remove_edges: _embedding_pb2.EdgeList
    set_features: _embedding_pb2.NodeRows
    idempotency_key: str
    def __init__(self, model: _Optional[str] = ..., add_nodes: _Optional[_Union[_embedding_pb2.NodeRows, _Mapping]] = ..., add_edges: _Optional[_Union[_embedding_pb2.EdgeList, _Mapping]] = ..., remove_edges: _Optional[_Union[_embedding_pb2.EdgeList, _Mapping]] = ..., set_features: _Optional[_Union[_embedding_pb2.NodeRows, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class UpdateGraphResponse(_message.Message):
    __slots__ = ("graph_seq", "graph_version", "nodes_added", "edges_added", "edges_removed", "features_set", "rows_invalidated", "replayed", "num_nodes", "num_edges")
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_ADDED_FIELD_NUMBER: _ClassVar[int]
    EDGES_ADDED_FIELD_NUMBER: _ClassVar[int]
    EDGES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    FEATURES_SET_FIELD_NUMBER: _ClassVar[int]
    ROWS_INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_EDGES_FIELD_NUMBER: _ClassVar[int]
    graph_seq: int
    graph_version: str
    nodes_added: int
    edges_added: int
    edges_removed: int
    features_set: int
    rows_invalidated: int
    replayed: bool
    num_nodes: int
    num_edges: int
    def __init__(self, graph_seq: _Optional[int] = ..., graph_version: _Optional[str] = ..., nodes_added: _Optional[int] = ..., edges_added: _Optional[int] = ..., edges_removed: _Optional[int] = ..., features_set: _Optional[int] = ..., rows_invalidated: _Optional[int] = ..., replayed: _Optional[bool] = ..., num_nodes: _Optional[int] = ..., num_edges: _Optional[int] = ...) -> None: ...

class CompactGraphRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetGraphRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GraphInfo(_message.Message):
    __slots__ = ("path", "graph_version", "graph_seq", "base_seq", "log_batches", "log_bytes", "num_nodes", "num_edges", "models", "compacting", "relations")
    PATH_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEQ_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LOG_BATCHES_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_EDGES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    COMPACTING_FIELD_NUMBER: _ClassVar[int]
    RELATIONS_FIELD_NUMBER: _ClassVar[int]
    path: str
    graph_version: str
    graph_seq: int
    base_seq: int
    log_batches: int
    log_bytes: int
    num_nodes: int
    num_edges: int
    models: _containers.RepeatedScalarFieldContainer[str]
    compacting: bool
    relations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, path: _Optional[str] = ..., graph_version: _Optional[str] = ..., graph_seq: _Optional[int] = ..., base_seq: _Optional[int] = ..., log_batches: _Optional[int] = ..., log_bytes: _Optional[int] = ..., num_nodes: _Optional[int] = ..., num_edges: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ..., compacting: _Optional[bool] = ..., relations: _Optional[_Iterable[str]] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("config", "make_default")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    MAKE_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    config: str
    make_default: bool
    def __init__(self, config: _Optional[str] = ..., make_default: _Optional[bool] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ("version", "drained_requests")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAINED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    version: str
    drained_requests: int
    def __init__(self, version: _Optional[str] = ..., drained_requests: _Optional[int] = ...) -> None: ...

class SetDefaultModelRequest(_message.Message):
    __slots__ = ("name", "version", "canary_version", "canary_percent")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    canary_version: str
    canary_percent: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., canary_version: _Optional[str] = ..., canary_percent: _Optional[int] = ...) -> None: ...
