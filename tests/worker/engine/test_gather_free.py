"""Gather-free batches: conv-only inputs are read in place and results stay exact."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_graph
from support.models import build

from hopserve import LayerwiseEvaluator
from hopserve.worker.convs import gcn


@pytest.fixture(scope="module")
def graph():
    return random_graph(900, 7000, 6, seed=12, x_seed=13)


FULL_LAYER_FAMILIES = ["gcn", "gcn_improved", "gcn_noloops"]  # x Θ once per full layer


@pytest.mark.parametrize(
    "family", ["sage_mean", "sage_sum", "gin", "graphconv", *FULL_LAYER_FAMILIES]
)
def test_full_evaluation_reads_in_place_and_is_exact(graph, family):
    edge_index, x, store = graph
    model = build(family, 6)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    with torch.no_grad():
        assert_exact(ev.evaluate(), build(family, 6)(x, edge_index), family)
    conv_layers = [layer for layer in ev.last_stats.layers if layer.layer > 0]
    assert any(layer.gather_free for layer in conv_layers)
    assert ev.last_stats.batches > len(ev.last_stats.layers)  # several batches per layer
    # GCN's second layer (16 -> 5) reads only x Θ: its input is freed once that is built
    freed = [layer.freed_inputs for layer in conv_layers]
    assert freed == ([0, 1] if family.startswith("gcn") else [0] * len(conv_layers)), freed


@pytest.mark.parametrize("family", FULL_LAYER_FAMILIES)
def test_full_layer_edge_weights_built_in_chunks_are_exact(graph, family, monkeypatch):
    """The normalized weights of a full layer are built a run of destinations at a time;
    chunk edges (97 edges, runs cut mid-graph) must not change them."""
    edge_index, x, store = graph
    monkeypatch.setattr(gcn, "FULL_WEIGHT_CHUNK_EDGES", 97)
    ev = LayerwiseEvaluator(build(family, 6), store, init_batch_nodes=64)
    with torch.no_grad():
        assert_exact(ev.evaluate(), build(family, 6)(x, edge_index), f"{family}, chunked")


@pytest.mark.parametrize("family", FULL_LAYER_FAMILIES)
def test_full_layer_only_adapters_gather_on_partial_frontiers(graph, family):
    """GCN derives x Θ for the whole table: a partial frontier must not pay for that."""
    edge_index, x, store = graph
    ev = LayerwiseEvaluator(build(family, 6), store, init_batch_nodes=64)
    ids = torch.tensor([3, 5, 899])
    with torch.no_grad():
        assert_exact(ev.evaluate(targets=ids), build(family, 6)(x, edge_index)[ids], family)
    assert not any(layer.gather_free for layer in ev.last_stats.layers)


def test_partial_evaluation_gathers(graph):
    edge_index, x, store = graph
    model = build("sage_mean", 6)
    ev = LayerwiseEvaluator(model, store)
    ids = torch.tensor([3, 5])
    with torch.no_grad():
        assert_exact(ev.evaluate(targets=ids), model(x, edge_index)[ids], "partial")
    assert not ev.last_stats.layers[-1].gather_free  # V^L is a subset: stored by position


def test_attention_convs_without_a_full_layer_path_gather(graph):
    """GATv2 scores each edge from both endpoints' projected rows: it runs its own forward
    on gathered rows (GATConv's full layers read a source table: tests/worker/convs)."""
    _, _, store = graph
    ev = LayerwiseEvaluator(build("gatv2", 6), store)
    ev.evaluate()
    assert not any(layer.gather_free for layer in ev.last_stats.layers)


def test_residual_reads_destination_rows_of_the_table(graph):
    # JKNet adds the conv input back: the residual reads destination rows, which in the
    # gather-free path are a view of the stored table — still exact.
    edge_index, x, store = graph
    model = build("jk_cat", 6)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=50)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "jk")
    assert any(layer.gather_free for layer in ev.last_stats.layers)


class _GATStack(torch.nn.Module):
    """Three PyG ``GATConv`` layers; ``skip``: the third layer adds its input's
    destination rows back; ``jump``: the output concatenates the first layer's rows."""

    def __init__(self, skip: bool = False, jump: bool = False) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv

        torch.manual_seed(5)
        self.convs = torch.nn.ModuleList(
            [GATConv(6, 4, heads=2), GATConv(8, 4, heads=2), GATConv(8, 4, heads=2)]
        )
        self.skip, self.jump = skip, jump

    def forward(self, x, edge_index):
        h1 = self.convs[0](x, edge_index).relu()
        h2 = self.convs[1](h1, edge_index).relu()
        h3 = self.convs[2](h2, edge_index)
        if self.skip:
            h3 = h3 + h2
        return torch.cat([h1, h3], dim=1) if self.jump else h3


