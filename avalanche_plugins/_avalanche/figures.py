"""Figures the metrics log, as compact images.

A metric value stays in Avalanche's ``EvaluationPlugin`` for the whole run (``collect_all=True``),
and a live ``matplotlib`` figure holds megabytes. :func:`figure_image` renders it once to a PNG
and returns a lazily decoded ``PIL`` image of a few tens of kB that every image-aware logger
(TensorBoard, W&B) accepts; the figure itself is dropped.
"""

from __future__ import annotations

import io

__all__ = ["figure_image", "profile_figure"]


def figure_image(fig, dpi: int = 80):
    """The figure rendered to PNG, as a ``PIL.Image`` (decoded only when a logger reads it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    buffer = io.BytesIO()
    FigureCanvasAgg(fig)  # attaches an Agg canvas to a pyplot-free Figure
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    return Image.open(buffer)


def profile_figure(names, values, title: str):
    """A bar chart of a per-layer profile (a ``matplotlib.figure.Figure``, not tracked by pyplot)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(3.0, 0.45 * len(names) + 1.5), 3.0))
    ax = fig.subplots()
    ax.bar(range(len(values)), values)
    ax.set_yscale("log" if min(values) > 0 else "linear")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


