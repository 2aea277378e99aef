"""compare's figure and the sensitivity tornados held to every mark a reader sees (prototype/figures.py): each bar's
colour, edge and hatch, the p90 whiskers and their caps, every task's dot and the triangle of a task beyond the scale,
the labels on the bars and where they sit, the legends (entries, swatches, place, columns), the grid, the panels'
layout, and the type sizes, on small made-up rows with the Agg backend. No pixel is compared; `savefig` is a stand-in
(drawing a whole figure takes seconds)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex, to_rgba  # noqa: E402

from prototype import figures  # noqa: E402
from prototype.client.harness import CHAINED, SUSPENDED  # noqa: E402
from tests.test_mutants_figures import PANEL, task_row  # noqa: E402

RED, BLUE, GREEN = figures.DESIGN_COLORS["http"], figures.DESIGN_COLORS[CHAINED], figures.DESIGN_COLORS[SUSPENDED]
BLACK, WHITE, SWATCH = "#000000", "#ffffff", "#bbbbbb"


@pytest.fixture
def drawn(monkeypatch):
    """The figures drawn, kept open for the test to read, and how each was saved: (figures, [(path, dpi, bbox)])."""
    closed, close, calls = [], plt.close, []
    monkeypatch.setattr(plt, "close", closed.append)

    def savefig(fig, path, dpi=None, bbox_inches=None):
        calls.append((path, dpi, bbox_inches))
        path.write_text(path.name)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    yield closed, calls
    for fig in closed:
        close(fig)


def nan_free(values, digits=6):
    return [None if np.isnan(v) else round(float(v), digits) for v in values]


def whiskers(ax):
    """Each errorbar's vertical segments ((x, y0), (x, y1)), colour and width, per design."""
    out = []
    for container in ax.containers:
        if type(container).__name__ != "ErrorbarContainer":
            continue
        _, caps, (segments,) = container.lines
        out.append(([tuple(tuple(round(float(v), 6) for v in point) for point in seg) for seg in segments.get_segments() if len(seg)],
                    [to_hex(c) for c in segments.get_color()], [float(v) for v in segments.get_linewidth()],
                    [(cap.get_marker(), cap.get_markersize(), nan_free(cap.get_ydata()), to_hex(cap.get_markeredgecolor()))
                     for cap in caps]))
    return out


def dots(ax):
    """Each scatter: (points, sizes, face colour with alpha, line widths, zorder, clipped)."""
    return [([tuple(round(float(v), 6) for v in p) for p in c.get_offsets()], list(c.get_sizes()),
             tuple(round(v, 6) for v in c.get_facecolor()[0]) if len(c.get_facecolor()) else None, list(c.get_linewidths()),
             c.get_zorder(), c.get_clip_on()) for c in ax.collections if type(c).__name__ == "PathCollection"]


def labels(ax):
    """Each text on the axes: (text, anchor, offset in points or None, size, horizontal, vertical alignment)."""
    return [(t.get_text(), tuple(round(float(v), 6) for v in getattr(t, "xy", t.get_position())),
             tuple(t.xyann) if hasattr(t, "xyann") else None, t.get_fontsize(), t.get_horizontalalignment(),
             t.get_verticalalignment()) for t in ax.texts]


def legend(leg):
    return ([t.get_text() for t in leg.get_texts()], [(to_hex(h.get_facecolor()), to_hex(h.get_edgecolor()), h.get_hatch())
                                                      for h in leg.legend_handles],
            leg._loc, leg._ncols, leg.get_texts()[0].get_fontsize())


def grid(axis):
    kw = axis._major_tick_kw
    return kw.get("gridOn", False), kw.get("grid_alpha")


API = {"validate": 0.002, "safety": 0.001, "render": 0.004, "route": 0.003, "store_read": 0.0005, "post": 0.006,
       "tool": 1.0, "prefill": 0.2, "network_client": 0.1}


def rows_of_three_designs():
    """http at 65 tok/s (three tasks), chained at 65 and 1000 (one beyond the scale), suspended at 1000 only."""
    rows = [task_row("http", 65, e, ttft=(0.1, 0.3), sent=2000.0, phases=API) for e in (10.0, 20.0, 30.0)]
    rows += [task_row(CHAINED, 65, 5.0, ttft=(0.2,), sent=500.0, turns=4, phases={"validate": 0.004, "tool": 2.0})]
    rows += [task_row(CHAINED, 1000, 1000.0, ttft=(0.05,), sent=500.0, phases=API)]
    rows += [task_row(CHAINED, 1000, 2.0, ttft=(0.05,), sent=500.0, phases=API)] * 8
    rows += [task_row(SUSPENDED, 1000, 3.0, ttft=(0.04, 0.06), sent=120.0, turns=1,
                      phases={"post": 0.002, "decode": 0.5, "queue": 0.1, "hosted_tool": 0.2, "network_client": 0.05})]
    return rows


