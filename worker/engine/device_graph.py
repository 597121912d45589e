"""The graph kept on the GPU: its CSC and features uploaded once, read by every batch.

Without it a CUDA run builds every batch on the host and copies it over: the in-edge slice
(8 bytes per edge), the gathered feature rows and the index tensors, once per batch and
layer. When the graph fits, the evaluator uploads ``indptr``, ``indices`` (int64) and the
features (float32) once per graph version; a full layer's batches are then slices of
device tensors (no host work, no copy) and layer 1 reads the features in place, like
every later layer reads its predecessor's stored outputs (gather-free).

Policy (``EngineSettings.graph_on_device``): ``None`` uploads when the graph takes at most
:data:`GRAPH_DEVICE_FRACTION` of the device's free memory, ``True`` always (an
out-of-memory error at upload is the operator's to see), ``False`` never.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GRAPH_DEVICE_FRACTION", "DeviceGraph", "device_bytes"]

log = logging.getLogger(__name__)

GRAPH_DEVICE_FRACTION = 0.4
"""Share of free device memory the graph may take by default; the rest is for batches
and stored layer outputs."""


def device_bytes(graph) -> int:
    """Bytes the graph takes on the device: int64 CSC plus float32 features."""
    n, e = graph.num_nodes, graph.num_edges
    return 8 * (n + 1) + 8 * e + 4 * n * graph.feature_dim


@dataclass(frozen=True)
class DeviceGraph:
    """Device copies of one graph store's CSC and features.

    Attributes:
        source: the host store these are copies of (a run uses them only for it).
        version: the store's version when uploaded.
        indptr: int64 ``[N + 1]``; indices: int64 ``[E]``; features: float32 ``[N, F]``.
    """

    source: object
    version: object
    indptr: Tensor
    indices: Tensor
    features: Tensor

    def serves(self, graph) -> bool:
        """Whether these are the copies of ``graph`` as it is now."""
        return self.source is graph and self.version == getattr(graph, "version", None)

    @classmethod
    def upload(cls, graph, device: torch.device) -> DeviceGraph:
        """Copy ``graph``'s CSC and features to ``device`` (chunked: no host-side copy
        of the whole feature table in another dtype)."""
        t = time.perf_counter()
        indptr = graph.indptr.to(device=device, dtype=torch.long)
        indices = graph.indices.to(device).long()
        feats = graph.features
        features = torch.empty(tuple(feats.shape), dtype=torch.float32, device=device)
        step = max(1, (64 << 20) // max(1, feats.shape[1] * feats.element_size()))
        for a in range(0, feats.shape[0], step):
            features[a : a + step].copy_(feats[a : a + step])
        torch.cuda.synchronize(device)
        log.info(
            "graph on %s: %d nodes, %d edges, %.2f GiB in %.2f s",
            device,
            graph.num_nodes,
            graph.num_edges,
            device_bytes(graph) / 2**30,
            time.perf_counter() - t,
        )
        return cls(graph, getattr(graph, "version", None), indptr, indices, features)

    @staticmethod
    def wanted(graph, device: torch.device, setting: bool | None) -> bool:
        """Whether the policy puts ``graph`` on ``device`` (CUDA only)."""
        if device.type != "cuda" or setting is False:
            return False
        if setting is True:
            return True
        free, _ = torch.cuda.mem_get_info(device)
        return device_bytes(graph) <= GRAPH_DEVICE_FRACTION * free
