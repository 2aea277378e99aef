"""`tornado_figure(panels, path)`: `experiments.sensitivity`'s tornados, one per conclusion: how far each
assumed parameter moves it from its low to its high end."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np


@attrs.frozen
class TornadoPanel:
    """One conclusion's tornado: its value with every parameter at its default, and each parameter's
    (name, value at the parameter's low end, value at its high end), the others at their defaults. With
    `intervals` (per bar, the low end's and the high end's (low, high)) and `default_interval`, each end carries
    its 95% interval."""

    title: str
    default: float
    bars: tuple[tuple[str, float, float], ...]
    default_interval: tuple[float, float] | None = None
    intervals: tuple[tuple[tuple[float, float], tuple[float, float]], ...] = ()


TORNADO_LOW, TORNADO_HIGH = "#4393c3", "#d6604d"  # a parameter at its low end, at its high end

# How the marks look: sizes, widths and greys, left to the reader's eye (the tests read what is drawn and where).
BAR_STYLE = {"height": 0.7}
WHISKER_STYLE = {"ecolor": "black", "capsize": 2, "lw": 0.8}
BAND_STYLE = {"color": "#999999", "alpha": 0.25, "lw": 0}
DEFAULT_LINE_STYLE = {"color": "black", "lw": 0.8}
LABEL_STYLE = {"fontsize": 7}
TITLE_STYLE = {"fontsize": 8}
GRID_STYLE = {"alpha": 0.3}
LEGEND_STYLE = {"loc": "upper right", "fontsize": 8}
SUPTITLE_STYLE = {"x": 0.02, "ha": "left", "fontsize": 10}


def tornado(ax: Any, panel: TornadoPanel, *, top: int = 6) -> None:
    """Horizontal bars from the default to each parameter's low-end (blue) and high-end (red) value, the
    widest span on top; parameters that move nothing are left out, and at most `top` are drawn. Where the panel
    has intervals, a black whisker at each end spans its interval and a grey band the default's."""
    kept = [(b, panel.intervals[i] if panel.intervals else None) for i, b in enumerate(panel.bars)
            if b[1] != panel.default or b[2] != panel.default]
    kept = sorted(kept, key=lambda k: -abs(k[0][2] - k[0][1]))[:top]
    y = np.arange(len(kept))
    for yi, ((_, low, high), ends) in zip(y, kept):
        ax.barh(yi, low - panel.default, left=panel.default, color=TORNADO_LOW, **BAR_STYLE)
        ax.barh(yi, high - panel.default, left=panel.default, color=TORNADO_HIGH, **BAR_STYLE)
        if ends is not None:
            for value, (lo, hi) in ((low, ends[0]), (high, ends[1])):
                ax.errorbar([value], [yi], xerr=[[max(value - lo, 0.0)], [max(hi - value, 0.0)]], fmt="none",
                            **WHISKER_STYLE)
    if panel.default_interval is not None:
        ax.axvspan(*panel.default_interval, **BAND_STYLE)
    ax.axvline(panel.default, **DEFAULT_LINE_STYLE)
    ax.set_yticks(y, [k[0][0] for k in kept], **LABEL_STYLE)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=LABEL_STYLE["fontsize"])
    ax.set_title(panel.title, **TITLE_STYLE)
    ax.grid(axis="x", **GRID_STYLE)
    if not kept:
        ax.text(0.5, 0.5, "no parameter moves it", transform=ax.transAxes, ha="center", va="center", **LABEL_STYLE)


def tornado_figure(panels: Sequence[TornadoPanel], path: str | Path, *, title: str = "", columns: int = 3) -> Path:
    """One tornado per conclusion (`experiments.sensitivity`), `columns` to a row. Writes `path` (PNG
    or SVG by its suffix) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 2.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        tornado(ax, panel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.legend(handles=[Patch(color=TORNADO_LOW, label="parameter at its low end"),
                        Patch(color=TORNADO_HIGH, label="parameter at its high end")],
               ncols=2, **LEGEND_STYLE)
    fig.suptitle(title, **SUPTITLE_STYLE)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90 if path.suffix == ".png" else None)
    plt.close(fig)
    return path