def test_compares_bars_whiskers_and_dots_are_each_designs_colour_and_black(tmp_path, drawn):
    figs, saved = drawn
    figures.compare_figure([{"tasks": 3}], rows_of_three_designs(), tmp_path / "c.png")
    (fig,) = figs
    e2e_ax, ttft_ax, bytes_ax, api_ax, turn_ax = fig.axes
    # Three designs, two speeds: bars 0.8 / 3 wide, http on the left, suspended on the right of each speed.
    w = 0.8 / 3
    for ax in (e2e_ax, ttft_ax, bytes_ax):
        assert [(round(p.get_x(), 6), round(p.get_width(), 6), to_hex(p.get_facecolor())) for p in ax.patches] == [
            (round(-0.4 + w * i + s, 6), round(w, 6), colour) for i, colour in enumerate((RED, BLUE, GREEN)) for s in (0, 1)]
    xs = [round(-0.4 + w * (i + 0.5) + s, 6) for i in range(3) for s in (0, 1)]
    assert nan_free(p.get_height() for p in e2e_ax.patches) == [20.0, None, 5.0, 2.0, None, 3.0]
    # p50 to p90 whiskers in black, 1 pt, capped at both ends; a group with no task draws nothing.
    top = 1.3 * np.percentile([1000.0] + [2.0] * 8, 90)
    assert whiskers(e2e_ax) == [
        ([((xs[0], 20.0), (xs[0], 28.0))], [BLACK], [1.0], [("_", 6.0, [20.0, None], BLACK), ("_", 6.0, [28.0, None], BLACK)]),
        ([((xs[2], 5.0), (xs[2], 5.0)), ((xs[3], 2.0), (xs[3], round(np.percentile([1000.0] + [2.0] * 8, 90), 6)))], [BLACK],
         [1.0], [("_", 6.0, [5.0, 2.0], BLACK), ("_", 6.0, [5.0, round(np.percentile([1000.0] + [2.0] * 8, 90), 6)], BLACK)]),
        ([((xs[5], 3.0), (xs[5], 3.0))], [BLACK], [1.0], [("_", 6.0, [None, 3.0], BLACK), ("_", 6.0, [None, 3.0], BLACK)])]
    assert whiskers(ttft_ax) == [
        ([((xs[0], 200.0), (xs[0], 300.0))], [BLACK], [1.0], [("_", 6.0, [200.0, None], BLACK), ("_", 6.0, [300.0, None], BLACK)]),
        ([((xs[2], 200.0), (xs[2], 200.0)), ((xs[3], 50.0), (xs[3], 50.0))], [BLACK], [1.0],
         [("_", 6.0, [200.0, 50.0], BLACK), ("_", 6.0, [200.0, 50.0], BLACK)]),
        ([((xs[5], 50.0), (xs[5], 58.0))], [BLACK], [1.0], [("_", 6.0, [None, 50.0], BLACK), ("_", 6.0, [None, 58.0], BLACK)])]
    assert nan_free(p.get_height() for p in ttft_ax.patches) == [200.0, None, 200.0, 50.0, None, 50.0]
    # Whiskers only: no line joins a design's p50s across speeds.
    for ax in (e2e_ax, ttft_ax):
        assert [c.lines[0] for c in ax.containers if type(c).__name__ == "ErrorbarContainer"] == [None, None, None]
    # Every task a small translucent black dot above the bars; the task beyond the scale a triangle on the top edge,
    # drawn whole (not clipped), with its value 4 points above it.
    dot = (0.0, 0.0, 0.0, 0.35)
    assert dots(e2e_ax) == [
        ([(xs[0], 10.0), (xs[0], 20.0), (xs[0], 30.0)], [6.0], dot, [0.0], 3, True), ([], [6.0], dot, [0.0], 3, True),
        ([(xs[2], 5.0)], [6.0], dot, [0.0], 3, True), ([(xs[3], 2.0)] * 8, [6.0], dot, [0.0], 3, True),
        ([(xs[3], round(top, 6))], [18.0], (0.0, 0.0, 0.0, 1.0), [1.0], 3, False),
        ([], [6.0], dot, [0.0], 3, True), ([(xs[5], 3.0)], [6.0], dot, [0.0], 3, True)]
    assert [c.get_paths()[0].vertices.shape for c in e2e_ax.collections if type(c).__name__ == "PathCollection"][4] == (4, 2)
    assert labels(e2e_ax) == [("1000", (xs[3], round(top, 6)), (0, 4), 6.0, "center", "baseline")]
    assert e2e_ax.texts[0].anncoords == "offset points"
    assert e2e_ax.get_ylim() == pytest.approx((0.0, top))
    # Bytes per turn in kB on each bar, 1 point above it, in 7 pt.
    assert nan_free(p.get_height() for p in bytes_ax.patches) == [2.0, 0.0, 0.5, 0.5, 0.0, 0.12]
    assert [(t, o, size) for t, _, o, size, _, _ in labels(bytes_ax)] == [
        ("2", (0, 1), 7.0), ("0", (0, 1), 7.0), ("0", (0, 1), 7.0), ("0", (0, 1), 7.0), ("0", (0, 1), 7.0), ("0", (0, 1), 7.0)]
    for ax in (e2e_ax, ttft_ax, bytes_ax, api_ax):
        assert grid(ax.yaxis) == (True, 0.3) and not grid(ax.xaxis)[0]
    assert saved == [(tmp_path / "c.png", 90, "tight")]


