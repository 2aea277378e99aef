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

from prototype import benchmark, figures  # noqa: E402
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


def group_of(rows, design, tps):
    return [r for r in rows if r["design"] == design and r["decode_tps"] == tps]


def test_compares_bars_are_the_tables_statistics_with_their_intervals_and_every_task_a_dot(tmp_path, drawn):
    figs, saved = drawn
    rows = rows_of_three_designs()
    figures.compare_figure([{"tasks": 3}], rows, tmp_path / "c.png")
    (fig,) = figs
    e2e_ax, ttft_ax, bytes_ax, api_ax, turn_ax = fig.axes
    # Three designs, two speeds: bars 0.8 / 3 wide, http on the left, suspended on the right of each speed.
    w = 0.8 / 3
    for ax in (e2e_ax, ttft_ax, bytes_ax):
        assert [(round(p.get_x(), 6), round(p.get_width(), 6), to_hex(p.get_facecolor())) for p in ax.patches] == [
            (round(-0.4 + w * i + s, 6), round(w, 6), colour) for i, colour in enumerate((RED, BLUE, GREEN)) for s in (0, 1)]
    xs = [round(-0.4 + w * (i + 0.5) + s, 6) for i in range(3) for s in (0, 1)]
    points = [("http", 65), (CHAINED, 65), (CHAINED, 1000), (SUSPENDED, 1000)]
    estimates = {p: benchmark.estimates(group_of(rows, *p), None) for p in points}
    # End to end: the mean per task (the statistic of the table's "vs http"); time to first token: the median turn.
    assert nan_free(p.get_height() for p in e2e_ax.patches) == [20.0, None, 5.0, round(1016 / 9, 6), None, 3.0]
    assert nan_free(p.get_height() for p in ttft_ax.patches) == [200.0, None, 200.0, 50.0, None, 50.0]
    # Each bar's black error bar runs over its 95% interval (a single task has none: no bar drawn above or below it).
    for ax, name in ((e2e_ax, "e2e_mean_s"), (ttft_ax, "ttft_p50_ms")):
        drawn_bars = {seg[0][0]: (seg[0][1], seg[1][1]) for segments, colours, _, _ in whiskers(ax) for seg in segments}
        assert all(c == [BLACK] for _, c, _, _ in whiskers(ax))
        for (design, tps), x in zip(points, (xs[0], xs[2], xs[3], xs[5])):
            e = estimates[(design, tps)][name]
            low, high = (e.low, e.high) if e.has_interval else (e.value, e.value)
            assert drawn_bars[x] == pytest.approx((low, high)), (name, design, tps)
    http = estimates[("http", 65)]["e2e_mean_s"]
    assert 10.0 <= http.low < 20.0 < http.high <= 30.0
    # Every task a small translucent black dot; the 1000 s task, beyond the top (1.15 x the highest interval's end),
    # a triangle on the top edge drawn whole (not clipped), with its value 4 points above it.
    top = 1.15 * max(e[name].high if e[name].has_interval else e[name].value for e in estimates.values() for name in ["e2e_mean_s"])
    assert e2e_ax.get_ylim() == pytest.approx((0.0, top))
    dot = (0.0, 0.0, 0.0, 0.35)
    scattered = dots(e2e_ax)
    assert [points for points, *_ in scattered if _[1] == dot] == [
        [(xs[0], 10.0), (xs[0], 20.0), (xs[0], 30.0)], [], [(xs[2], 5.0)], [(xs[3], 2.0)] * 8, [], [(xs[5], 3.0)]]
    [triangle] = [entry for entry in scattered if entry[2] != dot]
    assert triangle[0] == [(xs[3], round(top, 6))] and triangle[5] is False
    assert labels(e2e_ax) == [("1000", (xs[3], round(top, 6)), (0, 4), 6.0, "center", "baseline")]
    # Bytes per turn in kB on each bar.
    assert nan_free(p.get_height() for p in bytes_ax.patches) == [2.0, 0.0, 0.5, 0.5, 0.0, 0.12]
    assert [t for t, *_ in labels(bytes_ax)] == ["2", "0", "0", "0", "0", "0"]
    assert saved == [(tmp_path / "c.png", 90, "tight")]


def test_compares_bars_take_the_tables_estimates_when_it_has_them(tmp_path, drawn):
    figs, _ = drawn
    rows = [task_row("http", 65, e) for e in (10.0, 20.0, 30.0)]
    table = [{"design": "http", "decode_tps": 65, "tasks": 3, "e2e_mean_s": 21.0, "e2e_mean_s_low": 12.0, "e2e_mean_s_high": 27.0,
              "ttft_p50_ms": 90.0, "ttft_p50_ms_low": 80.0, "ttft_p50_ms_high": 150.0}]
    figures.compare_figure(table, rows, tmp_path / "c.svg")
    e2e_ax, ttft_ax = figs[0].axes[:2]
    assert [p.get_height() for p in e2e_ax.patches] == [21.0] and [p.get_height() for p in ttft_ax.patches] == [90.0]
    assert whiskers(e2e_ax)[0][0] == [((0.0, 12.0), (0.0, 27.0))] and whiskers(ttft_ax)[0][0] == [((0.0, 80.0), (0.0, 150.0))]


