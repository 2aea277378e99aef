"""`python -m prototype plot FOLDER [FOLDER ...]`: compare's table and figure again from results folders,
without running anything.

Each FOLDER is one that `python -m prototype compare` wrote (compare.json and compare_tasks.json; e.g.
results/compare/latest). One folder is drawn again as it is (after a change to the figure's code, say);
several are merged into one table and one figure, their (design, decode speed) points side by side: a run at
8,000 tokens/s beside the default speeds, or http-stored run later beside the other designs. A merge refuses
what would not compare like with like: two folders holding the same point, folders whose modeled parameters
differ (other than the decode speeds each ran and the settings of a design only one of them ran), or one
clock against another. Prints the table as compare does and writes compare.csv, compare.json,
compare_tasks.json and compare.png into a new folder results/plot/<timestamp>/ (results/plot/latest points at
it), or into --out; never into docs/figures/, which `python -m prototype figures` regenerates from fresh runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from .. import benchmark
from . import compare
from .common import RunFolder, plural
from .figures import FIGURES

PROG = "python -m prototype plot"
# Rows of compare's parameter block that may differ between folders that merge: the speeds each ran, and the
# settings of a design that only some of them ran (compare prints those only when the design runs).
PER_RUN = ("decode speeds", "v1 suspension TTL", "http connections")


class PlotError(ValueError):
    """Folders that cannot be drawn, or not together."""


@attrs.frozen
class Results:
    """What one compare run left in its folder."""

    folder: Path
    rows: list[dict[str, Any]]
    parameters: list[tuple[str, str, str]]
    workload: str
    clock: str

    @property
    def points(self) -> set[tuple[str, float]]:
        return {(row["design"], float(row["decode_tps"])) for row in self.rows}


def read(folder: str | Path) -> Results:
    """A compare results folder. Folders written before compare.json named the workload and clock take them from
    the parameters (the workload) or say they were not recorded (the clock)."""
    folder = Path(folder)
    try:
        summary = json.loads((folder / "compare.json").read_text())
        rows = json.loads((folder / "compare_tasks.json").read_text())
    except FileNotFoundError as missing:
        raise PlotError(f"{folder} is not a compare results folder (no {Path(missing.filename).name})") from None
    except (OSError, ValueError) as unreadable:
        raise PlotError(f"{folder}: cannot read its results ({unreadable})") from None
    if not isinstance(rows, list) or not rows or not isinstance(summary, dict):
        raise PlotError(f"{folder}: its compare_tasks.json holds no task rows")
    parameters = [tuple(row) for row in summary.get("parameters", [])]
    recorded = {name: value for name, value, _ in parameters}
    workload = summary.get("workload") or recorded.get("workload preset") or recorded.get("workload") or "workload not recorded"
    return Results(folder, rows, parameters, workload, summary.get("clock") or "clock not recorded")


def merge(results: list[Results]) -> Results:
    """One Results of several: their task rows together, refused where they would not compare like with like."""
    first = results[0]
    for other in results[1:]:
        if other.clock != first.clock:
            raise PlotError(f"{first.folder} ran in {first.clock} and {other.folder} in {other.clock}: one figure "
                            "compares designs under one clock")
        mine, theirs = ({name: value for name, value, _ in r.parameters if name not in PER_RUN} for r in (first, other))
        for name in mine.keys() & theirs.keys():
            if mine[name] != theirs[name]:
                raise PlotError(f"{first.folder} and {other.folder} ran different configurations ({name}: {mine[name]} "
                                f"against {theirs[name]}): their designs would not be compared on the same tasks")
    seen: dict[tuple[str, float], Path] = {}
    order = {design: i for i, design in enumerate(benchmark.ALL_DESIGNS)}
    for result in results:
        for point in sorted(result.points, key=lambda point: (point[1], order.get(point[0], len(order)), point[0])):
            if point in seen:
                raise PlotError(f"{seen[point]} and {result.folder} both hold {point[0]} at {point[1]:g} tokens/s: "
                                "give each point once")
            seen[point] = result.folder
    speeds = sorted({speed for _, speed in seen})
    parameters = [(name, ", ".join(f"{s:g}" for s in speeds) + " tokens/s" if name == "decode speeds" else value, source)
                  for name, value, source in first.parameters]
    return Results(first.folder, [row for result in results for row in result.rows], parameters, first.workload, first.clock)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folders", nargs="+", metavar="FOLDER",
                        help="results folders of `python -m prototype compare` (e.g. results/compare/latest); several merge")
    parser.add_argument("--out", default=None, help="write into this folder (default: a new results/plot/<timestamp>/, "
                        "with results/plot/latest pointing at it); never docs/figures/")
    parser.add_argument("--wide", action="store_true", help="print every column of compare.csv (default: the first seven)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.out and Path(args.out).resolve().is_relative_to(FIGURES.resolve()):
        print(f"{PROG}: error: --out {args.out} is inside docs/figures/, which holds the committed figures: "
              "`python -m prototype figures` regenerates them (see --help)", file=sys.stderr)
        return 2
    try:
        results = [read(folder) for folder in args.folders]
        merged = merge(results)
    except PlotError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    table = benchmark.summarize(merged.rows)
    sources = ", ".join(f"{r.folder} ({plural(len(r.points), 'point')})" for r in results)
    print(f"\n{merged.workload}, {merged.clock}; from {sources}\n")
    compare.print_compare_table(table, args.wide)
    with RunFolder(compare.RESULTS / "plot", args.out) as folder:
        written = compare.write_results(folder.path, table, merged.rows, merged.parameters, merged.workload, merged.clock)
        out = folder.publish()
    print(f"\nwrote {out}/{', '.join(written)} in {time.perf_counter() - started:.1f} s")
    return 0


__all__ = ["PlotError", "Results", "add_arguments", "merge", "read", "run"]
