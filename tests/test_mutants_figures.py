"""The figures held to what a reader sees, on small made-up rollouts and rows (prototype/figures.py): the spans of a
timeline and where they are drawn, each bar's place, length, colour and hatch, each line's points, the titles, axis
labels, ticks and legends, and the files written. No pixel is compared."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from prototype import benchmark, figures, metrics  # noqa: E402
from prototype.analysis import NETWORK_CLIENT, PAUSE, PAUSE_STATE, TOOL  # noqa: E402
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord, TurnRecord  # noqa: E402


@pytest.fixture
def ax():
    fig, axes = plt.subplots()
    yield axes
    plt.close(fig)


def rollout(design=SUSPENDED, hosted=False):
    """Two turns from 10 s: the first with server spans from its own origin and a 0.5 s tool, the second with a span
    placed from its send time (no origin) and no end."""
    spans = [["validate", 0, 250], ["prefill", 250, 500], ["decode", 500, 500], ["post", 750, 500]]
    if hosted:
        spans.append([metrics.HOSTED_TOOL, 500, 750])
    turns = [
        TurnRecord(turn=0, sent_at=10.0, first_token_at=10.75, ended_at=11.0, tool_seconds=0.5,
                   server_timing={"origin_s": 10.5, "spans": spans}),
        TurnRecord(turn=1, sent_at=12.0, first_token_at=None, ended_at=None, server_timing={"spans": [["decode", 0, 500]]}),
    ]
    timeline = [(10.0, "send", "response.create"), (10.25, "recv", "response.created"), (11.0, "recv", "response.done"),
                (12.0, "send", "response.append"), (13.0, "recv", "response.completed")]
    return RolloutRecord(design, "w", 10.0, ended_at=13.0, turns=turns, timeline=timeline)


def test_the_spans_of_a_rollout_are_placed_from_its_start():
    assert figures.turn_spans(rollout()) == [
        {"lane": "client", "phase": NETWORK_CLIENT, "turn": 0, "start": 0.0, "end": 1.0},
        {"lane": "client", "phase": TOOL, "turn": 0, "start": 1.0, "end": 1.5},
        {"lane": "server", "phase": "validate", "turn": 0, "start": 0.5, "end": 0.75},
        {"lane": "server", "phase": "prefill", "turn": 0, "start": 0.75, "end": 1.0},
        {"lane": "server", "phase": PAUSE, "turn": 0, "start": 1.0, "end": 2.0},
        {"lane": "client", "phase": NETWORK_CLIENT, "turn": 1, "start": 2.0, "end": 2.0},
        {"lane": "server", "phase": "decode", "turn": 1, "start": 2.0, "end": 2.5},
    ]
    # Each pause ends when the next turn is sent.
    three = RolloutRecord("x", "w", 0.0, turns=[TurnRecord(turn=t, sent_at=3.0 * t, ended_at=3.0 * t + 1) for t in range(3)])
    assert [(s["turn"], s["start"], s["end"]) for s in figures.turn_spans(three) if s["phase"] == PAUSE] == [
        (0, 1.0, 3.0), (1, 4.0, 6.0)]
    bare = RolloutRecord("x", "w", 0.0, turns=[TurnRecord(turn=0, sent_at=1.0, ended_at=2.0)])
    assert figures.turn_spans(bare) == [{"lane": "client", "phase": NETWORK_CLIENT, "turn": 0, "start": 1.0, "end": 2.0}]


def boxes(ax):
    """Each broken_barh drawn: (x0, x1, y0, y1, face colour, edge colour or None, hatch)."""
    out = []
    for coll in ax.collections:
        (path,) = coll.get_paths()
        (x0, y0), (x1, y1) = path.vertices.min(axis=0), path.vertices.max(axis=0)
        edges = coll.get_edgecolor()
        out.append((round(x0, 6), round(x1, 6), round(y0, 6), round(y1, 6), to_hex(coll.get_facecolor()[0]),
                    to_hex(edges[0]) if len(edges) else None, coll.get_hatch()))
    return out


def marks(ax):
    return [(line.get_marker(), list(line.get_xdata()), [round(y, 6) for y in line.get_ydata()], line.get_markersize(),
             to_hex(line.get_color())) for line in ax.lines]


def test_a_timeline_draws_each_span_on_its_lane_with_its_colour(ax):
    figures.timeline(ax, [rollout(SUSPENDED), rollout(CHAINED)])
    colour = figures.PHASE_COLORS
    pause_suspended, pause_chained = PAUSE_STATE[SUSPENDED][2], PAUSE_STATE[CHAINED][2]

    def drawn(base, pause):
        c, s = base, base + 1.0
        return [(0.0, 1.0, c - 0.35, c + 0.35, colour[NETWORK_CLIENT], None, None),
                (1.0, 1.5, c - 0.35, c + 0.35, colour[TOOL], None, None),
                (0.5, 0.75, s - 0.35, s + 0.35, colour["validate"], None, None),
                (0.75, 1.0, s - 0.35, s + 0.35, colour["prefill"], None, None),
                (1.0, 2.0, s - 0.35, s + 0.35, "#ffffff", pause, "///"),
                (2.0, 2.0, c - 0.35, c + 0.35, colour[NETWORK_CLIENT], None, None),
                (2.0, 2.5, s - 0.35, s + 0.35, colour["decode"], None, None)]

    assert boxes(ax) == drawn(3.0, pause_suspended) + drawn(0.0, pause_chained)
    pauses = [c for c in ax.collections if c.get_hatch() == "///"]
    assert [c.get_linewidth()[0] for c in pauses] == [0.8, 0.8]
    ticks = [(m, x, y) for m, x, y, size, _ in marks(ax) if size == 4]
    dots = [(m, x, y) for m, x, y, size, _ in marks(ax) if size == 2.5]
    assert ticks == [("v", [0.0], [3.47]), ("^", [1.0], [3.47]), ("v", [2.0], [3.47]), ("^", [3.0], [3.47]),
                     ("v", [0.0], [0.47]), ("^", [1.0], [0.47]), ("v", [2.0], [0.47]), ("^", [3.0], [0.47])]
    assert dots == [("o", [0.75], [3.0]), ("o", [0.75], [0.0])]
    assert {color for *_, color in marks(ax)} == {"#000000"}
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "suspended: server", "suspended: client", "chained: server", "chained: client"]
    assert list(ax.get_yticks()) == [4.0, 3.0, 1.0, 0.0]
    assert ax.get_xlabel() == "seconds since the rollout's first request (virtual time)"
    assert ax.get_xlim() == pytest.approx((0.0, 3.0 * 1.02))
    assert ax.get_ylim() == (-0.8, 4.8)
    assert ax.xaxis._major_tick_kw["gridOn"] and not ax.yaxis._major_tick_kw.get("gridOn", False)
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "validate", "prefill", "decode", "network + client", "client tool",
        f"suspended: {PAUSE_STATE[SUSPENDED][0]}", f"chained: {PAUSE_STATE[CHAINED][0]}",
        "request sent (create, append, POST)", "turn's last event (done, completed)", "first token"]
    assert legend.get_title().get_text() == "phase"
    handles = legend.legend_handles
    assert [to_hex(h.get_facecolor()) for h in handles[:5]] == [colour[p] for p in ("validate", "prefill", "decode", NETWORK_CLIENT, TOOL)]
    assert (handles[5].get_hatch(), to_hex(handles[5].get_edgecolor())) == ("///", pause_suspended)
    assert [(h.get_marker(), h.get_markersize()) for h in handles[7:]] == [("v", 4), ("^", 4), ("o", 2.5)]


def test_a_timeline_without_events_pauses_or_legend_and_with_its_own_labels_and_end(ax):
    record = rollout(SUSPENDED)
    record.turns[0].server_timing["spans"].append(["mystery", 0, 250])
    figures.timeline(ax, [record], labels=["mine"], events=False, pauses=False, legend=False, xmax=9.0)
    colour = figures.PHASE_COLORS
    assert boxes(ax) == [  # no pause band, every other span; a phase without a colour in grey
        (0.0, 1.0, -0.35, 0.35, colour[NETWORK_CLIENT], None, None), (1.0, 1.5, -0.35, 0.35, colour[TOOL], None, None),
        (0.5, 0.75, 0.65, 1.35, colour["validate"], None, None), (0.75, 1.0, 0.65, 1.35, colour["prefill"], None, None),
        (0.5, 0.75, 0.65, 1.35, "#999999", None, None), (2.0, 2.0, -0.35, 0.35, colour[NETWORK_CLIENT], None, None),
        (2.0, 2.5, 0.65, 1.35, colour["decode"], None, None)]
    assert list(ax.lines) == [] and ax.get_legend() is None
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mine: server", "mine: client"]
    assert ax.get_xlim() == (0.0, 9.0) and ax.get_ylim() == (-0.8, 1.8)
    fig, other = plt.subplots()
    unknown = RolloutRecord("other", "w", 0.0, ended_at=3.0, turns=[TurnRecord(0, 0.0, ended_at=1.0), TurnRecord(1, 2.0, ended_at=3.0)])
    figures.timeline(other, [unknown], events=False)
    assert (1.0, 2.0, 0.65, 1.35, "#ffffff", "#cccccc", "///") in boxes(other)
    assert [t.get_text() for t in other.get_legend().get_texts()] == ["network + client", "other: pause"]
    plt.close(fig)


def placement(legend):
    """Where a legend sits and how it is lettered: (loc code, anchor point or None, columns, its entries' font sizes,
    title, title's font size)."""
    anchor = legend._bbox_to_anchor
    return (legend._loc, None if anchor is None else tuple(float(v) for v in anchor._bbox.bounds[:2]), legend._ncols,
            {t.get_fontsize() for t in legend.get_texts()}, legend.get_title().get_text(), legend.get_title().get_fontsize())


def grids(ax):
    """Each axis's grid, x then y: (major lines on, their alpha, their zorder, minor lines on)."""
    return tuple((kw.get("gridOn", False), kw.get("grid_alpha"), kw.get("grid_zorder"), minor.get("gridOn", False))
                 for kw, minor in ((ax.xaxis._major_tick_kw, ax.xaxis._minor_tick_kw),
                                   (ax.yaxis._major_tick_kw, ax.yaxis._minor_tick_kw)))


def test_a_timelines_legend_sits_beside_it_and_shows_each_mark_as_drawn(ax):
    figures.timeline(ax, [rollout(SUSPENDED)])
    legend = ax.get_legend()
    assert placement(legend) == (2, (1.01, 1.0), 1, {7.0}, "phase", 8.0)
    drawn = [(h.get_marker(), h.get_linestyle(), to_hex(h.get_color(), keep_alpha=True), h.get_markersize())
             for h in legend.legend_handles[-3:]]
    assert drawn == [("v", "None", "#000000ff", 4), ("^", "None", "#000000ff", 4), ("o", "None", "#000000ff", 2.5)]
    assert grids(ax) == ((True, 0.3, None, False), (False, None, None, False))


def annotations(ax):
    return [(a.get_text(), tuple(round(v, 6) for v in a.xy), tuple(round(v, 6) for v in a.xyann), a.get_horizontalalignment())
            for a in ax.texts]


def test_the_tool_call_point_is_named_where_each_tool_answers(ax):
    record = rollout(SUSPENDED, hosted=True)
    ax.set_xlim(0, 2.4)
    ax.set_ylim(-0.8, 1.8)
    figures.annotate_tool_call_point(ax, record)
    assert annotations(ax) == [
        ("tool_call_point: web_search,\nanswered by the hosted tool service", (1.125, 1.35), (1.125, 2.1), "left"),
        ("tool_call_point: function call,\nanswered by the client (response.done ... response.append)", (1.25, -0.35),
         (1.25, -1.05), "right"),
    ]
    assert ax.get_ylim() == (-1.6, 2.6)
    fig, other = plt.subplots()
    other.set_xlim(0, 4.0)
    other.set_ylim(-5.0, 9.0)
    figures.annotate_tool_call_point(other, rollout(CHAINED), row=0, rows=2)
    assert annotations(other) == [
        ("tool_call_point: function call,\nanswered by the client (the response ends; the next request continues)",
         (1.25, 2.65), (1.25, 1.95), "left")]
    assert other.get_ylim() == (-5.0, 9.0)
    plt.close(fig)
    # The second of three rows; a note exactly at the middle grows to the right.
    fig, other = plt.subplots()
    other.set_xlim(0, 2.5)
    figures.annotate_tool_call_point(other, rollout(CHAINED), row=1, rows=3)
    assert annotations(other)[0][1:] == ((1.25, 2.65), (1.25, 1.95), "right")
    plt.close(fig)
    fig, bare = plt.subplots()
    figures.annotate_tool_call_point(bare, RolloutRecord("x", "w", 0.0, turns=[TurnRecord(0, 0.0, ended_at=1.0)]))
    assert list(bare.texts) == [] and bare.get_ylim() == (0.0, 1.0)
    plt.close(fig)


def rectangles(ax):
    return [(round(p.get_x(), 6), round(p.get_width(), 6), round(p.get_y(), 6), round(p.get_height(), 6),
             to_hex(p.get_facecolor()), p.get_hatch()) for p in ax.patches]


def test_phase_bars_stack_each_designs_phases_in_phase_order(ax):
    figures.phase_bars(ax, {"a": {"decode": 2.0, "validate": 1.0, "tool": 0.0, "post": 0.5},
                            "b": {"decode": 3.0, "unused": 9.0}})
    c = figures.PHASE_COLORS
    assert rectangles(ax) == [
        (0.0, 1.0, 0.7, 0.6, c["validate"], None), (0.0, 0.0, -0.3, 0.6, c["validate"], None),
        (1.0, 2.0, 0.7, 0.6, c["decode"], None), (0.0, 3.0, -0.3, 0.6, c["decode"], None),
        (3.0, 0.5, 0.7, 0.6, c["post"], None), (3.0, 0.0, -0.3, 0.6, c["post"], None)]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"] and list(ax.get_yticks()) == [1, 0]
    assert ax.get_xlabel() == "seconds"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["validate", "decode", "post"]
    assert ax.xaxis._major_tick_kw["gridOn"] and not ax.yaxis._major_tick_kw.get("gridOn", False)
    fig, other = plt.subplots()
    figures.phase_bars(other, {"a": {"tool": 1.0, "network_client": 0.5}}, legend=False, xlabel="ms")
    assert other.get_legend() is None and other.get_xlabel() == "ms"
    assert [r[4] for r in rectangles(other)] == [c[NETWORK_CLIENT], c[TOOL]]
    plt.close(fig)


TABLE = [
    {"design": CHAINED, "x": 2, "e2e_mean_s": 5.0, "other": 1.0},
    {"design": "http", "x": 1, "e2e_mean_s": 9.0, "other": 2.0},
    {"design": CHAINED, "x": 1, "e2e_mean_s": 4.0, "other": 3.0},
    {"design": "odd", "x": 1, "e2e_mean_s": 7.0, "other": 4.0},
]


def lines(ax):
    return [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()), line.get_marker(), line.get_linestyle())
            for line in ax.lines]


