"""``hopserve serve``: run the front-end (gRPC EmbeddingService + metrics) from a config.

::

    hopserve serve --config hopserve.yaml
    hopserve serve --config hopserve.yaml --port 6000 --metrics-port 0   # metrics off
    hopserve serve --config hopserve.yaml --check    # validate config and models, exit
    hopserve serve --config hopserve.yaml --workers 4  # 4 worker processes, one front-end

Serves ``hopserve.v1.EmbeddingService``, gRPC health and reflection on ``server.port``
and Prometheus metrics on ``server.metrics_port``, with an embedded in-process worker
(``server.workers`` empty) or remote workers. Says "serving" once every model is ready;
runs until SIGINT or SIGTERM, then shuts down gracefully (``server.grace_period_s`` for
in-flight requests); SIGHUP re-reads the token file (certificates are re-read when their
files change) and the config file's ``models:``: new and changed versions are loaded and
self-checked beside the served ones, defaults switched, removed versions drained and
unloaded (a file that does not validate changes nothing; other sections need a restart). ``--check`` also prints the security posture of each port. A bad configuration exits with code 2 and one ``error: ...`` line;
so do models that cannot be loaded, one line each (``-v`` for the full reasons).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from hopserve.cli import app, common
from hopserve.cli.common import ConfigPath, fail, load_cli_config, report_model_failures

log = logging.getLogger("hopserve.serve")


@app.command("serve")
def serve_cmd(
    config: ConfigPath,
    port: Annotated[
        int | None, typer.Option("--port", "-p", min=1, max=65535, help="gRPC port override.")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", min=0, max=65535, help="Metrics port override (0 = off)."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-w",
            min=0,
            max=64,
            help="Start N worker processes on this host (server.local_workers); 0: the "
            "models run in this process.",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Validate the config and load every model (import, weights, graph, "
            "layer-wise split and self-check) without serving; exit 0 if all are servable.",
        ),
    ] = False,
) -> None:
    """Serve node embeddings over gRPC (the front-end)."""
    cfg = load_cli_config(config, port=port, metrics_port=metrics_port, local_workers=workers)
    if check:
        raise typer.Exit(code=_check(cfg))
    code = asyncio.run(_serve(cfg, config))
    common.shut_down = True
    if code:
        raise typer.Exit(code=code)


def _check(cfg) -> int:  # noqa: ANN001 - HopserveConfig
    """Security posture and files, then every model loaded as a worker would; one line
    each; the exit code."""
    from hopserve.config import ConfigError
    from hopserve.security.factory import check_files, exposure_warnings, posture

    host = cfg.server.host
    typer.echo(f"security: {posture(cfg.security, host)}", err=True)
    for warning in exposure_warnings(cfg.security, host):
        typer.echo(f"warning: {warning}", err=True)
    try:
        check_files(cfg.security)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        return 2
    if importlib.util.find_spec("torch") is None:
        typer.echo(
            "config ok; models not checked: torch is not installed here (a front-end-only "
            "install); each worker checks its models at start-up",
            err=True,
        )
        return 0
    import torch

    from hopserve.worker.runtime import make_worker

    failures = []
    workers: dict[str, object] = {}
    for model in cfg.models:
        device = model.device if model.device == "cpu" or torch.cuda.is_available() else "cpu"
        try:
            worker = workers.get(device) or workers.setdefault(device, make_worker(device))
            loaded = worker.load_model(model, cfg.engine)  # type: ignore[attr-defined]
        except Exception as err:  # report every model
            log.debug("model %r failed its check", model.name, exc_info=True)
            failures.append((model.name, model.version, str(err)))
            continue
        graph = loaded.graph
        typer.echo(
            f"ok: model {model.name!r} version {model.version!r}: {loaded.evaluator.mode}, "
            f"{loaded.num_layers} layers, dim {loaded.dim}, graph {graph.num_nodes:,} nodes / "
            f"{graph.num_edges:,} edges (version {graph.version[:12]}) on {device}",
            err=True,
        )
    for worker in workers.values():
        worker.close()  # type: ignore[attr-defined]
    return 2 if report_model_failures(failures) else 0


async def _serve(cfg, path: Path | None = None) -> int:  # noqa: ANN001 - HopserveConfig
    """Run until a signal; the exit code (2 when a model failed to load)."""
    from hopserve.config import ConfigError
    from hopserve.server.app import build_server

    try:
        service = await build_server(cfg)
        await service.start()
    except ConfigError as err:
        fail(str(err))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _on_signal, sig, stop)
    reloads = _Reloads(service, path)
    loop.add_signal_handler(signal.SIGHUP, reloads.hangup)
    code = 0
    ready = asyncio.ensure_future(service.wait_ready())
    halted = asyncio.ensure_future(stop.wait())
    await asyncio.wait({ready, halted}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done() and not ready.result():
        failed = [(m.name, m.version, m.error) for m in service.models if m.state == "failed"]
        report_model_failures(failed)
        code = 2
    elif ready.done():
        host = cfg.server.host
        metrics = f"http://{host}:{service.metrics_port}/metrics"
        names = ", ".join(f"{m.name}:{m.version}" for m in service.models)
        typer.echo(
            f"hopserve serving [{names}] on gRPC {host}:{service.port}, metrics on "
            f"{metrics if service.metrics_port else '(disabled)'}",
            err=True,
        )
        await halted
    ready.cancel()
    halted.cancel()
    await service.stop()
    return code


class _Reloads:
    """SIGHUP: the token file now, then the config file's models (one reload at a time)."""

    def __init__(self, service: object, path: Path | None) -> None:
        self.service, self.path = service, path
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def hangup(self) -> None:
        self.service.reload_credentials()  # type: ignore[attr-defined]
        if self.path is not None:
            task = asyncio.get_running_loop().create_task(self._models())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _models(self) -> None:
        from hopserve.config import ConfigError, load_config

        async with self._lock:
            log.info("SIGHUP: reloading the models of %s", self.path)
            try:
                cfg = await asyncio.to_thread(load_config, self.path)
                cfg.validate_paths()
            except ConfigError as err:
                log.error("SIGHUP: %s not reloaded, nothing changed: %s", self.path, err)
                return
            problems = await self.service.reload_models(cfg)  # type: ignore[attr-defined]
            names = ", ".join(
                f"{m.name}:{m.version} ({m.state})"
                for m in self.service.models  # type: ignore[attr-defined]
            )
            if problems:
                log.error("SIGHUP: %d step(s) failed: %s", len(problems), "; ".join(problems))
            log.info("SIGHUP: serving [%s]", names)


def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    log.info("received %s; shutting down", sig.name)
    stop.set()
