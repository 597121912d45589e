"""Partition a traced model into ConvBlocks with DGI's three rules (DGI §3.2).

1. **Layer indexing** — a conv's layer is 1 + the largest layer among the convs it depends
   on; convs with the same layer form one block (so they share loaded inputs).
2. **Minimum input** — a normal (node-wise) op may move from the block where its inputs
   are ready to a later block that consumes it, when that lowers the number of tensors
   crossing block boundaries (each (value, consuming block) pair is one transfer).
3. **Upstream binding** — among equal-cost placements, an op stays in the earliest block,
   so it runs once per node instead of once per neighbour occurrence.

Ops before the first conv form *block 0* (node-wise only, run once per node). Then each
block's ops get a *row domain*: ``src`` if a conv of the block (transitively) consumes them
over the source rows of a batch, else ``dst`` (the batch's destination rows only).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from torch import fx

SRC, DST = "src", "dst"


@dataclass
class NodeFacts:
    """What the probe run and tracer know about one fx node."""

    row: bool  # a per-node tensor (dim 0 = nodes)
    const: bool  # does not depend on the features (parameters, literals)
    bundle: bool = False  # a feature-dependent container (tuple) of row tensors


@dataclass
class Partition:
    """Block assignment and row domains for every feature-dependent node."""

    num_layers: int
    block_of: dict[fx.Node, int]
    rows_of: dict[fx.Node, str] = field(default_factory=dict)  # rows the value is computed on
    demand_of: dict[fx.Node, str] = field(default_factory=dict)  # rows consumers need

    def crossings(self, node_users: dict[fx.Node, list[fx.Node]]) -> set[tuple[fx.Node, int]]:
        out = set()
        for v, users in node_users.items():
            for u in users:
                m = self.block_of[u]
                if m > self.block_of[v]:
                    out.add((v, m))
        return out


@dataclass
class ConvArgs:
    """The per-node arguments of one conv call: its feature input ``x`` (read on source
    rows) and the extra per-node inputs its adapter takes (``{param: value}``), each read on
    the rows ``rows[param]`` (``src`` or ``dst``; see ``ConvAdapter.node_inputs``)."""

    x: fx.Node
    extra: dict[str, fx.Node] = field(default_factory=dict)
    rows: dict[str, str] = field(default_factory=dict)

    def rows_of(self, value: fx.Node) -> str | None:
        """Rows the call reads ``value`` on (``None``: not an argument of the call)."""
        found = [SRC] if value is self.x else []
        found += [self.rows[p] for p, v in self.extra.items() if v is value]
        if not found:
            return None
        return SRC if SRC in found else DST


def _feature_users(
    node: fx.Node, facts: dict[fx.Node, NodeFacts], output_block: int
) -> list[fx.Node]:
    return [u for u in node.users if u.op == "output" or not facts[u].const]


def partition(
    graph: fx.Graph,
    feature_node: fx.Node,
    conv_args: dict[fx.Node, ConvArgs],
    facts: dict[fx.Node, NodeFacts],
) -> Partition:
    """Assign each feature-dependent node to a block and a row domain."""
    conv_nodes = set(conv_args)
    order = [n for n in graph.nodes if n is feature_node or (n in facts and not facts[n].const)]
    output = next(n for n in graph.nodes if n.op == "output")

    # Rule 1: layer indexing.
    level: dict[fx.Node, int] = {feature_node: 0}
    for n in order:
        if n is feature_node:
            continue
        ins = [i for i in n.all_input_nodes if i in level]
        base = max((level[i] for i in ins), default=0)
        level[n] = base + 1 if n in conv_nodes else base
    num_layers = max(level[c] for c in conv_nodes)
    block_of = dict(level)
    block_of[output] = num_layers

    users = {n: _feature_users(n, facts, num_layers) for n in order}

    def cost() -> int:
        return len(Partition(num_layers, block_of).crossings(users))

    # Rules 2 + 3: move normal ops downstream only on a strict decrease of crossings.
    pinned = {n for n in order if facts[n].bundle}
    pinned |= {
        u
        for n in pinned
        for u in users[n]
        if u.op == "call_function" and u.target is operator.getitem
    }
    improved = True
    while improved:
        improved = False
        for n in reversed(order):
            if n is feature_node or n in conv_nodes or n in pinned or not users[n]:
                continue
            target = min(block_of[u] for u in users[n])
            if target <= block_of[n]:
                continue
            before, old = cost(), block_of[n]
            block_of[n] = target
            if cost() < before:
                improved = True
            else:
                block_of[n] = old

    part = Partition(num_layers, block_of)
    _assign_rows(part, order, users, conv_args, facts)
    return part


def _assign_rows(
    part: Partition,
    order: list[fx.Node],
    users: dict[fx.Node, list[fx.Node]],
    conv_args: dict[fx.Node, ConvArgs],
    facts: dict[fx.Node, NodeFacts],
) -> None:
    """Demand (rows consumers need, per block) and computed rows of each node: a conv reads
    its feature input on source rows and its extra inputs on the rows it declares."""
    for n in reversed(order):
        need = DST
        for u in users[n]:
            if u.op == "output" or part.block_of[u] != part.block_of[n]:
                continue
            if u in conv_args:
                if (conv_args[u].rows_of(n) or SRC) == SRC:
                    need = SRC
            elif part.demand_of.get(u) == SRC:
                need = SRC
        part.demand_of[n] = need
    for n in order:
        rows = part.demand_of[n]
        if (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
            and facts.get(n.args[0], NodeFacts(False, True)).bundle
        ):
            rows = part.rows_of[n.args[0]]
        if n in conv_args:
            rows = DST
        part.rows_of[n] = rows