def test_a_sweep_is_one_line_per_design_in_its_order(ax):
    figures.sweep_plot(ax, TABLE, "x")
    assert lines(ax) == [(CHAINED, [1, 2], [4.0, 5.0], "s", "-"), ("http", [1], [9.0], "o", "-"), ("odd", [1], [7.0], "o", "-")]
    assert [to_hex(line.get_color()) for line in ax.lines[:2]] == [figures.DESIGN_COLORS[CHAINED], figures.DESIGN_COLORS["http"]]
    assert [line.get_markersize() for line in ax.lines] == [4, 4, 4]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("x", "e2e_mean_s", "")
    assert (ax.get_xscale(), ax.get_yscale()) == ("linear", "linear")
    assert ax.xaxis._major_tick_kw["gridOn"] and ax.yaxis._major_tick_kw["gridOn"]
    fig, other = plt.subplots()
    figures.sweep_plot(other, TABLE, "x", "other", designs=["http", "missing", CHAINED], logx=True, logy=True,
                       xlabel="X", ylabel="Y", title="T", linestyle="--", label_suffix=" (b)")
    assert lines(other) == [("http (b)", [1], [2.0], "o", "--"), (CHAINED + " (b)", [1, 2], [3.0, 1.0], "s", "--")]
    assert (other.get_xlabel(), other.get_ylabel(), other.get_title()) == ("X", "Y", "T")
    assert (other.get_xscale(), other.get_yscale()) == ("log", "log")
    plt.close(fig)