@pytest.mark.parametrize(
    ("skip", "jump", "freed"),
    [(False, False, [0, 1, 1]), (True, False, [0, 1, 0]), (False, True, [0, 0, 1])],
)
def test_inputs_read_only_through_source_tables_are_freed(graph, skip, jump, freed):
    """A layer's input is freed before its batches only when its convs read it through
    their derived tables alone and no later block reads it: not when the block adds its
    rows back (``skip``), nor when the output reads the first layer again (``jump``)."""
    edge_index, x, store = graph
    model = _GATStack(skip, jump).eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), f"skip={skip} jump={jump}")
    layers = [layer for layer in ev.last_stats.layers if layer.layer > 0]
    assert all(layer.gather_free and layer.batches > 1 for layer in layers)
    assert [layer.freed_inputs for layer in layers] == freed
    ids = torch.tensor([3, 5, 899])  # partial frontiers keep their inputs
    with torch.no_grad():
        assert_exact(ev.evaluate(targets=ids), model(x, edge_index)[ids], "partial")
    assert not any(layer.freed_inputs for layer in ev.last_stats.layers)


def test_a_stand_in_never_derives_a_table():
    """A table derived up front stays past the layer's last batch (a batch redone after
    running out of memory still finds it) until cleared; after that, reading the freed
    input's stand-in is an error, never a table made from its placeholder value."""
    from hopserve.worker.convs.base import LayerBatch
    from hopserve.worker.convs.layer_table import LayerTableCache, stand_in

    x = torch.randn(10, 3)
    s = stand_in(x)
    assert s.shape == x.shape and s.dtype == x.dtype and s.untyped_storage().nbytes() == 4
    cache = LayerTableCache()
    cache.put(s, "k", x * 2)
    indptr = torch.zeros(3, dtype=torch.long)
    last = LayerBatch(
        src_nodes=torch.arange(2), num_dst=2, indptr=indptr, src_index=indptr[:0],
        edge_ids=indptr[:0], layer=2, global_src_size=10, dst_start=8,
    )  # fmt: skip
    for _ in range(2):
        assert torch.equal(cache.get(s, "k", last, lambda: pytest.fail("rebuilt")), x * 2)
    cache.clear()
    with pytest.raises(RuntimeError, match="layer 2: no table derived"):
        cache.get(s, "k", last, lambda: s * 2)


class _SharedLastConv(torch.nn.Module):
    """One conv called on two values in a layer: ``c(a(x)) + c(b(x))``; ``again``: the
    next layer reads ``b(x)`` once more. ``kind``: GCN (16 -> 5 projects first) or GAT."""

    def __init__(self, kind: str, again: bool) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv

        torch.manual_seed(7)
        self.a, self.b = GCNConv(6, 16), GCNConv(6, 16)
        self.c = GCNConv(16, 5) if kind == "gcn" else GATConv(16, 4, heads=2)
        self.d = GCNConv(16, 3) if again else None

    def forward(self, x, edge_index):
        h1, h2 = self.a(x, edge_index).relu(), self.b(x, edge_index).relu()
        out = self.c(h1, edge_index) + self.c(h2, edge_index)
        if self.d is not None:
            out = torch.cat([out, self.d(h2, edge_index)], dim=1)
        return out


@pytest.mark.parametrize("kind", ["gcn", "gat"])
@pytest.mark.parametrize("again", [False, True])
def test_a_conv_called_on_two_values_keeps_its_inputs(graph, kind, again):
    """A conv holds one source table per layer: called on two values in one block, it
    derives neither up front and both stay stored (exact, nothing freed)."""
    edge_index, x, store = graph
    model = _SharedLastConv(kind, again).eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), f"{kind} shared conv")
    assert not any(layer.freed_inputs for layer in ev.last_stats.layers)


def test_a_freed_input_returns_its_host_budget_to_the_layer_outputs(graph, tmp_path):
    """Under a host budget of one layer's rows, a layer whose input is freed behind its
    tables keeps its output in host memory instead of spilling it to disk."""
    edge_index, x, store = graph
    model = _GATStack().eval()
    layer_bytes = store.num_nodes * 8 * 4  # every layer is 2 heads x 4 wide, float32
    ev = LayerwiseEvaluator(
        model, store, init_batch_nodes=64, host_memory_budget_bytes=layer_bytes + 1024,
        spill_dir=str(tmp_path),
    )  # fmt: skip
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "freed inputs, tight host budget")
    assert [layer.freed_inputs for layer in ev.last_stats.layers if layer.layer > 0] == [0, 1, 1]
    assert set(ev.last_stats.tiers.values()) == {"host"}, ev.last_stats.tiers


