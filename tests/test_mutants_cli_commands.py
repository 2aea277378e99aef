"""The subcommands `demo` and `figures` held to exact values, in-process: what the demo says each event
means and how it prints a rollout (prototype/cli/demo.py), and which files `figures` writes, from which runs,
with which environment (prototype/cli/figures.py; the compare run and the notebooks replaced by stand-ins
that write what they would)."""

from __future__ import annotations

import argparse
import io
import os
import sys
import types
from pathlib import Path

import pytest

from prototype import headline, notebook, workload
from prototype.__main__ import main as cli_main
from prototype.cli import demo, figures
from prototype.client.harness import RolloutRecord, TurnRecord

# --- demo -------------------------------------------------------------------------------------------------


def notes_of(timeline):
    record = RolloutRecord("suspended", "demo", 0.0, timeline=timeline)
    return [note for _, _, _, note in demo.notes(record)]


def test_the_notes_of_a_suspended_rollout():
    timeline = [
        (0.0, "send", "response.create"), (0.1, "recv", "response.created"), (0.1, "recv", "response.in_progress"),
        (0.2, "recv", "response.function_call_arguments.done"), (0.3, "recv", "response.done"),
        (0.6, "send", "response.append"), (0.6, "recv", "response.in_progress"), (0.7, "recv", "response.unknown"),
        (0.8, "recv", "response.completed"),
    ]
    assert notes_of(timeline) == [
        "a new request: API work, then a sampling loop starts", "API work done (validate, render, route)",
        "the sampling loop is running", "the model called a client tool",
        "blocked at the tool-call point, awaiting response.append", "answered by response.append: the loop resumes",
        "the sampling loop resumes past the tool-call point", "", "the model answered: the sampling loop ends",
    ]


def test_the_notes_of_a_chained_rollout():
    timeline = [
        (0.0, "send", "response.create"), (0.1, "recv", "response.created"), (0.1, "recv", "response.in_progress"),
        (0.3, "recv", "response.completed"), (0.6, "send", "response.create"), (0.7, "recv", "response.in_progress"),
        (0.8, "recv", "response.done"), (0.9, "recv", "response.completed"),
    ]
    assert notes_of(timeline) == [
        "a new request: API work, then a sampling loop starts", "API work done (validate, render, route)",
        "the sampling loop is running", "ends at the tool-call point; kept in the connection's cache",
        "a new request: a new sampling loop over the cached response", "the sampling loop is running",
        "", "the model answered: the sampling loop ends",
    ]
    assert notes_of([(0.0, "recv", "response.done")]) == [""]
    # The next-to-last event sees the last one.
    assert notes_of([(0.0, "recv", "response.completed"), (0.1, "send", "response.create")]) == [
        "ends at the tool-call point; kept in the connection's cache", "a new request: API work, then a sampling loop starts"]
    # Past the first three events (create, created, in_progress), a first request's in_progress is a resumption.
    assert notes_of([(0.0, "send", "response.create"), (0.1, "recv", "response.created"), (0.1, "recv", "response.done"),
                     (0.2, "recv", "response.in_progress")])[3] == "the sampling loop resumes past the tool-call point"


def test_every_event_type_the_demo_explains():
    assert demo.NOTES == {
        "response.created": "API work done (validate, render, route)",
        "response.in_progress": "the sampling loop is running",
        "response.output_item.added": "sampling: a new output item",
        "response.output_item.done": "sampling: the item is complete",
        "response.function_call_arguments.done": "the model called a client tool",
        "response.web_search_call.in_progress": "blocked at the tool-call point (hosted web_search)",
        "response.web_search_call.searching": "blocked at the tool-call point while the service searches",
        "response.web_search_call.completed": "answered by the hosted tool service: the loop resumes",
    }
    record = RolloutRecord("x", "demo", 0.0, timeline=[(1.5, "recv", "response.output_item.added")])
    assert list(demo.notes(record)) == [(1.5, "recv", "response.output_item.added", "sampling: a new output item")]