def test_compares_api_stages_stack_in_their_order_with_the_total_on_top(tmp_path, drawn):
    figs, _ = drawn
    figures.compare_figure([{"tasks": 3}], rows_of_three_designs(), tmp_path / "c.svg")
    (fig,) = figs
    api_ax = fig.axes[3]
    w = 0.8 / 3
    hatches = figures.PHASE_HATCHES
    # ms per turn: http 2-turn tasks (validate 1, safety 0.5, render 2, route 1.5, store_read 0.25, post 3);
    # chained at 65 one 4-turn task (validate 1), at 1000 as http; suspended at 1000 one turn (post 2).
    per_turn = {"http": [1.0, 0.5, 2.0, 1.5, 0.25, 3.0], CHAINED: [1.0, 0, 0, 0, 0, 0], "same": [1.0, 0.5, 2.0, 1.5, 0.25, 3.0],
                SUSPENDED: [0, 0, 0, 0, 0, 2.0]}
    expected = []
    for i, (_design, colour, (at65, at1000)) in enumerate([
            ("http", RED, (per_turn["http"], [0.0] * 6)), (CHAINED, BLUE, (per_turn[CHAINED], per_turn["same"])),
            (SUSPENDED, GREEN, ([0.0] * 6, per_turn[SUSPENDED]))]):
        bottoms = [0.0, 0.0]
        for k, phase in enumerate(figures.API_PHASES):
            for s, values in enumerate((at65, at1000)):
                expected.append((round(-0.4 + w * i + s, 6), round(bottoms[s], 6), round(w, 6), round(values[k], 6), colour, WHITE,
                                 hatches[phase], 0.5))
            bottoms = [bottoms[0] + at65[k], bottoms[1] + at1000[k]]
    assert [(round(p.get_x(), 6), round(p.get_y(), 6), round(p.get_width(), 6), round(p.get_height(), 6),
             to_hex(p.get_facecolor()), to_hex(p.get_edgecolor()), p.get_hatch(), p.get_linewidth()) for p in api_ax.patches] == expected
    # The total on top of each stack, at its centre, 1 point above, in 7 pt.
    totals = [8.25, 0.0, 1.0, 8.25, 0.0, 2.0]
    centres = [round(-0.4 + w * (i + 0.5) + s, 6) for i in range(3) for s in (0, 1)]
    assert labels(api_ax) == [(f"{t:.0f}", (x, round(t, 6)), (0, 1), 7.0, "center", "bottom") for x, t in zip(centres, totals)]
    assert legend(api_ax.get_legend()) == (list(figures.API_PHASES), [(SWATCH, WHITE, hatches[p]) for p in figures.API_PHASES],
                                           1, len(figures.API_PHASES), 8.0)
    # Room above the stacks for the legend: the autoscaled top (5% over the highest, 8.25) raised by a fifth.
    assert api_ax.get_ylim() == pytest.approx((0.0, 8.25 * 1.05 * 1.2))


