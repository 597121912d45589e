"""Plots: matplotlib on the Agg backend, figure saving, and timeline decorations."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, *, dpi: int = 120) -> Path:
    """``tight_layout``, save as ``path`` and close ``fig``; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def shade_spans(
    axes: Iterable[Any],
    spans: Sequence[tuple[float, float, str]],
    *,
    colors: Sequence[str] = ("#f2f2f2", "#ffffff"),
    label_ax: Any = None,
) -> None:
    """Alternate background shading of ``(start, end, label)`` spans on every axis;
    labels are written at the top of ``label_ax`` (if given)."""
    for i, (start, end, label) in enumerate(spans):
        for ax in axes:
            ax.axvspan(start, end, color=colors[i % len(colors)], zorder=0, lw=0)
        if label_ax is not None:
            label_ax.text(
                (start + end) / 2,
                1.01,
                label,
                transform=label_ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=8,
            )


def mark_events(
    axes: Iterable[Any],
    events: Sequence[tuple[float, str]],
    *,
    color: str = "#c0392b",
    label_ax: Any = None,
) -> None:
    """Dashed vertical lines at ``(time, label)`` events; labels rotated on ``label_ax``."""
    for t, label in events:
        for ax in axes:
            ax.axvline(t, color=color, ls="--", lw=0.8, zorder=1)
        if label_ax is not None:
            label_ax.text(
                t,
                0.98,
                f" {label}",
                transform=label_ax.get_xaxis_transform(),
                rotation=90,
                ha="left",
                va="top",
                fontsize=7,
                color=color,
            )
