"""`python -m prototype demo` (prototype/cli/demo.py): what it says each event means, how it prints a rollout, the
task it runs and its options, and each design on a fresh server, with the same times in either order."""

from __future__ import annotations

import argparse

import pytest

from prototype import workload
from prototype.__main__ import main as cli_main
from prototype.cli import demo
from prototype.client.harness import RolloutRecord, TurnRecord


def notes_of(timeline):
    record = RolloutRecord("suspended", "demo", 0.0, timeline=timeline)
    return [note for _, _, _, note in demo.notes(record)]


def test_the_notes_of_a_suspended_rollout():
    # A chained rollout's notes: the timeline printed (test_print_timeline...) and each design's run (test_demo_gives...).
    timeline = [(0.0, "send", "response.create"), (0.1, "recv", "response.created"), (0.1, "recv", "response.in_progress"),
                (0.2, "recv", "response.function_call_arguments.done"), (0.3, "recv", "response.done"),
                (0.6, "send", "response.append"), (0.6, "recv", "response.in_progress"), (0.7, "recv", "response.unknown"),
                (0.8, "recv", "response.completed")]
    assert notes_of(timeline) == [
        "a new request: API work, then a sampling loop starts", "API work done (validate, render, route)",
        "the sampling loop is running", "the model called a client tool", "blocked at the tool-call point, awaiting response.append",
        "answered by response.append: the loop resumes", "the sampling loop resumes past the tool-call point", "",
        "the model answered: the sampling loop ends"]


def test_the_notes_of_a_next_to_last_event_see_the_last_and_a_first_requests_in_progress_past_its_start_is_a_resumption():
    assert notes_of([(0.0, "recv", "response.done")]) == [""]
    assert notes_of([(0.0, "recv", "response.completed"), (0.1, "send", "response.create")]) == [
        "ends at the tool-call point; kept in the connection's cache", "a new request: API work, then a sampling loop starts"]
    # Past the first three events (create, created, in_progress).
    assert notes_of([(0.0, "send", "response.create"), (0.1, "recv", "response.created"), (0.1, "recv", "response.done"),
                     (0.2, "recv", "response.in_progress")])[3] == "the sampling loop resumes past the tool-call point"


@pytest.mark.parametrize("event, says", [
    ("response.output_item.added", "a new output item"), ("response.output_item.done", "the item is complete"),
    ("response.web_search_call.in_progress", "(hosted web_search)"),
    ("response.web_search_call.searching", "while the service searches"),
    ("response.web_search_call.completed", "hosted tool service: the loop resumes")])
def test_the_demo_explains_each_output_item_and_hosted_search_event(event, says):
    [(at, direction, name, note)] = demo.notes(RolloutRecord("x", "demo", 0.0, timeline=[(1.5, "recv", event)]))
    assert (at, direction, name) == (1.5, "recv", event) and note.endswith(says)


def test_print_timeline_counts_deltas_between_events_and_prints_each_turn(capsys):
    timeline = [(10.0, "send", "response.create"), (10.5, "recv", "response.output_text.delta"),
                (10.6, "recv", "response.function_call_arguments.delta"), (10.7, "recv", "response.output_text.delta"),
                (10.75, "recv", "response.output_text.done"), (11.0, "recv", "response.completed"),
                (11.2, "send", "response.create"), (12.25, "recv", "response.output_text.delta")]
    turns = [TurnRecord(0, 10.0, first_token_at=10.5, ended_at=11.0, tool_seconds=0.75, bytes_sent=10, bytes_received=2000),
             TurnRecord(1, 11.2, ended_at=12.25)]
    record = RolloutRecord("chained", "demo", 10.0, ended_at=12.25, status="completed", response_ids=["a", "b"],
                           timeline=timeline, turns=turns)
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
    assert list(task.turns) == [workload.TurnSpec(2000, 7, (0.3,), searches), workload.TurnSpec(400, 7, (0.3,), searches),
                                workload.TurnSpec(400, 7, (), ())]


def test_the_demo_options_help_states_their_defaults(monkeypatch):
    # The defaults themselves: the header and design order of the default run (test_demo_gives_each_design_the_same_times...).
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    text = parser.format_help()
    for fact in ("at least 2 (default 3)\n", "decode tokens/s (default 1000, Codex-Spark class)\n", "text tokens per turn (default 40)\n",
                 "start with a hosted web_search\n", "each on a fresh server, separated by commas or spaces (default suspended chained)"):
        assert fact in text, fact


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


def demo_printout(capsys, argv) -> tuple[str, dict[str, str]]:
    """`python -m prototype demo` run with `argv`: what it printed, and each design's printed block, by design."""
    assert cli_main(["demo", *argv]) == 0
    printed = capsys.readouterr().out
    return printed, {block.split(":", 1)[0]: block for block in printed.split("\n== ")[1:]}


@pytest.mark.parametrize("hosted, seconds", [([], {"suspended": "1.279", "chained": "1.320"}),
                                             (["--hosted"], {"suspended": "2.338", "chained": "2.379"})])
def test_demo_gives_each_design_the_same_times_in_either_order(hosted, seconds, capsys):
    # Each design runs on a fresh server: the second one does not find the prompt in the first one's prefix cache.
    printed, first = demo_printout(capsys, hosted)  # suspended, then chained: the default
    _, second = demo_printout(capsys, ["--designs", "chained,suspended", *hosted])
    assert (list(first), list(second), first) == (["suspended", "chained"], ["chained", "suspended"], second)
    assert {design: block.split(" in ", 1)[1].split(" s ")[0] for design, block in first.items()} == seconds
    if hosted:
        assert_the_demo_says_what_the_sampling_loop_does(printed)


def assert_the_demo_says_what_the_sampling_loop_does(printed: str) -> None:
    assert printed.startswith("demo task: 3 turns, 40 text tokens per turn at 1000 tokens/s, tool time 0.3 s, one hosted "
                              "web_search per tool turn; each design on a fresh server\n\n== suspended: completed in ")
    suspended, chained = printed.split("\n== ")[1:]
    assert suspended.split("\n")[0].endswith(" s (virtual), 3 turns, 1 response id(s)")
    assert suspended.split("\n")[1] == "         0.0ms C->S response.create                        a new request: API work, then a sampling loop starts"
    assert ", tool 300 ms, sent " in suspended.split("\n")[-4] and ", tool 0 ms, " in suspended.split("\n")[-2]
    # Three turns: two tool calls, then the answer; each tool turn starts with a hosted search.
    assert suspended.count("response.done                          blocked at the tool-call point, awaiting response.append") == 2
    assert suspended.count("C->S response.append                        answered by response.append: the loop resumes") == 2
    assert (suspended.count("a new request"), chained.count("a new request")) == (1, 3)
    assert chained.count("ends at the tool-call point; kept in the connection's cache") == 2
    for block in (suspended, chained):
        assert block.count("answered by the hosted tool service: the loop resumes") == 2
        assert block.count("the model answered: the sampling loop ends") == 1