def test_compares_turn_panel_splits_a_turn_at_the_middle_speed(tmp_path, drawn):
    figs, _ = drawn
    rows = rows_of_three_designs() + [task_row(SUSPENDED, 8000, 1.0, phases={"tool": 9.0})]
    figures.compare_figure([{"tasks": 3}], rows, tmp_path / "c.svg")
    (fig,) = figs
    turn_ax = fig.axes[4]
    assert turn_ax.get_title() == "A turn's time at 1000 tok/s"
    # Seconds per turn at 1000 tok/s: http has no task there; chained 2-turn tasks (tool 0.5, model 0.1, API 0.00825,
    # network 0.05); suspended one turn (model 0.8, API 0.002, network 0.05).
    parts = {"http": [0, 0, 0, 0], CHAINED: [0.5, 0.1, 0.00825, 0.05], SUSPENDED: [0, 0.8, 0.002, 0.05]}
    expected = []
    lefts = {d: 0.0 for d in parts}
    for k, part in enumerate(figures.TURN_PARTS):
        for y, (design, colour) in enumerate(zip(parts, (RED, BLUE, GREEN))):
            expected.append((round(lefts[design], 6), round(y - 0.3, 6), round(parts[design][k], 6), 0.6, colour, WHITE,
                             figures.PART_HATCHES[part], 0.5))
            lefts[design] += parts[design][k]
    assert [(round(p.get_x(), 6), round(p.get_y(), 6), round(p.get_width(), 6), round(p.get_height(), 6),
             to_hex(p.get_facecolor()), to_hex(p.get_edgecolor()), p.get_hatch(), p.get_linewidth()) for p in turn_ax.patches] == expected
    assert labels(turn_ax) == [(" 0.00 s", (0.0, 0.0), None, 8.0, "left", "center"),
                               (" 0.66 s", (0.65825, 1.0), None, 8.0, "left", "center"),
                               (" 0.85 s", (0.852, 2.0), None, 8.0, "left", "center")]
    assert [t.get_text() for t in turn_ax.get_yticklabels()] == ["http", CHAINED, SUSPENDED] and turn_ax.yaxis_inverted()
    assert turn_ax.get_xlim() == pytest.approx((0.0, 0.852 * 1.3))
    assert legend(turn_ax.get_legend()) == (list(figures.TURN_PARTS), [(SWATCH, WHITE, figures.PART_HATCHES[p]) for p in figures.TURN_PARTS],
                                            9, 2, 8.0)
    assert tuple(turn_ax.get_legend().get_bbox_to_anchor().transformed(turn_ax.transAxes.inverted()).p0) == pytest.approx((0.5, -0.14))
    assert grid(turn_ax.xaxis) == (True, 0.3) and not grid(turn_ax.yaxis)[0]


def test_compares_panels_titles_and_legend_are_laid_out_as_drawn(tmp_path, drawn):
    figs, _ = drawn
    figures.compare_figure([{"tasks": 3}], rows_of_three_designs(), tmp_path / "c.svg")
    (fig,) = figs
    e2e_ax, ttft_ax, bytes_ax, api_ax, turn_ax = fig.axes
    assert tuple(fig.get_size_inches()) == (14.0, 8.5)
    spec = e2e_ax.get_subplotspec().get_gridspec()
    assert (spec.nrows, spec.ncols, spec.hspace, spec.wspace) == (2, 3, 0.42, 0.28)
    assert [(a.get_subplotspec().rowspan, a.get_subplotspec().colspan) for a in fig.axes] == [
        (range(0, 1), range(0, 1)), (range(0, 1), range(1, 2)), (range(0, 1), range(2, 3)), (range(1, 2), range(0, 2)),
        (range(1, 2), range(2, 3))]
    assert [a.title.get_fontsize() for a in fig.axes] == [10.0] * 5
    # The end-to-end title sits 14 points above its panel (room for a triangle's value), the others at the default.
    assert e2e_ax.titleOffsetTrans.get_matrix()[1, 2] == pytest.approx(14 * fig.dpi / 72)
    assert ttft_ax.titleOffsetTrans.get_matrix()[1, 2] == pytest.approx(matplotlib.rcParams["axes.titlepad"] * fig.dpi / 72)
    lg = fig.legends[0]
    assert ([t.get_text() for t in lg.get_texts()], [to_hex(h.get_facecolor()) for h in lg.legend_handles]) == (
        ["http", CHAINED, SUSPENDED], [RED, BLUE, GREEN])
    assert (lg._loc, lg._ncols, lg.get_texts()[0].get_fontsize()) == (1, 3, 9.0)
    assert tuple(lg.get_bbox_to_anchor().transformed(fig.transFigure.inverted()).p0) == pytest.approx((0.98, 0.985))
    title = fig._suptitle
    assert (title.get_position()[0], title.get_horizontalalignment(), title.get_fontsize()) == (0.02, "left", 12.0)


