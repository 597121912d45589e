"""Wire contract of hopserve: the ``hopserve.v1`` protos, their stubs, and the typed
front-end ↔ worker contract.

* :mod:`hopserve.proto.v1`: generated stubs (``from hopserve.proto.v1 import
  embedding_pb2, embedding_pb2_grpc``); regenerate with ``make proto``.
* :mod:`hopserve.proto.contract`: the dataclasses the front-end and the workers exchange
  (job, result, stats, status), the stage names and the job errors.
* :mod:`hopserve.proto.codec`: contract dataclasses <-> ``worker.proto`` messages, and
  job errors <-> gRPC status codes.
* :mod:`hopserve.proto.tensors`: numpy arrays <-> packed ``bytes`` fields.

Imports numpy, grpc and protobuf only (no torch), like the client SDK.
"""
