"""The parts of ``bench/updates.py`` (the command line and the top-level flow stay there).

* :mod:`.streams` — the graph as the client sees it (IDs, in-neighbours, hubs), the query
  stream every phase replays, the checker's probe nodes and the update batches;
* :mod:`.service` — one served configuration: a private copy of the graph, the config file,
  ``hopserve serve`` in a subprocess;
* :mod:`.phases` — one measured phase: open-loop queries, the updater, the read-your-writes
  checker, and the one-off measurements (cold start, hub updates);
* :mod:`.cost` — in-process timings of one update's parts (splice, log fsync, invalidation)
  and of GCN's per-sequence normalization: where the time goes;
* :mod:`.report` — the summary, the goals, the markdown tables and the figure.

``bench/`` is not a package: ``bench/updates.py`` puts it on ``sys.path``, so these modules
import ``harness`` (``bench/harness/``) and each other as ``updates_parts``.
"""