def test_compares_scale_keeps_a_task_exactly_at_its_top_as_a_dot(tmp_path, drawn):
    figs, _ = drawn
    # p90 of ten 10 s tasks is 10, so the scale stops at 13 s; a task of exactly 13 s elsewhere is a dot, not a triangle.
    rows = [task_row("http", 65, 10.0)] * 10 + [task_row(CHAINED, 65, e) for e in [1.0] * 9 + [13.0]]
    figures.compare_figure([], rows, tmp_path / "c.svg")
    (fig,) = figs
    e2e_ax = fig.axes[0]
    assert e2e_ax.get_ylim()[1] == 13.0
    assert [len(c.get_offsets()) for c in e2e_ax.collections if type(c).__name__ == "PathCollection"] == [10, 10]
    assert list(e2e_ax.texts) == []
    # Without a table the n is the count of the first design's tasks at the first speed.
    assert fig._suptitle.get_text() == "compare: the 'coding' workload, n = 10 tasks per design and speed, virtual time"


def test_a_tornados_marks_and_type_sizes(tmp_path):
    fig, ax = plt.subplots()
    figures.tornado(ax, PANEL)
    (line,) = ax.lines
    assert (to_hex(line.get_color()), line.get_linewidth()) == (BLACK, 0.8)
    assert [t.get_fontsize() for t in ax.get_yticklabels()] == [7.0] * 3
    assert ax.xaxis._major_tick_kw["labelsize"] == 7
    assert ax.title.get_fontsize() == 8.0
    assert grid(ax.xaxis) == (True, 0.3) and not grid(ax.yaxis)[0]
    plt.close(fig)
    fig, still = plt.subplots()
    figures.tornado(still, figures.TornadoPanel("S", 1.0, (("flat", 1.0, 1.0),)))
    (note,) = still.texts
    assert (note.get_position(), note.get_transform() == still.transAxes) == ((0.5, 0.5), True)
    assert (note.get_horizontalalignment(), note.get_verticalalignment(), note.get_fontsize()) == ("center", "center", 7.0)
    plt.close(fig)


def test_a_tornado_figures_legend_title_and_margins(tmp_path, drawn):
    figs, _ = drawn
    figures.tornado_figure([PANEL] * 2, tmp_path / "t.svg")
    (fig,) = figs
    assert fig._suptitle.get_text() == ""
    lg = fig.legends[0]
    assert ([t.get_text() for t in lg.get_texts()], [to_hex(h.get_facecolor()) for h in lg.legend_handles]) == (
        ["parameter at its low end", "parameter at its high end"], [figures.TORNADO_LOW, figures.TORNADO_HIGH])
    assert (lg._loc, lg._ncols, lg.get_texts()[0].get_fontsize()) == (1, 2, 8.0)
    title = fig._suptitle
    assert (title.get_position()[0], title.get_horizontalalignment(), title.get_fontsize()) == (0.02, "left", 10.0)
    # tight_layout keeps the panels inside the figure and below the top 4% left for the title and legend.
    boxes = [a.get_position() for a in fig.axes]
    assert all(0 < b.x0 and b.x1 < 1 and 0 < b.y0 and b.y1 <= 0.96 for b in boxes)
    assert boxes[1].x1 < boxes[2].x0 and boxes[2].x1 > 0.9
    assert to_rgba(lg.legend_handles[0].get_facecolor()) == to_rgba(figures.TORNADO_LOW)


def test_a_tornado_draws_six_parameters_unless_told_otherwise():
    fig, ax = plt.subplots()
    bars = tuple((f"p{k}", 10.0 - k - 1, 10.0 + k + 1) for k in range(8))
    figures.tornado(ax, figures.TornadoPanel("T", 10.0, bars))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["p7", "p6", "p5", "p4", "p3", "p2"]
    plt.close(fig)


def test_a_tornado_figure_of_many_rows_leaves_the_top_to_its_title_and_legend(tmp_path, drawn):
    figs, _ = drawn
    path = figures.tornado_figure([PANEL] * 12, tmp_path / "a" / "b" / "t.svg", title="Twelve conclusions")
    assert path.read_text() == "t.svg"  # every missing folder made
    (fig,) = figs
    assert tuple(fig.get_size_inches()) == (15.0, 9.6)
    tops = [a.get_position().y1 for a in fig.axes]
    assert max(tops) <= 0.96 and min(a.get_position().y0 for a in fig.axes) > 0


def test_compares_figure_is_written_under_folders_that_do_not_exist_yet(tmp_path, drawn):
    path = figures.compare_figure([], [task_row(SUSPENDED, 65, 3.0)], tmp_path / "a" / "b" / "c.svg")
    assert path.read_text() == "c.svg"
