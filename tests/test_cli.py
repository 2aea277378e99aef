"""The command lines as a user meets them (prototype/cli/common.py): abbreviations refused with a
one-line error, help on every option, lists as `1000,4000` or `1000 4000`, and a new results
folder per run with a `latest` link, never an overwrite."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json

import pytest

from prototype.__main__ import main as cli_main
from prototype.cli import common, compare

EXPERIMENTS = [
    "codex_transports", "concurrency", "efficiency", "history_cpu", "kv_memory", "load", "published", "steering", "streaming",
    "subagents", "virtual_vs_real",
]


class Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@pytest.fixture
def capture_parser(monkeypatch):
    """Stop every `Parser.parse_args` and hand back the parser, fully built."""

    def capture(self, args=None, namespace=None):
        raise Captured(self)

    monkeypatch.setattr(common.Parser, "parse_args", capture)


def options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += [f"{name} {option}" for option in options_without_help(sub)]
        elif not action.help:
            missing.append("/".join(action.option_strings) or action.dest)
    return missing


def built_parser(main, argv) -> argparse.ArgumentParser:
    with pytest.raises(Captured) as captured:
        main(argv)
    return captured.value.parser


@pytest.mark.parametrize("name", ["prototype", *EXPERIMENTS])
def test_every_option_has_help_and_abbreviations_are_off(name, capture_parser):
    main = cli_main if name == "prototype" else importlib.import_module(f"experiments.{name}").main
    parser = built_parser(main, [])
    assert options_without_help(parser) == []
    assert parser.allow_abbrev is False


@pytest.mark.parametrize("argv, says", [
    # An unknown option is refused by its subcommand's parser, which names it.
    (["compare", "--task", "3"], "python -m prototype compare: error: unrecognized arguments: --task 3"),  # not read as --tasks 3
    (["serve", "--por", "1"], "python -m prototype serve: error: unrecognized arguments: --por 1"),
    (["demo", "--turn", "2"], "python -m prototype demo: error: unrecognized arguments: --turn 2"),
    (["compare", "--speeds", "fast"], "argument --speeds: 'fast' is not a valid float"),
    (["compare", "--designs", "http,carrier-pigeon"], "'carrier-pigeon' is not one of http, http-stored, chained, suspended"),
])
def test_bad_arguments_get_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        cli_main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.endswith("(see --help)\n"), err


@pytest.mark.parametrize("argv, line", [
    (["compare", "--tasks", "0"], "python -m prototype compare: error: argument --tasks: must be at least 1, not 0"),
    (["compare", "--tasks", "-1"], "python -m prototype compare: error: argument --tasks: must be at least 1, not -1"),
    (["compare", "--speeds", "0"], "python -m prototype compare: error: argument --speeds: must be greater than 0, not 0"),
    (["compare", "--speeds", "1000,-65"], "python -m prototype compare: error: argument --speeds: must be greater than 0, not -65"),
    (["compare", "--speeds", "inf"], "python -m prototype compare: error: argument --speeds: must be a finite number, not inf"),
    (["compare", "--rtt-ms", "-3"], "python -m prototype compare: error: argument --rtt-ms: must be at least 0, not -3"),
    (["compare", "--rtt-ms", "nan"], "python -m prototype compare: error: argument --rtt-ms: must be a finite number, not nan"),
    (["compare", "--turns", "0"], "python -m prototype compare: error: argument --turns: must be at least 1, not 0"),
    (["compare", "--seed", "-1"], "python -m prototype compare: error: argument --seed: must be at least 0, not -1"),
    (["compare", "--jobs", "0"], "python -m prototype compare: error: argument --jobs: must be at least 1, not 0"),
    (["serve", "--port", "70000"], "python -m prototype serve: error: argument --port: must be from 0 to 65535, not 70000"),
    (["serve", "--workers", "0"], "python -m prototype serve: error: argument --workers: must be at least 1, not 0"),
    (["serve", "--suspension-ttl", "0"], "python -m prototype serve: error: argument --suspension-ttl: must be greater than 0, not 0"),
    (["serve", "--flush-interval", "-0.1"], "python -m prototype serve: error: argument --flush-interval: must be at least 0, not -0.1"),
    (["serve", "--max-connections", "0"], "python -m prototype serve: error: argument --max-connections: must be at least 1, not 0"),
    (["serve", "--kv-ttl", "-1"], "python -m prototype serve: error: argument --kv-ttl: must be at least 0, not -1"),
    (["demo", "--turns", "1"], "python -m prototype demo: error: argument --turns: must be at least 2, not 1"),
    (["demo", "--tps", "0"], "python -m prototype demo: error: argument --tps: must be greater than 0, not 0"),
    (["demo", "--output-tokens", "0"], "python -m prototype demo: error: argument --output-tokens: must be at least 1, not 0"),
    (["calibrate", "t.jsonl", "--baseline-tasks", "0"], "python -m prototype calibrate: error: argument --baseline-tasks: must be at least 1, not 0"),
    (["figures", "--smok"], "python -m prototype figures: error: unrecognized arguments: --smok"),
])
def test_out_of_range_values_are_refused_before_any_work(argv, line, capsys, monkeypatch):
    monkeypatch.setattr(compare, "run", lambda args: pytest.fail("compare ran"))
    with pytest.raises(SystemExit) as exited:
        cli_main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"{line} (see --help)\n"


@pytest.mark.parametrize("name, argv, line", [
    ("kv_memory", ["--agents", "0"], "argument --agents: must be at least 1, not 0"),
    ("kv_memory", ["--swap-gbps", "0"], "argument --swap-gbps: must be greater than 0, not 0"),
    ("load", ["--sessions", "10,0"], "argument --sessions: must be at least 1, not 0"),
    ("load", ["--tool-seconds", "-1"], "argument --tool-seconds: must be at least 0, not -1"),
    ("efficiency", ["--speeds", "0"], "argument --speeds: must be greater than 0, not 0"),
    ("published", ["--tasks", "0"], "argument --tasks: must be at least 1, not 0"),
    ("streaming", ["--client-processes", "0"], "argument --client-processes: must be at least 1, not 0"),
    ("subagents", ["--tps", "0"], "argument --tps: must be greater than 0, not 0"),
    ("steering", ["--rtt-ms", "-3"], "argument --rtt-ms: must be at least 0, not -3"),
    ("virtual_vs_real", ["--turns", "0"], "argument --turns: must be at least 1, not 0"),
    ("history_cpu", ["--rounds", "0"], "argument --rounds: must be at least 1, not 0"),
    ("concurrency", ["--workers", "0"], "argument --workers: must be at least 1, not 0"),
    ("soak", ["--warmup", "1"], "argument --warmup: must be at least 0 and below 1, not 1"),
    ("profile_turn", ["--top", "-1"], "argument --top: must be at least 0, not -1"),
])
def test_experiments_refuse_out_of_range_values(name, argv, line, capsys):
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"experiments.{name}").main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(f": error: {line} (see --help)\n"), err


def test_options_that_do_not_go_together_name_the_subcommand(tmp_path, capsys):
    assert cli_main(["compare", "--preset", "nonsense", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("python -m prototype compare: error: --preset 'nonsense' is neither a preset "
                                       "(coding, compact, chat, long) nor a file (see --help)\n")


def test_experiment_abbreviation_is_refused(capsys):
    from experiments import load

    with pytest.raises(SystemExit) as exited:
        load.main(["--sess", "3"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --sess 3" in capsys.readouterr().err


@pytest.mark.parametrize("words", [["65,1000", "4000"], ["65", "1000", "4000"], ["65,1000,4000"], ["65, 1000,4000,"]])
def test_list_options_take_commas_or_spaces(words):
    parser = common.Parser(prog="t")
    compare.add_arguments(parser)
    args = parser.parse_args(["--speeds", *words, "--designs", "http,chained", "suspended"])
    assert args.speeds == [65.0, 1000.0, 4000.0]
    assert args.designs == ["http", "chained", "suspended"]
    assert parser.parse_args([]).designs == ["http", "chained", "suspended"]  # the default is untouched


def test_a_new_run_folder_each_time_and_latest_points_at_the_newest(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    first = common.new_run_folder(tmp_path / "x", now)
    (first / "a.csv").write_text("first")
    second = common.new_run_folder(tmp_path / "x", now)  # the same second: a suffix, not the same folder
    assert (first.name, second.name) == ("20260102-030405", "20260102-030405-2")
    assert (first / "a.csv").read_text() == "first"
    assert (tmp_path / "x" / "latest").resolve() == second.resolve()
    assert (tmp_path / "x" / "latest").readlink().name == second.name  # relative: the folder can move


@pytest.mark.slow
def test_compare_twice_keeps_both_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "RESULTS", tmp_path)
    argv = ["compare", "--tasks", "1", "--turns", "2", "--speeds", "4000", "--designs", "http,chained", "--jobs", "1"]
    assert cli_main(argv) == 0
    assert cli_main([*argv[:2], "2", *argv[3:]]) == 0
    runs = sorted(p for p in (tmp_path / "compare").iterdir() if p.name != "latest")
    assert len(runs) == 2
    assert [json.loads((r / "compare.json").read_text())["table"][0]["tasks"] for r in runs] == [1, 2]
    assert (tmp_path / "compare" / "latest").resolve() == runs[1].resolve()
    assert str(runs[1]) in capsys.readouterr().out


def demo_blocks(capsys, argv) -> dict[str, str]:
    """`python -m prototype demo` run with `argv`: each design's printed block, by design."""
    assert cli_main(["demo", *argv]) == 0
    blocks = capsys.readouterr().out.split("\n== ")[1:]
    return {block.split(":", 1)[0]: block for block in blocks}


