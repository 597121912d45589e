"""The worker side of the layer cache: one per loaded model (see :mod:`~hopserve.worker.
engine.layer_cache` for the rule).

Per exact job (no sampling, no cold-start delta) on a layer-wise model::

    track(live)                      before the graph's read lock: stale-since per layer
    plan(job, graph, targets)        under the model's lock and the graph's read lock:
      ├─ cache for this graph        rebuilt when the base store changed (compaction)
      ├─ reusable(seq, stale_since)  hub rows valid at the job's sequence
      ├─ planner(reusable=…)         frontiers stop at them
      └─ LayerReuse                  their rows + a hook keeping the hub rows computed

Only jobs without frontiers use it: the front-end sends none to a worker that reports a
layer cache (it cannot know which rows the worker holds), and a job that carries
frontiers runs on them as sent.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from hopserve.worker.engine.layer_cache import LayerCache, LayerReuse, cacheable_boundaries
from hopserve.worker.graph.planner import Plan
from hopserve.worker.runtime.degrees import degree_reads

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.proto.contract import Job
    from hopserve.worker.graph.live import LiveGraph

__all__ = ["ModelLayerCache"]

log = logging.getLogger(__name__)


class ModelLayerCache:
    """A loaded model's layer cache of ``capacity`` hub rows per cacheable boundary."""

    def __init__(self, evaluator, capacity: int) -> None:  # noqa: ANN001 - LayerwiseEvaluator
        self.evaluator = evaluator
        self.capacity = int(capacity)
        self.degree_normalized, self.source_degrees = degree_reads(evaluator)
        self.cache: LayerCache | None = None  # built on the first plan (see plan)
        # The same boundaries LayerCache keeps, without choosing hubs or allocating tables.
        self._boundaries = tuple(cacheable_boundaries(evaluator.split)) if self.capacity > 0 else ()

    @property
    def enabled(self) -> bool:
        return bool(self._boundaries) and self.capacity > 0

    def kind(self, layer: int) -> tuple[int, bool, bool, bool]:
        """The living graph's invalidation kind of layer-``layer`` rows (layer-wise rows
        read in-edges only)."""
        return (layer, self.degree_normalized, self.source_degrees, False)

    def track(self, live: LiveGraph | None) -> None:
        """Keep stale-since sequences at every cached depth (call before taking the
        graph's read lock: tracking takes the writer's mutex)."""
        if live is not None and self.enabled:
            for layer in self._boundaries:
                live.track(self.kind(layer))

    def plan(
        self, job: Job, graph, targets: np.ndarray, live: LiveGraph | None
    ) -> tuple[Plan, LayerReuse] | None:  # noqa: ANN001 - GraphStore
        """The job's plan with reused rows and the run's :class:`LayerReuse`; ``None``
        when the job cannot use the cache (sampling, a delta, cache off, or a job run on
        an earlier version of the graph than the current one).

        Called under the graph's read lock: the sequence and stale marks hold still.
        """
        if not self.enabled or job.fanouts is not None or job.delta:
            return None
        seq = int(getattr(graph.topology, "seq", 0))
        if live is not None and seq != live.seq:
            return None  # a job planned before an update, run on its older version
        token = _graph_token(graph, live)
        if self.cache is None or not self.cache.matches(token):
            self.cache = self._build(graph, token)
        cache = self.cache
        if live is not None:

            def stale_since(layer: int, nodes: np.ndarray) -> np.ndarray:
                return live.stale_since(self.kind(layer), nodes)
        else:

            def stale_since(layer: int, nodes: np.ndarray) -> np.ndarray:
                return np.zeros(nodes.shape, dtype=np.int64)

        reusable = cache.reusable(seq, stale_since, graph.num_nodes)
        plan = self.evaluator.plan(torch.from_numpy(targets), reusable=reusable)
        reused = {layer: f.reused for layer, f in enumerate(plan.layers) if f.reused is not None}
        return plan, cache.reuse(reused, seq)

    def _build(self, graph, token: object) -> LayerCache:  # noqa: ANN001 - GraphStore
        degrees = np.asarray(graph.topology.in_degrees)
        return LayerCache(self.evaluator.split, degrees, self.capacity, token)


def _graph_token(graph, live: LiveGraph | None) -> object:  # noqa: ANN001 - GraphStore
    """What names the graph's storage order: a living graph's history and base (a
    compaction writes a new base), or a fixed store's content version."""
    if live is None:
        return graph.version
    return (live.cache_version, live.base_seq, str(live.base_dir))