def test_compares_api_stages_stack_in_their_order_each_with_a_hatch_of_its_own(tmp_path, drawn):
    figs, _ = drawn
    figures.compare_figure([{"tasks": 3}], rows_of_three_designs(), tmp_path / "c.svg")
    (fig,) = figs
    api_ax = fig.axes[3]
    w = 0.8 / 3
    hatches = figures.PHASE_HATCHES
    assert len(set(hatches.values())) == len(figures.API_PHASES)  # no two stages look alike
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
                expected.append((round(-0.4 + w * i + s, 6), round(bottoms[s], 6), round(w, 6), round(values[k], 6), colour,
                                 hatches[phase], figures.HATCH_COLOR))
            bottoms = [bottoms[0] + at65[k], bottoms[1] + at1000[k]]
    assert [(round(p.get_x(), 6), round(p.get_y(), 6), round(p.get_width(), 6), round(p.get_height(), 6),
             to_hex(p.get_facecolor()), p.get_hatch(), to_hex(p.get_hatchcolor())) for p in api_ax.patches] == expected
    # The total on top of each stack.
    totals = [8.25, 0.0, 1.0, 8.25, 0.0, 2.0]
    centres = [round(-0.4 + w * (i + 0.5) + s, 6) for i in range(3) for s in (0, 1)]
    assert [(t, xy) for t, xy, *_ in labels(api_ax)] == [(f"{t:.0f}", (x, round(t, 6))) for x, t in zip(centres, totals)]
    # The legend shows each stage's hatch as drawn, dark lines on white.
    texts, swatches, *_ = legend(api_ax.get_legend())
    assert (texts, swatches) == (list(figures.API_PHASES), [(WHITE, figures.HATCH_COLOR, hatches[p]) for p in figures.API_PHASES])
    assert api_ax.get_ylim() == pytest.approx((0.0, 8.25 * 1.05 * 1.2))  # room above the stacks for the legend


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
            expected.append((round(lefts[design], 6), round(y - 0.3, 6), round(parts[design][k], 6), 0.6, colour,
                             figures.PART_HATCHES[part]))
            lefts[design] += parts[design][k]
    assert [(round(p.get_x(), 6), round(p.get_y(), 6), round(p.get_width(), 6), round(p.get_height(), 6),
             to_hex(p.get_facecolor()), p.get_hatch()) for p in turn_ax.patches] == expected
    assert len(set(figures.PART_HATCHES.values())) == len(figures.TURN_PARTS)
    assert [(t, xy) for t, xy, *_ in labels(turn_ax)] == [(" 0.00 s", (0.0, 0.0)), (" 0.66 s", (0.65825, 1.0)),
                                                          (" 0.85 s", (0.852, 2.0))]
    assert [t.get_text() for t in turn_ax.get_yticklabels()] == ["http", CHAINED, SUSPENDED] and turn_ax.yaxis_inverted()
    assert turn_ax.get_xlim() == pytest.approx((0.0, 0.852 * 1.3))
    texts, swatches, *_ = legend(turn_ax.get_legend())
    assert (texts, swatches) == (list(figures.TURN_PARTS), [(WHITE, figures.HATCH_COLOR, figures.PART_HATCHES[p]) for p in figures.TURN_PARTS])


def test_compares_panels_do_not_overlap_and_a_caption_explains_every_mark(tmp_path, drawn):
    figs, _ = drawn
    figures.compare_figure([{"tasks": 3}], rows_of_three_designs(), tmp_path / "c.svg")
    (fig,) = figs
    e2e_ax, ttft_ax, bytes_ax, api_ax, turn_ax = fig.axes
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    # The turn panel's design names (the longest, "suspended") stay clear of the API panel on their left.
    names = [t.get_window_extent(renderer) for t in turn_ax.get_yticklabels()]
    assert min(box.x0 for box in names) > api_ax.get_window_extent(renderer).x1
    for left, right in ((e2e_ax, ttft_ax), (ttft_ax, bytes_ax)):
        assert left.get_tightbbox(renderer).x1 < right.get_tightbbox(renderer).x0
    # The caption sits under every panel and names each kind of mark the panels draw.
    (caption,) = [t for t in fig.texts if t is not fig._suptitle]
    assert caption.get_window_extent(renderer).y1 < min(a.get_tightbbox(renderer).y0 for a in fig.axes)
    for mark in ("mean per task", "median turn", "95% interval", "Dots", "▲", "hatch"):
        assert mark in caption.get_text().replace("\n", " ")
    lg = fig.legends[0]
    assert ([t.get_text() for t in lg.get_texts()], [to_hex(h.get_facecolor()) for h in lg.legend_handles]) == (
        ["http", CHAINED, SUSPENDED], [RED, BLUE, GREEN])


def test_compares_scale_keeps_a_task_exactly_at_its_top_as_a_dot(tmp_path, drawn):
    figs, _ = drawn
    # Ten 10 s http tasks: an exact mean, so the scale stops at 11.5 s; a task of exactly 11.5 s elsewhere is a dot.
    rows = [task_row("http", 65, 10.0)] * 10 + [task_row(CHAINED, 65, e) for e in [1.0] * 9 + [11.5]]
    figures.compare_figure([], rows, tmp_path / "c.svg")
    (fig,) = figs
    e2e_ax = fig.axes[0]
    assert e2e_ax.get_ylim()[1] == pytest.approx(11.5)
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
