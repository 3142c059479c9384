"""Matplotlib figures rendered to PNG bytes with the Agg backend (matplotlib is imported only here, on use)."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# label -> (x values, y values); an empty label draws an unlabelled line.
Series = Mapping[str, tuple[Sequence[Any], Sequence[float]]]
# (x, label): a vertical line across the plot, such as where an attempt began.
Mark = tuple[Any, str]

MARK_COLOUR = "#dc143c"  # crimson: in no line colour of matplotlib's cycle, so marks stand out (and can be found)
MAX_MARK_LABELS = 10  # more labels would overlap: then the marks go unlabelled
RAW_ALPHA = 0.3  # the raw values under a smoothed line


def figure(width: float = 8.0, height: float = 3.6) -> tuple[Any, Any]:
    """A new (figure, axes) on the Agg backend, whose text (names of metrics, parameters, sweeps) is drawn as written:
    never parsed as mathtext or handed to TeX, so a '$' in a name is a dollar sign."""
    import matplotlib

    matplotlib.use("Agg")
    # Every text artist reads these when it is made, tick labels too (made as the figure is drawn).
    matplotlib.rcParams.update({"text.parse_math": False, "text.usetex": False})
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def png(fig: Any) -> bytes:
    """The figure as PNG bytes (at 100 dpi); the figure is closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def lines(
    series: Series,
    title: str,
    xlabel: str,
    ylabel: str,
    points: bool = False,
    smooth: Callable[[Sequence[float]], list[float]] | None = None,
    marks: Sequence[Mark] = (),
    mark_legend: str = "",
    dashed: Sequence[str] = (),
    sparse: Series | None = None,
) -> bytes:
    """One line (or, with ``points``, one set of markers) per series, with a legend when they are labelled;
    the series named in ``dashed`` dashed (levels such as a budget).
    With ``smooth``, each series' values are drawn faint and the smoothed ones on top in its colour; each mark
    is a dashed vertical line in MARK_COLOUR, its label at the top, ``mark_legend`` their legend entry.
    ``sparse`` series (values taken now and then, such as held-out evaluations) are drawn as markers joined by
    a line, never smoothed."""
    fig, ax = figure()
    for label, (xs, ys) in (sparse or {}).items():
        ax.plot(xs, ys, label=label, marker="o", markersize=4, linewidth=1.2)
    style = {"marker": "o", "linestyle": "none", "markersize": 5} if points else {"linewidth": 1.2}
    for label, (xs, ys) in series.items():
        if smooth is None:
            ax.plot(xs, ys, label=label or None, **{**style, **({"linestyle": "--"} if label in dashed else {})})
        else:
            (line,) = ax.plot(xs, smooth(ys), label=label or "smoothed", linewidth=1.5)
            ax.plot(
                xs,
                ys,
                label=None if label else "raw",
                color=line.get_color(),
                alpha=RAW_ALPHA,
                linewidth=0.8,
                zorder=line.get_zorder() - 0.1,
            )
    _mark(ax, marks, mark_legend)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    labels = ax.get_legend_handles_labels()[1]
    if labels:
        ax.legend(fontsize="small", ncol=1 + len(labels) // 8)
    if any(hasattr(x, "year") for xs, _ in series.values() for x in xs[:1]):  # datetimes on the x axis
        fig.autofmt_xdate()
    return png(fig)


def stacked_bars(
    labels: Sequence[str], stacks: Mapping[str, Sequence[float]], title: str, xlabel: str, ylabel: str
) -> bytes:
    """One bar per label, its parts (``stacks``: part name -> one value per label) stacked in order, with a legend
    of the parts that are not zero everywhere."""
    fig, ax = figure()
    bottom = [0.0] * len(labels)
    for name, values in stacks.items():
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize="small", ncol=3)
    if len(labels) > 8:
        fig.autofmt_xdate()
    return png(fig)


def _mark(ax: Any, marks: Sequence[Mark], legend: str) -> None:
    """The marks as dashed vertical lines, one legend entry for all, labelled unless there are too many."""
    for i, (x, label) in enumerate(marks):
        ax.axvline(x, color=MARK_COLOUR, linestyle="--", linewidth=1.5, label=None if i else legend or None)
        if len(marks) <= MAX_MARK_LABELS:
            ax.annotate(
                label,
                (x, 1),
                xycoords=ax.get_xaxis_transform(),
                xytext=(-2, -3),
                textcoords="offset points",
                rotation=90,
                ha="right",
                va="top",
                fontsize="x-small",
                color=MARK_COLOUR,
            )
