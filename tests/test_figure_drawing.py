"""What each figure draws (prototype/figures/), read off the Axes: spans, bars, lines, intervals, texts, ticks, legends and
the files written. A colour is checked only against the legend's own table; a pixel is read only to see that nothing
runs off the saved image."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from prototype import benchmark, figures, metrics  # noqa: E402
from prototype.analysis import NETWORK_CLIENT, PAUSE, PAUSE_STATE, TOOL  # noqa: E402
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord, TurnRecord  # noqa: E402


@pytest.fixture
def subplots():
    """`plt.subplots(*shape)`'s Axes; every figure it made closed when the test ends."""
    made = []
    yield lambda *shape: made.append(plt.subplots(*shape)) or made[-1][1]
    for fig, _ in made:
        plt.close(fig)


@pytest.fixture
def ax(subplots):
    return subplots()


@pytest.fixture
def drawn(monkeypatch):
    """The figures drawn, kept open to read, with `Figure.savefig` a stand-in that writes the file's name."""
    closed, close = [], plt.close
    monkeypatch.setattr(plt, "close", closed.append)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, path, **kwargs: path.write_text(path.name))
    yield closed
    for fig in closed:
        close(fig)


def r6(values):
    return tuple(None if np.isnan(v) else round(float(v), 6) for v in values)


def texts(items):
    return [t.get_text() for t in items]


# --- a rollout's timeline ----------------------------------------------------------------------------------


def rollout(design=SUSPENDED, hosted=False):
    """Two turns from 10 s: the first with server spans from its origin and a 0.5 s tool, the second from its send time."""
    spans = [["validate", 0, 250], ["prefill", 250, 500], ["decode", 500, 500], ["post", 750, 500]]
    spans += [[metrics.HOSTED_TOOL, 500, 750]] if hosted else []
    turns = [TurnRecord(turn=0, sent_at=10.0, first_token_at=10.75, ended_at=11.0, tool_seconds=0.5,
                        server_timing={"origin_s": 10.5, "spans": spans}),
             TurnRecord(turn=1, sent_at=12.0, first_token_at=None, ended_at=None, server_timing={"spans": [["decode", 0, 500]]})]
    timeline = [(10.0, "send", "response.create"), (10.25, "recv", "response.created"), (11.0, "recv", "response.done"),
                (12.0, "send", "response.append"), (13.0, "recv", "response.completed")]
    return RolloutRecord(design, "w", 10.0, ended_at=13.0, turns=turns, timeline=timeline)


def test_each_pause_of_a_rollout_ends_when_the_next_turn_is_sent():
    # The spans of `rollout()`, each on its lane from the rollout's start: the boxes of its timeline, below.
    three = RolloutRecord("x", "w", 0.0, turns=[TurnRecord(turn=t, sent_at=3.0 * t, ended_at=3.0 * t + 1) for t in range(3)])
    assert [(s["turn"], s["start"], s["end"]) for s in figures.turn_spans(three) if s["phase"] == PAUSE] == [
        (0, 1.0, 3.0), (1, 4.0, 6.0)]
    assert [(s["phase"], s["turn"]) for s in figures.turn_spans(rollout())] == [
        (NETWORK_CLIENT, 0), (TOOL, 0), ("validate", 0), ("prefill", 0), (PAUSE, 0), (NETWORK_CLIENT, 1), ("decode", 1)]
    bare = RolloutRecord("x", "w", 0.0, turns=[TurnRecord(turn=0, sent_at=1.0, ended_at=2.0)])
    assert figures.turn_spans(bare) == [{"lane": "client", "phase": NETWORK_CLIENT, "turn": 0, "start": 1.0, "end": 2.0}]


def key(mark):
    """What tells a mark or its legend key apart: face colour, edge colour, hatch."""
    face, edge = (c[0] if np.ndim(c) == 2 else c for c in (mark.get_facecolor(), mark.get_edgecolor()))
    return to_hex(face), to_hex(edge), mark.get_hatch()


def boxes(ax):
    """Each span drawn: (x0, x1, lane's centre, the phase its colour is the legend's for, or its hatch)."""
    by_colour = {colour: phase for phase, colour in figures.PHASE_COLORS.items()}
    out = []
    for coll in ax.collections:
        (path,) = coll.get_paths()
        (x0, y0), (x1, y1) = path.vertices.min(axis=0), path.vertices.max(axis=0)
        out.append((*r6((x0, x1, (y0 + y1) / 2)), coll.get_hatch() or by_colour.get(to_hex(coll.get_facecolor()[0]), "?")))
    return out


