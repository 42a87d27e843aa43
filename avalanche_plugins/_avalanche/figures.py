"""Figures the metrics log, as compact images.

A metric value stays in Avalanche's ``EvaluationPlugin`` for the whole run (``collect_all=True``),
and a live ``matplotlib`` figure holds megabytes. :func:`figure_image` renders it once to a PNG
and returns a lazily decoded ``PIL`` image of a few tens of kB that every image-aware logger
(TensorBoard, W&B) accepts; the figure itself is dropped. :func:`as_image` turns any image-like
metric value (a ``PIL`` image, a ``Figure``, Avalanche's ``TensorImage``) into a ``PIL`` image for
the loggers that store files (the tidy CSV logger, the W&B fix). :func:`wants_images` says whether
anything of a run can take a figure at all: rendering one costs about as much as a small model's
measurement (0.1–0.2 s on a 2-core CPU, docs/RESULTS.md, issue 41), so a metric renders only then.
"""

from __future__ import annotations

import io

__all__ = ["as_image", "figure_image", "profile_figure", "wants_images"]


def figure_image(fig, dpi: int = 80):
    """The figure rendered to PNG, as a ``PIL.Image`` (decoded only when a logger reads it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    buffer = io.BytesIO()
    FigureCanvasAgg(fig)  # attaches an Agg canvas to a pyplot-free Figure
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    return Image.open(buffer)


def wants_images(strategy) -> bool:
    """Whether an image value emitted now can reach anything: False only when the strategy's
    ``EvaluationPlugin`` keeps no values (``collect_all=False``) and every one of its loggers is
    known to drop images (a ``TidyCSVLogger(images=False)``: a logger with an ``images`` attribute
    set to False). Anything else (no evaluator, an unknown logger, a text logger that prints the
    value) takes them, so nothing a logger received before changes.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> wants_images(NS(evaluator=NS(collect_all=False, loggers=[NS(images=False)])))
        False
        >>> wants_images(NS(evaluator=NS(collect_all=False, loggers=[NS(images=False), NS()])))
        True
    """
    evaluator = getattr(strategy, "evaluator", None)
    if evaluator is None or getattr(evaluator, "collect_all", True):
        return True
    return any(getattr(logger, "images", True) is not False for logger in getattr(evaluator, "loggers", ()))


def as_image(value):
    """A ``PIL`` image of ``value`` (``PIL`` image, ``matplotlib`` ``Figure`` or ``TensorImage``),
    or None when ``value`` is none of these."""
    from matplotlib.figure import Figure
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, Figure):
        return figure_image(value)
    from avalanche.evaluation.metric_results import TensorImage

    if isinstance(value, TensorImage):
        import torch

        pixels = value.image.detach().cpu()
        if pixels.is_floating_point():  # Avalanche's convention: CHW in [0, 1]
            pixels = (pixels.clamp(0, 1) * 255).round().to(torch.uint8)
        array = pixels.numpy()
        if array.ndim == 3:
            array = array.transpose(1, 2, 0)
            array = array[..., 0] if array.shape[2] == 1 else array
        return Image.fromarray(array)
    return None


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


