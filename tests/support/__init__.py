"""Shared test helpers: exactness assertion, random graph builders, seeded test models."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from hopserve import GraphStore

ATOL, RTOL = 1e-5, 1e-4
ULPS = 64  # rounding allowance, in float32 ulps of the reference's largest value


def exact_tolerance(
    want: torch.Tensor, scale: float | None = None, eps: float | None = None
) -> torch.Tensor:
    """Per-element allowed ``|got - want|``: ``RTOL·|want| + max(ATOL, ULPS·ε·scale)``.

    ``scale`` defaults to ``max |want|`` over the tensor's finite values, ``ε`` to float32's
    machine epsilon (≈1.19e-7, the precision the engine computes in). A float32 sum of
    ``K`` terms is only exact to about ``K·ε·max|term|``, and a small output element can be
    the difference of large terms, so the absolute floor follows the magnitude the
    computation worked at, with the largest output value as its proxy. Per tensor, not per
    row: layers mix rows, so a small row's error comes from its neighbours' large values.
    For ``scale ≤ ATOL / (ULPS·ε) ≈ 1.3`` this is exactly ``allclose(atol=ATOL, rtol=RTOL)``.
    """
    ref = want.detach().double()
    finite = ref[torch.isfinite(ref)]
    if scale is None:
        scale = float(finite.abs().max()) if finite.numel() else 0.0
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    return RTOL * ref.abs() + max(ATOL, ULPS * eps * scale)


def assert_exact(
    got: torch.Tensor, want: torch.Tensor, what: str = "", *, scale: float | None = None
) -> None:
    """Layer-wise result equals the model's own forward up to float rounding.

    Passes iff per element ``|got - want| ≤ RTOL·|want| + max(ATOL, ULPS·ε·max|want|)``
    (see :func:`exact_tolerance`; ``scale`` overrides ``max|want|``) and non-finite values
    are equal. The message names the max abs error, the tolerance and the worst row.
    """
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.numel() == 0:
        return
    g = got.detach().cpu().double()
    w = want.detach().cpu().double()
    finite_w = w[torch.isfinite(w)]
    if scale is None:
        scale = float(finite_w.abs().max()) if finite_w.numel() else 0.0
    eps = max(_eps(torch.float32), _eps(got.dtype), _eps(want.dtype))  # the coarser dtype
    tol = exact_tolerance(w, scale, eps)
    err = (g - w).abs()
    both_finite = torch.isfinite(g) & torch.isfinite(w)
    bad = torch.where(both_finite, err > tol, g != w)  # inf == inf passes; nan never does
    if not bool(bad.any()):
        return
    excess = torch.where(both_finite, err / tol, torch.full_like(err, float("inf")))
    flat = int(excess.reshape(-1).argmax())
    at = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), w.shape)) or (0,)
    row = at[0]
    finite_err = err[both_finite]
    max_err = float(finite_err.max()) if finite_err.numel() else float("nan")
    where = f"row {row}" + (f", column {at[1:]}" if len(at) > 1 else "")
    g_row, w_row = (g[row], w[row]) if g.dim() else (g, w)
    raise AssertionError(
        f"{what}: not exact: max abs error {max_err:.3g}; tolerance "
        f"{RTOL}·|want| + {max(ATOL, ULPS * eps * scale):.3g} "
        f"(= max(atol={ATOL}, {ULPS} ulps of scale {scale:.3g})); "
        f"{int(bad.sum())} of {w.numel()} elements out of tolerance; worst at {where}: "
        f"|got - want| = {float(err.reshape(-1)[flat]):.3g} > allowed "
        f"{float(tol.reshape(-1)[flat]):.3g}\n  got  row {row}: {_short(g_row)}"
        f"\n  want row {row}: {_short(w_row)}"
    )


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def _short(t: torch.Tensor, n: int = 8) -> str:
    """The first ``n`` values of a row, for messages."""
    vals = t.reshape(-1)
    text = ", ".join(f"{float(v):.6g}" for v in vals[:n])
    return f"[{text}{', …' if vals.numel() > n else ''}]"


def random_edge_index(num_nodes: int, num_edges: int, seed: int = 0) -> torch.Tensor:
    """Random directed edges with self-loops and duplicates; the last node is isolated."""
    gen = torch.Generator().manual_seed(seed)
    active = max(1, num_nodes - 1)
    ei = torch.randint(0, active, (2, num_edges), generator=gen)
    loops = torch.arange(0, active, 3).repeat(2, 1)
    return torch.cat([ei, loops, ei[:, : num_edges // 10]], dim=1)


def random_graph(
    num_nodes: int, num_edges: int, dim: int, seed: int, x_seed: int
) -> tuple[torch.Tensor, torch.Tensor, GraphStore]:
    """``(edge_index, x, store)``: :func:`random_edge_index` (``seed``), ``randn`` features
    of width ``dim`` (generator seeded with ``x_seed``) and their graph store."""
    edge_index = random_edge_index(num_nodes, num_edges, seed=seed)
    x = torch.randn(num_nodes, dim, generator=torch.Generator().manual_seed(x_seed))
    return edge_index, x, GraphStore.from_edge_index(edge_index, x)


def build_family(
    families: Mapping[str, Callable[[int], nn.Module]],
    name: str,
    d_in: int,
    seed: int = 0,
    tweak: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """``families[name](d_in)`` in eval mode with deterministic weights (``seed``) and
    non-trivial BN statistics; ``tweak`` then sees every module."""
    torch.manual_seed(seed)
    model = families[name](d_in)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
        if tweak is not None:
            tweak(m)
    return model.eval()


def spy_relation_slices(monkeypatch) -> list[tuple[int, int, int]]:  # noqa: ANN001
    """The ``(relation, start, end)`` of every per-relation CSC slice
    (:meth:`~hopserve.worker.graph.relation_csc.RelationCSC.in_edges`) read from now on."""
    from hopserve.worker.graph.relation_csc import RelationCSC

    slices: list[tuple[int, int, int]] = []
    in_edges = RelationCSC.in_edges
    monkeypatch.setattr(
        RelationCSC, "in_edges", lambda self, *a: slices.append(a) or in_edges(self, *a)
    )
    return slices
