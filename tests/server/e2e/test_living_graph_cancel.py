"""Cancelled graph work leaves nothing half done and nothing wedged.

UpdateGraph and a cold-start GetEmbeddings (with a delta) are cancelled by the client
at delays swept across the call (before the server sees it, while the batch is applied or
the delta is evaluated, after the answer). After each cancellation the graph is at its
old sequence or the next one, whole; a retry with the same idempotency key is answered,
never applied twice; served rows equal the model's forward on the graph as it is; and the
next update and query go through.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import torch
from support import assert_exact

from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc, embedding_pb2_grpc
from hopserve.proto.v1 import embedding_pb2 as pb

from .conftest import FEATURES, external_ids
from .test_living_graph import Oracle, _rows, serve

DELAYS = (0.0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.05)


def _served(embed, ids) -> torch.Tensor:
    answer = embed.GetEmbeddings(pb.GetEmbeddingsRequest(model="sage", node_ids=ids.tolist()))
    rows = np.frombuffer(answer.embeddings, "<f4").reshape(len(ids), -1)
    return torch.from_numpy(rows.copy())


def test_a_cancelled_update_is_applied_whole_or_not_at_all(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    server = serve(tmp_path, graph_dir, redis_server)
    oracle = Oracle(tmp_path / "graph")
    ids = external_ids()
    rng = np.random.default_rng(7)
    try:
        with grpc.insecure_channel(server.target) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            seq = 0
            for k, delay in enumerate(DELAYS):
                src = rng.choice(ids, 400).tolist()
                dst = rng.choice(ids, 400).tolist()
                request = admin_pb2.UpdateGraphRequest(
                    model="sage", add_edges=pb.EdgeList(src=src, dst=dst),
                    idempotency_key=f"cancel-{k}",
                )  # fmt: skip
                call = admin.UpdateGraph.future(request, timeout=30)
                time.sleep(delay)
                call.cancel()
                # Applied whole or not at all: the retry says which, and applies nothing twice.
                again = admin.UpdateGraph(request, timeout=30)
                assert again.graph_seq == seq + 1, (delay, again.graph_seq, seq)
                seq = again.graph_seq
                oracle.edges.update(zip(src, dst, strict=True))
                info = admin.GetGraph(admin_pb2.GetGraphRequest(model="sage"))
                assert info.graph_seq == seq and info.num_edges == sum(oracle.edges.values())
                probe = ids[[0, 5, 17, 40]]
                assert_exact(_served(embed, probe), oracle.forward("sage", probe), f"after {k}")
            server.drain()
            metrics = server.service.metrics.registry
            assert metrics.get_sample_value("hopserve_graph_seq", {"graph": "graph"}) == seq
    finally:
        server.stop()


def test_a_cancelled_cold_start_request_releases_the_graph(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """The delta job holds the graph exclusively while it runs: cancelling its request
    must not leave it held (updates and queries go on) nor change the stored graph."""
    server = serve(tmp_path, graph_dir, redis_server)
    oracle = Oracle(tmp_path / "graph")
    ids = external_ids()
    feats = np.random.default_rng(2).standard_normal((1, FEATURES)).astype(np.float32)
    try:
        with grpc.insecure_channel(server.target) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            for k, delay in enumerate(DELAYS):
                new = 7_000_000 + k
                delta = pb.GraphDelta(
                    add_nodes=_rows([new], feats),
                    add_edges=pb.EdgeList(src=[new, int(ids[k])], dst=[int(ids[k + 1]), new]),
                )
                call = embed.GetEmbeddings.future(
                    pb.GetEmbeddingsRequest(model="sage", node_ids=[new, int(ids[k])], delta=delta),
                    timeout=30,
                )
                time.sleep(delay)
                call.cancel()
                answer = admin.UpdateGraph(
                    admin_pb2.UpdateGraphRequest(
                        model="sage", add_edges=pb.EdgeList(src=[int(ids[k])], dst=[int(ids[9])])
                    ),
                    timeout=10,
                )
                assert answer.graph_seq == k + 1  # the delta was never stored
                oracle.edges[(int(ids[k]), int(ids[9]))] += 1
                probe = ids[[k, 9, 30]]
                assert_exact(_served(embed, probe), oracle.forward("sage", probe), f"after {k}")
    finally:
        server.stop()
