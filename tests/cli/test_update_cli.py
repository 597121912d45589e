"""``hopserve update`` / ``hopserve compact``: the files they read and the request they send.

The files are parsed for real; the request goes over loopback gRPC to the real
``AdminService``, whose graph RPCs reach a recording double of the graph owner
(``support.admin_double``), so the test sees exactly what the server would receive.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.admin_double import AdminServer, RecordingGraphs
from typer.testing import CliRunner

from hopserve.cli import app
from hopserve.cli.update import InputFileError, read_edges, read_node_rows
from hopserve.proto.v1 import embedding_pb2 as pb


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- files


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("n.csv", "id,f0,f1\n7,0.5,1\n# a comment\n\n17,-2,3e-1\n"),
        ("n.csv", "7, 0.5, 1\n17,-2,0.3\n"),  # no header, spaces
        ("n.ndjson", '{"id": 7, "features": [0.5, 1]}\n\n{"id": 17, "features": [-2, 0.3]}\n'),
        ("n.jsonl", '{"id": 7.0, "features": [0.5, 1]}\n{"id": "17", "features": [-2, 0.3]}\n'),
    ],
)
def test_node_rows(tmp_path: Path, name: str, text: str) -> None:
    ids, features = read_node_rows(write(tmp_path, name, text))
    assert ids.tolist() == [7, 17] and ids.dtype == np.int64
    np.testing.assert_array_equal(features, np.float32([[0.5, 1], [-2, 0.3]]))
    assert features.dtype == np.float32


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("e.csv", "src,dst\n7,17\n17,27\n"),
        ("e.csv", "7,17\n17, 27\n"),
        ("e.ndjson", '{"src": 7, "dst": 17}\n{"src": 17, "dst": 27}\n'),
    ],
)
def test_edges(tmp_path: Path, name: str, text: str) -> None:
    rows = read_edges(write(tmp_path, name, text))
    assert (rows.src.tolist(), rows.dst.tolist(), rows.relations) == ([7, 17], [17, 27], None)


@pytest.mark.parametrize(
    ("reader", "name", "text", "message"),
    [
        (read_node_rows, "n.csv", "id,f\n7,1\nx8,2\n", r"n.csv:3: the node id must be an integer, got 'x8'"),
        (read_node_rows, "n.csv", "7,1,2\n8,1\n", r"n.csv:2: node 8 has 1 features, the first row 2"),
        (read_node_rows, "n.csv", "7,1\n8,nan\n", r"n.csv:2: feature 0 must be a finite number, got 'nan'"),
        (read_node_rows, "n.csv", "7\n", r"n.csv:1: node 7 has no features"),
        (read_node_rows, "n.csv", "id,f0\n", r"n.csv: no nodes"),
        (read_node_rows, "n.ndjson", '{"id": 7}\n', r"n.ndjson:1: expected \{\"id\""),
        (read_node_rows, "n.ndjson", "{oops\n", r"n.ndjson:1: not JSON"),
        (read_node_rows, "n.ndjson", '{"id": true, "features": [1]}\n', "got True"),
        (read_node_rows, "n.ndjson", '{"id": 1, "features": 3}\n', "features must be a list"),
        (read_edges, "e.csv", "src,dst\n7,17,27\n", r"e.csv:2: expected 2 columns src,dst, got 3"),
        (read_edges, "e.csv", "7,1.5\n", r"e.csv:1: dst must be an integer, got '1.5'"),
        (read_edges, "e.ndjson", '{"src": 7}\n', r"e.ndjson:1: expected \{\"src\""),
        (read_edges, "e.csv", "# nothing\n", r"e.csv: no edges"),
    ],
)  # fmt: skip
def test_bad_files_name_file_and_line(
    tmp_path: Path, reader: object, name: str, text: str, message: str
) -> None:
    with pytest.raises(InputFileError, match=message):
        reader(write(tmp_path, name, text))  # type: ignore[operator]


# ----------------------------------------------------------------------------- commands


@pytest.fixture
def graphs() -> RecordingGraphs:
    return RecordingGraphs()


@pytest.fixture
def cli(graphs: RecordingGraphs) -> Iterator[object]:
    server = AdminServer(graphs)
    runner = CliRunner()

    def invoke(*args: str):  # noqa: ANN202
        return runner.invoke(app, [*args, "--target", server.target, "--timeout", "10"])

    yield invoke
    server.stop()


def test_update_sends_one_batch(cli, graphs: RecordingGraphs, tmp_path: Path) -> None:  # noqa: ANN001
    nodes = write(tmp_path, "nodes.csv", "id,f0,f1\n1000,0.25,1\n1001,2,-1\n")
    edges = write(tmp_path, "edges.ndjson", '{"src": 1000, "dst": 7}\n{"src": 7, "dst": 1001}\n')
    gone = write(tmp_path, "gone.csv", "17,27\n")
    feats = write(tmp_path, "feats.jsonl", '{"id": 7, "features": [3, 4]}\n')
    result = cli(
        "update", "--model", "sage", "--nodes", str(nodes), "--edges", str(edges),
        "--remove-edges", str(gone), "--features", str(feats), "--idempotency-key", "b-1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["nodes_added"], out["edges_added"], out["edges_removed"]) == (2, 2, 1)
    assert out["features_set"] == 1 and out["graph_seq"] == 1
    (request,) = graphs.requests
    assert request.model == "sage" and request.idempotency_key == "b-1"
    assert list(request.add_nodes.node_ids) == [1000, 1001] and request.add_nodes.dim == 2
    np.testing.assert_array_equal(
        np.frombuffer(request.add_nodes.features, "<f4").reshape(2, 2),
        np.float32([[0.25, 1], [2, -1]]),
    )
    assert (list(request.add_edges.src), list(request.add_edges.dst)) == ([1000, 7], [7, 1001])
    assert (list(request.remove_edges.src), list(request.remove_edges.dst)) == ([17], [27])
    assert list(request.set_features.node_ids) == [7]
    np.testing.assert_array_equal(np.frombuffer(request.set_features.features, "<f4"), [3, 4])


@pytest.mark.parametrize(
    ("name", "text", "flags"),
    [
        ("gone.csv", "7,17,user__clicks__item\n8,18,user__buys__item\n", ["--relation-column"]),
        ("gone.ndjson", '{"src": 7, "dst": 17, "relation": "user__clicks__item"}\n'
         '{"src": 8, "dst": 18, "relation": "user__buys__item"}\n', []),
    ],
)  # fmt: skip
def test_update_sends_typed_removals_and_feature_rows(
    cli, graphs, tmp_path, name, text, flags
) -> None:  # noqa: ANN001
    """Removed edges name their relations, feature rows their node type (graphs with node
    types: the ends and IDs are read within those types)."""
    gone = write(tmp_path, name, text)
    feats = write(tmp_path, "feats.csv", "7,3,4\n")
    result = cli(
        "update", "--model", "rec", "--remove-edges", str(gone), *flags,
        "--features", str(feats), "--features-type", "item",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (request,) = graphs.requests
    assert (list(request.remove_edges.src), list(request.remove_edges.dst)) == ([7, 8], [17, 18])
    assert list(request.remove_edges.relations) == ["user__clicks__item", "user__buys__item"]
    assert request.set_features.node_type == "item" and list(request.set_features.node_ids) == [7]
    result = cli("update", "--model", "rec", "--remove-edges", str(gone), "--features-type", "item")
    assert result.exit_code == 2 and "--features-type needs --features" in result.output


def test_update_sends_the_type_of_added_nodes(cli, graphs, tmp_path) -> None:  # noqa: ANN001
    """``--nodes-type``: the nodes ``--nodes`` adds are new IDs of that type."""
    nodes = write(tmp_path, "users.csv", "5001,0.5,1\n")
    edges = write(tmp_path, "clicks.csv", "5001,7,user__clicks__item\n")
    result = cli(
        "update", "--model", "rec", "--nodes", str(nodes), "--nodes-type", "user",
        "--edges", str(edges), "--relation-column",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (request,) = graphs.requests
    assert request.add_nodes.node_type == "user" and list(request.add_nodes.node_ids) == [5001]
    assert list(request.add_edges.relations) == ["user__clicks__item"]
    result = cli("update", "--model", "rec", "--edges", str(edges), "--nodes-type", "user")
    assert result.exit_code == 2 and "--nodes-type needs --nodes" in result.output


@pytest.mark.parametrize(
    ("name", "text", "mode", "weights", "features"),
    [
        ("e.csv", "src,dst,w,a,b\n1,2,0.5,1,2\n3,4,1.5,3,4\n", "weight", [0.5, 1.5],
         [[1, 2], [3, 4]]),
        ("e.csv", "1,2,0.5\n3,4,1.5\n", "weight", [0.5, 1.5], None),
        ("e.csv", "1,2,0.5,7\n3,4,1.5,8\n", "features", None, [[0.5, 7], [1.5, 8]]),
        ("e.ndjson", '{"src": 1, "dst": 2, "weight": 0.5, "features": [1, 2]}\n'
         '{"src": 3, "dst": 4, "weight": 1.5, "features": [3, 4]}\n', "weight", [0.5, 1.5],
         [[1, 2], [3, 4]]),
    ],
)  # fmt: skip
def test_update_sends_edge_data(cli, graphs, tmp_path, name, text, mode, weights, features) -> None:  # noqa: ANN001
    edges = write(tmp_path, name, text)
    result = cli("update", "--model", "w", "--edges", str(edges), "--edge-data", mode)
    assert result.exit_code == 0, result.output
    (request,) = graphs.requests
    sent = request.add_edges
    assert (list(sent.src), list(sent.dst)) == ([1, 3], [2, 4])
    assert sent.dtype == pb.DTYPE_FLOAT32
    if weights is None:
        assert sent.weights == b""
    else:
        np.testing.assert_array_equal(np.frombuffer(sent.weights, "<f4"), weights)
    if features is None:
        assert sent.features == b"" and sent.feature_dim == 0
    else:
        got = np.frombuffer(sent.features, "<f4").reshape(2, sent.feature_dim)
        np.testing.assert_array_equal(got, features)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("e.csv", "1,2,0.5,1\n3,4,1.5\n", "e.csv:2: edge data a weight, the first row a weight and 1 features"),
        ("e.csv", "1,2,nan\n", "e.csv:1: weight must be a finite number"),
        ("e.ndjson", '{"src": 1, "dst": 2, "weight": 1}\n{"src": 3, "dst": 4}\n',
         "e.ndjson:2: edge data none, the first row a weight"),
    ],
)  # fmt: skip
def test_bad_edge_data_is_refused_before_sending(
    cli, graphs, tmp_path, name, text, message
) -> None:  # noqa: ANN001
    result = cli("update", "--model", "w", "--edges", str(write(tmp_path, name, text)))
    assert result.exit_code == 2 and message in result.output, result.output
    gone = write(tmp_path, "gone.ndjson", '{"src": 1, "dst": 2, "weight": 1}\n')
    result = cli("update", "--model", "w", "--remove-edges", str(gone))
    assert result.exit_code == 2 and "edges to remove take no edge data" in result.output
    assert graphs.requests == []


def test_update_refuses_before_sending(cli, graphs: RecordingGraphs, tmp_path: Path) -> None:  # noqa: ANN001
    result = cli("update", "--model", "sage")
    assert result.exit_code == 2 and "at least one of --nodes" in result.output
    bad = write(tmp_path, "edges.csv", "1,2\n3,x\n")
    result = cli("update", "--model", "sage", "--edges", str(bad))
    assert result.exit_code == 2 and "edges.csv:2: dst must be an integer" in result.output
    dup = write(tmp_path, "nodes.csv", "5,1\n5,2\n")
    result = cli("update", "--model", "sage", "--nodes", str(dup))
    assert result.exit_code == 1 and "node IDs listed twice: 5" in result.output
    assert graphs.requests == []


def test_update_reports_the_server_refusal(cli, graphs: RecordingGraphs, tmp_path: Path) -> None:  # noqa: ANN001
    import grpc

    graphs.fail = (grpc.StatusCode.INVALID_ARGUMENT, "edge 1 -> 2: node 2 is not in the graph")
    edges = write(tmp_path, "edges.csv", "1,2\n")
    result = cli("update", "--model", "sage", "--edges", str(edges))
    assert result.exit_code == 1
    assert "error: [INVALID_ARGUMENT] UpdateGraph: edge 1 -> 2: node 2" in result.output


def test_compact(cli, graphs: RecordingGraphs) -> None:  # noqa: ANN001
    result = cli("compact", "--model", "sage")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["compacting"] is True
    assert graphs.requests[0].model == "sage"