def test_a_log_axis_is_labelled_in_plain_numbers(ax):
    figures.log_axis(ax)
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "linear")
    formatter = ax.xaxis.get_major_formatter()
    assert [formatter(v, 0) for v in (0.5, 1.0, 2000.0, 0.02)] == ["0.5", "1", "2,000", "0.02"]
    assert type(ax.xaxis.get_minor_formatter()).__name__ == "NullFormatter"
    locator = ax.xaxis.get_major_locator()
    assert type(locator).__name__ == "LogLocator"
    assert list(locator.tick_values(1, 100)) == pytest.approx([0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500])
    figures.log_axis(ax, "y")
    assert ax.get_yscale() == "log"
    assert ax.yaxis.get_major_formatter()(5000.0, 0) == "5,000"
    assert type(ax.yaxis.get_minor_formatter()).__name__ == "NullFormatter"


PUBLISHED = [
    {"result": "first", "role": "check", "published_gain": 0.4, "measured_gain": 0.3, "implied_ms_per_turn": 50.0,
     "testbed_ms_per_turn": 40.0},
    {"result": "a calibration result whose name is long enough to wrap over more than one line of the axis",
     "role": "calibration", "published_gain": 0.2, "measured_gain": 0.25, "implied_ms_per_turn": 100.0,
     "testbed_ms_per_turn": 90.0},
]
TRENDS = [{"tok_s": 65, "gain_chained_vs_http": 0.1}, {"tok_s": 1000, "gain_chained_vs_http": 0.3}]