def test_a_timeline_draws_each_span_on_its_lane_with_its_events(ax):
    figures.timeline(ax, [rollout(SUSPENDED), rollout(CHAINED)])

    def drawn(client):
        server = client + 1.0
        return [(0.0, 1.0, client, NETWORK_CLIENT), (1.0, 1.5, client, TOOL), (0.5, 0.75, server, "validate"),
                (0.75, 1.0, server, "prefill"), (1.0, 2.0, server, "///"), (2.0, 2.0, client, NETWORK_CLIENT),
                (2.0, 2.5, server, "decode")]

    assert boxes(ax) == drawn(3.0) + drawn(0.0)  # the first rollout on top
    # Requests sent (v) and each turn's last event (^) above the client lane, the first token (o) on it.
    assert [(line.get_marker(), list(line.get_xdata()), r6(line.get_ydata())) for line in ax.lines] == [
        ("v", [0.0], (3.47,)), ("^", [1.0], (3.47,)), ("v", [2.0], (3.47,)), ("^", [3.0], (3.47,)), ("o", [0.75], (3.0,)),
        ("v", [0.0], (0.47,)), ("^", [1.0], (0.47,)), ("v", [2.0], (0.47,)), ("^", [3.0], (0.47,)), ("o", [0.75], (0.0,))]
    assert texts(ax.get_yticklabels()) == ["suspended: server", "suspended: client", "chained: server", "chained: client"]
    assert list(ax.get_yticks()) == [4.0, 3.0, 1.0, 0.0]
    assert ax.get_xlabel() == "seconds since the rollout's first request (virtual time)"
    assert ax.get_xlim() == pytest.approx((0.0, 3.0 * 1.02)) and ax.get_ylim() == (-0.8, 4.8)
    legend = ax.get_legend()
    assert (legend.get_title().get_text(), texts(legend.get_texts())) == ("phase", [
        "validate", "prefill", "decode", "network + client", "client tool",
        f"suspended: {PAUSE_STATE[SUSPENDED][0]}", f"chained: {PAUSE_STATE[CHAINED][0]}",
        "request sent (create, append, POST)", "turn's last event (done, completed)", "first token"])
    assert [h.get_marker() for h in legend.legend_handles[7:]] == ["v", "^", "o"]
    # Each phase's key in its colour, each pause's hatched as its band.
    assert [to_hex(h.get_facecolor()) for h in legend.legend_handles[:5]] == [
        figures.PHASE_COLORS[p] for p in ("validate", "prefill", "decode", NETWORK_CLIENT, TOOL)]
    pause_bands = [c for c in ax.collections if c.get_hatch()]  # suspended's, then chained's
    assert [key(h) for h in legend.legend_handles[5:7]] == [key(band) for band in pause_bands] and len(pause_bands) == 2


def test_a_timeline_without_events_pauses_or_legend_and_with_its_own_labels_and_end(ax, subplots):
    record = rollout(SUSPENDED)
    record.turns[0].server_timing["spans"].append(["mystery", 0, 250])
    figures.timeline(ax, [record], labels=["mine"], events=False, pauses=False, legend=False, xmax=9.0)
    assert boxes(ax) == [  # no pause band, every other span, a phase without a colour of its own too
        (0.0, 1.0, 0.0, NETWORK_CLIENT), (1.0, 1.5, 0.0, TOOL), (0.5, 0.75, 1.0, "validate"), (0.75, 1.0, 1.0, "prefill"),
        (0.5, 0.75, 1.0, "?"), (2.0, 2.0, 0.0, NETWORK_CLIENT), (2.0, 2.5, 1.0, "decode")]
    assert list(ax.lines) == [] and ax.get_legend() is None and texts(ax.get_yticklabels()) == ["mine: server", "mine: client"]
    assert ax.get_xlim() == (0.0, 9.0) and ax.get_ylim() == (-0.8, 1.8)
    other = subplots()
    unknown = RolloutRecord("other", "w", 0.0, ended_at=3.0, turns=[TurnRecord(0, 0.0, ended_at=1.0), TurnRecord(1, 2.0, ended_at=3.0)])
    figures.timeline(other, [unknown], events=False)
    assert (1.0, 2.0, 1.0, "///") in boxes(other)
    assert texts(other.get_legend().get_texts()) == ["network + client", "other: pause"]


def annotations(ax):
    """Each note: its text, the point its arrow names, where the text sits and the side it grows to."""
    assert all(a.arrow_patch is not None for a in ax.texts)
    return [(a.get_text(), r6(a.xy), r6(a.xyann), a.get_horizontalalignment()) for a in ax.texts]


def test_the_tool_call_point_is_named_where_each_tool_answers(ax, subplots):
    ax.set(xlim=(0, 2.4), ylim=(-0.8, 1.8))
    figures.annotate_tool_call_point(ax, rollout(SUSPENDED, hosted=True))
    assert annotations(ax) == [
        ("tool_call_point: web_search,\nanswered by the hosted tool service", (1.125, 1.35), (1.125, 2.1), "left"),
        ("tool_call_point: function call,\nanswered by the client (response.done ... response.append)", (1.25, -0.35),
         (1.25, -1.05), "right")]
    assert ax.get_ylim() == (-1.6, 2.6)  # room for the notes
    axes = subplots(1, 4)
    axes[0].set(xlim=(0, 4.0), ylim=(-5.0, 9.0))
    figures.annotate_tool_call_point(axes[0], rollout(CHAINED), row=0, rows=2)
    assert annotations(axes[0]) == [
        ("tool_call_point: function call,\nanswered by the client (the response ends; the next request continues)",
         (1.25, 2.65), (1.25, 1.95), "left")]
    assert axes[0].get_ylim() == (-5.0, 9.0)
    # The second of three rows; a note exactly at the middle grows to the right.
    axes[1].set_xlim(0, 2.5)
    figures.annotate_tool_call_point(axes[1], rollout(CHAINED), row=1, rows=3)
    assert annotations(axes[1])[0][1:] == ((1.25, 2.65), (1.25, 1.95), "right")
    figures.annotate_tool_call_point(axes[2], RolloutRecord("x", "w", 0.0, turns=[TurnRecord(0, 0.0, ended_at=1.0)]))
    assert list(axes[2].texts) == [] and axes[2].get_ylim() == (0.0, 1.0)
    axes[3].set_xlim(0, 2.0)  # both tools past the middle: both notes grow to the left of it
    figures.annotate_tool_call_point(axes[3], rollout(SUSPENDED, hosted=True))
    assert [note[3] for note in annotations(axes[3])] == ["right", "right"]


