"""`python -m prototype figures` (prototype/cli/figures.py): it regenerates every committed figure the docs embed; with
stand-ins for its compare run and notebooks, which files it writes from which runs, with which environment, what it prints."""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import types
from pathlib import Path

import pytest

from prototype import headline, notebook
from prototype.__main__ import main as cli_main
from prototype.cli import figures
from prototype.uncertainty import Estimate
from tests.conftest import REPO

PNG = b"\x89PNG\r\n\x1a\n"
GAIN = headline.figure(Estimate(0.04, 0.021, 0.063, 10, "tasks", "bootstrap"), "{:.1f}%", scale=100)
SPAN = "<!-- fig:compare.gain -->?<!-- /fig -->\n"  # a page's span of compare's data
EMBEDS = {"README.md": "docs/figures/", "docs/notebooks.md": "figures/"}


def embedded_images(page: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (REPO / page).read_text())


@pytest.mark.parametrize("page", sorted(EMBEDS))
def test_every_embedded_figure_is_committed_under_docs_figures(page):
    images = embedded_images(page)
    assert images, f"{page} embeds no figure"
    for image in images:
        assert image.startswith(EMBEDS[page]), f"{page} embeds {image} from outside docs/figures/"
        path = (REPO / page).parent / image
        assert path.read_bytes()[:8] == PNG, image
        assert path.stat().st_size < 400_000, f"{image} is not small"
        assert path.name in ("compare.png", *figures.NOTEBOOK_PICTURES)  # so the command regenerates it


# --- the command with its compare run and notebooks replaced by stand-ins -----------------------------------


@pytest.fixture
def stand_ins(monkeypatch):
    """Stand-ins for the compare run and notebooks that write their pictures and record their arguments and environment."""
    calls = {"compare": [], "notebooks": []}

    def compare(argv):
        calls["compare"].append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "compare.png").write_bytes(b"compare")
        headline.write(out / "compare.json", {"headline": headline.section("compare", command="c", workload="w", figures={"gain": GAIN})})
        return 0

    def execute(path, output):
        path, output = Path(path), Path(output)
        env = {name: os.environ.get(name) for name in ("TESTBED_RESULTS", "TESTBED_NOTEBOOK_TEST", "MPLBACKEND")}
        calls["notebooks"].append((path, output, env))
        folder = Path(env["TESTBED_RESULTS"])
        folder.mkdir(parents=True, exist_ok=True)
        picture = figures.NOTEBOOK_PICTURES[figures.NOTEBOOKS.index(path.stem)]
        (folder / picture).write_bytes(path.stem.encode())
        if path.stem in figures.NOTEBOOK_DATA:  # the results whose numbers the docs quote
            name = Path(figures.NOTEBOOK_DATA[path.stem]).stem
            headline.write(folder / figures.NOTEBOOK_DATA[path.stem],
                           {"headline": headline.section(name, command=path.stem, workload="w", figures={})})
        return 1.25

    monkeypatch.setattr(figures, "_compare", compare)
    monkeypatch.setattr(notebook, "execute_notebook", execute)
    monkeypatch.setenv("TESTBED_RESULTS", "/kept")
    monkeypatch.delenv("TESTBED_NOTEBOOK_TEST", raising=False)
    monkeypatch.setenv("MPLBACKEND", "kept-backend")
    return calls


