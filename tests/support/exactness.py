"""The exactness harness: layer-wise results equal the model's own full-graph forward.

Shared by the PyG suite (tests/worker/engine) and the DGL suite (tests/with_dgl); a
:class:`Style` says how a model takes its graph. Importable without DGL: the DGL style is
``support.dgl_models.DGL``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from hopserve import GraphStore, LayerwiseEvaluator
from support import assert_exact

D_IN = 6
MEDIUM_TARGETS = (2999, 0, 17, 17, 1500, 42)  # targets of the 3,000-node ``medium_graph``


def _edge_index(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    return edge_index


@dataclass(frozen=True)
class Style:
    """How a model takes its graph: PyG ``model(x, edge_index)``, DGL ``model(graph, x)``.

    ``graph_arg`` is the graph's position in the arguments of the model and of its convs;
    ``to_graph(edge_index, num_nodes)`` makes the graph argument of a ``[2, E]`` edge index
    (row 0 = source).
    """

    name: str
    graph_arg: int
    to_graph: Callable[[torch.Tensor, int], Any] = _edge_index

    def call(self, model: nn.Module, graph: Any, x: torch.Tensor) -> torch.Tensor:
        return model(graph, x) if self.graph_arg == 0 else model(x, graph)

    def forward(self, model: nn.Module, edge_index: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The model's own full-graph forward, without gradients."""
        with torch.no_grad():
            return self.call(model, self.to_graph(edge_index, x.shape[0]), x)


PYG = Style("pyg", graph_arg=1)


def examples(max_examples: int) -> Callable:
    """Hypothesis settings of the engine's property tests: no deadline, slow data is fine."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def family_cases(families: Iterable[str], max_examples: int, cases: st.SearchStrategy) -> Callable:
    """A property test per model family: ``test(family, case)`` with ``max_examples`` cases
    drawn from ``cases`` (``parametrize`` over the sorted families, then hypothesis)."""

    def wrap(test: Callable) -> Callable:
        prop = examples(max_examples)(given(case=cases)(test))
        return pytest.mark.parametrize("family", sorted(families))(prop)

    return wrap


@st.composite
def graphs(draw, hub: bool = False, layers: int = 0):
    """Random graphs: isolated nodes, self-loops and duplicate edges all occur.

    A case is ``(edge_index, x, targets, reorder)``; with ``hub``, node 0 sometimes becomes
    a hub; with ``layers``, the case goes on with ``layers`` fanouts and a sampling seed.
    """
    n = draw(st.integers(1, 40))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=120))
    if hub and draw(st.booleans()):  # node 0 becomes a hub: every node points at it (0 → 0 too)
        edges += [(u, 0) for u in range(n)]
    edge_index = torch.tensor(edges, dtype=torch.long).reshape(-1, 2).t().contiguous()
    seed = draw(st.integers(0, 2**16))
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed))
    targets = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8))
    reorder = draw(st.sampled_from(["rcmk", None]))
    case = (edge_index, x, torch.tensor(targets), reorder)
    if not layers:
        return case
    fanouts = draw(st.lists(st.sampled_from([-1, 1, 2, 3, 5]), min_size=layers, max_size=layers))
    sample_seed = draw(st.sampled_from([0, 1, 7, 2**64 - 1]))
    return (*case, fanouts, sample_seed)


def assert_full_and_partial(
    ev: LayerwiseEvaluator, want: torch.Tensor, targets: torch.Tensor, what: str, where: str = ""
) -> None:
    """All rows, then ``targets``' rows, equal ``want`` (the forward's rows)."""
    assert_exact(ev.evaluate(), want, f"{what} full{where}")
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{what} partial{where}")


def check_random_graph(style: Style, model: nn.Module, case: tuple, what: str) -> None:
    """A :func:`graphs` case, in batches of 3 nodes: full and partial equal the forward."""
    edge_index, x, targets, reorder = case
    want = style.forward(model, edge_index, x)
    store = GraphStore.from_edge_index(edge_index, x, reorder=reorder)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, self_check=False, progress=False)
    assert_full_and_partial(ev, want, targets, what)


def check_medium_graph(
    style: Style, model: nn.Module, medium_graph: tuple, what: str
) -> LayerwiseEvaluator:
    """The ``medium_graph`` fixture in many batches: full, partial and ``fanouts=-1`` equal
    the forward; returns the evaluator."""
    edge_index, x, store = medium_graph
    want = style.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)
    assert_exact(ev.evaluate(), want, f"{what} full")
    assert ev.last_stats.batches > ev.num_layers  # really batched
    targets = torch.tensor(MEDIUM_TARGETS)
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{what} partial")
    exact_again = ev.evaluate(targets=targets, fanouts=[-1] * ev.num_layers)
    assert_exact(exact_again, want[targets], f"{what} fanouts=-1")
    return ev
