"""The ``hopserve`` command line: one Typer app, one module per command group.

Each module below registers its commands on :data:`app`; keep torch imports inside the
command functions so ``hopserve query`` starts fast and works without torch.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="hopserve",
    help="Exact GNN node embeddings, computed layer by layer and served over gRPC.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def setup_logging(verbose: bool = False) -> None:
    """Log to stderr (DEBUG with ``verbose``, else INFO), repeated identical warnings
    rate-limited to one line per minute plus a count (:mod:`hopserve.logs`).

    When the root logger already has handlers (an embedding application, a test runner),
    they are left as they are, as ``logging.basicConfig`` does.
    """
    import logging

    from hopserve.logs import install

    root = logging.getLogger()
    configured = bool(root.handlers)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not configured:
        install(root.handlers)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    """Exact GNN node embeddings, computed layer by layer and served over gRPC."""
    setup_logging(verbose)


# Command modules register themselves on `app` when imported.
from hopserve.cli import (  # noqa: E402,F401
    demo,
    embed,
    graph,
    loadtest,
    models,
    query,
    security,
    serve,
    update,
    worker,
)


def main() -> None:
    """Console-script entry point.

    A long-running command that has shut down gracefully (``serve``, ``worker``) exits
    at once: with torch and PyG loaded, the interpreter's own teardown adds 1-3 s after
    the last request was answered, and nothing is left to clean up.
    """
    from hopserve.cli import common

    try:
        app()
    except SystemExit as done:
        if common.shut_down:
            common.exit_now(done.code)
        raise
