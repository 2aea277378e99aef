"""Running the notebooks (notebooks/*.py, jupytext py:percent) and what they need around them.

* `notebook_test_mode()`: TESTBED_NOTEBOOK_TEST shrinks every notebook to a smoke test;
* `add_repo_to_path()`: `experiments` imports from any working directory;
* `results_path(name)`: the results folder, as experiments/common.py;
* `execute_notebook(path)` and `python -m prototype.notebook notebooks/*.py`: run notebooks headless, each in its
  own folder as Jupyter does (`run_notebook(nb, folder)`: in any folder).

The notebooks' grids go through the sweep runner (prototype/sweep.py), their tables and sentences
come from prototype/analysis.py and their figures from prototype/figures.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

TEST_MODE_ENV = "TESTBED_NOTEBOOK_TEST"

RESULTS_ENV = "TESTBED_RESULTS"


def notebook_test_mode() -> bool:
    """True when TESTBED_NOTEBOOK_TEST is set to a true value: notebooks shrink to a smoke test."""
    return os.environ.get(TEST_MODE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def add_repo_to_path() -> Path:
    """Put the repository on sys.path so `experiments` imports from any working directory (a
    notebook server started in notebooks/, say); returns the repository root."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return REPO


def results_path(name: str = "") -> Path:
    """A path in the results folder: $TESTBED_RESULTS, else <repo>/results (git-ignored), as
    experiments/common.py. The folder is created."""
    folder = Path(os.environ.get(RESULTS_ENV, REPO / "results"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name if name else folder


def run_notebook(nb: Any, folder: str | Path, *, timeout: float = 600.0) -> None:
    """Execute the notebook `nb` (nbformat) in a fresh `python3` kernel of this environment, with `folder` as its
    working directory. The kernel talks over Unix sockets in a private temporary folder (ZeroMQ's IPC transport)
    rather than TCP on localhost: nothing leaves the machine's file system, and ipykernel has no reason for its
    "running over TCP without encryption" warning. Raises nbclient's CellExecutionError when a cell fails."""
    import tempfile

    import nbclient
    from traitlets.config import Config

    with tempfile.TemporaryDirectory(prefix="kernel-") as sockets:
        # Applies to the AsyncKernelManager nbclient creates (and shuts down) for this run.
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "ipc")}})
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", config=config,
                                resources={"metadata": {"path": str(folder)}}).execute()


def execute_notebook(path: str | Path, output: str | Path | None = None, *, timeout: float = 600.0) -> float:
    """Run a jupytext notebook (py:percent) top to bottom in a fresh `python3` kernel of this
    environment, with the notebook's own folder as working directory (as Jupyter runs it), and write
    the executed notebook to `output` (default: the results folder, <name>.ipynb). Returns the wall
    time in seconds. Needs the test extra (jupytext, nbclient, ipykernel). Raises nbclient's
    CellExecutionError when a cell fails."""
    import time

    import jupytext
    import nbformat

    path = Path(path)
    nb = jupytext.read(path)
    started = time.perf_counter()
    run_notebook(nb, path.resolve().parent, timeout=timeout)
    seconds = time.perf_counter() - started
    nbformat.write(nb, str(output or results_path(f"{path.stem}.ipynb")))
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m prototype.notebook notebooks/*.py`: execute each notebook at the size its parameters
    cell sets (test mode if TESTBED_NOTEBOOK_TEST=1) into the results folder, with its wall time."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("notebooks", nargs="+", help="jupytext py:percent notebooks")
    args = parser.parse_args(argv)
    for notebook in args.notebooks:
        seconds = execute_notebook(notebook)
        print(f"{notebook}: executed in {seconds:.1f} s -> {results_path(Path(notebook).stem + '.ipynb')}", flush=True)
    return 0


__all__ = ["REPO", "add_repo_to_path", "execute_notebook", "main", "notebook_test_mode", "results_path", "run_notebook"]


if __name__ == "__main__":
    raise SystemExit(main())