@pytest.mark.parametrize("hosted, seconds", [([], {"suspended": "1.279", "chained": "1.320"}),
                                             (["--hosted"], {"suspended": "2.338", "chained": "2.379"})])
def test_demo_gives_each_design_the_same_times_in_either_order(hosted, seconds, capsys):
    # Each design runs on a fresh server: the second one does not find the prompt in the first one's prefix cache.
    first = demo_blocks(capsys, ["--designs", "suspended,chained", *hosted])
    second = demo_blocks(capsys, ["--designs", "chained,suspended", *hosted])
    assert list(first) == ["suspended", "chained"] and list(second) == ["chained", "suspended"]
    assert first == second
    assert {design: block.split(" in ", 1)[1].split(" s ")[0] for design, block in first.items()} == seconds


def test_demo_says_what_the_sampling_loop_does(capsys):
    blocks = demo_blocks(capsys, ["--hosted"])
    suspended, chained = blocks["suspended"], blocks["chained"]
    # Three turns: two tool calls, then the answer; each tool turn starts with a hosted search.
    assert suspended.count("response.done                          blocked at the tool-call point, awaiting response.append") == 2
    assert suspended.count("C->S response.append                        answered by response.append: the loop resumes") == 2
    assert suspended.count("a new request") == 1
    assert chained.count("a new request") == 3
    assert chained.count("ends at the tool-call point; kept in the connection's cache") == 2
    for block in (suspended, chained):
        assert block.count("answered by the hosted tool service: the loop resumes") == 2
        assert block.count("the model answered: the sampling loop ends") == 1