# --- bars, lines and the published results' panels ---------------------------------------------------------


def rectangles(ax):
    """Each bar: (x, width, y, height, hatch)."""
    return [(*r6((p.get_x(), p.get_width(), p.get_y(), p.get_height())), p.get_hatch()) for p in ax.patches]


def test_phase_bars_stack_each_designs_phases_in_phase_order(ax, subplots):
    figures.phase_bars(ax, {"a": {"decode": 2.0, "validate": 1.0, "tool": 0.0, "post": 0.5}, "b": {"decode": 3.0, "unused": 9.0}})
    assert rectangles(ax) == [
        (0.0, 1.0, 0.7, 0.6, None), (0.0, 0.0, -0.3, 0.6, None), (1.0, 2.0, 0.7, 0.6, None), (0.0, 3.0, -0.3, 0.6, None),
        (3.0, 0.5, 0.7, 0.6, None), (3.0, 0.0, -0.3, 0.6, None)]
    assert [to_hex(p.get_facecolor()) for p in ax.patches[::2]] == [figures.PHASE_COLORS[p] for p in ("validate", "decode", "post")]
    assert texts(ax.get_yticklabels()) == ["a", "b"] and list(ax.get_yticks()) == [1, 0]
    assert ax.get_xlabel() == "seconds" and texts(ax.get_legend().get_texts()) == ["validate", "decode", "post"]
    other = subplots()
    figures.phase_bars(other, {"a": {"tool": 1.0, "network_client": 0.5}}, legend=False, xlabel="ms")
    assert other.get_legend() is None and other.get_xlabel() == "ms"
    assert [to_hex(p.get_facecolor()) for p in other.patches] == [figures.PHASE_COLORS[NETWORK_CLIENT], figures.PHASE_COLORS[TOOL]]


TABLE = [
    {"design": CHAINED, "x": 2, "e2e_mean_s": 5.0, "other": 1.0}, {"design": "http", "x": 1, "e2e_mean_s": 9.0, "other": 2.0},
    {"design": CHAINED, "x": 1, "e2e_mean_s": 4.0, "other": 3.0}, {"design": "odd", "x": 1, "e2e_mean_s": 7.0, "other": 4.0}]


def lines(ax):
    return [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()), line.get_linestyle()) for line in ax.lines]


def whisker_segments(ax):
    """Each interval drawn, per errorbar container: its segments ((x, low), (x, high)); the whiskers alone, no line
    through the points."""
    containers = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert [c.lines[0] for c in containers] == [None] * len(containers)
    return [[tuple(r6(point) for point in seg) for seg in c.lines[2][0].get_segments() if len(seg)]
            for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]


def test_a_sweep_is_one_line_per_design_in_its_order_with_each_points_interval_where_the_table_has_one(ax, subplots):
    figures.sweep_plot(ax, TABLE, "x")
    assert lines(ax) == [(CHAINED, [1, 2], [4.0, 5.0], "-"), ("http", [1], [9.0], "-"), ("odd", [1], [7.0], "-")]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title(), ax.get_xscale(), ax.get_yscale()) == (
        "x", "e2e_mean_s", "", "linear", "linear")
    assert whisker_segments(ax) == []  # no interval in the table
    other = subplots()
    figures.sweep_plot(other, TABLE, "x", "other", designs=["http", "missing", CHAINED], logx=True, logy=True,
                       xlabel="X", ylabel="Y", title="T", linestyle="--", label_suffix=" (b)")
    assert lines(other) == [("http (b)", [1], [2.0], "--"), (CHAINED + " (b)", [1, 2], [3.0, 1.0], "--")]
    assert (other.get_xlabel(), other.get_ylabel(), other.get_title(), other.get_xscale(), other.get_yscale()) == (
        "X", "Y", "T", "log", "log")
    nan = float("nan")
    table = [{"x": 1, "design": CHAINED, "g": 0.3, "g_low": 0.2, "g_high": 0.5},
             {"x": 2, "design": CHAINED, "g": 0.4, "g_low": 0.35, "g_high": 0.42},
             {"x": 1, "design": "http", "g": 0.0, "g_low": nan, "g_high": nan},
             {"x": 1, "design": "odd", "g": 0.1, "g_low": 0.05, "g_high": 0.12},
             {"x": 2, "design": "odd", "g": 0.2, "g_low": nan, "g_high": nan}]
    figures.sweep_plot(intervals := subplots(), table, "x", "g")
    # http's has no interval; odd's point without one a whisker of no length at its value.
    assert whisker_segments(intervals) == [[((1.0, 0.2), (1.0, 0.5)), ((2.0, 0.35), (2.0, 0.42))],
                                           [((1.0, 0.05), (1.0, 0.12)), ((2.0, 0.2), (2.0, 0.2))]]


def test_a_log_axis_is_labelled_in_plain_numbers(ax):
    figures.log_axis(ax)
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "linear")
    assert [ax.xaxis.get_major_formatter()(v, 0) for v in (0.5, 1.0, 2000.0, 0.02)] == ["0.5", "1", "2,000", "0.02"]
    assert type(ax.xaxis.get_minor_formatter()).__name__ == "NullFormatter"  # no unlabelled minor ticks' labels
    assert list(ax.xaxis.get_major_locator().tick_values(1, 100)) == pytest.approx([0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500])
    figures.log_axis(ax, "y")
    assert ax.get_yscale() == "log" and ax.yaxis.get_major_formatter()(5000.0, 0) == "5,000"
    assert type(ax.yaxis.get_minor_formatter()).__name__ == "NullFormatter"


