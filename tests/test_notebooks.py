"""The notebooks (notebooks/*.py, jupytext py:percent) execute top to bottom in test mode.

Each is converted with jupytext and run cell by cell in a fresh `python3` kernel (ipykernel from
this environment) by nbclient (prototype/notebook.py `run_notebook`) in its own folder, as Jupyter
starts it, with TESTBED_NOTEBOOK_TEST=1 so it shrinks to a smoke test and TESTBED_RESULTS pointing
at a temporary folder so nothing is written into the repository. The kernel finds `prototype` as an
installed package would be found (a folder on PYTHONPATH holding only `prototype`), so a notebook
that imports `experiments` before putting the repository on the path fails here as it fails for a
user. Any cell that raises fails the test, with the cell's traceback in the message. Each also runs
as a script from the other folder, `python notebooks/X.py` from the repository root, with an empty
results cache (its sweeps compute).
"""

from __future__ import annotations

import json
import pathlib

import jupytext
import pytest
from nbclient.exceptions import CellExecutionError

from prototype.cli.figures import NOTEBOOK_DATA, NOTEBOOK_PICTURES
from prototype.cli.figures import NOTEBOOKS as FIGURE_NOTEBOOKS

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
CELL_TIMEOUT = 120  # seconds per cell; test mode runs each notebook in well under 30 s


def test_the_three_notebooks_are_there():
    assert {p.stem for p in NOTEBOOKS} >= {"hosted_tool_analogy", "latency_experiments", "published_results"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_test_mode_in_its_own_folder(path, tmp_path, monkeypatch):
    from prototype.notebook import run_notebook

    monkeypatch.setenv("TESTBED_NOTEBOOK_TEST", "1")  # the kernel inherits os.environ
    results = tmp_path / "results"
    monkeypatch.setenv("TESTBED_RESULTS", str(results))
    monkeypatch.setenv("PYTHONPATH", str(installed_prototype(tmp_path)))  # `prototype` importable, `experiments` not by itself
    nb = jupytext.read(path)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and "parameters" in code[0].metadata.get("tags", []), "the first code cell is the parameters cell"
    try:
        run_notebook(nb, path.parent, timeout=CELL_TIMEOUT)
    except CellExecutionError as error:
        pytest.fail(f"{path.name}: a cell failed\n{error}", pytrace=False)
    assert all(not any(o.get("output_type") == "error" for o in cell.get("outputs", [])) for cell in code)
    # Its picture, the one `python -m prototype figures` takes (and the data, its figures in a headline section).
    picture = dict(zip(FIGURE_NOTEBOOKS, NOTEBOOK_PICTURES)).get(path.stem)
    assert any(results.glob("notebook_*.png")) and (picture is None or (results / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n")
    if path.stem in NOTEBOOK_DATA:
        assert json.loads((results / NOTEBOOK_DATA[path.stem]).read_text())["headline"]["figures"], path.stem


def installed_prototype(tmp_path) -> pathlib.Path:
    """A folder holding only `prototype` (this checkout's), to put on PYTHONPATH as an installed package."""
    installed = tmp_path / "site-packages"
    installed.mkdir()
    (installed / "prototype").symlink_to(REPO / "prototype", target_is_directory=True)
    return installed


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_as_a_script_from_the_repository_root_with_an_empty_cache(path, tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, TESTBED_NOTEBOOK_TEST="1", TESTBED_RESULTS=str(tmp_path / "results"),
               TESTBED_CACHE=str(tmp_path / "cache"), MPLBACKEND="Agg", PYTHONPATH=str(installed_prototype(tmp_path)))
    done = subprocess.run([sys.executable, f"notebooks/{path.name}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "<IPython" not in done.stdout  # tables print as text, not as the repr of a display object
    assert any((tmp_path / "results").glob("notebook_*.png")), "the notebook saves its picture in the results folder"


# --- the helpers the notebooks draw with (prototype/analysis.py, figures.py) ----------------------


def test_every_phase_has_one_colour():
    from prototype import analysis, figures, metrics

    assert set(metrics.SERVER_PHASES) | {analysis.NETWORK_CLIENT, analysis.TOOL} == set(figures.PHASE_COLORS)
    assert set(figures.PHASE_ORDER) == set(figures.PHASE_COLORS)

