"""`python -m prototype figures`: regenerate the figures the README and docs/notebooks.md embed, the data behind
them, and every headline number README.md and docs/ quote.

The figures are committed in docs/figures/ so that a reader sees them on a fresh clone without
running anything. This command redraws them from fresh runs:

  compare.png                          `python -m prototype compare` at its default size (README)
  notebook_hosted_tool_timeline.png    notebooks/hosted_tool_analogy.py (docs/notebooks.md)
  notebook_latency_sweeps.png          notebooks/latency_experiments.py (docs/notebooks.md)
  notebook_published.png               notebooks/published_results.py (docs/notebooks.md)
  notebook_lanes_and_steering.png      notebooks/lanes_and_steering.py (docs/notebooks.md)

Beside each figure whose run quotes numbers it writes the data (docs/figures/<name>.json: compare.json,
published.json, notebook_latency_sweeps.json), taken from the headline section of the run's results JSON, and then
rewrites every marked span of README.md and docs/*.md from the data (prototype/headline.py). With `--no-run` it
runs nothing: it imports the headline sections of the results given (a sensitivity run, say) and rewrites the
spans; `--check` names every span that differs from the data and exits 1.

  python -m prototype figures                                   # everything (about 8 min on 2 cores)
  python -m prototype figures --no-run results/sensitivity/latest
  python -m prototype figures --check

The notebooks need the test extra (jupytext, nbclient, ipykernel); without it they are skipped,
with a message. `--smoke` runs everything at the smallest size (what tests/test_figures.py runs); it writes into
--out and never rewrites the pages.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .. import headline
from . import compare
from .common import Parser

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs" / "figures"
NOTEBOOKS = ("hosted_tool_analogy", "latency_experiments", "published_results", "lanes_and_steering")
NOTEBOOK_PICTURES = (
    "notebook_hosted_tool_timeline.png", "notebook_latency_sweeps.png", "notebook_published.png", "notebook_lanes_and_steering.png",
)
# The smallest compare that still has every design and speed: one short task each.
SMOKE_COMPARE = ["--tasks", "1", "--turns", "2"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=str(FIGURES), help="folder the figures are written to (default docs/figures/)")
    parser.add_argument("--smoke", action="store_true", help="smallest size: one 2-turn task per compare point, notebooks in test mode")
    parser.add_argument("--no-notebooks", action="store_true", help="only the compare figure")
    parser.add_argument("--no-run", nargs="*", metavar="RESULTS", default=None,
                        help="run nothing: import the headline sections of these results (JSON files or folders) into "
                        "--out and rewrite the spans of README.md and docs/*.md")
    parser.add_argument("--check", action="store_true", help="run nothing: name every span of README.md and docs/*.md that "
                        "differs from the data in --out, exit 1 if any")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.check or args.no_run is not None:
        return _spans(args.no_run or [], out, check=args.check)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="figures-") as scratch:
        work = Path(scratch)
        if _compare(["--out", str(work / "compare"), *(SMOKE_COMPARE if args.smoke else [])]) != 0:
            return 1
        shutil.copyfile(work / "compare" / "compare.png", out / "compare.png")
        written = [out / "compare.png", headline.import_results(work / "compare" / "compare.json", out)]
        if not args.no_notebooks:
            written += _notebook_pictures(work, out, args.smoke)
    print(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - started:.0f} s")
    if args.smoke or out.resolve() != FIGURES.resolve():
        return 0  # a smoke run's numbers, or figures written elsewhere, are not what the pages quote
    return _spans([], out, check=False)


def _spans(results: list[str], out: Path, *, check: bool) -> int:
    """Import `results`' headline sections into `out`, then rewrite the pages' spans from it (or check them)."""
    try:
        for path in headline.results_files(results):
            print(f"imported {path} into {headline.import_results(path, out)}")
        if check:
            stale = headline.stale_spans(REPO, out)
            for mismatch in stale:
                print(mismatch)
            print(f"{len(stale)} span(s) differ from the data in {out}" if stale else f"every span shows the data in {out}")
            return 1 if stale else 0
        changed = headline.update_pages(REPO, out)
    except headline.HeadlineError as e:
        print(f"python -m prototype figures: error: {e}", file=sys.stderr)
        return 2
    print("rewrote the spans of " + ", ".join(str(p.relative_to(REPO)) for p in changed) if changed
          else "every span already shows its data")
    return 0


def _compare(argv: list[str]) -> int:
    """`python -m prototype compare ARGV`, called through the compare command itself (the package's
    `__main__` imports this module, so this module does not import it back)."""
    parser = Parser(prog="python -m prototype compare")
    compare.add_arguments(parser)
    return compare.run(parser.parse_args(argv))


def _notebook_pictures(work: Path, out: Path, smoke: bool) -> list[Path]:
    try:
        import jupytext  # noqa: F401  (the notebooks need the test extra)

        from ..notebook import execute_notebook as execute
    except ImportError as missing:
        print(f"notebook pictures skipped: {missing} (install the test extra: pip install -e '.[test]')")
        return []
    saved = {name: os.environ.get(name) for name in ("TESTBED_RESULTS", "TESTBED_NOTEBOOK_TEST", "MPLBACKEND")}
    # The kernel inherits this environment: the notebooks write into the scratch folder.
    os.environ.update(TESTBED_RESULTS=str(work / "notebooks"), TESTBED_NOTEBOOK_TEST="1" if smoke else "0", MPLBACKEND="Agg")
    written = []
    try:
        for name, picture in zip(NOTEBOOKS, NOTEBOOK_PICTURES):
            seconds = execute(REPO / "notebooks" / f"{name}.py", work / f"{name}.ipynb")
            print(f"notebooks/{name}.py: executed in {seconds:.1f} s", flush=True)
            shutil.copyfile(work / "notebooks" / picture, out / picture)
            written.append(out / picture)
            data = work / "notebooks" / Path(picture).with_suffix(".json")
            if data.is_file():  # the numbers the notebook's picture shows, as the docs quote them
                written.append(headline.import_results(data, out))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return written
