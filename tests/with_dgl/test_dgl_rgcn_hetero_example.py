"""DGL's rgcn-hetero example (``examples/pytorch/rgcn-hetero/model.py``, the layer users
copy) served unmodified: per-relation weights from a ``WeightBasis`` (or one weight per
relation) split in ``forward`` and passed through ``HeteroGraphConv``'s ``mod_kwargs``,
``g.local_var()``, the ``if g.is_block`` branch, self-loop, bias, activation, dropout.
Exact against its own forward, full and partial, in batches of a few nodes, and the
relation weights follow the parameters after load."""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

import dgl.nn.pytorch as dglnn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from support import assert_exact  # noqa: E402
from torch import nn  # noqa: E402

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.testing.dgl_rgcn_hetero import RelGraphConvLayer  # noqa: E402
from hopserve.worker.trace.tracer import ModelTraceError  # noqa: E402

pytestmark = pytest.mark.dgl


class EntityClassify(nn.Module):
    """Two example layers over per-type input features of one width."""

    def __init__(self, rel_names, num_bases, dim=6, hidden=8, out=4):
        super().__init__()
        self.layers = nn.ModuleList(
            [
                RelGraphConvLayer(
                    dim, hidden, rel_names, num_bases, activation=F.relu, self_loop=True,
                    dropout=0.2,
                ),
                RelGraphConvLayer(hidden, out, rel_names, num_bases, self_loop=True),
            ]
        )  # fmt: skip

    def forward(self, g, h):
        for layer in self.layers:
            h = layer(g, h)
        return h


def _graph(seed: int) -> dgl.DGLGraph:
    gen = torch.Generator().manual_seed(seed)
    n = {"user": 40, "item": 50, "tag": 6}
    rel = {
        ("user", "clicks", "item"): (40, 50, 160),
        ("item", "clicked-by", "user"): (50, 40, 160),
        ("item", "similar", "item"): (50, 50, 70),
        ("item", "tagged", "tag"): (50, 6, 60),
        ("tag", "tags", "item"): (6, 50, 60),
    }
    g = dgl.heterograph(
        {
            k: (
                torch.randint(0, a, (e,), generator=gen),
                torch.randint(0, b, (e,), generator=gen),
            )
            for k, (a, b, e) in rel.items()
        },
        num_nodes_dict=n,
    )
    for t in g.ntypes:
        g.nodes[t].data["feat"] = torch.randn(n[t], 6, generator=gen)
    return g


def _inputs(g):
    return {t: g.nodes[t].data["feat"] for t in g.ntypes}


def _check(ev, store, model, g, label):
    with torch.no_grad():
        want = model(g, _inputs(g))
    offsets = {t.name: t.offset for t in store.node_types}
    full = ev.evaluate()
    targets, rows = [], []
    for t, w in want.items():
        assert_exact(full[offsets[t] : offsets[t] + w.shape[0], : w.shape[1]], w, f"{label} {t}")
        pick = torch.tensor([w.shape[0] - 1, 0, 3, 3])
        targets.append(offsets[t] + pick)
        rows.append(w[pick])
    got = ev.evaluate(targets=torch.cat(targets))
    assert_exact(got[:, : rows[0].shape[1]], torch.cat(rows), f"{label} partial")


def _halved_sum(outputs, dsttype):
    """An aggregation of the user's own: hopserve runs the typed subgraph for it."""
    return torch.stack(outputs).sum(0) * 0.5


@pytest.mark.parametrize("path", ["in place", "typed subgraph"])
@pytest.mark.parametrize("num_bases", [2, 5])  # a WeightBasis; one weight per relation
@pytest.mark.parametrize("seed", [0, 1])
def test_the_rgcn_hetero_example_equals_its_own_forward(num_bases, seed, path):
    g = _graph(seed)
    torch.manual_seed(seed)
    model = EntityClassify(sorted(set(g.etypes)), num_bases).eval()
    for layer in model.layers:
        nn.init.normal_(layer.h_bias)  # the example starts them at zero
        if path == "typed subgraph":
            layer.conv.agg_fn = _halved_sum
    store = GraphStore.from_dgl(g)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=4, progress=False)  # self-check on
    ev.evaluate()
    in_place = [layer.gather_free for layer in ev.last_stats.layers]
    assert in_place == [path == "in place"] * 2
    assert min(layer.batches for layer in ev.last_stats.layers) > 5
    # The per-type dropout and the next layer's self-loop matmul are one op each, not one
    # per node type: layer 2 reads one table (three full tables per type before).
    assert [len(block.inputs) for block in ev.split.blocks] == [1, 1]
    _check(ev, store, model, g, f"bases={num_bases} {path}")


