"""hopserve front-end: the grpc.aio server that answers embedding requests.

It validates requests, looks embeddings up in the cache (Redis, versioned keys), batches
concurrent requests, plans per-layer frontiers, dispatches one job per batch to a worker and
exports Prometheus metrics. Submodules are imported explicitly (``hopserve.server.app``,
``hopserve.server.cache``, ``hopserve.server.metrics``); this package imports nothing.
"""