def test_the_published_results_panels():
    fig, axes = plt.subplots(1, 3)
    left, middle, right = axes
    figures.published_plot(axes, PUBLISHED, TRENDS, agreement_factor=3.0)
    grey, blue = "#999999", figures.DESIGN_COLORS[CHAINED]
    assert rectangles(left) == [
        (0.0, 40.0, 1.0, 0.38, grey, None), (0.0, 20.0, 0.0, 0.38, grey, "//"),
        (0.0, 30.0, 0.62, 0.38, blue, None), (0.0, 25.0, -0.38, 0.38, blue, "//")]
    assert [to_hex(p.get_edgecolor()) for p in left.patches if p.get_hatch() == "//"] == ["#000000", "#000000"]
    assert [t.get_text() for t in left.get_yticklabels()] == [
        "0: first", "1: a calibration result whose name\nis long enough to wrap over more\nthan [...]"]
    assert (left.get_xlabel(), left.get_title()) == ("gain, % (1 - design / baseline)", "Published vs testbed gain")
    assert [t.get_text() for t in left.get_legend().get_texts()] == ["published", "testbed", "calibration row"]
    assert [p[:4] for p in rectangles(middle)[:4]] == [
        (0.0, 50.0, 1.0, 0.38), (0.0, 100.0, 0.0, 0.38), (0.0, 40.0, 0.62, 0.38), (0.0, 90.0, -0.38, 0.38)]
    band = [p for p in middle.patches if to_hex(p.get_facecolor()) == "#2ca02c"]
    assert len(band) == 1
    assert (band[0].get_x(), band[0].get_x() + band[0].get_width()) == pytest.approx((100 / 3, 300.0))
    assert [list(line.get_xdata()) for line in middle.lines] == [[100.0, 100.0]]
    assert [t.get_text() for t in middle.get_yticklabels()] == ["0", "1"]
    assert middle.get_xscale() == "log"
    assert (middle.get_xlabel(), middle.get_title()) == ("ms per turn (per first token for TTFT rows)", "Overhead the published gain implies")
    assert [t.get_text() for t in middle.get_legend().get_texts()] == [
        "implied by the published gain", "removed in the testbed", "calibration's implied value, x/÷3"]
    (line,) = right.lines
    assert (list(line.get_xdata()), list(line.get_ydata()), line.get_marker()) == ([65, 1000], [10.0, 30.0], "s")
    assert right.get_xscale() == "log" and right.get_ylim()[0] == 0
    assert (right.get_xlabel(), right.get_ylabel(), right.get_title()) == (
        "decode speed (tokens/s)", "chained vs http gain, %", "Direction check: gain by decode speed")
    plt.close(fig)
    fig, axes = plt.subplots(1, 3)
    figures.published_plot(axes, PUBLISHED[:1], TRENDS)
    assert [t.get_text() for t in axes[1].get_legend().get_texts()] == ["implied by the published gain", "removed in the testbed"]
    assert list(axes[1].lines) == []
    plt.close(fig)


