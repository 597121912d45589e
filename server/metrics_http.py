"""The metrics port: ``/metrics`` (Prometheus text) and ``/healthz``, 404 elsewhere.

Built on prometheus-client's WSGI app and threading server (a daemon thread). ``/healthz``
answers 200 ``SERVING`` while ``healthy()`` is true and 503 ``NOT_SERVING`` otherwise, for
probes that speak HTTP only (Kubernetes ``httpGet``, load balancers). The port carries
no request data; keep it on an internal network (README, Security).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

__all__ = ["start_metrics_server"]


def _text(body: bytes) -> list[tuple[str, str]]:
    return [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]


def start_metrics_server(
    port: int,
    registry: CollectorRegistry,
    addr: str = "127.0.0.1",
    healthy: Callable[[], bool] = lambda: True,
) -> tuple[WSGIServer, int]:
    """Serve ``registry`` at ``http://addr:port/metrics`` and health at ``/healthz``.

    Args:
        port: TCP port; 0 picks a free one.
        registry: The registry to expose (``Metrics.registry``).
        addr: Bind address.
        healthy: Whether ``/healthz`` answers 200.

    Returns:
        ``(server, bound_port)``; stop with ``server.shutdown(); server.server_close()``.
    """
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            ok = healthy()
            body = b"SERVING\n" if ok else b"NOT_SERVING\n"
            start_response("200 OK" if ok else "503 Service Unavailable", _text(body))
            return [body]
        body = b"not found: this port serves /metrics and /healthz\n"
        start_response("404 Not Found", _text(body))
        return [body]

    class _Server(ThreadingWSGIServer):
        pass

    _Server.address_family, addr = _get_best_family(addr, port)
    httpd = make_server(addr, port, app, _Server, handler_class=_SilentHandler)
    threading.Thread(target=httpd.serve_forever, name="hopserve-metrics", daemon=True).start()
    return httpd, int(httpd.server_port)