def compare_printout(capsys, tmp_path, *options: str) -> str:
    assert cli_main(["compare", "--tasks", "2", "--turns", "2", "--jobs", "1", "--out", str(tmp_path / "out"), *options]) == 0
    return capsys.readouterr().out


def test_compare_prints_what_this_run_used_and_a_table_that_fits_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    printed = compare_printout(capsys, tmp_path, "--speeds", "4000", "--designs", "http,chained")
    lines = printed.splitlines()
    header = next(line for line in lines if "design" in line and "tok/s" in line)
    assert [h.strip() for h in header.split("  ") if h.strip()] == ["design", "tok/s", "e2e mean (s)", "vs http (x)", "TTFT p50 (ms)",
                                                                     "API (%)", "sent/turn (kB)"]
    table = lines[lines.index(header): lines.index(header) + 3]
    assert [row.split()[:2] for row in table[1:]] == [["http", "4,000"], ["chained", "4,000"]]
    assert max(len(line) for line in table) <= 100  # every estimate with its interval
    assert "  API (%): api_overhead_share, the API's own work" in printed  # the legend under the table
    assert any(line.split()[:2] == ["decode", "speeds"] and line.split()[2:4] == ["4000", "tokens/s"] for line in lines)
    assert "suspension TTL" not in printed  # v1 did not run
    assert "results cache" not in printed
    again = compare_printout(capsys, tmp_path, "--speeds", "4000", "--designs", "http,chained")
    assert f"2 of 2 (design, speed) points came from the results cache ({tmp_path / 'cache'})" in again
    assert again.split("\n2 of 2")[0].rstrip("\n") == printed.split("\nModeled")[0].rstrip("\n")  # the same table


def test_compare_wide_prints_every_column_and_the_cached_share_legend(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    printed = compare_printout(capsys, tmp_path, "--speeds", "4000", "--designs", "suspended", "--wide")
    header = next(line for line in printed.splitlines() if "design" in line and "tok/s" in line)
    assert header.split("  ")[-4:] == ["reasoning (%)", "searches/task", "calls/tool turn", "reconnects"]
    assert "cached (%)" in header and "recv/turn (kB)" in header and "e2e p90 (s)" in header
    assert "  cached (%): cached_share, the share of input tokens found in the engine's prefix cache" in printed
    assert "v1's default 300 s suspension TTL" in printed and "v1 suspension TTL" in printed