def test_the_published_results_panels_are_lettered_layered_and_gridded():
    cut = {**PUBLISHED[0], "result": "r" * 78}  # "0: " and 78 characters: one past the 80 a row's name is cut to
    with matplotlib.rc_context({"axes.prop_cycle": matplotlib.cycler(color=["#123456"])}):  # colours named, not cycled
        fig, axes = plt.subplots(1, 3)
        figures.published_plot(axes, [cut, PUBLISHED[1]], TRENDS)  # the default agreement factor, 2
    left, middle, right = axes
    grey, blue, green = "#999999", figures.DESIGN_COLORS[CHAINED], "#2ca02c"
    assert left.get_yticklabels()[0].get_text() == "0: [...]"
    assert {t.get_fontsize() for t in left.get_yticklabels()} == {7.0}
    assert [a.title.get_fontsize() for a in axes] == [9.0, 9.0, 9.0]
    # The bars above the band (zorder 0) and the calibration line (1); the calibration row's bars outlined in black.
    assert {p.get_zorder() for p in left.patches} == {2} and {p.get_zorder() for p in middle.patches[:4]} == {2}
    assert [to_hex(p.get_edgecolor(), keep_alpha=True) for p in left.patches if p.get_hatch()] == ["#000000ff"] * 2
    legend = left.get_legend()
    assert placement(legend)[:4] == (1, None, 1, {7.0})
    assert [(to_hex(h.get_facecolor()), to_hex(h.get_edgecolor(), keep_alpha=True), h.get_hatch())
            for h in legend.legend_handles] == [(grey, grey + "ff", None), (blue, blue + "ff", None), ("#ffffff", "#000000ff", "//")]
    (band,) = middle.patches[4:]
    assert (to_hex(band.get_facecolor(), keep_alpha=True), band.get_alpha(), band.get_zorder()) == (green + "26", 0.15, 0)
    assert (band.get_x(), band.get_x() + band.get_width()) == pytest.approx((50.0, 200.0))
    (line,) = middle.lines
    assert (list(line.get_xdata()), to_hex(line.get_color()), line.get_linewidth(), line.get_zorder()) == (
        [100.0, 100.0], green, 1.0, 1)
    legend = middle.get_legend()
    assert placement(legend)[:4] == (9, (0.5, -0.2), 2, {7.0})
    assert [t.get_text() for t in legend.get_texts()][2] == "calibration's implied value, x/÷2"
    assert [(to_hex(h.get_facecolor(), keep_alpha=True), h.get_alpha()) for h in legend.legend_handles] == [
        (grey + "ff", None), (blue + "ff", None), (green + "4c", 0.3)]
    (trend,) = right.lines
    assert to_hex(trend.get_color()) == blue
    assert grids(left) == ((True, 0.3, 0, False), (False, None, None, False))
    assert grids(middle) == ((True, 0.3, 0, False), (False, None, None, False))
    assert grids(right) == ((True, 0.3, None, False), (True, 0.3, None, False))
    plt.close(fig)


