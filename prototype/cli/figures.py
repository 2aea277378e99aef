"""`python -m prototype figures`: regenerate the figures the README and docs/notebooks.md embed.

The figures are committed in docs/figures/ so that a reader sees them on a fresh clone without
running anything. This command redraws them from fresh runs:

  compare.png                          `python -m prototype compare` at its default size (README)
  notebook_hosted_tool_timeline.png    notebooks/hosted_tool_analogy.py (docs/notebooks.md)
  notebook_latency_sweeps.png          notebooks/latency_experiments.py (docs/notebooks.md)
  notebook_published.png               notebooks/published_results.py (docs/notebooks.md)
  notebook_lanes_and_steering.png      notebooks/lanes_and_steering.py (docs/notebooks.md)

The notebooks need the notebooks extra (jupytext, nbclient, ipykernel; the test extra has them too);
without it they are skipped, with a message. `--smoke` runs everything at the smallest size (what tests/test_figures.py runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

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


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="figures-") as scratch:
        work = Path(scratch)
        if _compare(["--out", str(work / "compare"), *(SMOKE_COMPARE if args.smoke else [])]) != 0:
            return 1
        shutil.copyfile(work / "compare" / "compare.png", out / "compare.png")
        written = [out / "compare.png"]
        if not args.no_notebooks:
            written += _notebook_pictures(work, out, args.smoke)
    print(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - started:.0f} s")
    return 0


def _compare(argv: list[str]) -> int:
    """`python -m prototype compare ARGV`, called through the compare command itself (the package's
    `__main__` imports this module, so this module does not import it back)."""
    parser = Parser(prog="python -m prototype compare")
    compare.add_arguments(parser)
    return compare.run(parser.parse_args(argv))


def _notebook_pictures(work: Path, out: Path, smoke: bool) -> list[Path]:
    try:
        import jupytext  # noqa: F401  (the notebooks need the notebooks extra)

        from ..notebook import execute_notebook as execute
    except ImportError as missing:
        print(f"notebook pictures skipped: {missing} (install the notebooks extra: pip install -e '.[notebooks]')")
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
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return written