def test_figures_at_smoke_size_write_every_picture_from_a_scratch_folder_and_leave_the_pages_spans(tmp_path, stand_ins, capsys,
                                                                                                     monkeypatch):
    out = tmp_path / "new" / "figures"  # the checkout's docs/figures/, but a smoke run's numbers are not quoted
    (tmp_path / "README.md").write_text(SPAN)
    monkeypatch.setattr(figures, "REPO", tmp_path)
    monkeypatch.setattr(figures, "FIGURES", out)
    assert cli_main(["figures", "--smoke", "--out", str(out)]) == 0
    [argv] = stand_ins["compare"]
    scratch = Path(argv[1]).parent
    assert argv == ["--out", str(scratch / "compare"), "--tasks", "1", "--turns", "2"]
    assert scratch.name.startswith("figures-") and not scratch.exists()  # the scratch folder is removed
    data = ["compare.json", "published.json", "notebook_latency_sweeps.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(["compare.png", *data, *figures.NOTEBOOK_PICTURES])
    assert (out / "compare.png").read_bytes() == b"compare"
    # The data behind the figures: compare's, the published notebook's run of experiments.published, the latency sweep's.
    assert [headline.load(Path(name).stem, out)["command"] for name in data] == ["c", "published_results", "latency_experiments"]
    assert [(out / p).read_bytes() for p in figures.NOTEBOOK_PICTURES] == [n.encode() for n in figures.NOTEBOOKS]
    assert [(path, output) for path, output, _ in stand_ins["notebooks"]] == [
        (figures.REPO / "notebooks" / f"{name}.py", scratch / f"{name}.ipynb") for name in figures.NOTEBOOKS]
    assert {str(env) for *_, env in stand_ins["notebooks"]} == {
        str({"TESTBED_RESULTS": str(scratch / "notebooks"), "TESTBED_NOTEBOOK_TEST": "1", "MPLBACKEND": "Agg"})}
    # The environment is as it was before.
    assert (os.environ["TESTBED_RESULTS"], os.environ.get("TESTBED_NOTEBOOK_TEST"), os.environ["MPLBACKEND"]) == (
        "/kept", None, "kept-backend")
    printed = capsys.readouterr().out.splitlines()
    assert printed[:4] == [f"notebooks/{name}.py: executed in 1.2 s" for name in figures.NOTEBOOKS]
    written = ", ".join(str(out / p) for p in ("compare.png", "compare.json", "notebook_hosted_tool_timeline.png",
                                               "notebook_latency_sweeps.png", "notebook_latency_sweeps.json",
                                               "notebook_published.png", "published.json", "notebook_lanes_and_steering.png"))
    assert printed[4] == "" and printed[5].startswith(f"wrote {written} in ") and printed[5].endswith(" s")
    assert len(printed) == 6 and (tmp_path / "README.md").read_text() == SPAN


def test_figures_at_full_size_print_each_notebook_as_it_ends_and_the_time_taken_and_rewrite_the_pages_spans(tmp_path, stand_ins,
                                                                                                            monkeypatch):
    (tmp_path / "README.md").write_text(SPAN)
    monkeypatch.setattr(figures, "REPO", tmp_path)
    monkeypatch.setattr(figures, "FIGURES", tmp_path / "figures")
    flushed = []

    class Stdout(io.StringIO):
        def flush(self):
            flushed.append(self.getvalue())

    stdout = Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    clock = iter([100.0, 102.6])
    monkeypatch.setattr(figures, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    assert cli_main(["figures", "--out", str(tmp_path / "figures")]) == 0
    lines = [f"notebooks/{name}.py: executed in 1.2 s\n" for name in figures.NOTEBOOKS]
    assert [text for text in flushed if text.endswith(".py: executed in 1.2 s\n")] == [
        "".join(lines[:i + 1]) for i in range(len(lines))]  # each line reaches a pipe as its notebook ends
    assert stdout.getvalue().endswith(" in 3 s\nrewrote the spans of README.md\n")
    assert (tmp_path / "README.md").read_text() == "<!-- fig:compare.gain -->4.0% [2.1%, 6.3%] n=10<!-- /fig -->\n"
    [argv] = stand_ins["compare"]  # at full size: the default compare, the notebooks in full
    assert argv == ["--out", argv[1]] and argv[1].endswith("/compare")
    assert {env["TESTBED_NOTEBOOK_TEST"] for *_, env in stand_ins["notebooks"]} == {"0"}


SKIPPED = ("notebook pictures skipped: import of jupytext halted; None in sys.modules (install the notebooks extra: "
           "pip install -e '.[notebooks]')\n")


@pytest.mark.parametrize(("argv", "skipped"), [(["--no-notebooks"], ""), ([], SKIPPED)], ids=["--no-notebooks", "no extra"])
def test_figures_without_notebooks_or_their_extra_write_only_the_compare_figure(argv, skipped, tmp_path, stand_ins, monkeypatch,
                                                                                capsys):
    if skipped:
        monkeypatch.setitem(sys.modules, "jupytext", None)
    assert cli_main(["figures", *argv, "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.json", "compare.png"] and stand_ins["notebooks"] == []
    assert capsys.readouterr().out.startswith(f"{skipped}\nwrote {tmp_path / 'compare.png'}, {tmp_path / 'compare.json'} in ")


def test_a_failing_notebook_restores_the_environment_and_a_failed_compare_writes_nothing_and_exits_1(tmp_path, stand_ins,
                                                                                                     monkeypatch, capsys):
    monkeypatch.setattr(notebook, "execute_notebook", lambda path, output: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli_main(["figures", "--out", str(tmp_path / "n")])
    assert (os.environ["TESTBED_RESULTS"], os.environ.get("TESTBED_NOTEBOOK_TEST"), os.environ["MPLBACKEND"]) == (
        "/kept", None, "kept-backend")
    capsys.readouterr()
    monkeypatch.setattr(figures, "_compare", lambda argv: 2)
    assert cli_main(["figures", "--out", str(tmp_path / "f")]) == 1
    assert list((tmp_path / "f").iterdir()) == [] and capsys.readouterr().out == ""


def test_the_figures_options_and_the_compare_they_call(tmp_path, monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    figures.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.out, args.smoke, args.no_notebooks) == (str(REPO / "docs" / "figures"), False, False)
    assert figures.REPO == REPO
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    text = parser.format_help()
    for fact in ("written to (default docs/figures/)\n", "one 2-turn task per compare point, notebooks in test mode\n",
                 "only the compare figure\n", "(JSON files or folders) into --out and rewrite the spans of README.md and docs/*.md\n",
                 "name every span of README.md and docs/*.md that differs from the data in --out, exit 1 if any\n"):
        assert fact in text, fact
    seen = []
    monkeypatch.setattr(figures.compare, "run", lambda args: seen.append(args) or 7)
    assert (figures._compare(["--out", str(tmp_path), "--tasks", "3"]), (seen[0].out, seen[0].tasks)) == (7, (str(tmp_path), 3))
    with pytest.raises(SystemExit):
        figures._compare(["--tasks", "0"])
    assert capsys.readouterr().err == ("python -m prototype compare: error: argument --tasks: must be at least 1, not 0 "
                                       "(see --help)\n")