def task_row(design, tps, e2e, *, ttft=(0.1,), turns=2, sent=1000.0, phases=None):
    return {"design": design, "decode_tps": tps, "e2e_s": e2e, "ttft_s": np.array(ttft), "turns": turns,
            "bytes_sent_per_turn": sent, "phase_totals_s": phases or {}}


def test_rows_are_grouped_by_design_in_the_benchmarks_order_and_speed():
    rows = [task_row("other", 65, 1.0), task_row(SUSPENDED, 1000, 2.0), task_row("http", 65, 3.0), task_row("http", 65, 4.0)]
    designs, speeds, groups = figures._groups(rows)
    assert designs == ["http", SUSPENDED, "other"] and speeds == [65, 1000]
    assert groups == {("other", 65): [rows[0]], (SUSPENDED, 1000): [rows[1]], ("http", 65): [rows[2], rows[3]]}
    assert figures._color("other") == "#937860" and figures._color(CHAINED) == figures.DESIGN_COLORS[CHAINED]
    group = [task_row("http", 65, 1.0, turns=2, phases={"render": 1.0, "route": 2.0}),
             task_row("http", 65, 1.0, turns=3, phases={"render": 4.0})]
    assert figures._per_turn(group, ("render",)) == 1.0
    assert figures._per_turn(group, ("render", "route", "missing")) == 7.0 / 5
    assert figures._per_turn([], ("render",)) == 0.0
    assert figures._per_turn([task_row("http", 65, 1.0, turns=1, phases={"render": 3.0})], ("render",)) == 3.0


@pytest.fixture
def kept(monkeypatch):
    """The figures compare_figure and tornado_figure close, kept for the test to read."""
    closed, close = [], plt.close
    monkeypatch.setattr(plt, "close", closed.append)
    yield closed
    for fig in closed:
        close(fig)


@pytest.fixture
def saved(monkeypatch):
    """Figure.savefig replaced by a stand-in that writes the path's name and records how it was asked to save (drawing
    a whole figure takes seconds, and a test per mutant would pay it): (path, dpi, bbox_inches) each."""
    calls = []

    def savefig(fig, path, dpi=None, bbox_inches=None):
        calls.append((path, dpi, bbox_inches))
        path.write_text(path.name)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return calls


def heights(ax):
    return [round(p.get_height(), 6) for p in ax.patches]


