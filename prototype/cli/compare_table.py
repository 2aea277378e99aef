"""What `python -m prototype compare` prints: the table (the columns of TABLE, or every column of compare.csv with
`--wide`: units in the headers, an interval under each estimate, a legend under it), the headline under it (each
design's TTFT ratio and end-to-end gain against http with their intervals) and the modeled parameters with their
sources."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from typing import Any

import attrs

from .. import analysis, benchmark, uncertainty


@attrs.frozen
class Column:
    """A column of the printed table: the CSV field, its header with the unit, how a cell prints, and what the
    legend under the table says of it (empty: the header says enough). A column with a `template` is an estimate:
    its cell prints the value and its 95% interval (`<field>_low`, `<field>_high`) in that format, times `scale`."""

    field: str
    header: str
    cell: Callable[[Any], str]
    legend: str = ""
    template: str = ""
    scale: float = 1.0

    def show(self, row: dict[str, Any]) -> str:
        value = row.get(self.field)
        if not self.template or f"{self.field}_low" not in row or value is None or value != value:
            return self.cell(value)
        if row[f"{self.field}_low"] == row[f"{self.field}_high"] == value:
            return self.cell(value)  # an exact figure (http against itself): no interval to print
        return benchmark.interval_of(row, self.field).scaled(self.scale).format(self.template)


def _number(template: str, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda value: "-" if value is None or value != value else template.format(value * scale)


# The table a reader needs first: what ran, how long a task took, the gain over http, time to first
# token, the API's share of the time and the upload per turn; `--wide` adds the rest.
TABLE = (
    Column("design", "design", str),
    Column("decode_tps", "tok/s", _number("{:,.0f}")),
    Column("e2e_mean_s", "e2e mean (s)", _number("{:,.0f}"), "end-to-end time per task, first request to final answer, "
           "mean over the tasks (as in compare.png)", "{:,.0f}"),
    Column("speedup_vs_http", "vs http (x)", _number("{:.2f}"), "total http time / total time of this design, same tasks: "
           "the ratio of the means", "{:.2f}"),
    Column("ttft_p50_ms", "TTFT p50 (ms)", _number("{:,.0f}"), "per turn, request sent to first output delta", "{:,.0f}"),
    Column("api_overhead_share", "API (%)", _number("{:.1f}", 100),
           "api_overhead_share, the API's own work (validate, safety, render, route, store reads, blocking "
           "post-inference) as a share of end-to-end time"),
    Column("bytes_sent_per_turn", "sent/turn (kB)", _number("{:,.1f}", 1e-3),
           "client-to-server payload per turn, all the tasks' bytes over all their turns (as in compare.png)"),
)
WIDE = (
    *TABLE[:2],
    Column("tasks", "tasks", str),
    *TABLE[2:3],
    Column("e2e_p50_s", "e2e p50 (s)", _number("{:,.1f}"), "the same, the median task", "{:,.1f}"),
    Column("e2e_p90_s", "e2e p90 (s)", _number("{:,.1f}")),
    *TABLE[3:4],
    Column("gain_vs_http", "gain (%)", _number("{:.1f}", 100), "1 - total time of this design / total http time", "{:.1f}", 100),
    *TABLE[4:5],
    Column("ttft_p50_ratio_vs_http", "TTFT/http (x)", _number("{:.2f}"), "this design's TTFT p50 / http's", "{:.2f}"),
    *TABLE[5:],
    Column("bytes_received_per_turn", "recv/turn (kB)", _number("{:,.1f}", 1e-3), "server-to-client payload per turn, the same way"),
    Column("cached_share", "cached (%)", _number("{:.1f}", 100),
           "cached_share, the share of input tokens found in the engine's prefix cache (not prefilled again)"),
    Column("reasoning_share", "reasoning (%)", _number("{:.1f}", 100), "reasoning tokens as a share of output tokens"),
    Column("web_searches_per_task", "searches/task", _number("{:.2f}"), "hosted web_search calls per task"),
    Column("calls_per_tool_turn", "calls/tool turn", _number("{:.2f}"), "client function calls per turn that ended in calls"),
    Column("reconnects", "reconnects", str, "new connections the clients opened because one ended before the task did "
           "(the 60-minute connection limit, or a fault); --reconnect picks the policy"),
)


INTERVALS_LEGEND = ("[low, high]: the 95% interval over the tasks (bootstrap; a ratio to http resamples the tasks of "
                    "both designs together, as they ran the same tasks)")


def print_compare_table(table: list[dict[str, Any]], wide: bool = False) -> None:
    """The table with units in the headers and one number format per column, an estimate's cell with its interval,
    then its legend. `wide`: every column of compare.csv (one this module does not know prints under its CSV name,
    an interval's ends in their estimate's cell)."""
    columns = list(WIDE if wide else TABLE)
    if wide:
        known = {c.field for c in columns} | {f"{c.field}{end}" for c in columns if c.template for end in ("_low", "_high")}
        columns += [Column(field, field, analysis.format_value) for field in table[0] if field not in known]
    cells = [{c.field: c.show(row) for c in columns} for row in table]
    analysis.print_table(cells, [c.field for c in columns], formats={c.field: str for c in columns},
                         headers={c.field: c.header for c in columns})
    for column in columns:
        if column.legend:
            print(textwrap.fill(f"{column.header}: {column.legend}", 100, initial_indent="  ", subsequent_indent="      "))
    if any(c.template and f"{c.field}_low" in table[0] for c in columns):
        print(textwrap.fill(INTERVALS_LEGEND, 100, initial_indent="  ", subsequent_indent="      "))


def print_headline(table: list[dict[str, Any]]) -> None:
    """Each design against http at each speed: the TTFT ratio and the end-to-end gain with their intervals, and
    whether the gain's interval excludes 0 (a claim of faster or slower holds only then)."""
    rows = [r for r in table if r["design"] != benchmark.HTTP and r.get("gain_vs_http_low", math.nan) == r.get("gain_vs_http_low")]
    if not rows:
        return
    print(f"\nAgainst http on the same {rows[0]['tasks']} tasks, with 95% intervals (paired bootstrap over the tasks):")
    zero = uncertainty.Estimate(0.0, 0.0, 0.0, rows[0]["tasks"], "tasks", "exact")
    for row in rows:
        ratio = benchmark.interval_of(row, "ttft_p50_ratio_vs_http")
        gain = benchmark.interval_of(row, "gain_vs_http")
        verdict = {"yes": "slower", "no": "faster", "not separated": "not separated from 0"}[uncertainty.holds(gain, zero)]
        print(f"  {row['design']:<11} at {row['decode_tps']:>5,.0f} tok/s: TTFT p50 {ratio.format('{:.2f}')} of http's; "
              f"end-to-end gain {gain.scaled(100).format('{:+.1f}%')} ({verdict})")


PARAMETER_COLUMN = 44


def print_parameters(parameters: list[tuple[str, str, str]]) -> None:
    """Name, value and source in three columns; a value wider than its column wraps within it, so the sources stay
    in theirs."""
    for name, value, source in parameters:
        lines = textwrap.wrap(value, PARAMETER_COLUMN, break_on_hyphens=False) or [""]
        print(f"  {name:<{PARAMETER_COLUMN}} {lines[0]:<{PARAMETER_COLUMN}} {source}")
        for line in lines[1:]:
            print(f"  {'':<{PARAMETER_COLUMN}} {line}")