def test_print_timeline_counts_deltas_between_events_and_prints_each_turn(capsys):
    record = RolloutRecord(
        "chained", "demo", 10.0, ended_at=12.25, status="completed", response_ids=["a", "b"],
        timeline=[
            (10.0, "send", "response.create"), (10.5, "recv", "response.output_text.delta"),
            (10.6, "recv", "response.function_call_arguments.delta"), (10.7, "recv", "response.output_text.delta"),
            (10.75, "recv", "response.output_text.done"), (11.0, "recv", "response.completed"),
            (11.2, "send", "response.create"), (12.25, "recv", "response.output_text.delta"),
        ],
        turns=[TurnRecord(0, 10.0, first_token_at=10.5, ended_at=11.0, tool_seconds=0.75, bytes_sent=10, bytes_received=2000),
               TurnRecord(1, 11.2, ended_at=12.25)],
    )
    demo.print_timeline(record)
    assert capsys.readouterr().out == (
        "\n== chained: completed in 2.250 s (virtual), 2 turns, 2 response id(s)\n"
        "         0.0ms C->S response.create                        a new request: API work, then a sampling loop starts\n"
        "                   ... 2 x response.output_text.delta\n"
        "                   ... 1 x response.function_call_arguments.delta\n"
        "       750.0ms S->C response.output_text.done\n"
        "      1000.0ms S->C response.completed                     ends at the tool-call point; kept in the connection's cache\n"
        "      1200.0ms C->S response.create                        a new request: a new sampling loop over the cached response\n"
        "                   ... 1 x response.output_text.delta\n"
        "   turn 0: ttft 500.0 ms, turn 1000.0 ms, tool 750 ms, sent 10 B, received 2000 B\n"
        "   turn 1: ttft - ms, turn 1050.0 ms, tool 0 ms, sent 0 B, received 0 B\n"
    )


@pytest.mark.parametrize("hosted", [False, True])
def test_the_demo_task_has_a_fixed_prompt_and_hosted_searches_only_on_tool_turns(hosted):
    task = demo.demo_task(3, 7, hosted)
    assert (task.name, task.seed) == ("demo", 0)
    searches = (workload.HostedCall(seconds=0.5, result_tokens=200),) if hosted else ()
    assert list(task.turns) == [
        workload.TurnSpec(2000, 7, (0.3,), searches), workload.TurnSpec(400, 7, (0.3,), searches),
        workload.TurnSpec(400, 7, (), ()),
    ]


def test_the_demo_options_and_their_defaults():
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.turns, args.tps, args.output_tokens, args.hosted, args.designs) == (3, 1000.0, 40, False, ["suspended", "chained"])
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["turns"] == "model turns in the task, at least 2 (default 3)"
    assert helps["tps"] == "decode tokens/s (default 1000, Codex-Spark class)"
    assert helps["output_tokens"] == "text tokens per turn (default 40)"
    assert helps["hosted"] == "make each tool turn start with a hosted web_search"
    assert helps["designs"] == ("the designs to run, in this order, each on a fresh server, separated by commas or spaces "
                                "(default suspended chained); choices: suspended, chained")
    assert parser.parse_args(["--hosted", "--turns", "2", "--tps", "65.5", "--output-tokens", "1"]).hosted is True


def test_the_demo_runs_each_design_on_a_fresh_server_with_the_task_and_speed_asked_for(capsys, monkeypatch):
    seen = []

    async def rollout(connector, design, task, *, metadata):
        seen.append((design, task, metadata, connector.server))
        assert connector.server.api.workloads.resolve(metadata) is task
        return RolloutRecord(design, task.name, 0.0, ended_at=0.5, status="completed")

    monkeypatch.setattr(demo, "run_websocket_rollout", rollout)
    assert cli_main(["demo", "--designs", "chained,suspended", "--tps", "65.5", "--turns", "4", "--output-tokens", "9"]) == 0
    assert capsys.readouterr().out == (
        "demo task: 4 turns, 9 text tokens per turn at 65.5 tokens/s, tool time 0.3 s; each design on a fresh server\n"
        "\n== chained: completed in 0.500 s (virtual), 0 turns, 0 response id(s)\n"
        "\n== suspended: completed in 0.500 s (virtual), 0 turns, 0 response id(s)\n"
    )
    assert [design for design, *_ in seen] == ["chained", "suspended"]
    for _, task, metadata, _ in seen:
        assert task == demo.demo_task(4, 9, False)
        assert metadata == {"testbed_workload": metadata["testbed_workload"], "testbed_decode_tps": "65.5"}
    assert seen[0][3] is not seen[1][3]  # each design on a fresh server