def test_the_compare_figure_shows_each_design_at_each_speed(tmp_path, kept, saved):
    api = {"validate": 0.002, "render": 0.004, "post": 0.006, "tool": 1.0, "prefill": 0.2, "network_client": 0.1}
    rows = [task_row("http", 65, e, ttft=(0.1, 0.3), sent=2000.0, phases=api) for e in (10.0, 20.0, 30.0)]
    rows += [task_row(CHAINED, 65, 5.0, ttft=(0.2,), sent=500.0, turns=4, phases=api),
             task_row(CHAINED, 1000, 1000.0, ttft=(0.05,), sent=500.0, phases=api),
             task_row(CHAINED, 1000, 2.0, ttft=(0.05,), sent=500.0, phases=api)] + [
             task_row(CHAINED, 1000, 2.0, ttft=(0.05,), sent=500.0, phases=api)] * 8
    path = figures.compare_figure([{"tasks": 3}, {"tasks": 1}], rows, tmp_path / "deep" / "compare.svg",
                                  workload="W", clock="C")
    assert path == tmp_path / "deep" / "compare.svg" and path.read_text() == "compare.svg"
    assert saved == [(path, None, "tight")]
    (fig,) = kept
    e2e_ax, ttft_ax, bytes_ax, api_ax, turn_ax = fig.axes
    assert fig._suptitle.get_text() == "compare: W, n = 1, 3 tasks per design and speed, C"
    assert [(a.get_title(), a.get_ylabel()) for a in (e2e_ax, ttft_ax, bytes_ax, api_ax)] == [
        ("End to end per task: mean, 95% interval, tasks", "seconds per task"),
        ("Time to first token per turn: median, 95% interval", "ms per turn"),
        ("Bytes sent per turn (client to server)", "kB per turn"),
        ("Where the API's time goes per turn (total on top); tool time is on the right", "ms per turn")]
    for a in (e2e_ax, ttft_ax, bytes_ax, api_ax):
        assert [t.get_text() for t in a.get_xticklabels()] == ["65 tok/s", "1000 tok/s"]
        assert a.get_xlim() == (-0.5, 1.5)
    # Two designs, two speeds: http at -0.2 (65 only), chained at +0.2; bars 0.4 wide.
    assert [(round(p.get_x(), 6), round(p.get_width(), 6)) for p in e2e_ax.patches] == [
        (-0.4, 0.4), (0.6, 0.4), (0.0, 0.4), (1.0, 0.4)]
    assert heights(e2e_ax)[0] == 20.0 and heights(e2e_ax)[2:] == [5.0, pytest.approx(101.8)]  # the mean task
    assert heights(ttft_ax)[0] == pytest.approx(200.0) and heights(ttft_ax)[2:] == pytest.approx([200.0, 50.0])
    assert heights(bytes_ax)[0] == 2.0 and heights(bytes_ax)[2:] == [0.5, 0.5]
    assert [t.get_text() for t in bytes_ax.texts] == ["2", "0", "0", "0"]
    # The API's stages stacked per turn: validate 1 ms, render 2 ms, post 3 ms for http (2 turns a task).
    http_api = [round(p.get_height(), 6) for p in api_ax.patches][:2]
    assert http_api == [1.0, 0.0]
    assert [t.get_text() for t in api_ax.texts] == ["6", "0", "3", "6"]
    assert [t.get_text() for t in api_ax.get_legend().get_texts()] == list(figures.API_PHASES)
    assert [p.get_hatch() for p in api_ax.get_legend().legend_handles] == [figures.PHASE_HATCHES[p] for p in figures.API_PHASES]
    # Every task a dot below the scale's top (1.15 x the highest end of an interval); the 1000 s task a triangle at the
    # top, with its value.
    top = e2e_ax.get_ylim()[1]
    highest = max(benchmark.estimates([r for r in rows if (r["design"], r["decode_tps"]) == point], None)["e2e_mean_s"].high
                  for point in (("http", 65), (CHAINED, 1000)))
    assert top == pytest.approx(1.15 * highest) and top < 1000.0
    assert [t.get_text() for t in e2e_ax.texts] == ["1000"]
    assert e2e_ax.texts[0].xy == pytest.approx((1.2, top))
    assert (turn_ax.get_title(), turn_ax.get_xlabel()) == ("A turn's time at 1000 tok/s", "seconds per turn")
    assert [t.get_text() for t in turn_ax.get_yticklabels()] == ["http", CHAINED]
    assert [t.get_text() for t in turn_ax.texts] == [" 0.00 s", " 0.66 s"]
    assert turn_ax.get_xlim() == pytest.approx((0.0, 0.656 * 1.3))
    assert [t.get_text() for t in turn_ax.get_legend().get_texts()] == list(figures.TURN_PARTS)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["http", CHAINED]


