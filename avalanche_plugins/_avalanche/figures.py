"""Figures the metrics log, as compact images.

A metric value stays in Avalanche's ``EvaluationPlugin`` for the whole run (``collect_all=True``),
and a live ``matplotlib`` figure holds megabytes. :func:`figure_image` renders it once to a PNG
and returns a lazily decoded ``PIL`` image of a few tens of kB that every image-aware logger
(TensorBoard, W&B) accepts; the figure itself is dropped. :func:`as_image` turns any image-like
metric value (a ``PIL`` image, a ``Figure``, Avalanche's ``TensorImage``) into a ``PIL`` image for
the loggers that store files (the tidy CSV logger, the W&B fix). :func:`wants_images` says whether
anything of a run can take a figure at all: rendering one costs about as much as a small model's
measurement (0.1–0.2 s on a 2-core CPU, docs/RESULTS.md, issue 41), so a metric renders only then. A metric hands out a :class:`DeferredFigure`: a ``PIL`` image whose
pixels are drawn on first read, so the drawing happens where a logger reads it (the tidy CSV
logger: when it closes, after training), not inside the metric's callback. The figures have fixed
margins (no ``tight_layout``) and no minor log ticks: about a quarter of the drawing time before.
"""

from __future__ import annotations

import io
import math

from PIL import Image

__all__ = ["DeferredFigure", "as_image", "figure_image", "fixed_margins", "label_extent", "profile_figure",
           "profile_figure_size", "wants_images"]

DPI = 80  # the images' resolution: a 3-inch figure is 240 pixels wide


def figure_image(fig, dpi: int = DPI):
    """The figure rendered to PNG, as a ``PIL.Image`` (decoded only when a logger reads it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

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


def label_extent(labels, fontsize: float, degrees: float) -> float:
    """Inches a row of tick labels rotated by ``degrees`` takes below (or beside) its axis: the
    longest label at about 0.6 em per character, projected, plus the tick and its padding."""
    longest = max((len(str(label)) for label in labels), default=0)
    width, height = 0.6 * fontsize / 72 * longest, fontsize / 72
    angle = math.radians(degrees)
    return width * math.sin(angle) + height * math.cos(angle) + 0.12


def fixed_margins(fig, *, left: float, bottom: float, top: float = 0.3, right: float = 0.15) -> None:
    """Place the axes ``left``/``bottom``/``top``/``right`` inches from the figure's edges: what
    ``tight_layout`` computes by measuring every text, which costs most of a small figure's drawing."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)


def profile_figure_size(names) -> tuple[float, float]:
    """The size in inches of :func:`profile_figure`'s chart of ``names``."""
    return max(3.0, 0.45 * len(names) + 1.5), 2.4 + label_extent(names, 7, 60)


def profile_figure(names, values, title: str):
    """A bar chart of a per-layer profile (a ``matplotlib.figure.Figure``, not tracked by pyplot):
    a log axis when every value is positive (decades labelled, no minor ticks)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogFormatter, NullLocator

    fig = Figure(figsize=profile_figure_size(names))
    ax = fig.subplots()
    ax.bar(range(len(values)), values)
    if len(values) and min(values) > 0:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(LogFormatter())  # "0.01", not mathtext's 10^-2: parsing it dominates
        ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    fixed_margins(fig, left=0.6, bottom=label_extent(names, 7, 60))
    return fig


class DeferredFigure(Image.Image):
    """A ``PIL`` image of ``draw(*args)`` (a ``matplotlib`` figure of ``figsize`` inches) drawn on
    first read: ``load()``, which every pixel access, ``save``, ``tobytes`` and pickling call.
    Until then it holds ``args`` (a few numbers and names), so a metric can hand one to the
    loggers at the cost of a tuple, and the drawing happens only where a logger reads it.

    Example:
        >>> image = DeferredFigure(profile_figure, ["a", "b"], [1.0, 0.1], "s_l",
        ...                        figsize=profile_figure_size(["a", "b"]))
        >>> image.drawn, image.size
        (False, (240, 209))
        >>> image.convert("RGB").size, image.drawn
        ((240, 209), True)
    """

    def __init__(self, draw, *args, figsize: tuple[float, float], dpi: int = DPI):
        super().__init__()
        self._draw = (draw, args, dpi)
        self._mode = "RGBA"  # what Agg's PNG holds
        self._size = (int(figsize[0] * dpi), int(figsize[1] * dpi))

    @property
    def drawn(self) -> bool:
        return getattr(self, "_draw", None) is None

    def load(self):
        if not self.drawn:
            draw, args, dpi = self._draw
            pixels = figure_image(draw(*args), dpi=dpi)
            pixels.load()
            self.im, self._mode, self._size = pixels.im, pixels.mode, pixels.size
            self._draw = None  # after the drawing: one that raised is tried again at the next read
        return super().load()
