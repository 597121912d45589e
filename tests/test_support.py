"""``support.assert_exact``: float32 rounding noise passes at any magnitude, real bugs fail.

The noise cases are built so that the old fixed tolerance (``allclose(atol=1e-5,
rtol=1e-4)``) rejects them; the bug cases are checked both on outputs of magnitude ~1
(where the tolerance is the old one) and ~100s (where the ulp floor is in force).
"""

from __future__ import annotations

import copy

import pytest
import torch
from support import ATOL, RTOL, ULPS, assert_exact, exact_tolerance, random_edge_index
from torch import nn
from torch_geometric.nn import GCNConv, SAGEConv

EPS32 = torch.finfo(torch.float32).eps
N, E, D = 2000, 40_000, 16


def old_allclose(got: torch.Tensor, want: torch.Tensor) -> bool:
    """The fixed tolerance assert_exact used before it scaled with magnitude."""
    return torch.allclose(got.double(), want.double(), atol=ATOL, rtol=RTOL)


@pytest.fixture(scope="module")
def graph() -> tuple[torch.Tensor, torch.Tensor]:
    """A random graph (avg in-degree ~22, self-loops, duplicates, an isolated node) and
    unit-variance features."""
    edge_index = random_edge_index(N, E, seed=3)
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(4))
    return edge_index, x


