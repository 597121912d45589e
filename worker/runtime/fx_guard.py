"""One process-wide guard between torch.fx tracing and running models.

``torch.fx.Tracer.trace`` patches ``torch.nn.Module.__call__`` for the whole process
while it traces, so a model run by another thread meanwhile is routed into the tracer
and fails (``NameError: module is not installed as a submodule``). A worker that loads a
model version while it serves others (a hot swap) therefore traces under
:meth:`FxGuard.tracing` (exclusive) and runs jobs under :meth:`FxGuard.running` (shared):
jobs run concurrently with each other, never with a trace. A waiting trace goes first
(new jobs wait for it), so a load is not starved by steady traffic.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FX_GUARD", "FxGuard"]


class FxGuard:
    """A readers-writer lock: many runners or one tracer, tracers first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._tracing = False
        self._waiting_tracers = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        """Shared: run models (waits while a trace runs or waits)."""
        with self._cond:
            while self._tracing or self._waiting_tracers:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if not self._running:
                    self._cond.notify_all()

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """Exclusive: trace a model (waits for the running models to finish)."""
        with self._cond:
            self._waiting_tracers += 1
            try:
                while self._tracing or self._running:
                    self._cond.wait()
            finally:
                self._waiting_tracers -= 1
            self._tracing = True
        try:
            yield
        finally:
            with self._cond:
                self._tracing = False
                self._cond.notify_all()


FX_GUARD = FxGuard()
"""The guard of this process (tracing patches the process, not a thread)."""
