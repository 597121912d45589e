"""Fixtures shared across the suite (the PyG engine tests and the DGL suite alike).

Imports nothing heavy at collection: torch and the engine load when a fixture runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from hopserve import GraphStore


@pytest.fixture(scope="module")
def medium_graph() -> tuple[torch.Tensor, torch.Tensor, GraphStore]:
    """``(edge_index, x, store)``: 3,000 nodes, ~26,000 edges (self-loops, duplicates, the
    last node isolated) and ``D_IN`` features: many batches at the engine tests' sizes."""
    from support import random_graph
    from support.exactness import D_IN

    return random_graph(3000, 24_000, D_IN, seed=1, x_seed=2)
