"""Curves over a swept parameter and the published-results panels.

* `sweep_plot(ax, table, key, metric)`: one line per design over a swept parameter.
* `log_axis(ax, which)`: a log scale labelled in plain numbers.
* `published_plot(axes, rows, trends)`: the published-results notebook's three panels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..analysis import series
from ..client.harness import CHAINED
from .style import DESIGN_COLORS, DESIGN_MARKERS


def sweep_plot(
    ax: Any,
    table: Sequence[Mapping[str, Any]],
    key: str,
    metric: str = "e2e_mean_s",
    *,
    designs: Sequence[str] | None = None,
    logx: bool = False,
    logy: bool = False,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    linestyle: str = "-",
    label_suffix: str = "",
) -> None:
    """One line per design of `metric` against the swept `key` (DESIGN_COLORS, DESIGN_MARKERS); where the table has
    the metric's 95% interval (`<metric>_low`, `<metric>_high`), a whisker at each point spans it."""
    designs = designs or list(dict.fromkeys(r["design"] for r in table))
    for design in designs:
        xs, ys = series(table, key, metric, design)
        if not xs:
            continue
        ax.plot(xs, ys, marker=DESIGN_MARKERS.get(design, "o"), color=DESIGN_COLORS.get(design), linestyle=linestyle,
                label=design + label_suffix, markersize=4)
        if all(f"{metric}_low" in r for r in table):
            _, lows = series(table, key, f"{metric}_low", design)
            _, highs = series(table, key, f"{metric}_high", design)
            if any(low == low for low in lows):
                ax.errorbar(xs, ys, yerr=[[max(y - lo, 0.0) if lo == lo else 0.0 for y, lo in zip(ys, lows)],
                                          [max(hi - y, 0.0) if hi == hi else 0.0 for y, hi in zip(ys, highs)]],
                            fmt="none", ecolor=DESIGN_COLORS.get(design), capsize=2, lw=0.8)
    if logx:
        log_axis(ax, "x")
    if logy:
        log_axis(ax, "y")
    ax.set_xlabel(xlabel or key)
    ax.set_ylabel(ylabel or metric)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def log_axis(ax: Any, which: str = "x") -> None:
    """Put axis `which` ("x" or "y") of `ax` on a log scale labelled in plain numbers (1, 2, 5, 10,
    20, ...) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def published_plot(axes: Sequence[Any], rows: Sequence[Mapping[str, Any]], trends: Sequence[Mapping[str, Any]],
                   *, agreement_factor: float = 2.0) -> None:
    """Three panels: published vs measured gain per row; implied vs testbed ms per turn, with the
    calibration row's implied value and its agreement band; the chained-over-http gain by decode
    speed (the out-of-sample direction check). The calibration row is hatched."""
    import textwrap

    from matplotlib.patches import Patch

    left, middle, right = axes
    names = [textwrap.shorten(f"{i}: {r['result']}", 80) for i, r in enumerate(rows)]
    names = ["\n".join(textwrap.wrap(n, 36)) for n in names]
    ys = np.arange(len(rows))[::-1]
    h = 0.38
    grey, blue = "#999999", DESIGN_COLORS[CHAINED]
    calibration_patch = Patch(facecolor="white", edgecolor="black", hatch="//", label="calibration row")

    def bars(ax: Any, columns: Sequence[str], scale: float) -> None:
        for j, (column, colour) in enumerate(zip(columns, (grey, blue), strict=True)):
            drawn = ax.barh(ys + (h / 2 if j == 0 else -h / 2), [scale * r[column] for r in rows], h, color=colour,
                            zorder=2)
            for bar, r in zip(drawn, rows, strict=True):
                if r["role"] == "calibration":
                    bar.set_hatch("//")
                    bar.set_edgecolor("black")

    bars(left, ("published_gain", "measured_gain"), 100)
    # The measured gain's 95% interval over the tasks (a row of one task has none).
    measured = [(100 * r["measured_gain"], 100 * r.get("gain_low", np.nan), 100 * r.get("gain_high", np.nan)) for r in rows]
    left.errorbar([m for m, _, _ in measured], ys - h / 2,
                  xerr=[[max(m - lo, 0.0) if lo == lo else 0.0 for m, lo, _ in measured],
                        [max(hi - m, 0.0) if hi == hi else 0.0 for m, _, hi in measured]],
                  fmt="none", ecolor="black", capsize=2, lw=0.8, zorder=3)
    left.set_yticks(ys, names, fontsize=7)
    left.set_xlabel("gain, % (1 - design / baseline)")
    left.set_title("Published vs testbed gain", fontsize=9)
    from matplotlib.lines import Line2D

    left.legend(handles=[Patch(color=grey, label="published"), Patch(color=blue, label="testbed"), calibration_patch,
                         Line2D([], [], color="black", lw=0.8, label="testbed's 95% interval (tasks)")],
                fontsize=7, loc="upper right")
    left.grid(True, axis="x", alpha=0.3, zorder=0)

    bars(middle, ("implied_ms_per_turn", "testbed_ms_per_turn"), 1)
    handles = [Patch(color=grey, label="implied by the published gain"),
               Patch(color=blue, label="removed in the testbed")]
    calibration = next((r for r in rows if r["role"] == "calibration"), None)
    if calibration is not None:
        c = calibration["implied_ms_per_turn"]
        middle.axvspan(c / agreement_factor, c * agreement_factor, color="#2ca02c", alpha=0.15, zorder=0)
        middle.axvline(c, color="#2ca02c", linewidth=1, zorder=1)
        handles.append(Patch(color="#2ca02c", alpha=0.3,
                             label=f"calibration's implied value, x/÷{agreement_factor:g}"))
    log_axis(middle, "x")
    middle.set_yticks(ys, [str(i) for i in range(len(rows))])
    middle.set_xlabel("ms per turn (per first token for TTFT rows)")
    middle.set_title("Overhead the published gain implies", fontsize=9)
    middle.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    middle.grid(True, axis="x", which="major", alpha=0.3, zorder=0)

    xs = [t["tok_s"] for t in trends]
    gains = [100 * t["gain_chained_vs_http"] for t in trends]
    right.plot(xs, gains, marker="s", color=blue)
    if trends and "gain_low" in trends[0]:  # each speed's 95% interval over the tasks
        right.errorbar(xs, gains, yerr=[[max(g - 100 * t["gain_low"], 0.0) for g, t in zip(gains, trends)],
                                        [max(100 * t["gain_high"] - g, 0.0) for g, t in zip(gains, trends)]],
                       fmt="none", ecolor="black", capsize=3, lw=0.8)
    log_axis(right, "x")
    right.set_xlabel("decode speed (tokens/s)")
    right.set_ylabel("chained vs http gain, %")
    right.set_ylim(bottom=0)
    right.set_title("Direction check: gain by decode speed", fontsize=9)
    right.grid(True, which="major", alpha=0.3)
