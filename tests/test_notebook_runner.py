"""The notebook runner (prototype/notebook.py): test mode, the repository on the path, the results folder, a notebook
executed in its own folder, the command line with and without the notebooks extra, and tables as text outside a kernel."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError

from prototype import notebook
from tests.support import exit_code

# A py:percent notebook that prints where it ran and the transport its kernel talks over; its header names a kernel no
# environment has, and it runs in this environment's python3 all the same.
NOTEBOOK = ('# ---\n# jupyter:\n#   kernelspec:\n#     display_name: Elsewhere\n#     name: no-such-kernel\n# ---\n\n'
            '# %%\nimport os\nfrom ipykernel.kernelapp import IPKernelApp\n'
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


def test_a_cell_running_past_the_timeout_stops_the_notebook(tmp_path) -> None:
    source = tmp_path / "slow.py"
    source.write_text("# %%\nimport time\ntime.sleep(5)\n")
    with pytest.raises(CellTimeoutError):
        notebook.execute_notebook(source, tmp_path / "out.ipynb", timeout=1.0)
    assert not (tmp_path / "out.ipynb").exists()


def test_the_command_line_runs_each_notebook_into_the_results_folder_and_names_its_argument(monkeypatch, tmp_path, capsys):
    results = tmp_path / "results"
    monkeypatch.setenv("TESTBED_RESULTS", str(results))
    source = tmp_path / "tiny.py"
    source.write_text(NOTEBOOK)
    assert notebook.main([str(source)]) == 0 and executed_output(results / "tiny.ipynb") == f"ran in {tmp_path}\ntransport ipc\n"
    line = capsys.readouterr().out
    assert line.startswith(f"{source}: executed in ") and line.endswith(f" s -> {results / 'tiny.ipynb'}\n")
    failing = tmp_path / "failing.py"
    failing.write_text('# %%\nraise ValueError("no such thing")\n')
    assert notebook.main([str(failing), str(source)]) == 1  # the first failure ends the run
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"python -m prototype.notebook: {failing}: ") and 'raise ValueError("no such thing")' in err
    assert exit_code(notebook.main, []) == 2
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    assert exit_code(notebook.main, ["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m prototype.notebook [-h] notebooks [notebooks ...]\n")
    assert " ".join(notebook.main.__doc__.split()) in " ".join(text.split()) and "notebooks (notebooks/*.py)\n" in text


def test_the_command_line_reports_each_notebook_as_it_ends_and_ctrl_c_names_the_one_it_stopped(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path))
    names = [str(tmp_path / f"{stem}.py") for stem in "abc"]
    for name in names:
        Path(name).write_text(NOTEBOOK)
    pipe, err, seen = io.BytesIO(), io.StringIO(), []
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(pipe))  # block-buffered, as a pipe is
    monkeypatch.setattr(sys, "stderr", err)

    def execute(path: str) -> float:
        seen.append(pipe.getvalue().decode())  # what a reader of the pipe has when this notebook starts
        if path == names[2]:
            raise KeyboardInterrupt
        return 2.5

    monkeypatch.setattr(notebook, "execute_notebook", execute)
    assert notebook.main(names) == 130
    a, b = (f"{name}: executed in 2.5 s -> {tmp_path / stem}.ipynb\n" for name, stem in zip(names, "ab"))
    assert seen == ["", a, a + b] and err.getvalue() == f"python -m prototype.notebook: interrupted in {names[2]}\n"


def test_a_cell_past_its_time_limit_ends_the_command_with_status_1_naming_the_notebook(monkeypatch, tmp_path, capsys) -> None:
    from nbclient.exceptions import CellTimeoutError

    slow = tmp_path / "slow.py"
    slow.write_text(NOTEBOOK)

    def execute(path: str) -> float:
        raise CellTimeoutError("A cell timed out while it was being executed, after 600 seconds.")

    monkeypatch.setattr(notebook, "execute_notebook", execute)
    assert notebook.main([str(slow)]) == 1
    assert capsys.readouterr() == ("", f"python -m prototype.notebook: {slow}: a cell failed\n"
                                       "A cell timed out while it was being executed, after 600 seconds.\n")


def test_the_notebook_command_says_in_one_line_what_to_install_or_which_notebooks_it_cannot_find(monkeypatch, capsys):
    assert notebook.main(["notebooks/no_such_a.py", "notebooks/no_such_b.py"]) == 2
    assert capsys.readouterr() == ("", "python -m prototype.notebook: error: no such notebook: notebooks/no_such_a.py, "
                                       "notebooks/no_such_b.py\n")
    monkeypatch.setattr(notebook, "NOTEBOOK_MODULES", ("jupytext", "no_such_module_a", "no_such_module_b"))
    assert notebook.main(["notebooks/any.py"]) == 2
    assert capsys.readouterr().err == ("python -m prototype.notebook: error: no_such_module_a, no_such_module_b not installed: "
                                       'install the notebooks extra (pip install -e ".[notebooks]")\n')
    assert notebook.missing_modules() == ["no_such_module_a", "no_such_module_b"]


def test_a_table_prints_as_text_outside_a_kernel_and_goes_to_ipythons_display_in_one(monkeypatch, tmp_path, capsys):
    import IPython
    import IPython.display

    monkeypatch.delitem(sys.modules, "IPython")
    assert not notebook.in_kernel()  # plain Python, IPython not imported
    monkeypatch.setitem(sys.modules, "IPython", IPython)
    for shell in (None, SimpleNamespace()):  # IPython imported but not running; a terminal IPython
        monkeypatch.setattr(IPython, "get_ipython", lambda shell=shell: shell)
        assert not notebook.in_kernel()
    notebook.show_markdown("| a |\n| --- |\n| 1 |")
    notebook.show_image("results/x.png")
    assert capsys.readouterr().out == "| a |\n| --- |\n| 1 |\npicture: results/x.png\n"
    monkeypatch.setattr(IPython, "get_ipython", lambda: SimpleNamespace(kernel=object()))
    displayed: list = []
    monkeypatch.setattr(IPython.display, "display", displayed.append)
    picture = tmp_path / "x.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n")
    assert notebook.in_kernel()
    notebook.show_markdown("| a |")
    notebook.show_image(picture)
    assert [(type(item), item.data) for item in displayed] == [(IPython.display.Markdown, "| a |"),
                                                             (IPython.display.Image, picture.read_bytes())]
    assert capsys.readouterr().out == ""
