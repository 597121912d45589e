"""Coverage audit, PyG: every conv ``torch_geometric.nn.conv`` exports is exact (full and
partial, against its own full-graph forward) or refused at load with a reason; nothing
crashes, and ``docs/support_matrix.md`` says so (``bench/support_matrix.py``).

The DGL half is tests/with_dgl/test_dgl_coverage_audit.py; the audit itself is
``support.conv_audit``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch_geometric", reason="needs PyG")

from support import conv_audit as audit  # noqa: E402

from hopserve.worker.convs import registry  # noqa: E402

MATRIX = Path(__file__).resolve().parents[3] / "docs" / "support_matrix.md"
OK = ("exact", "adapted", "refused")

# 1-hop convs that must stay exact by default (the list and the audit's finds).
ONE_HOP = [
    "AGNNConv",
    "AntiSymmetricConv",
    "CGConv",
    "ClusterGCNConv",
    "DNAConv",
    "EdgeConv",
    "EGConv",
    "FeaStConv",
    "FastRGCNConv",
    "FiLMConv",
    "GATConv",
    "GATv2Conv",
    "GCNConv",
    "GENConv",
    "GeneralConv",
    "GINConv",
    "GraphConv",
    "LEConv",
    "LGConv",
    "MFConv",
    "PNAConv",
    "ResGatedGraphConv",
    "RGATConv",
    "RGCNConv",
    "SAGEConv",
    "SimpleConv",
    "SuperGATConv",
    "TransformerConv",
    "WLConvContinuous",
]


@pytest.fixture(scope="module")
def rows() -> list[audit.Row]:
    return audit.run_audit("pyg")


def _show(rows: list[audit.Row]) -> str:
    return "\n".join(f"  {r.label}: {r.status}: {r.reason}" for r in rows)


def test_every_exported_conv_has_audit_arguments():
    missing = audit.missing_cases("pyg")
    assert not missing, (
        f"torch_geometric.nn.conv exports {missing} without a row in "
        "support/conv_audit.py PYG_CASES: add typical constructor arguments (and a "
        "support-matrix row in worker/convs/pyg_support.py), then run bench/support_matrix.py"
    )


def test_every_conv_is_exact_or_refused_with_a_reason(rows):
    assert len(rows) >= len(audit.pyg_classes())
    bad = [r for r in rows if r.status not in OK]
    assert not bad, "convs that crash or are not exact:\n" + _show(bad)
    silent = [r for r in rows if r.status == "refused" and not r.reason.strip()]
    assert not silent, "refused without a reason:\n" + _show(silent)


def test_one_hop_convs_are_exact_by_default(rows):
    typical = {r.conv: r for r in rows if not r.variant}
    not_exact = [typical[name] for name in ONE_HOP if typical[name].status not in OK[:2]]
    assert not not_exact, "1-hop convs not exact by default:\n" + _show(not_exact)


def test_audit_agrees_with_the_support_matrix(rows):
    """A class's typical case has the status its row states (variants may be refused)."""
    matrix = registry.support_matrix()
    for r in rows:
        if r.variant or r.conv not in matrix:
            continue
        assert r.status == matrix[r.conv][0], f"{r.label}: audit {r.status}, row {matrix[r.conv]}"


def test_committed_matrix_is_up_to_date(rows):
    want = audit.render_section("pyg", rows, audit.library_version("pyg"))
    text = MATRIX.read_text() if MATRIX.exists() else ""
    assert audit.extract_section(text, "pyg") == want, (
        "docs/support_matrix.md is stale for PyG: run `.venv/bin/python "
        "bench/support_matrix.py` and commit the result"
    )


def test_readme_summary_counts_are_the_audit_s(rows):
    c = audit.counts(r for r in rows if not r.variant)
    readme = (MATRIX.parents[1] / "README.md").read_text()
    summary = f"PyG: {c['exact']} exact, {c['adapted']} adapted"
    assert summary in readme and f"{c['refused']} refused" in readme, (
        f"README's Support matrix section should say '{summary} (...), {c['refused']} "
        "refused', as docs/support_matrix.md does"
    )


def test_audit_catches_an_adapter_that_is_not_exact(monkeypatch):
    """LGConv run as a plain square conv normalizes by the batch's degrees: not exact,
    and the audit must say so (refused by the self-check counts as wrong too)."""
    from hopserve.worker.convs.pyg_support import _square

    lg = audit.pyg_classes()["LGConv"]
    registry._load_builtins()
    monkeypatch.setitem(registry._MATRIX, lg, registry.ConvSupport("exact", _square, "naive"))
    row = audit.run_audit("pyg", ["LGConv"])[0]  # the typical case (no edge weights)
    assert row.status == "wrong", row


def test_audit_catches_a_node_wise_fallback_that_is_not_exact(monkeypatch):
    """DirGNNConv served node-wise over in-edges only misses its out-neighbours: the
    audit's node-wise column must then say wrong, not exact."""
    from hopserve.worker.engine.nodewise import NodewiseEvaluator

    monkeypatch.setattr(NodewiseEvaluator, "check_field", lambda self: False)
    row = audit.run_audit("pyg", ["DirGNNConv"])[0]
    assert row.status == "wrong" and "node-wise" in row.reason, row


def test_refused_rows_say_what_the_node_wise_fallback_does(rows):
    """Every refused conv that was built states the fallback's outcome; a multi-hop conv
    is exact node-wise and DirGNNConv's field runs both ways."""
    refused = [r for r in rows if r.status == "refused" and "not built here" not in r.reason]
    assert all(r.nodewise.startswith(("exact", "refused: ")) for r in refused), _show(refused)
    by_name = {r.conv: r for r in rows if not r.variant}
    assert by_name["APPNP"].nodewise == "exact"
    assert by_name["DirGNNConv"].nodewise == "exact, field both ways"
    assert by_name["GPSConv"].nodewise.startswith("refused: ")
