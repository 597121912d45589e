"""``hopserve worker``: serve the configured models on one device over gRPC.

::

    hopserve worker --config hopserve.yaml --device cuda:0 --host 0.0.0.0 --port 50052
    hopserve worker --config hopserve.yaml --device cpu --port 0
    hopserve worker --config hopserve.yaml --unix-socket /run/hopserve/w0.sock

Binds loopback unless ``--host`` says otherwise. With ``security.link`` configured the
port is mutual TLS and takes jobs only from a front-end with the link token; SIGHUP
re-reads the token (certificates are re-read when their files change).

Loads every model of the config (weights, graph store, layer-wise split) onto the device,
then serves ``hopserve.v1.WorkerService`` (plus gRPC health and reflection) until SIGINT
or SIGTERM; in-flight jobs get ``server.grace_period_s`` to finish. A bad configuration
exits with code 2 and one ``error: ...`` line; so do models that cannot be loaded, one
line each (every model is tried; ``-v`` prints the full reasons).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated

import typer

from hopserve.cli import app, common
from hopserve.cli.common import ConfigPath, fail, load_cli_config, report_model_failures

log = logging.getLogger("hopserve.worker")


@app.command("worker")
def worker_cmd(
    config: ConfigPath,
    device: Annotated[
        str, typer.Option("--device", "-d", help="'cpu', 'cuda' or 'cuda:N'.")
    ] = "cpu",
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="gRPC port (0 = any free).")
    ] = 50052,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to bind (loopback by default; binding others without "
            "security.link warns).",
        ),
    ] = "127.0.0.1",
    unix_socket: Annotated[
        str | None,
        typer.Option(
            "--unix-socket",
            help="Listen on this Unix domain socket instead of --host/--port (access is "
            "the socket's file permissions; what `hopserve serve --workers N` uses).",
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU: torch intra-op threads.")
    ] = None,
    max_pending_jobs: Annotated[
        int,
        typer.Option("--max-pending-jobs", min=1, help="Jobs accepted at once; more: busy."),
    ] = 16,
) -> None:
    """Serve the configured models on one device (the front-end's remote worker)."""
    from hopserve.config import ConfigError
    from hopserve.security.factory import (
        exposure_warnings,
        posture,
        worker_credentials,
        worker_gate,
    )
    from hopserve.worker.runtime import make_worker
    from hopserve.worker.runtime.allocator import log_allocator
    from hopserve.worker.service import serve_worker

    cfg = load_cli_config(config)
    if unix_socket:
        host = f"unix:{unix_socket}"
    link = cfg.security.link
    try:
        credentials, gate = worker_credentials(link), worker_gate(link)
    except ConfigError as err:
        fail(str(err))
    kwargs = {"num_threads": threads} if device == "cpu" else {}
    try:
        worker = make_worker(device, **kwargs)
    except (ValueError, RuntimeError) as err:
        fail(str(err))
    failures = []
    for model in cfg.models:
        try:
            worker.load_model(model, cfg.engine)
        except Exception as err:  # every model is tried; each failure is reported
            log.debug("model %r failed to load", model.name, exc_info=True)
            failures.append((model.name, model.version, str(err)))
    if report_model_failures(failures):
        worker.close()
        raise typer.Exit(code=2)
    try:
        server, bound = serve_worker(
            worker, host, port, max_pending_jobs=max_pending_jobs,
            credentials=credentials, gate=gate, engine=cfg.engine,
        )  # fmt: skip
    except RuntimeError as err:
        fail(str(err), code=1)

    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    def _on_hangup(_signum: int, _frame: object) -> None:
        if gate.tokens is not None:
            gate.tokens.reload()  # certificates follow their files without a signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    signal.signal(signal.SIGHUP, _on_hangup)
    log.info("security: %s", posture(cfg.security, host, worker=True))
    for warning in exposure_warnings(cfg.security, host, worker=True):
        log.warning("%s", warning)
    log_allocator()
    names = ", ".join(f"{m.name}:{m.version}" for m in cfg.models)
    where = host if unix_socket else f"{host}:{bound}"
    log.info("worker %s serving [%s] on %s (%s)", worker.worker_id, names, where, device)
    typer.echo(f"hopserve worker listening on {where} ({device})", err=True)
    stop.wait()
    grace = cfg.server.grace_period_s
    server.stop(grace).wait(grace + 5)
    worker.close()
    log.info("worker stopped")
    common.shut_down = True