def test_the_demo_prints_each_designs_real_rollout(capsys):
    assert cli_main(["demo", "--turns", "2", "--output-tokens", "3", "--designs", "suspended", "--hosted"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("demo task: 2 turns, 3 text tokens per turn at 1000 tokens/s, tool time 0.3 s, one hosted "
                        "web_search per tool turn; each design on a fresh server")
    assert sum("answered by the hosted tool service: the loop resumes" in line for line in lines) == 1
    assert lines[2].startswith("== suspended: completed in ") and lines[2].endswith(" s (virtual), 2 turns, 1 response id(s)")
    assert lines[3] == "         0.0ms C->S response.create                        a new request: API work, then a sampling loop starts"
    assert lines[-2].startswith("   turn 0: ttft ") and ", tool 300 ms, sent " in lines[-2]
    assert lines[-1].startswith("   turn 1: ") and ", tool 0 ms, " in lines[-1]


# --- figures ----------------------------------------------------------------------------------------------


@pytest.fixture
def stand_ins(monkeypatch):
    """`figures`' compare run and notebooks replaced by stand-ins that write the pictures they would, and record
    what they were asked and the environment a notebook's kernel would inherit."""
    calls = {"compare": [], "notebooks": []}

    def compare(argv):
        calls["compare"].append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "compare.png").write_bytes(b"compare")
        headline.write(out / "compare.json", {"headline": headline.section("compare", command="c", workload="w", figures={})})
        return 0

    def execute(path, output):
        path, output = Path(path), Path(output)
        env = {name: os.environ.get(name) for name in ("TESTBED_RESULTS", "TESTBED_NOTEBOOK_TEST", "MPLBACKEND")}
        calls["notebooks"].append((path, output, env))
        folder = Path(env["TESTBED_RESULTS"])
        folder.mkdir(parents=True, exist_ok=True)
        picture = figures.NOTEBOOK_PICTURES[figures.NOTEBOOKS.index(path.stem)]
        (folder / picture).write_bytes(path.stem.encode())
        return 1.25

    monkeypatch.setattr(figures, "_compare", compare)
    monkeypatch.setattr(notebook, "execute_notebook", execute)
    monkeypatch.setenv("TESTBED_RESULTS", "/kept")
    monkeypatch.delenv("TESTBED_NOTEBOOK_TEST", raising=False)
    monkeypatch.setenv("MPLBACKEND", "kept-backend")
    return calls


def test_figures_at_smoke_size_write_every_picture_from_a_scratch_folder(tmp_path, stand_ins, capsys):
    out = tmp_path / "new" / "figures"
    assert cli_main(["figures", "--smoke", "--out", str(out)]) == 0
    [argv] = stand_ins["compare"]
    scratch = Path(argv[1]).parent
    assert argv == ["--out", str(scratch / "compare"), "--tasks", "1", "--turns", "2"]
    assert scratch.name.startswith("figures-") and not scratch.exists()  # the scratch folder is removed
    assert sorted(p.name for p in out.iterdir()) == sorted(["compare.png", "compare.json", *figures.NOTEBOOK_PICTURES])
    assert (out / "compare.png").read_bytes() == b"compare"
    assert headline.load("compare", out)["command"] == "c"  # the data behind the compare figure
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
    written = ", ".join(str(out / p) for p in ("compare.png", "compare.json", *figures.NOTEBOOK_PICTURES))
    assert printed[4] == "" and printed[5].startswith(f"wrote {written} in ") and printed[5].endswith(" s")
    assert len(printed) == 6


def test_figures_print_each_notebook_as_it_ends_and_the_time_taken(tmp_path, stand_ins, monkeypatch):
    class Stdout(io.StringIO):
        def __init__(self):
            super().__init__()
            self.flushed = []

        def flush(self):
            self.flushed.append(self.getvalue())

    stdout = Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    clock = iter([100.0, 102.6])
    monkeypatch.setattr(figures, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    assert cli_main(["figures", "--out", str(tmp_path)]) == 0
    lines = [f"notebooks/{name}.py: executed in 1.2 s\n" for name in figures.NOTEBOOKS]
    assert [text for text in stdout.flushed if text.endswith(".py: executed in 1.2 s\n")] == [
        "".join(lines[:i + 1]) for i in range(len(lines))]  # each line reaches a pipe as its notebook ends
    assert stdout.getvalue().endswith(" in 3 s\n")


def test_figures_at_full_size_run_the_default_compare_and_the_notebooks_in_full(tmp_path, stand_ins, capsys):
    assert cli_main(["figures", "--out", str(tmp_path)]) == 0
    [argv] = stand_ins["compare"]
    assert argv == ["--out", argv[1]] and argv[1].endswith("/compare")
    assert {env["TESTBED_NOTEBOOK_TEST"] for *_, env in stand_ins["notebooks"]} == {"0"}


def test_figures_without_notebooks_write_only_the_compare_figure(tmp_path, stand_ins, capsys):
    assert cli_main(["figures", "--no-notebooks", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.json", "compare.png"]
    assert stand_ins["notebooks"] == []
    assert capsys.readouterr().out.startswith(f"\nwrote {tmp_path / 'compare.png'}, {tmp_path / 'compare.json'} in ")


def test_a_failed_compare_writes_nothing_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(figures, "_compare", lambda argv: 2)
    assert cli_main(["figures", "--out", str(tmp_path / "f")]) == 1
    assert list((tmp_path / "f").iterdir()) == []
    assert capsys.readouterr().out == ""


def test_without_the_notebook_extra_the_pictures_are_skipped_with_a_message(tmp_path, stand_ins, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "jupytext", None)
    assert cli_main(["figures", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.json", "compare.png"]
    printed = capsys.readouterr().out
    assert printed.startswith("notebook pictures skipped: import of jupytext halted; None in sys.modules "
                              "(install the test extra: pip install -e '.[test]')\n\nwrote ")


def test_a_failing_notebook_still_restores_the_environment(tmp_path, stand_ins, monkeypatch):
    def fail(path, output):
        raise RuntimeError("a cell failed")

    monkeypatch.setattr(notebook, "execute_notebook", fail)
    with pytest.raises(RuntimeError, match="a cell failed"):
        cli_main(["figures", "--out", str(tmp_path)])
    assert (os.environ["TESTBED_RESULTS"], os.environ.get("TESTBED_NOTEBOOK_TEST"), os.environ["MPLBACKEND"]) == (
        "/kept", None, "kept-backend")


def test_the_figures_options_and_the_compare_they_call(tmp_path, monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    figures.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.out, args.smoke, args.no_notebooks) == (str(figures.REPO / "docs" / "figures"), False, False)
    assert figures.REPO == Path(figures.__file__).resolve().parents[2]
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["out"] == "folder the figures are written to (default docs/figures/)"
    assert helps["smoke"] == "smallest size: one 2-turn task per compare point, notebooks in test mode"
    assert helps["no_notebooks"] == "only the compare figure"
    seen = []
    monkeypatch.setattr(figures.compare, "run", lambda args: seen.append(args) or 7)
    assert figures._compare(["--out", str(tmp_path), "--tasks", "3"]) == 7
    assert (seen[0].out, seen[0].tasks) == (str(tmp_path), 3)
    with pytest.raises(SystemExit):
        figures._compare(["--tasks", "0"])
    assert capsys.readouterr().err == ("python -m prototype compare: error: argument --tasks: must be at least 1, not 0 "
                                       "(see --help)\n")
