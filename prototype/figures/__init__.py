"""Figures: one colour per phase and per design, timelines, phase bars, sweep curves, the
published-results panels and the `compare` figure. Matplotlib is imported by the functions that
draw, never at import time. One module per figure family:

* style.py: `PHASE_COLORS`, one colour per phase, shared by every figure and every design, so a reader can
  compare a suspended, a chained and an http timeline at a glance; `DESIGN_COLORS` and `DESIGN_MARKERS`.
* timelines.py: `timeline(ax, records)`, per-turn phase spans of one rollout per design, from the server's
  timing events (`TurnRecord.server_timing`: "spans" [phase, start_ms, end_ms] from "origin_s"),
  with the client's tool runs, the protocol events and what the server keeps across each pause;
  `phase_bars(ax, totals_by_label)`, where each design's end-to-end time goes, stacked by phase.
* sweeps.py: `sweep_plot(ax, table, key, metric)`, one line per design over a swept parameter;
  `published_plot(axes, rows, trends)`, the published-results notebook's three panels.
* compare.py: `compare_figure(table, rows, path)`, `python -m prototype compare`'s figure, around its question:
  per design and decode speed, end-to-end time per task (p50, p90, every task), time to first
  token and bytes sent per turn, and where a turn's API time goes, with the tool time, which dwarfs
  it, in a panel of its own; one colour per design in every panel.
* tornados.py: `tornado_figure(panels, path)`, `experiments.sensitivity`'s tornados, one per conclusion: how far
  each assumed parameter moves it from its low to its high end.
"""

from .compare import (
    API_PHASES,
    COMPARE_CAPTION,
    HATCH_COLOR,
    HATCH_WIDTH,
    PART_HATCHES,
    PHASE_HATCHES,
    TURN_PARTS,
    compare_figure,
)
from .compare import _color as _color
from .compare import _groups as _groups
from .compare import _per_turn as _per_turn
from .style import DESIGN_COLORS, DESIGN_MARKERS, PHASE_COLORS, PHASE_LABELS, PHASE_ORDER
from .sweeps import log_axis, published_plot, sweep_plot
from .timelines import EVENT_MARKS, annotate_tool_call_point, phase_bars, timeline, turn_spans
from .tornados import TORNADO_HIGH, TORNADO_LOW, TornadoPanel, tornado, tornado_figure

__all__ = [
    "API_PHASES", "COMPARE_CAPTION", "DESIGN_COLORS", "DESIGN_MARKERS", "EVENT_MARKS", "HATCH_COLOR", "HATCH_WIDTH",
    "PART_HATCHES", "PHASE_COLORS", "PHASE_HATCHES", "PHASE_LABELS", "PHASE_ORDER", "TORNADO_HIGH", "TORNADO_LOW",
    "TURN_PARTS", "TornadoPanel", "annotate_tool_call_point", "compare_figure", "log_axis", "phase_bars", "published_plot",
    "sweep_plot", "timeline", "tornado", "tornado_figure", "turn_spans",
]
