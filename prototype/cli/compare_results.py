"""What a `python -m prototype compare` run writes: compare.csv, compare.json (with its "headline" section: the
figures with their intervals over the tasks, which `python -m prototype figures` copies into docs/figures/),
compare_tasks.json and compare.png."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

from .. import analysis, benchmark, figures, headline, uncertainty
from .common import plural
from .compare_table import TABLE, WIDE


def headline_estimates(table: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> dict[str, uncertainty.Estimate]:
    """compare's headline figures by key (prototype/headline.py): per design other than http and per speed, the
    median TTFT's ratio to http's and the end-to-end gain over http; per design and speed, the mean end-to-end time
    and the median TTFT; from the task rows, when given, the bytes sent per turn (kB), http's upload over each
    design's and the share of the time spent in the client's tools, each with its 95% interval over the tasks."""
    figures: dict[str, uncertainty.Estimate] = {}
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows or []:
        groups.setdefault((r["design"], r["decode_tps"]), []).append(r)
    for row in (r for r in table if "e2e_mean_s_low" in r):
        at = f"{row['design']}.{row['decode_tps']:g}"
        figures[f"e2e_mean_s.{at}"] = benchmark.interval_of(row, "e2e_mean_s")
        figures[f"ttft_p50_ms.{at}"] = benchmark.interval_of(row, "ttft_p50_ms")
        if row["design"] != benchmark.HTTP and row["speedup_vs_http"] == row["speedup_vs_http"]:
            figures[f"ttft_ratio.{at}"] = benchmark.interval_of(row, "ttft_p50_ratio_vs_http")
            figures[f"gain.{at}"] = benchmark.interval_of(row, "gain_vs_http")
            figures[f"speedup.{at}"] = benchmark.interval_of(row, "speedup_vs_http")
        group = groups.get((row["design"], row["decode_tps"]))
        if group:
            figures |= _task_figures(at, group, groups.get((benchmark.HTTP, row["decode_tps"])))
    return figures


def _task_figures(at: str, group: list[dict[str, Any]], http: list[dict[str, Any]] | None) -> dict[str, uncertainty.Estimate]:
    """The upload per turn (kB, all the drawn tasks' bytes over all their turns), http's over this design's on the same
    tasks, and the client tools' share of the end-to-end time."""
    n = len(group)
    sent = uncertainty.unit_total([r["bytes_sent_per_turn"] * r["turns"] for r in group])
    turns = uncertainty.unit_total([r["turns"] for r in group])
    tools = uncertainty.unit_total([r["phase_totals_s"].get(analysis.TOOL, 0.0) for r in group])
    e2e = uncertainty.unit_total([r["e2e_s"] for r in group])
    figures = {f"sent_kb.{at}": uncertainty.resample(n, lambda c: sent(c) / turns(c) / 1000),
               f"tool_share.{at}": uncertainty.resample(n, lambda c: tools(c) / e2e(c))}
    if http is not None and http is not group and [r["task"] for r in http] == [r["task"] for r in group]:
        their_sent = uncertainty.unit_total([r["bytes_sent_per_turn"] * r["turns"] for r in http])
        their_turns = uncertainty.unit_total([r["turns"] for r in http])
        figures[f"upload_ratio.{at}"] = uncertainty.resample(
            n, lambda c: (their_sent(c) / their_turns(c)) / (sent(c) / turns(c)), method="paired bootstrap")
    return figures


# How each headline figure prints in the docs (prototype/headline.py): template, scale.
# Units other than % are the sentence's, after the span: "742 [533, 835] ms".
FORMATS = {"e2e_mean_s": ("{:,.1f}", 1.0), "ttft_p50_ms": ("{:,.0f}", 1.0), "ttft_ratio": ("{:.2f}", 1.0),
           "gain": ("{:.1f}%", 100.0), "speedup": ("{:.3f}", 1.0), "sent_kb": ("{:,.1f}", 1.0),
           "upload_ratio": ("{:.1f}", 1.0), "tool_share": ("{:.0f}%", 100.0)}
# The table docs/results.md quotes: the printed table's columns with the download and the prefix cache's share.
DOCS_TABLE = (*TABLE, *(c for c in WIDE if c.field in ("bytes_received_per_turn", "cached_share")))


def write_results(out: Path, table: list[dict[str, Any]], rows: list[dict[str, Any]], parameters: list[tuple[str, str, str]],
                  workload: str, clock: str, *, command: str = "python -m prototype compare") -> list[str]:
    """compare.csv, compare.json (the table, the parameters, what ran and its headline section: the figures with their
    intervals over the tasks, which `python -m prototype figures` copies into docs/figures/), compare_tasks.json and
    compare.png in `out`; returns their names. `python -m prototype plot` writes the same from results folders."""
    analysis.write_csv(out / "compare.csv", table)
    tasks = max(collections.Counter((row["design"], row["decode_tps"]) for row in rows).values(), default=0)
    section = headline.section(
        "compare", command=command, workload=f"{plural(tasks, 'task')} of {workload}, {clock}",
        figures={key: headline.figure(e, FORMATS[key.split(".")[0]][0], scale=FORMATS[key.split(".")[0]][1])
                 for key, e in headline_estimates(table, rows).items()},
        tables={"table": headline.table([c.header for c in DOCS_TABLE], ([c.show(r) for c in DOCS_TABLE] for r in table))},
        data=rows)
    headline.write(out / "compare.json", {"table": table, "parameters": parameters, "workload": workload, "clock": clock,
                                          "headline": section})
    (out / "compare_tasks.json").write_text(json.dumps(rows))
    figures.compare_figure(table, rows, out / "compare.png", workload=workload, clock=clock)
    return ["compare.csv", "compare.json", "compare_tasks.json", "compare.png"]