def test_relation_weights_follow_the_parameters_after_load():
    """The per-relation weights are recomputed from the parameters at each call (a model
    updated in place, e.g. by load_state_dict, serves its new weights)."""
    g = _graph(2)
    torch.manual_seed(2)
    model = EntityClassify(sorted(set(g.etypes)), 2).eval()
    store = GraphStore.from_dgl(g)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=4, progress=False)
    before = ev.evaluate().clone()
    with torch.no_grad():
        for layer in model.layers:
            layer.basis.w_comp.mul_(-1.5)  # every relation's weight changes
    assert (ev.evaluate() - before).abs().max() > 1e-3
    _check(ev, store, model, g, "after the update")


class SplitsItsInput(nn.Module):
    """Iterates a value computed from the node features: no static length to unroll."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = dglnn.HeteroGraphConv(
            {
                r: dglnn.GraphConv(6, 4, norm="right", allow_zero_in_degree=True)
                for r in ("clicks", "clicked-by", "similar", "tagged", "tags")
            }
        )

    def forward(self, g, inputs):
        parts = [p * 2 for p in torch.split(inputs["item"], 3, dim=1)]
        return self.conv(g, {**inputs, "item": torch.cat(parts, dim=1)})


def test_iterating_a_value_of_the_inputs_is_still_refused_with_the_tracer_s_reason():
    g = _graph(0)
    with pytest.raises(ModelTraceError, match="could not be traced.*iterated"):
        LayerwiseEvaluator(SplitsItsInput().eval(), GraphStore.from_dgl(g), progress=False)


class HeteroGraphConv(dglnn.HeteroGraphConv):
    """A user's subclass of the same name whose forward gates each relation's output: the
    in-place path (which repeats DGL's own forward) must not take it."""

    def __init__(self, mods) -> None:
        super().__init__(mods)
        self.gate = nn.Parameter(torch.linspace(0.5, 2.0, len(mods)))

    def forward(self, g, inputs, mod_args=None, mod_kwargs=None):
        outputs = {}
        for k, (stype, etype, dtype) in enumerate(g.canonical_etypes):
            mod = self._get_module((stype, etype, dtype))
            y = mod(g[stype, etype, dtype], (inputs[stype], inputs[dtype])) * self.gate[k]
            outputs[dtype] = outputs.get(dtype, 0) + y
        return outputs


class Gated(nn.Module):
    def __init__(self, rels) -> None:
        super().__init__()
        self.conv = HeteroGraphConv(
            {r: dglnn.GraphConv(6, 4, norm="right", allow_zero_in_degree=True) for r in rels}
        )

    def forward(self, g, inputs):
        return self.conv(g, inputs)


def test_a_subclass_of_heterographconv_runs_its_own_forward():
    g = _graph(4)
    model = Gated(sorted(set(g.etypes))).eval()
    store = GraphStore.from_dgl(g)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=4, progress=False)  # self-check on
    with torch.no_grad():
        want = model(g, _inputs(g))
    full = ev.evaluate()
    assert [layer.gather_free for layer in ev.last_stats.layers] == [False]
    offsets = {t.name: t.offset for t in store.node_types}
    for t, w in want.items():
        assert_exact(full[offsets[t] : offsets[t] + w.shape[0], : w.shape[1]], w, f"gated {t}")


class LearnedEdgeWeights(nn.Module):
    """A per-edge parameter passed as edge data: not a weight, and not the store's."""

    def __init__(self, rels, num_edges) -> None:
        super().__init__()
        self.conv = dglnn.HeteroGraphConv(
            {r: dglnn.GraphConv(6, 4, norm="right", allow_zero_in_degree=True) for r in rels}
        )
        self.rels = rels
        self.ew = nn.Parameter(torch.ones(num_edges))

    def forward(self, g, inputs):
        return self.conv(g, inputs, mod_kwargs={self.rels[0]: {"edge_weight": self.ew}})


def test_a_parameter_passed_as_edge_data_is_refused_naming_it():
    g = _graph(0)
    rels = sorted(set(g.etypes))
    # Sized like the load-time example graph's relations (12 edges), so that tracing, not
    # the example run, is what meets it.
    model = LearnedEdgeWeights(rels, 12).eval()
    with pytest.raises(ModelTraceError, match=r"mod_kwargs\['[\w-]+'\]\['edge_weight'\] is not"):
        LayerwiseEvaluator(model, GraphStore.from_dgl(g), progress=False)