PUBLISHED = [
    {"result": "first", "role": "check", "published_gain": 0.4, "measured_gain": 0.3, "implied_ms_per_turn": 50.0,
     "testbed_ms_per_turn": 40.0, "gain_low": 0.24, "gain_high": 0.33},
    {"result": "a calibration result whose name is long enough to wrap over more than one line of the axis",
     "role": "calibration", "published_gain": 0.2, "measured_gain": 0.25, "implied_ms_per_turn": 100.0,
     "testbed_ms_per_turn": 90.0},
]
TRENDS = [{"tok_s": 65, "gain_chained_vs_http": 0.1, "gain_low": 0.05, "gain_high": 0.12},
          {"tok_s": 1000, "gain_chained_vs_http": 0.3, "gain_low": 0.28, "gain_high": 0.31}]


def test_the_published_results_panels(subplots):
    left, middle, right = subplots(1, 3)
    figures.published_plot((left, middle, right), PUBLISHED, TRENDS, agreement_factor=3.0)
    # Published then testbed gains, in %; the calibration row hatched.
    assert rectangles(left) == [(0.0, 40.0, 1.0, 0.38, None), (0.0, 20.0, 0.0, 0.38, "//"), (0.0, 30.0, 0.62, 0.38, None),
                                (0.0, 25.0, -0.38, 0.38, "//")]
    assert texts(left.get_yticklabels()) == [
        "0: first", "1: a calibration result whose name\nis long enough to wrap over more\nthan [...]"]
    assert (left.get_xlabel(), left.get_title()) == ("gain, % (1 - design / baseline)", "Published vs testbed gain")
    assert texts(left.get_legend().get_texts()) == ["published", "testbed", "calibration row", "testbed's 95% interval (tasks)"]
    # Each key as the bars it names: published, testbed, the calibration row's hatch.
    keys = left.get_legend().legend_handles
    assert [key(h)[0] for h in keys[:2]] == [key(bar)[0] for bar in left.patches[::2]] and keys[2].get_hatch() == "//"
    # The measured gain's interval on its bar; a row without one (the calibration's single task) has none.
    assert whisker_segments(left) == [[((24.0, 0.81), (33.0, 0.81)), ((25.0, -0.19), (25.0, -0.19))]]
    # Implied and removed overhead in ms, on a log scale, with the calibration's band x/÷3 and its line.
    assert [p[:4] for p in rectangles(middle)[:4]] == [
        (0.0, 50.0, 1.0, 0.38), (0.0, 100.0, 0.0, 0.38), (0.0, 40.0, 0.62, 0.38), (0.0, 90.0, -0.38, 0.38)]
    (band,) = middle.patches[4:]
    assert (band.get_x(), band.get_x() + band.get_width()) == pytest.approx((100 / 3, 300.0))
    assert [list(line.get_xdata()) for line in middle.lines] == [[100.0, 100.0]]
    assert texts(middle.get_yticklabels()) == ["0", "1"] and middle.get_xscale() == "log"
    assert (middle.get_xlabel(), middle.get_title()) == ("ms per turn (per first token for TTFT rows)", "Overhead the published gain implies")
    assert texts(middle.get_legend().get_texts()) == [
        "implied by the published gain", "removed in the testbed", "calibration's implied value, x/÷3"]
    keys = [key(h)[0] for h in middle.get_legend().legend_handles]
    assert keys == [key(middle.patches[0])[0], key(middle.patches[2])[0], key(band)[0]] and keys[0] != keys[1]
    assert to_hex(middle.lines[0].get_color()) == keys[2]
    # The gain by decode speed with its intervals.
    line = right.lines[0]
    assert (list(line.get_xdata()), list(line.get_ydata())) == ([65, 1000], [10.0, 30.0])
    assert whisker_segments(right) == [[((65.0, 5.0), (65.0, 12.0)), ((1000.0, 28.0), (1000.0, 31.0))]]
    assert right.get_xscale() == "log" and right.get_ylim()[0] == 0
    assert (right.get_xlabel(), right.get_ylabel(), right.get_title()) == (
        "decode speed (tokens/s)", "chained vs http gain, %", "Direction check: gain by decode speed")


def test_the_published_panels_agree_within_a_factor_of_2_by_default_and_cut_a_long_name(subplots):
    axes = subplots(1, 3)
    # A name one past the 80 kept; intervals narrower than a point of gain; one speed.
    narrow = [{**PUBLISHED[0], "result": "r" * 78, "gain_low": 0.298, "gain_high": 0.305}, PUBLISHED[1]]
    figures.published_plot(axes, narrow, [{"tok_s": 65, "gain_chained_vs_http": 0.1, "gain_low": 0.099, "gain_high": 0.104}])
    assert axes[0].get_yticklabels()[0].get_text() == "0: [...]"
    assert whisker_segments(axes[0])[0][0] == ((29.8, 0.81), (30.5, 0.81))
    assert whisker_segments(axes[2]) == [[((65.0, 9.9), (65.0, 10.4))]]
    (band,) = axes[1].patches[4:]
    assert (band.get_x(), band.get_x() + band.get_width()) == pytest.approx((50.0, 200.0))
    assert texts(axes[1].get_legend().get_texts())[2] == "calibration's implied value, x/÷2"
    axes = subplots(1, 3)
    figures.published_plot(axes, PUBLISHED[:1], [{"tok_s": 65, "gain_chained_vs_http": 0.1}])  # no calibration row: no band, no line
    assert texts(axes[1].get_legend().get_texts()) == ["implied by the published gain", "removed in the testbed"]
    assert list(axes[1].lines) == [] and whisker_segments(axes[2]) == []  # speeds without intervals: no whisker