def test_no_layer_keeps_a_released_value_alive(graph, monkeypatch):
    """A value the run stops storing is gone before the next layer runs (no reference to
    it outlives its release), freed inputs included."""
    import weakref

    from hopserve.worker.engine.run import LayerwiseRun

    edge_index, x, store = graph
    seen: dict[str, weakref.ref] = {}
    alive_after_release: list[tuple[int, str]] = []
    real = LayerwiseRun._run_block

    def spy(self, block, bar):
        for name, ref in seen.items():
            if name not in self.stored and ref() is not None:
                alive_after_release.append((block.index, name))
        real(self, block, bar)
        seen.update({name: weakref.ref(t) for name, (t, _) in self.stored.items()})

    model = _GATStack().eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    monkeypatch.setattr(LayerwiseRun, "_run_block", spy)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "released values")
    assert len(seen) >= 3 and alive_after_release == [], alive_after_release


def _layer_hook(monkeypatch, hook):
    """Run ``hook(batch, last)`` after each GAT full-layer batch of layer 2 computes."""
    from hopserve.worker.convs.gat import GATAdapter
    from hopserve.worker.convs.layer_table import _last_of_layer

    real = GATAdapter._run_full_layer

    def run(self, x, batch):
        out = real(self, x, batch)
        if batch.layer == 2:
            hook(batch, _last_of_layer(batch))
        return out

    monkeypatch.setattr(GATAdapter, "_run_full_layer", run)


def test_a_batch_redone_after_running_out_of_memory_finds_the_derived_table(graph, monkeypatch):
    """The last batch of a freed layer runs out of memory after reading the table (as a
    CUDA OOM in the conv does): the halved redo still finds the table, exactly."""
    from hopserve.worker.engine.batching import BatchOutOfMemory

    edge_index, x, store = graph
    model = _GATStack().eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    raised = []

    def oom_once(batch, last):
        if last and not raised:
            raised.append(batch.num_dst)
            raise BatchOutOfMemory("simulated")

    _layer_hook(monkeypatch, oom_once)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "redone after OOM")
    layer2 = next(layer for layer in ev.last_stats.layers if layer.layer == 2)
    assert raised and raised[0] > 1 and layer2.oom_halvings == 1 and layer2.freed_inputs == 1


def test_a_layer_that_fails_midway_drops_its_derived_tables(graph, monkeypatch):
    """An error in the middle of a freed layer leaves no table behind, and the next run
    is exact."""
    edge_index, x, store = graph
    model = _GATStack().eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    calls = []

    def fail_second(batch, last):
        calls.append(batch.num_dst)
        if len(calls) == 2:
            raise ValueError("simulated failure")

    _layer_hook(monkeypatch, fail_second)
    with pytest.raises(ValueError, match="simulated failure"):
        ev.evaluate()
    assert all(a._source._entry is None for a in ev.split.adapters.values())
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "after a failed run")


@pytest.mark.parametrize("tail", ["none", "method", "input-helper"])
def test_destination_rows_of_a_full_layer_are_read_in_place(graph, tail, monkeypatch):
    """A block reading an earlier layer at its destinations only (JKNet's concatenation)
    gets a view of that layer's table on a full layer, not a copy, also when it writes
    into its own tensors in place; a block that may write into an input gets copies (an
    ``fx.wrap``'d helper may). All are exact."""
    from support.models import SkipCat

    from hopserve.worker.engine import run as run_module

    edge_index, _, store = graph
    x = torch.randn(store.num_nodes, 6, generator=torch.Generator().manual_seed(3))
    store = type(store).from_edge_index(edge_index, x)
    torch.manual_seed(0)
    model = SkipCat(tail).eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    last = ev.split.blocks[-1]
    dst_specs = [i for i, s in enumerate(last.inputs) if s.rows == "dst"]
    assert dst_specs and last.writes_in_place == tail.startswith("input")
    seen = []
    real = run_module.prepare

    def spy(*args, **kwargs):
        prepared = real(*args, **kwargs)
        if args[2] is last:
            seen.extend(prepared.inputs[i]._base is not None for i in dst_specs)
        return prepared

    monkeypatch.setattr(run_module, "prepare", spy)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x.clone(), edge_index), tail)
    assert len(seen) == ev.last_stats.layers[-1].batches > 1
    assert not any(seen) if tail.startswith("input") else all(seen)
