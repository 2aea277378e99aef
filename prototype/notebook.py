"""Running the notebooks (notebooks/*.py, jupytext py:percent) and what they need around them.

* `notebook_test_mode()`: TESTBED_NOTEBOOK_TEST shrinks every notebook to a smoke test;
* `add_repo_to_path()`: `experiments` imports from any working directory;
* `results_path(name)`: the results folder, as experiments/common.py;
* `show_markdown(text)`, `show_image(path)`: rendered in Jupyter, printed in a terminal (`python notebooks/X.py`);
* `execute_notebook(path)` and `python -m prototype.notebook notebooks/*.py`: run notebooks headless, each in its
  own folder as Jupyter does (`run_notebook(nb, folder)`: in any folder). They need the notebooks extra
  (`pip install -e ".[notebooks]"`); without it the command says so in one line.

The notebooks' grids go through the sweep runner (prototype/sweep.py), their tables and sentences
come from prototype/analysis.py and their figures from prototype/figures/.
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


def in_kernel() -> bool:
    """True inside a Jupyter kernel, where IPython's display renders Markdown and images (in a terminal it
    prints `<IPython.core.display.Markdown object>`)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def show_markdown(text: str) -> None:
    """A Markdown table or paragraph: rendered in Jupyter, printed as it is when the notebook runs as a script."""
    if in_kernel():
        from IPython.display import Markdown, display

        display(Markdown(text))
    else:
        print(text)


def show_image(path: str | Path) -> None:
    """A picture file: shown in Jupyter, named when the notebook runs as a script."""
    if in_kernel():
        from IPython.display import Image, display

        display(Image(filename=str(path)))
    else:
        print(f"picture: {path}")


# What executing a notebook needs (the notebooks extra), by import name.
NOTEBOOK_MODULES = ("jupytext", "nbclient", "nbformat", "ipykernel")


def missing_modules() -> list[str]:
    """The modules of NOTEBOOK_MODULES that this environment cannot import."""
    import importlib.util

    return [name for name in NOTEBOOK_MODULES if importlib.util.find_spec(name) is None]


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
    from .cli.common import Parser

    prog = "python -m prototype.notebook"
    parser = Parser(prog=prog, description=main.__doc__)
    parser.add_argument("notebooks", nargs="+", help="jupytext py:percent notebooks (notebooks/*.py)")
    args = parser.parse_args(argv)
    if missing := missing_modules():
        print(f"{prog}: error: {', '.join(missing)} not installed: install the notebooks extra "
              '(pip install -e ".[notebooks]")', file=sys.stderr)
        return 2
    if absent := [name for name in args.notebooks if not Path(name).is_file()]:
        print(f"{prog}: error: no such notebook: {', '.join(absent)}", file=sys.stderr)
        return 2
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    for name in args.notebooks:
        try:
            seconds = execute_notebook(name)
        except (CellExecutionError, CellTimeoutError) as error:  # the cell's own traceback, or its time limit
            print(f"{prog}: {name}: a cell failed\n{error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{prog}: interrupted in {name}", file=sys.stderr)
            return 130
        print(f"{name}: executed in {seconds:.1f} s -> {results_path(Path(name).stem + '.ipynb')}", flush=True)
    return 0


__all__ = [
    "REPO", "add_repo_to_path", "execute_notebook", "in_kernel", "main", "missing_modules", "notebook_test_mode", "results_path",
    "run_notebook", "show_image", "show_markdown",
]


if __name__ == "__main__":
    raise SystemExit(main())