def sum_aggregate(x: torch.Tensor, edge_index: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``out[v] = Σ_{(u,v)} x[u]``, the edges added one by one in ``order``."""
    src, dst = edge_index[:, order]
    return torch.zeros_like(x).index_add_(0, dst, x[src])


class GCN(nn.Module):
    """Two GCNConv layers; ``loops`` toggles the self-loops of both."""

    def __init__(self, d_in: int, loops: bool = True, normalize: bool = True) -> None:
        super().__init__()
        kw = {"add_self_loops": loops, "normalize": normalize}
        self.conv1 = GCNConv(d_in, 32, **kw)
        self.conv2 = GCNConv(32, 8, **kw)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def gcn_pair() -> tuple[GCN, GCN]:
    """The same weights with and without self-loops."""
    torch.manual_seed(0)
    with_loops = GCN(D).eval()
    without = copy.deepcopy(with_loops)
    for conv in (without.conv1, without.conv2):
        conv.add_self_loops = False
    return with_loops, without


def gcn_outputs(graph, magnitude: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The :func:`gcn_pair`'s outputs on ``magnitude · x``: with self-loops, without."""
    edge_index, x = graph
    with_loops, without = gcn_pair()
    with torch.no_grad():
        return with_loops(magnitude * x, edge_index), without(magnitude * x, edge_index)


# ----------------------------------------------------------------------- noise passes


def test_summation_order_noise_passes(graph) -> None:
    """Two-hop sum aggregation of large features, edges added in two different orders."""
    edge_index, x = graph
    x = 50 * x
    order = torch.arange(edge_index.shape[1])
    shuffled = torch.randperm(edge_index.shape[1], generator=torch.Generator().manual_seed(5))
    a = sum_aggregate(sum_aggregate(x, edge_index, order), edge_index, order)
    b = sum_aggregate(sum_aggregate(x, edge_index, shuffled), edge_index, shuffled)
    assert not torch.equal(a, b) and not old_allclose(a, b)  # really in the noisy regime
    assert_exact(a, b, "edge order")
    assert_exact(b, a, "edge order, swapped")


def test_float32_vs_float64_gcn_passes(graph) -> None:
    """An unnormalized (sum) float32 GCN against the same GCN in float64; outputs ~2e4."""
    edge_index, x = graph
    torch.manual_seed(0)
    model = GCN(D, loops=False, normalize=False).eval()
    with torch.no_grad():
        got = model(100 * x, edge_index)
        want = copy.deepcopy(model).double()(100 * x.double(), edge_index)
    assert got.dtype == torch.float32 and want.dtype == torch.float64
    assert not old_allclose(got, want)
    assert_exact(got, want, "float32 vs float64")


def test_small_outputs_keep_the_old_tolerance() -> None:
    """For max|want| ≤ ATOL / (ULPS·ε) the tolerance is exactly ``atol + rtol·|want|``."""
    want = torch.linspace(-1.0, 1.0, 101)
    assert torch.equal(exact_tolerance(want), RTOL * want.double().abs() + ATOL)
    assert_exact(want + 0.9 * ATOL, want)
    with pytest.raises(AssertionError):
        assert_exact(want + 2 * ATOL, want)


def test_large_outputs_allow_only_ulps_of_the_largest_value() -> None:
    """At magnitude 400 an error of 2·ULPS ulps of the largest value still fails."""
    want = torch.tensor([[400.0, -3.0], [0.001, 7.0]])
    floor = ULPS * EPS32 * 400
    assert_exact(want + torch.tensor([[0.0, 0.0], [0.9 * floor, 0.0]]), want)
    with pytest.raises(AssertionError):
        assert_exact(want + torch.tensor([[0.0, 0.0], [2 * floor, 0.0]]), want)


# ------------------------------------------------------------------------- bugs fail


@pytest.mark.parametrize("magnitude", [1.0, 100.0])
def test_missing_self_loop_fails(graph, magnitude) -> None:
    got, want = gcn_outputs(graph, magnitude)  # the reference forgot the self-loops
    with pytest.raises(AssertionError, match="not exact"):
        assert_exact(got, want, "missing self-loop")


@pytest.mark.parametrize("magnitude", [1.0, 100.0])
def test_one_wrong_neighbour_fails(graph, magnitude) -> None:
    """SAGE (mean) where the highest in-degree node reads one wrong neighbour: a 1/deg
    change of one row."""
    edge_index, x = graph
    x = magnitude * x
    torch.manual_seed(1)
    sage = SAGEConv(D, 8).eval()
    deg = torch.bincount(edge_index[1], minlength=N)
    hub = int(deg.argmax())
    edge = int((edge_index[1] == hub).nonzero()[0])
    wrong = edge_index.clone()
    wrong[0, edge] = (wrong[0, edge] + 1) % (N - 1)
    with torch.no_grad():
        got, want = sage(x, wrong), sage(x, edge_index)
    changed = (got != want).any(dim=1).nonzero().squeeze(1)
    assert changed.tolist() == [hub] and deg[hub] > 40
    with pytest.raises(AssertionError, match=f"worst at row {hub},"):
        assert_exact(got, want, "wrong neighbour")


@pytest.mark.parametrize("magnitude", [1.0, 100.0])
def test_permuted_rows_fail(graph, magnitude) -> None:
    want, _ = gcn_outputs(graph, magnitude)
    got = want.clone()
    got[[10, 11]] = want[[11, 10]]
    with pytest.raises(AssertionError, match="worst at row 1[01],"):
        assert_exact(got, want, "permuted")


# --------------------------------------------------------------------------- message


def test_message_names_error_tolerance_and_worst_row() -> None:
    want = 0.3 * torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    got = want.clone()
    got[4, 2] += 0.5
    got[1, 0] += 0.01
    with pytest.raises(AssertionError) as info:
        assert_exact(got, want, "layer 2")
    msg = str(info.value)
    assert msg.startswith("layer 2: not exact: max abs error 0.5;")
    assert f"tolerance {RTOL}·|want| + 1e-05" in msg
    assert "2 of 24 elements out of tolerance" in msg
    assert "worst at row 4, column (2,)" in msg
    assert "got  row 4: [" in msg and "want row 4: [" in msg


def test_shapes_and_non_finite_values() -> None:
    with pytest.raises(AssertionError, match="shape"):
        assert_exact(torch.zeros(3, 2), torch.zeros(2, 3))
    assert_exact(torch.zeros(0, 5), torch.zeros(0, 5))
    inf = torch.tensor([1.0, float("inf"), -float("inf")])
    assert_exact(inf.clone(), inf)
    with pytest.raises(AssertionError):
        assert_exact(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(AssertionError):
        assert_exact(torch.tensor([1.0, 1e30]), torch.tensor([1.0, float("inf")]))
