"""The wire contract itself: names, packing and documentation of hopserve.v1."""

from __future__ import annotations

import re

import pytest
from google.protobuf.descriptor import FieldDescriptor

from hopserve.proto import generate
from hopserve.proto.v1 import embedding_pb2, embedding_pb2_grpc, worker_pb2, worker_pb2_grpc

FILES = [embedding_pb2.DESCRIPTOR, worker_pb2.DESCRIPTOR]


def test_services_and_methods() -> None:
    svc = embedding_pb2.DESCRIPTOR.services_by_name["EmbeddingService"]
    assert svc.full_name == "hopserve.v1.EmbeddingService"
    methods = {m.name: m for m in svc.methods}
    assert set(methods) == {"GetEmbeddings", "StreamEmbeddings", "ListModels", "GetModel"}
    assert methods["StreamEmbeddings"].server_streaming
    assert methods["StreamEmbeddings"].output_type.name == "EmbeddingChunk"
    assert methods["GetModel"].output_type.name == "ModelInfo"
    worker = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]
    assert worker.full_name == "hopserve.v1.WorkerService"
    assert {m.name for m in worker.methods} == {
        "RunJob", "WorkerStatus", "LoadModel", "UnloadModel",
    }  # fmt: skip
    assert worker.methods_by_name["LoadModel"].output_type.name == "LoadedModel"
    assert worker.methods_by_name["WorkerStatus"].input_type.full_name == "google.protobuf.Empty"
    # the gRPC stubs import and expose both services
    assert embedding_pb2_grpc.EmbeddingServiceStub and worker_pb2_grpc.WorkerServiceStub


def test_cache_policy_enum() -> None:
    assert embedding_pb2.CachePolicy.Name(0) == "CACHE_POLICY_UNSPECIFIED"
    assert {"CACHE_USE", "CACHE_REFRESH", "CACHE_BYPASS"} <= set(embedding_pb2.CachePolicy.keys())


def _repeated_scalars(desc):
    for msg in desc.message_types_by_name.values():
        for f in msg.fields:
            if f.is_repeated and f.type not in (f.TYPE_MESSAGE, f.TYPE_BYTES, f.TYPE_STRING):
                yield msg.name, f


@pytest.mark.parametrize("desc", FILES, ids=lambda d: d.name)
def test_repeated_numbers_are_packed(desc) -> None:
    for msg_name, f in _repeated_scalars(desc):
        assert f.is_packed, f"{msg_name}.{f.name} should be packed"


def test_packed_node_ids_round_trip() -> None:
    req = embedding_pb2.GetEmbeddingsRequest(model="m", node_ids=[2**40, -1, 0])
    again = embedding_pb2.GetEmbeddingsRequest.FromString(req.SerializeToString())
    assert list(again.node_ids) == [2**40, -1, 0]
    assert not again.options.HasField("seed")
    req.options.seed = 0
    assert embedding_pb2.GetEmbeddingsRequest.FromString(req.SerializeToString()).options.HasField(
        "seed"
    )


def test_field_types() -> None:
    req = embedding_pb2.GetEmbeddingsRequest.DESCRIPTOR.fields_by_name
    assert req["node_ids"].type == FieldDescriptor.TYPE_INT64
    resp = embedding_pb2.GetEmbeddingsResponse.DESCRIPTOR.fields_by_name
    assert resp["embeddings"].type == FieldDescriptor.TYPE_BYTES
    job = worker_pb2.JobRequest.DESCRIPTOR.fields_by_name
    assert job["targets"].type == FieldDescriptor.TYPE_BYTES
    assert job["frontiers"].type == FieldDescriptor.TYPE_BYTES and job["frontiers"].is_repeated


_DECL = re.compile(
    r"^\s*(?:(?:optional|repeated)\s+)?[\w.]+\s+\w+\s*=\s*\d+|^\s*[A-Z0-9_]+\s*=\s*\d+;"
)


@pytest.mark.parametrize("source", generate.SOURCES)
def test_every_field_and_enum_value_is_commented(source: str) -> None:
    """Each field / enum value declaration is directly preceded by a // comment."""
    lines = (generate.PROTO_ROOT / source).read_text().splitlines()
    missing = [
        f"{source}:{i + 1}: {line.strip()}"
        for i, line in enumerate(lines)
        if _DECL.match(line) and not lines[i - 1].strip().startswith("//")
    ]
    assert not missing, "uncommented declarations:\n" + "\n".join(missing)