def test_the_compare_figure_of_one_task_is_a_png(tmp_path, kept, saved):
    path = figures.compare_figure([], [task_row(SUSPENDED, 65, 3.0)], str(tmp_path / "c.png"))
    assert path == tmp_path / "c.png" and saved == [(path, 90, "tight")]
    (fig,) = kept
    assert fig._suptitle.get_text() == "compare: the 'coding' workload, n = 1 task per design and speed, virtual time"
    assert fig.axes[4].get_xlim() == (0.0, 1.0)  # nothing per turn: a unit scale


PANEL = figures.TornadoPanel("T", 10.0, (("a", 9.0, 12.0), ("flat", 10.0, 10.0), ("b", 5.0, 20.0), ("c", 10.0, 11.0)))


def test_a_tornado_draws_the_widest_span_on_top(ax):
    figures.tornado(ax, PANEL)
    low, high = figures.TORNADO_LOW, figures.TORNADO_HIGH
    assert rectangles(ax) == [
        (10.0, -5.0, -0.35, 0.7, low, None), (10.0, 10.0, -0.35, 0.7, high, None),
        (10.0, -1.0, 0.65, 0.7, low, None), (10.0, 2.0, 0.65, 0.7, high, None),
        (10.0, 0.0, 1.65, 0.7, low, None), (10.0, 1.0, 1.65, 0.7, high, None)]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a", "c"]
    assert ax.yaxis_inverted() and ax.get_title() == "T"
    assert [list(line.get_xdata()) for line in ax.lines] == [[10.0, 10.0]]
    assert list(ax.texts) == []
    fig, other = plt.subplots()
    figures.tornado(other, PANEL, top=1)
    assert [t.get_text() for t in other.get_yticklabels()] == ["b"]
    plt.close(fig)
    fig, still = plt.subplots()
    figures.tornado(still, figures.TornadoPanel("S", 1.0, (("flat", 1.0, 1.0),)))
    assert [t.get_text() for t in still.texts] == ["no parameter moves it"] and list(still.patches) == []
    plt.close(fig)
    fig, one_end = plt.subplots()
    figures.tornado(one_end, figures.TornadoPanel("E", 1.0, (("lo", 0.5, 1.0), ("hi", 1.0, 3.0))))
    assert [t.get_text() for t in one_end.get_yticklabels()] == ["hi", "lo"]
    plt.close(fig)


def test_a_tornado_figure_lays_the_panels_in_rows(tmp_path, kept, saved):
    path = figures.tornado_figure([PANEL] * 4, str(tmp_path / "deep" / "t.png"), title="Tornados", columns=3)
    assert path == tmp_path / "deep" / "t.png" and path.read_text() == "t.png"
    (fig,) = kept
    assert len(fig.axes) == 6 and [a.get_visible() for a in fig.axes] == [True] * 4 + [False] * 2
    assert [a.get_title() for a in fig.axes[:4]] == ["T"] * 4
    assert fig._suptitle.get_text() == "Tornados"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["parameter at its low end", "parameter at its high end"]
    assert tuple(fig.get_size_inches()) == (15.0, 4.8)
    svg = figures.tornado_figure([PANEL], tmp_path / "t.svg", columns=1)
    assert saved[:2] == [(path, 90, None), (svg, None, None)]
    assert tuple(kept[1].get_size_inches()) == (5.0, 2.4) and len(kept[1].axes) == 1
    figures.tornado_figure([], tmp_path / "e.png")
    assert len(kept[2].axes) == 3 and not any(a.get_visible() for a in kept[2].axes)


@pytest.mark.parametrize("draw", ["compare", "tornado"])
def test_each_figure_is_written_as_the_image_its_suffix_names(tmp_path, draw):
    rows = [task_row(SUSPENDED, 65, 3.0)]
    for suffix, head in ((".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")):
        target = tmp_path / draw / f"figure{suffix}"
        path = (figures.compare_figure([], rows, target) if draw == "compare"
                else figures.tornado_figure([PANEL], target, columns=1))
        assert path.read_bytes().lstrip()[:len(head)] == head
    assert plt.get_fignums() == []  # closed once written
