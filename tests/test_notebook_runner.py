"""The notebook runner (prototype/notebook.py): test mode, the repository on the path, the results folder, a notebook
executed in its own folder, the command line with and without the notebooks extra, and tables as text outside a kernel."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
import pytest

from prototype import notebook
from tests.support import exit_code

# A py:percent notebook that prints where it ran and the transport its kernel talks over.
NOTEBOOK = ('# %%\nimport os\nfrom ipykernel.kernelapp import IPKernelApp\n'
            'print("ran in", os.getcwd())\nprint("transport", IPKernelApp.instance().transport)\n')


@pytest.mark.parametrize(("value", "on"), [
    (None, False), ("", False), ("0", False), ("false", False), (" FALSE ", False), ("no", False), ("No", False),
    ("1", True), ("true", True), ("yes", True), ("on", True)])
def test_test_mode_is_any_value_but_empty_0_false_or_no(monkeypatch, value: str | None, on: bool) -> None:
    if value is None:
        monkeypatch.delenv(notebook.TEST_MODE_ENV, raising=False)
    else:
        monkeypatch.setenv("TESTBED_NOTEBOOK_TEST", value)
    assert notebook.notebook_test_mode() is on


def test_the_repository_goes_first_on_the_path_once_and_the_results_folder_is_the_environments_or_ours(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", ["/elsewhere", "/other"])
    assert notebook.add_repo_to_path() == notebook.REPO and sys.path == [str(notebook.REPO), "/elsewhere", "/other"]
    assert notebook.add_repo_to_path() == notebook.REPO and sys.path.count(str(notebook.REPO)) == 1
    assert (notebook.REPO / "prototype" / "notebook.py").is_file() and (notebook.REPO / "experiments").is_dir()
    folder = tmp_path / "a" / "b"
    monkeypatch.setenv("TESTBED_RESULTS", str(folder))
    assert notebook.results_path() == folder and folder.is_dir() and notebook.results_path("x.csv") == folder / "x.csv"
    monkeypatch.delenv("TESTBED_RESULTS")
    assert notebook.results_path() == notebook.REPO / "results" and (notebook.REPO / "results").is_dir()
    assert notebook.results_path("y.png") == notebook.REPO / "results" / "y.png"


def executed_output(path: Path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))


def test_a_notebook_runs_in_its_own_folder_into_the_given_output(tmp_path) -> None:
    source = tmp_path / "books" / "tiny.py"
    source.parent.mkdir()
    source.write_text(NOTEBOOK)
    output = tmp_path / "out.ipynb"
    before = time.perf_counter()
    seconds = notebook.execute_notebook(source, output, timeout=60.0)
    elapsed = time.perf_counter() - before
    assert 0 < seconds <= elapsed
    assert executed_output(output) == f"ran in {source.parent}\ntransport ipc\n"  # Unix sockets, not TCP


def test_the_command_line_runs_each_notebook_into_the_results_folder_and_names_its_argument(monkeypatch, tmp_path, capsys):
    results = tmp_path / "results"
    monkeypatch.setenv("TESTBED_RESULTS", str(results))
    source = tmp_path / "tiny.py"
    source.write_text(NOTEBOOK)
    assert notebook.main([str(source)]) == 0 and executed_output(results / "tiny.ipynb") == f"ran in {tmp_path}\ntransport ipc\n"
    line = capsys.readouterr().out
    assert line.startswith(f"{source}: executed in ") and line.endswith(f" s -> {results / 'tiny.ipynb'}\n")
    assert exit_code(notebook.main, []) == 2
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    assert exit_code(notebook.main, ["--help"]) == 0 and "notebooks (notebooks/*.py)\n" in capsys.readouterr().out


def test_the_notebook_command_without_the_notebooks_extra_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(notebook, "NOTEBOOK_MODULES", ("jupytext", "a_module_no_environment_has"))
    assert notebook.main(["notebooks/any.py"]) == 2
    assert capsys.readouterr().err == ("python -m prototype.notebook: error: a_module_no_environment_has not installed: "
                                       'install the notebooks extra (pip install -e ".[notebooks]")\n')
    assert notebook.missing_modules() == ["a_module_no_environment_has"]


def test_a_table_prints_as_text_outside_a_kernel(capsys):
    assert not notebook.in_kernel()
    notebook.show_markdown("| a |\n| --- |\n| 1 |")
    notebook.show_image("results/x.png")
    assert capsys.readouterr().out == "| a |\n| --- |\n| 1 |\npicture: results/x.png\n"
