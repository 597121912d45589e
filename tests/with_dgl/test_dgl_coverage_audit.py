"""Coverage audit, DGL: every ``nn.Module`` class of ``dgl.nn.pytorch.conv`` is exact (full
and partial, against its own full-graph forward) or refused at load with a reason; nothing
crashes, and ``docs/support_matrix.md`` says so (``bench/support_matrix.py``).

The PyG half is tests/worker/convs/test_coverage_audit.py; the audit itself is
``support.conv_audit``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from support import conv_audit as audit  # noqa: E402

from hopserve.worker.convs import registry  # noqa: E402

pytestmark = pytest.mark.dgl

MATRIX = Path(__file__).resolve().parents[2] / "docs" / "support_matrix.md"
OK = ("exact", "adapted", "refused")

# 1-hop convs that must stay exact by default.
ONE_HOP = ["AGNNConv", "DotGatConv", "EdgeConv", "GATConv", "GATv2Conv", "GINConv"]
ONE_HOP += ["GraphConv", "PNAConv", "SAGEConv"]


@pytest.fixture(scope="module")
def rows() -> list[audit.Row]:
    return audit.run_audit("dgl")


def _show(rows: list[audit.Row]) -> str:
    return "\n".join(f"  {r.label}: {r.status}: {r.reason}" for r in rows)


def test_every_exported_conv_has_audit_arguments():
    missing = audit.missing_cases("dgl")
    assert not missing, (
        f"dgl.nn.pytorch.conv has {missing} without a row in support/conv_audit.py "
        "DGL_CASES: add typical constructor arguments (and a support-matrix row in "
        "worker/convs/dgl_support.py), then run bench/support_matrix.py"
    )


def test_every_conv_is_exact_or_refused_with_a_reason(rows):
    assert len(rows) >= len(audit.dgl_classes())
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
        key = f"dgl.{r.conv}"
        if r.variant or key not in matrix:
            continue
        assert r.status == matrix[key][0], f"{r.label}: audit {r.status}, row {matrix[key]}"


def test_committed_matrix_is_up_to_date(rows):
    want = audit.render_section("dgl", rows, audit.library_version("dgl"))
    text = MATRIX.read_text() if MATRIX.exists() else ""
    assert audit.extract_section(text, "dgl") == want, (
        "docs/support_matrix.md is stale for DGL: run `.venv/bin/python "
        "bench/support_matrix.py` (it audits DGL in .venv-dgl) and commit the result"
    )


def test_readme_summary_counts_are_the_audit_s(rows):
    c = audit.counts(r for r in rows if not r.variant)
    readme = (MATRIX.parents[1] / "README.md").read_text()
    summary = f"DGL: {c['exact']} exact, {c['adapted']} adapted"
    assert summary in readme and f"{c['refused']} refused" in readme, (
        f"README's Support matrix section should say '{summary} (...), {c['refused']} "
        "refused', as docs/support_matrix.md does"
    )


def test_audit_catches_an_adapter_that_is_not_exact(monkeypatch):
    """PNAConv on a plain block normalizes by the block's node count, not the graph's:
    not exact, and the audit must say so."""
    from hopserve.worker.convs.dgl_support import _block

    pna = audit.dgl_classes()["PNAConv"]
    registry.support_matrix()  # loads the DGL rows
    monkeypatch.setitem(registry._MATRIX, pna, registry.ConvSupport("exact", _block, "naive"))
    row = audit.run_audit("dgl", ["PNAConv"])[0]  # the typical case (no edge features)
    assert row.status in ("wrong", "crash"), row


def test_pna_many_batches_and_sampled(medium_graph):
    """PNAConv's 1/sqrt(N) is the whole graph's in every batch (and in G_l, same N);
    its degree scalers follow the sampled in-degrees."""
    from support.dgl_models import DGL
    from support.exactness import check_medium_graph
    from support.sampling import check_medium_graph as check_medium_sampled

    cls = audit.dgl_classes()["PNAConv"]
    model = audit.build_model("dgl", cls, audit.DGL_CASES["PNAConv"][0], seed=3)
    check_medium_graph(DGL, model, medium_graph, "PNAConv")
    check_medium_sampled(DGL, model, medium_graph, [([3, 2], 7)], "PNAConv")
