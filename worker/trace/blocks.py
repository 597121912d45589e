"""The schema of a split model: ConvBlocks, what each reads, and the model output.

A block's module is called as ``module(block, *inputs) -> tuple(outputs)``: ``block`` is
a :class:`~hopserve.worker.convs.Block`, each input holds rows ``block.src_nodes`` or
``block.dst_nodes`` (see :class:`BlockInput`), every output holds ``block.dst_nodes``
rows. Block modules share the user's parameters; nothing is copied. They are generated
by :func:`hopserve.worker.trace.split.split_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, fx

from hopserve.worker.convs.base import Block, ConvAdapter

FEATURES = -1  # producer id of the raw node features (the graph store)


def dst_rows(t: Tensor, block: Block) -> Tensor:
    """The destination rows of a source-row tensor (see :meth:`Block.dst_rows`)."""
    return block.dst_rows(t)


@dataclass
class BlockInput:
    """One tensor a block reads: which value, which block stored it, which rows."""

    name: str  # value key (fx node name of the producer)
    producer: int  # block index that stores it; FEATURES = the graph store's features
    rows: str  # "src": all source rows of a batch; "dst": destination rows only
    # Convs reading it over source rows, when only convs do (else None): such inputs can
    # be handed over whole, without a gather, to adapters that support it.
    src_convs: tuple[str, ...] | None = None


@dataclass
class ConvBlock:
    """One layer of the model as a standalone module (DGI's ConvBlock)."""

    index: int  # 0 = node-wise pre-block (ops before the first conv), 1..L = layers
    module: fx.GraphModule
    inputs: list[BlockInput]
    outputs: list[str]
    convs: list[str]  # qualified names of the convs it runs

    @property
    def has_edges(self) -> bool:
        return self.index > 0


@dataclass
class ModelSplit:
    """The schema: blocks in execution order, the model output, and value lifetimes."""

    blocks: list[ConvBlock]
    output: str
    num_layers: int
    adapters: dict[str, ConvAdapter] = field(default_factory=dict)
    last_use: dict[str, int] = field(default_factory=dict)  # value -> last block reading it
    style: str = "pyg"

    def describe(self) -> str:
        """Human-readable schema, one line per block."""
        lines = []
        for b in self.blocks:
            ins = ", ".join(
                f"{i.name}@{'x' if i.producer == FEATURES else i.producer}[{i.rows}]"
                for i in b.inputs
            )
            lines.append(
                f"block {b.index}: convs={b.convs or '-'} inputs=({ins}) outputs={b.outputs}"
            )
        return "\n".join(lines)


__all__ = ["FEATURES", "BlockInput", "ConvBlock", "ModelSplit", "dst_rows"]