# --- compare's figure ---------------------------------------------------------------------------------------


def task_row(design, tps, e2e, *, ttft=(0.1,), turns=2, sent=1000.0, phases=None):
    return {"design": design, "decode_tps": tps, "e2e_s": e2e, "ttft_s": np.array(ttft), "turns": turns,
            "bytes_sent_per_turn": sent, "phase_totals_s": phases or {}}


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


W = 0.8 / 3  # three designs' bars side by side at each speed
LEFTS = [-0.4 + W * i + s for i in range(3) for s in (0, 1)]  # http, chained, suspended at 65 and 1000 tok/s
CENTRES = [round(x + W / 2, 6) for x in LEFTS]


def heights(ax):
    return list(r6(p.get_height() for p in ax.patches))


def design_colours(fig):
    """Each panel's bars, as the place in the figure's legend of the key in their colour (None: no key's)."""
    keys = [h.get_facecolor() for h in fig.legends[0].legend_handles]
    return [[keys.index(p.get_facecolor()) if p.get_facecolor() in keys else None for p in a.patches] for a in fig.axes]


def test_compares_panels_show_each_designs_statistic_at_each_speed_with_its_interval_and_every_task(tmp_path, drawn):
    rows = rows_of_three_designs()
    path = figures.compare_figure([{"tasks": 3}, {"tasks": 9}], rows, tmp_path / "a" / "deep" / "c.png", workload="W", clock="C")
    assert path == tmp_path / "a" / "deep" / "c.png" and path.read_text() == "c.png"
    (fig,) = drawn
    e2e_ax, ttft_ax, bytes_ax, api_ax, turn_ax = fig.axes
    assert fig.get_suptitle() == "compare: W, n = 3, 9 tasks per design and speed, C"
    assert [(a.get_title(), a.get_ylabel()) for a in (e2e_ax, ttft_ax, bytes_ax, api_ax)] == [
        ("End to end per task: mean, 95% interval, tasks", "seconds per task"),
        ("Time to first token per turn: median, 95% interval", "ms per turn"),
        ("Bytes sent per turn (client to server)", "kB per turn"),
        ("Where the API's time goes per turn (total on top); tool time is on the right", "ms per turn")]
    for a in (e2e_ax, ttft_ax, bytes_ax):
        assert [r6((p.get_x(), p.get_width())) for p in a.patches] == [r6((x, W)) for x in LEFTS]
        assert texts(a.get_xticklabels()) == ["65 tok/s", "1000 tok/s"] and a.get_xlim() == (-0.5, 1.5)
    assert texts(fig.legends[0].get_texts()) == ["http", CHAINED, SUSPENDED]
    assert design_colours(fig) == [[0, 0, 1, 1, 2, 2]] * 3 + [[k // 12 for k in range(36)], [0, 1, 2] * 4]  # one per design
    assert turn_ax.get_title() == "A turn's time at 1000 tok/s"  # the second of two speeds
    # End to end: the mean task; time to first token: the median turn; no bar where a design did not run.
    assert heights(e2e_ax) == [20.0, None, 5.0, round(1016 / 9, 6), None, 3.0]
    assert heights(ttft_ax) == [200.0, None, 200.0, 50.0, None, 50.0]
    # Each bar's interval over the tasks (a single task has none: a bar of no length at its value).
    points = [("http", 65, CENTRES[0]), (CHAINED, 65, CENTRES[2]), (CHAINED, 1000, CENTRES[3]), (SUSPENDED, 1000, CENTRES[5])]
    estimates = {(d, tps): benchmark.estimates([r for r in rows if (r["design"], r["decode_tps"]) == (d, tps)], None)
                 for d, tps, _ in points}
    for a, name in ((e2e_ax, "e2e_mean_s"), (ttft_ax, "ttft_p50_ms")):
        intervals = {seg[0][0]: (seg[0][1], seg[1][1]) for segments in whisker_segments(a) for seg in segments}
        for design, tps, x in points:
            e = estimates[(design, tps)][name]
            assert intervals[x] == pytest.approx((e.low, e.high) if e.has_interval else (e.value, e.value)), (name, design, tps)
    assert 10.0 <= estimates[("http", 65)]["e2e_mean_s"].low < 20.0 < estimates[("http", 65)]["e2e_mean_s"].high <= 30.0
    # Every task a dot; the scale's top 1.15 x the highest end of an interval; the 1000 s task beyond it a triangle on
    # the top edge, drawn whole, with its value above it.
    top = 1.15 * max(e["e2e_mean_s"].high if e["e2e_mean_s"].has_interval else e["e2e_mean_s"].value for e in estimates.values())
    assert e2e_ax.get_ylim() == pytest.approx((0.0, top)) and top < 1000.0
    scattered = [([r6(p) for p in c.get_offsets()], c.get_clip_on(), c.get_paths()[0].vertices.tolist())
                 for c in e2e_ax.collections if type(c).__name__ == "PathCollection"]
    assert [points for points, _, _ in scattered] == [
        [(CENTRES[0], 10.0), (CENTRES[0], 20.0), (CENTRES[0], 30.0)], [], [(CENTRES[2], 5.0)], [(CENTRES[3], 2.0)] * 8,
        [(CENTRES[3], round(top, 6))], [], [(CENTRES[5], 3.0)]]
    assert scattered[4][1] is False and scattered[4][2] != scattered[0][2]  # a mark of its own, not a task's dot
    assert [(t.get_text(), r6(t.xy)) for t in e2e_ax.texts] == [("1000", (CENTRES[3], round(top, 6)))]
    box, (x, y) = e2e_ax.texts[0].get_window_extent(fig.canvas.get_renderer()), e2e_ax.transData.transform((CENTRES[3], top))
    assert box.x0 < x < box.x1 and y < box.y0  # the value centred above its triangle
    # Bytes per turn in kB, written on each bar.
    assert heights(bytes_ax) == [2.0, 0.0, 0.5, 0.5, 0.0, 0.12] and texts(bytes_ax.texts) == ["2", "0", "0", "0", "0", "0"]


def test_compares_bars_take_the_tables_estimates_when_it_has_them(tmp_path, drawn):
    table = [{"design": "http", "decode_tps": 65, "tasks": 3, "e2e_mean_s": 21.0, "e2e_mean_s_low": 12.0, "e2e_mean_s_high": 27.0,
              "ttft_p50_ms": 90.0, "ttft_p50_ms_low": 80.0, "ttft_p50_ms_high": 150.0}]
    figures.compare_figure(table, [task_row("http", 65, e) for e in (10.0, 20.0, 30.0)], tmp_path / "c.svg")
    e2e_ax, ttft_ax = drawn[0].axes[:2]
    assert (heights(e2e_ax), heights(ttft_ax)) == ([21.0], [90.0])
    assert whisker_segments(e2e_ax) == [[((0.0, 12.0), (0.0, 27.0))]] and whisker_segments(ttft_ax) == [[((0.0, 80.0), (0.0, 150.0))]]
    rows = [task_row("http", 65, e) for e in (10.0, 20.0, 30.0)] + [task_row("http", 1000, 4.0), task_row(CHAINED, 65, 5.0)]
    figures.compare_figure(table, rows, tmp_path / "d.svg")  # the table's row for its own design and speed alone
    assert heights(drawn[1].axes[0]) == [21.0, 4.0, 5.0, None]


def test_compares_api_stages_stack_hatched_as_their_legend_shows_and_no_panel_or_caption_overlaps_another(tmp_path, drawn):
    figures.compare_figure([{"tasks": 3}], rows_of_three_designs(), tmp_path / "c.svg")
    (fig,) = drawn
    e2e_ax, ttft_ax, bytes_ax, api_ax, turn_ax = fig.axes
    hatches = figures.PHASE_HATCHES
    assert len(set(hatches.values())) == len(figures.API_PHASES)  # no two stages look alike
    # ms per turn: http 2-turn tasks (validate 1, safety 0.5, render 2, route 1.5, store_read 0.25, post 3); chained at
    # 65 one 4-turn task (validate 1), at 1000 as http; suspended at 1000 one turn (post 2).
    http = [1.0, 0.5, 2.0, 1.5, 0.25, 3.0]
    stacks = [(http, [0.0] * 6), ([1.0, 0, 0, 0, 0, 0], http), ([0.0] * 6, [0, 0, 0, 0, 0, 2.0])]
    expected = []
    for i, (at65, at1000) in enumerate(stacks):
        bottoms = [0.0, 0.0]
        for k, phase in enumerate(figures.API_PHASES):
            for s, values in enumerate((at65, at1000)):
                expected.append((*r6((-0.4 + W * i + s, bottoms[s], values[k])), hatches[phase]))
            bottoms = [bottoms[0] + at65[k], bottoms[1] + at1000[k]]
    assert [(*r6((p.get_x(), p.get_y(), p.get_height())), p.get_hatch()) for p in api_ax.patches] == expected
    assert [(t.get_text(), r6(t.xy)) for t in api_ax.texts] == [  # the total on top of each stack
        (f"{t:.0f}", (x, t)) for x, t in zip(CENTRES, [8.25, 0.0, 1.0, 8.25, 0.0, 2.0])]
    legend = api_ax.get_legend()
    assert texts(legend.get_texts()) == list(figures.API_PHASES)
    assert [h.get_hatch() for h in legend.legend_handles] == [hatches[p] for p in figures.API_PHASES]
    assert api_ax.get_ylim() == pytest.approx((0.0, 8.25 * 1.05 * 1.2))  # room above the stacks for the legend
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    # The turn panel's design names (the longest, "suspended") stay clear of the API panel on their left.
    assert min(t.get_window_extent(renderer).x0 for t in turn_ax.get_yticklabels()) > api_ax.get_window_extent(renderer).x1
    for left, right in ((e2e_ax, ttft_ax), (ttft_ax, bytes_ax)):
        assert left.get_tightbbox(renderer).x1 < right.get_tightbbox(renderer).x0
    # The caption sits under every panel and names each kind of mark the panels draw.
    (caption,) = [t for t in fig.texts if t.get_text() != fig.get_suptitle()]
    assert caption.get_window_extent(renderer).y1 < min(a.get_tightbbox(renderer).y0 for a in fig.axes)
    assert min(a.get_tightbbox(renderer).y0 for a in fig.axes[:3]) > max(a.get_tightbbox(renderer).y1 for a in fig.axes[3:])
    assert caption.get_text().replace("\n", " ") == figures.COMPARE_CAPTION  # wrapped between words, nothing added
    for mark in ("mean per task", "median turn", "95% interval", "Dots", "▲", "hatch"):
        assert mark in caption.get_text().replace("\n", " ")


def test_compares_turn_panel_splits_a_turn_at_the_middle_speed(tmp_path, drawn):
    rows = rows_of_three_designs() + [task_row(SUSPENDED, 8000, 1.0, phases={"tool": 9.0})]
    figures.compare_figure([{"tasks": 3}], rows, tmp_path / "c.svg")
    turn_ax = drawn[0].axes[4]
    assert (turn_ax.get_title(), turn_ax.get_xlabel()) == ("A turn's time at 1000 tok/s", "seconds per turn")
    # Seconds per turn at 1000 tok/s: http has no task there; chained 2-turn tasks (tool 0.5, model 0.1, API 0.00825,
    # network 0.05); suspended one turn (model 0.8, API 0.002, network 0.05).
    parts = {"http": [0, 0, 0, 0], CHAINED: [0.5, 0.1, 0.00825, 0.05], SUSPENDED: [0, 0.8, 0.002, 0.05]}
    expected, lefts = [], dict.fromkeys(parts, 0.0)
    for k, part in enumerate(figures.TURN_PARTS):
        for y, design in enumerate(parts):
            expected.append((*r6((lefts[design], y - 0.3, parts[design][k], 0.6)), figures.PART_HATCHES[part]))
            lefts[design] += parts[design][k]
    assert [(*r6((p.get_x(), p.get_y(), p.get_width(), p.get_height())), p.get_hatch()) for p in turn_ax.patches] == expected
    assert len(set(figures.PART_HATCHES.values())) == len(figures.TURN_PARTS)
    assert [(t.get_text(), r6(t.get_position())) for t in turn_ax.texts] == [(" 0.00 s", (0.0, 0.0)), (" 0.66 s", (0.65825, 1.0)),
                                                                 (" 0.85 s", (0.852, 2.0))]
    assert texts(turn_ax.get_yticklabels()) == ["http", CHAINED, SUSPENDED] and turn_ax.yaxis_inverted()
    assert turn_ax.get_xlim() == pytest.approx((0.0, 0.852 * 1.3))
    legend = turn_ax.get_legend()
    assert texts(legend.get_texts()) == list(figures.TURN_PARTS)
    assert [h.get_hatch() for h in legend.legend_handles] == [figures.PART_HATCHES[p] for p in figures.TURN_PARTS]


def test_compares_scale_keeps_a_task_exactly_at_its_top_as_a_dot_and_its_title_counts_the_tasks(tmp_path, drawn):
    # Ten 10 s http tasks: an exact mean, so the scale stops at 11.5 s; a task of exactly 11.5 s elsewhere is a dot.
    rows = [task_row("http", 65, 10.0)] * 10 + [task_row(CHAINED, 65, e) for e in [1.0] * 9 + [11.5]]
    figures.compare_figure([], rows, tmp_path / "c.svg")
    (fig,) = drawn
    e2e_ax = fig.axes[0]
    assert e2e_ax.get_ylim()[1] == pytest.approx(11.5)
    assert [len(c.get_offsets()) for c in e2e_ax.collections if type(c).__name__ == "PathCollection"] == [10, 10]
    assert list(e2e_ax.texts) == []
    # Without a table the n is the count of the first design's tasks at the first speed; of one task, it says so.
    assert fig.get_suptitle() == "compare: the 'coding' workload, n = 10 tasks per design and speed, virtual time"
    # A design the testbed does not know comes after those it knows, in a colour of its own; a scale under 1 s.
    path = figures.compare_figure([], [task_row("other", 65, 0.5), task_row(SUSPENDED, 65, 0.5)], str(tmp_path / "c.png"))
    assert path == tmp_path / "c.png" and drawn[1].get_suptitle() == (
        "compare: the 'coding' workload, n = 1 task per design and speed, virtual time")
    assert texts(drawn[1].legends[0].get_texts()) == [SUSPENDED, "other"] and design_colours(drawn[1])[0] == [0, 1]
    assert drawn[1].axes[0].get_ylim()[1] == pytest.approx(0.575)
    assert drawn[1].axes[4].get_xlim() == (0.0, 1.0)  # nothing per turn: a unit scale
    with pytest.warns(UserWarning):  # tasks of no time: drawn (Matplotlib warns of the flat scale), on a widened scale
        figures.compare_figure([], [task_row(SUSPENDED, 65, 0.0)], tmp_path / "z.svg")
    assert drawn[2].axes[0].get_ylim()[1] > 0 and drawn[2].axes[3].get_ylim()[0] == 0  # the API's scale from 0 still


# --- the sensitivity tornados -------------------------------------------------------------------------------

PANEL = figures.TornadoPanel("T", 10.0, (("a", 9.0, 12.0), ("flat", 10.0, 10.0), ("b", 5.0, 20.0), ("c", 10.0, 11.0)))


def test_a_tornado_draws_the_widest_span_on_top_each_end_in_the_legends_colour(ax, subplots):
    figures.tornado(ax, PANEL)
    low, high = figures.TORNADO_LOW, figures.TORNADO_HIGH
    assert [(*r6((p.get_x(), p.get_width(), p.get_y())), to_hex(p.get_facecolor())) for p in ax.patches] == [
        (10.0, -5.0, -0.35, low), (10.0, 10.0, -0.35, high), (10.0, -1.0, 0.65, low), (10.0, 2.0, 0.65, high),
        (10.0, 0.0, 1.65, low), (10.0, 1.0, 1.65, high)]
    assert texts(ax.get_yticklabels()) == ["b", "a", "c"] and ax.yaxis_inverted() and ax.get_title() == "T"
    assert [list(line.get_xdata()) for line in ax.lines] == [[10.0, 10.0]] and list(ax.texts) == []
    assert whisker_segments(ax) == []  # a panel without intervals draws no whisker and no band
    axes = subplots(1, 4)
    figures.tornado(axes[0], PANEL, top=1)
    assert texts(axes[0].get_yticklabels()) == ["b"]
    figures.tornado(axes[1], figures.TornadoPanel("S", 1.0, (("flat", 1.0, 1.0),), default_interval=(0.5, 2.5)))  # no bar, the band
    assert texts(axes[1].texts) == ["no parameter moves it"] and len(axes[1].patches) == 1
    axes[1].figure.canvas.draw()  # the note in the middle of the panel
    assert axes[1].texts[0].get_window_extent().get_points().mean(axis=0) == pytest.approx(
        axes[1].get_window_extent().get_points().mean(axis=0), abs=1.0)
    figures.tornado(axes[2], figures.TornadoPanel("E", 1.0, (("lo", 0.5, 1.0), ("hi", 1.0, 3.0))))
    assert texts(axes[2].get_yticklabels()) == ["hi", "lo"]
    figures.tornado(axes[3], figures.TornadoPanel("T", 10.0, tuple((f"p{k}", 9.0 - k, 11.0 + k) for k in range(8))))
    assert texts(axes[3].get_yticklabels()) == ["p7", "p6", "p5", "p4", "p3", "p2"]  # six unless told otherwise


def test_a_tornado_draws_each_ends_interval_where_the_panel_says_and_the_defaults_band(ax):
    # Per bar, the low end's and the high end's interval; an end outside its interval is drawn to it from the value.
    intervals = (((8.0, 8.5), (11.0, 13.0)), ((1.0, 2.0), (3.0, 4.0)), ((4.0, 7.0), (21.0, 22.0)))
    figures.tornado(ax, figures.TornadoPanel("I", 10.0, PANEL.bars[:3], default_interval=(9.5, 10.5), intervals=intervals))
    assert texts(ax.get_yticklabels()) == ["b", "a"]  # the flat bar's interval is dropped with it
    assert whisker_segments(ax) == [[((4.0, 0.0), (7.0, 0.0))], [((20.0, 0.0), (22.0, 0.0))], [((8.0, 1.0), (9.0, 1.0))],
                                    [((11.0, 1.0), (13.0, 1.0))]]
    assert [list(line.get_xdata()) for line in ax.lines] == [[4.0], [7.0], [20.0], [22.0], [8.0], [9.0], [11.0], [13.0],
                                                             [10.0, 10.0]]  # each whisker capped at both ends
    band = ax.patches[-1]  # the default's interval, the panel's full height
    assert r6((band.get_x(), band.get_width(), band.get_y(), band.get_height())) == (9.5, 1.0, 0.0, 1.0) and len(ax.patches) == 5


def test_a_tornado_figure_lays_the_panels_in_rows_under_its_title_and_legend(tmp_path, drawn):
    path = figures.tornado_figure([PANEL] * 4, str(tmp_path / "deep" / "t.png"), title="Tornados", columns=3)
    assert path == tmp_path / "deep" / "t.png" and path.read_text() == "t.png"
    fig = drawn[0]
    assert [a.get_visible() for a in fig.axes] == [True] * 4 + [False] * 2
    assert texts([a.title for a in fig.axes[:4]]) == ["T"] * 4 and fig.get_suptitle() == "Tornados"
    assert texts(fig.legends[0].get_texts()) == ["parameter at its low end", "parameter at its high end"]
    assert [key(h)[0] for h in fig.legends[0].legend_handles] == [figures.TORNADO_LOW, figures.TORNADO_HIGH]
    figures.tornado_figure([PANEL], tmp_path / "t.svg", columns=1)
    assert len(drawn[1].axes) == 1 and drawn[1].get_suptitle() == ""
    figures.tornado_figure([], tmp_path / "e.png")
    assert len(drawn[2].axes) == 3 and not any(a.get_visible() for a in drawn[2].axes)
    # Twelve panels: four rows, all inside the figure and below the top 4% left for the title and legend.
    figures.tornado_figure([PANEL] * 12, tmp_path / "a" / "b" / "t.svg", title="Twelve conclusions")
    boxes = [a.get_position() for a in drawn[3].axes]
    assert len(boxes) == 12 and len({round(b.y0, 6) for b in boxes}) == 4
    assert all(0 < b.x0 and b.x1 < 1 and 0 < b.y0 and b.y1 <= 0.96 for b in boxes)
    drawn[3].canvas.draw()  # the legend's two entries side by side, it and the title above every panel
    renderer, legend = drawn[3].canvas.get_renderer(), drawn[3].legends[0]
    assert len({t.get_window_extent(renderer).y0 for t in legend.get_texts()}) == 1
    top = max(a.get_tightbbox(renderer).y1 for a in drawn[3].axes)
    (title,) = [t for t in drawn[3].texts if t.get_text() == "Twelve conclusions"]
    assert top < legend.get_window_extent(renderer).y0 and top < title.get_window_extent(renderer).y0


@pytest.mark.parametrize("draw", ["compare", "tornado"])
def test_each_figure_is_written_as_the_image_its_suffix_names_with_nothing_cut_off_at_an_edge(tmp_path, draw):
    rows = [task_row(SUSPENDED, 65, 3.0)]
    for suffix, head in ((".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")):
        target = tmp_path / draw / f"figure{suffix}"
        path = figures.compare_figure([], rows, target) if draw == "compare" else figures.tornado_figure([PANEL], target, columns=1)
        assert path.read_bytes().lstrip()[:len(head)] == head
    ink = (matplotlib.image.imread(tmp_path / draw / "figure.png")[..., :3] < 0.9).any(axis=2)
    assert not (ink[:2].any() or ink[-2:].any() or ink[:, :2].any() or ink[:, -2:].any())  # nothing cut off at an edge
    assert plt.get_fignums() == []  # closed once written
