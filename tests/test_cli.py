"""The command lines as a user meets them (prototype/cli/common.py): one-line refusals, no abbreviations, help on
every option, lists, a new results folder per run with a `latest` link; the subcommands and the `--engine` options."""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys

import pytest

import prototype.__main__ as cli_module
from prototype.__main__ import main as cli_main
from prototype.cli import common, compare, engine_options
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, TINY_CPU
from tests.support import exit_code

EXPERIMENTS = [
    "codex_transports", "concurrency", "efficiency", "history_cpu", "kv_memory", "load", "published", "steering", "streaming",
    "subagents", "virtual_vs_real"]


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
    parser = built_parser(cli_main if name == "prototype" else importlib.import_module(f"experiments.{name}").main, [])
    assert options_without_help(parser) == [] and parser.allow_abbrev is False


@pytest.mark.parametrize("argv, line", [
    # An unknown option is refused by its subcommand's parser, which names it (not read as --tasks 3).
    (["compare", "--task", "3"], "python -m prototype compare: error: unrecognized arguments: --task 3"),
    (["serve", "--por", "1"], "python -m prototype serve: error: unrecognized arguments: --por 1"),
    (["serve", "--cost", "zero"], "python -m prototype serve: error: unrecognized arguments: --cost zero"),  # no abbreviations
    (["demo", "--turn", "2"], "python -m prototype demo: error: unrecognized arguments: --turn 2"),
    (["compare", "--speeds", "fast"], "python -m prototype compare: error: argument --speeds: 'fast' is not a valid float"),
    (["compare", "--designs", "http,carrier-pigeon"],
     "python -m prototype compare: error: argument --designs: 'carrier-pigeon' is not one of http, http-stored, chained, "
     "suspended"),
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
    (["demo", "--turns", "1"], "python -m prototype demo: error: argument --turns: must be at least 2, not 1"),
    (["demo", "--tps", "0"], "python -m prototype demo: error: argument --tps: must be greater than 0, not 0"),
    (["demo", "--output-tokens", "0"], "python -m prototype demo: error: argument --output-tokens: must be at least 1, not 0"),
    (["demo", "--designs", "chained,http"],
     "python -m prototype demo: error: argument --designs: 'http' is not one of suspended, chained"),
    (["calibrate", "t.jsonl", "--baseline-tasks", "0"], "python -m prototype calibrate: error: argument --baseline-tasks: must be at least 1, not 0"),
    (["figures", "--smok"], "python -m prototype figures: error: unrecognized arguments: --smok")])
def test_bad_arguments_are_refused_in_one_line_before_any_work(argv, line, capsys, monkeypatch):
    monkeypatch.setattr(compare, "run", lambda args: pytest.fail("compare ran"))
    assert exit_code(cli_main, argv) == 2 and capsys.readouterr().err == f"{line} (see --help)\n"


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
    ("load", ["--sess", "3"], "unrecognized arguments: --sess 3"),  # no abbreviation
])
def test_experiments_refuse_out_of_range_values(name, argv, line, capsys):
    assert exit_code(importlib.import_module(f"experiments.{name}").main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(f": error: {line} (see --help)\n"), err


# --- the subcommands and the engine options ---------------------------------------------------------------

def test_the_help_lists_every_subcommand_with_what_it_does_and_without_one_the_error_names_it(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    assert exit_code(cli_main, ["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m prototype [-h] {serve,compare,plot,demo,calibrate,figures}")
    assert f"\n\n{cli_module.__doc__}\n\n" in text  # what the program is, below the usage
    for fact in ("(HTTP and WebSocket) on one port\n", "side by side at 65, 1000 and 4000 tokens/s\n",
                 "(one, or several merged), without running anything\n", "under virtual time and print its timeline\n",
                 "latency fit beside the testbed's defaults\n", "docs/figures/ (README, docs/notebooks.md)\n"):
        assert fact in text, fact
    assert exit_code(cli_main, []) == 2
    assert capsys.readouterr().err == "python -m prototype: error: the following arguments are required: command (see --help)\n"


def test_each_subcommand_runs_its_own_command_and_ctrl_c_in_one_says_which_in_one_line(monkeypatch, capsys):
    for name, operands in (("serve", []), ("compare", []), ("plot", ["results"]), ("demo", []), ("calibrate", ["t.jsonl"]),
                           ("figures", [])):
        def interrupted(args: argparse.Namespace, name: str = name) -> int:
            assert args.command == name
            raise KeyboardInterrupt

        monkeypatch.setattr(importlib.import_module(f"prototype.cli.{name}"), "run", interrupted)
        assert cli_main([name, *operands]) == 130
        assert capsys.readouterr().err == f"python -m prototype {name}: interrupted\n"


def engine_parser() -> common.Parser:
    parser = common.Parser(prog="t")
    engine_options.add_engine_arguments(parser)
    return parser


def test_the_engine_options_default_to_the_simulated_engine_and_the_tiny_model(monkeypatch):
    args = engine_parser().parse_args([])
    assert (args.engine, args.vllm_model, args.vllm_python) == ("simulated", "tiny-llama-cpu", None)
    assert engine_options.model_spec(args) is TINY_CPU
    args = engine_parser().parse_args(["--engine", "vllm", "--vllm-model", "llama-3.1-8b-shape", "--vllm-python", "/x/python"])
    assert (args.engine, args.vllm_python) == ("vllm", "/x/python") and engine_options.model_spec(args) is LLAMA_8B_SHAPE
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    text = engine_parser().format_help()
    venv = os.path.join(os.path.expanduser("~"), ".cache", "testbed", "vllm-venv")
    for fact in ("simulated: the latency model (default);", "in its own process with dummy weights, in real time (docs/real_engine.md)\n",
                 "the model config (default tiny-llama-cpu; llama-3.1-8b-shape for a GPU)\n",
                 "the interpreter that has vLLM (default: $TESTBED_VLLM_PYTHON,", f"else {venv}/bin/python)\n"):
        assert fact in text, fact


@pytest.mark.parametrize("argv, says", [
    (["--engine", "sglang"], "argument --engine: invalid choice: 'sglang' (choose from simulated, vllm)"),
    (["--vllm-model", "gpt"], "argument --vllm-model: invalid choice: 'gpt' (choose from llama-3.1-8b-shape, tiny-llama-cpu)")])
def test_the_engine_options_refuse_an_unknown_engine_or_model(argv, says, capsys):
    assert exit_code(engine_parser().parse_args, argv) == 2
    err = capsys.readouterr().err.replace("'simulated', 'vllm'", "simulated, vllm")
    assert err.replace("'llama-3.1-8b-shape', 'tiny-llama-cpu'", "llama-3.1-8b-shape, tiny-llama-cpu") == f"t: error: {says} (see --help)\n"


# --- the parser every command line shares -----------------------------------------------------------------


def test_the_parser_allows_abbreviations_when_asked_takes_its_name_first_and_fills_a_given_namespace():
    allowing = common.Parser(prog="p", allow_abbrev=True)
    allowing.add_argument("--tasks", type=int)
    assert allowing.parse_args(["--task", "3"]).tasks == 3
    parser = common.Parser("p")
    parser.add_argument("--n", type=int)
    assert parser.prog == "p"
    namespace = argparse.Namespace(kept=True)
    assert parser.parse_args(["--n", "2"], namespace) is namespace and (namespace.kept, namespace.n) == (True, 2)
    assert parser.parse_known_args(["--n", "3", "--m"], namespace) == (namespace, ["--m"])


def test_an_unknown_word_after_a_subcommand_is_refused_by_that_subcommand_or_else_by_the_top_parser(capsys):
    parser = common.Parser(prog="top")
    parser.add_subparsers(dest="command").add_parser("run").add_argument("--n", type=int)
    assert exit_code(parser.parse_args, ["run", "--n", "1", "--m", "2", "x"]) == 2
    assert capsys.readouterr().err == "top run: error: unrecognized arguments: --m 2 x (see --help)\n"
    assert parser.parse_known_args(["run", "--n", "4"]) == (argparse.Namespace(command="run", n=4), [])
    plain = common.Parser(prog="top")
    plain.add_subparsers(dest="command", parser_class=argparse.ArgumentParser).add_parser("run")  # a plain argparse subcommand
    assert plain.parse_known_args(["run", "--m"]) == (argparse.Namespace(command="run"), ["--m"])
    assert exit_code(plain.parse_args, ["run", "--m"]) == 2
    assert capsys.readouterr().err == "top: error: unrecognized arguments: --m (see --help)\n"
    undestined = common.Parser(prog="top")  # subcommands without a destination
    undestined.add_subparsers().add_parser("run")
    assert undestined.parse_known_args(["run", "--m"]) == (argparse.Namespace(), ["--m"])
    top = common.Parser(prog="top")  # no subcommand given
    top.add_argument("--n")
    top.add_subparsers(dest="command").add_parser("run")
    assert top.parse_known_args(["--n", "1", "--m"]) == (argparse.Namespace(n="1", command=None), ["--m"])


# --- the range-checked and list types (their messages and edges on a command line are in the tables above and serve's) --


def refusal(kind, word) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        kind(word)
    return str(refused.value)


@pytest.mark.parametrize("kind, word, says", [
    (common.checked(str.upper, lambda value: value != "NO", "anything but no"), "no", "must be anything but no, not no"),
    (common.list_of(float), ", ,", "', ,' names no value"),
    (common.list_of(float), "", "'' names no value"),
    (common.list_of(int, [1, 2]), "3", "'3' is not one of 1, 2")])
def test_a_value_out_of_its_range_is_refused_with_what_it_must_be(kind, word, says):
    assert refusal(kind, word) == says


def test_the_types_take_their_values_and_name_their_kind_and_a_list_option_joins_every_word_and_shows_its_default(capsys):
    # Each kind's value at its edge: serve's options (tests/test_cli_serve.py); a checked word is the kind's value.
    assert common.checked(str.upper, bool, "x")("yes") == "YES"
    assert common.list_of(float)(" 65, 1000,,4000 ,") == [65.0, 1000.0, 4000.0]
    assert common.list_of(str, ["http", "chained"])("chained,http") == ["chained", "http"]
    for kind, name in ((common.positive(), "float"), (common.positive(int), "int"), (common.non_negative(), "float"),
                       (common.at_least(2), "int"), (common.list_of(float), "float"),
                       (common.checked(lambda word: word, bool, "x"), "<lambda>")):
        assert kind.__name__ == name
    with pytest.raises(ValueError):
        common.positive()("fast")
    with pytest.raises(ValueError):
        common.at_least(2)("2.5")

    class Unnamed:
        def __call__(self, word):
            raise ValueError(word)

    assert common.checked(Unnamed(), bool, "x").__name__ == "value" and common.list_of(Unnamed()).__name__ == "value"
    assert refusal(common.list_of(Unnamed()), "a") == "'a' is not a valid value"
    # A list option joins every word; its help shows its default and choices.
    parser, default = common.Parser(prog="t"), [65.0, 1000.0, 4000.5]
    common.add_list(parser, "--speeds", float, default, "decode speeds")
    common.add_list(parser, "--designs", str, ("http", "chained"), "the designs", choices=["http", "chained", "suspended"])
    common.add_list(parser, "--seeds", int, None, "seeds", nargs="*")
    common.add_list(parser, "--tool-times", float, (), "tool times")
    defaults = parser.parse_args([])
    assert (defaults.speeds, defaults.designs, defaults.seeds, defaults.tool_times) == (default, ["http", "chained"], None, [])
    defaults.speeds.append(3.0)
    assert default == [65.0, 1000.0, 4000.5]  # the default is a copy
    args = parser.parse_args(["--speeds", "1,2", "3", "--seeds", "--designs", "suspended"])
    assert (args.speeds, args.seeds, args.designs) == ([1.0, 2.0, 3.0], [], ["suspended"])
    assert exit_code(parser.parse_args, ["--designs", "http,v3"]) == 2
    assert "'v3' is not one of http, chained, suspended" in capsys.readouterr().err
    parser.print_help()
    text = " ".join(capsys.readouterr().out.split())
    assert "--speeds SPEEDS [SPEEDS ...] decode speeds, separated by commas or spaces (default 65 1000 4000.5)" in text
    assert "the designs, separated by commas or spaces (default http chained); choices: http, chained, suspended" in text
    assert "--seeds [SEEDS ...] seeds, separated by commas or spaces" in text
    assert "--tool-times TOOL_TIMES [TOOL_TIMES ...] tool times, separated by commas or spaces" in text
    assert "(default )" not in text


# --- the run folders --------------------------------------------------------------------------------------


def test_a_new_run_folder_each_time_named_by_the_clock_numbered_from_2_in_one_second_and_latest_at_the_newest(tmp_path):
    now, base = datetime.datetime(2026, 11, 12, 13, 14, 15), tmp_path / "deep" / "compare"
    first = common.new_run_folder(base, now)
    (first / "a.csv").write_text("first")
    names = [first.name] + [common.new_run_folder(base, now).name for _ in range(2)]
    assert names == ["20261112-131415", "20261112-131415-2", "20261112-131415-3"] and (first / "a.csv").read_text() == "first"
    assert os.readlink(base / "latest") == "20261112-131415-3"  # relative: the folder can move
    assert sorted(p.name for p in base.iterdir()) == [*names, "latest"]  # the temporary link is gone
    # A left-over temporary link (or file) is replaced; the clock gives the name by default.
    left_over = tmp_path / f".latest.{os.getpid()}"
    left_over.symlink_to("nowhere")
    before, folder = datetime.datetime.now().replace(microsecond=0), common.new_run_folder(str(tmp_path))
    assert before <= datetime.datetime.strptime(folder.name, "%Y%m%d-%H%M%S") <= datetime.datetime.now()
    assert folder.is_dir() and folder.parent == tmp_path
    assert os.readlink(tmp_path / "latest") == folder.name and not left_over.is_symlink()
    left_over.write_text("a file left over")
    second = common.new_run_folder(tmp_path, datetime.datetime(2000, 1, 1))
    assert os.readlink(tmp_path / "latest") == second.name == "20000101-000000" and not left_over.exists()


def test_runs_started_in_one_second_stage_apart_and_each_publishes_its_own_files(tmp_path):
    now = datetime.datetime(2026, 11, 12, 13, 14, 15)
    with common.RunFolder(tmp_path, tmp_path / "a", now) as a, common.RunFolder(tmp_path, tmp_path / "b", now) as b, \
            common.RunFolder(tmp_path / "runs", now=now) as stamped:
        for run, name in ((a, "a.txt"), (b, "b.txt"), (stamped, "c.txt")):
            (run.path / name).write_text(name)
        assert [a.publish(), b.publish(), stamped.publish()] == [
            tmp_path / "a", tmp_path / "b", tmp_path / "runs" / "20261112-131415"]
    assert [sorted(p.name for p in run.path.iterdir()) for run in (a, b, stamped)] == [["a.txt"], ["b.txt"], ["c.txt"]]


def test_runs_started_in_one_second_publish_into_folders_numbered_from_2_and_latest_at_the_last(tmp_path):
    now, names = datetime.datetime(2026, 11, 12, 13, 14, 15), ["20261112-131415", "20261112-131415-2", "20261112-131415-3"]
    for run, name in enumerate(names):
        with common.RunFolder(tmp_path, now=now) as folder:
            (folder.path / "a.txt").write_text(str(run))
            assert folder.publish() == tmp_path / name
    assert [(tmp_path / name / "a.txt").read_text() for name in names] == ["0", "1", "2"]
    assert os.readlink(tmp_path / "latest") == "20261112-131415-3"


def test_a_named_folder_takes_the_runs_files_and_folders_in_place_of_the_ones_it_held(tmp_path):
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "old.json").write_text("old")
    (out / "a.txt").write_text("old")
    (out / "kept.txt").write_text("kept")
    with common.RunFolder(tmp_path, out) as folder:
        (folder.path / "traces").mkdir()
        (folder.path / "traces" / "new.json").write_text("new")
        (folder.path / "a.txt").write_text("new")
        assert folder.publish() == out
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "kept.txt", "traces"]
    assert [p.name for p in (out / "traces").iterdir()] == ["new.json"] and (out / "a.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left beside it


def test_a_staging_folder_left_by_a_killed_run_with_this_process_id_is_started_afresh(tmp_path):
    left = tmp_path / f".out.partial-{os.getpid()}"
    left.mkdir()
    (left / "half.csv").write_text("half")
    with common.RunFolder(tmp_path, tmp_path / "out") as folder:
        assert folder.path == left and list(left.iterdir()) == []
        (folder.path / "a.txt").write_text("a")
        folder.publish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and [p.name for p in (tmp_path / "out").iterdir()] == ["a.txt"]


def test_a_run_whose_latest_link_cannot_be_replaced_fails_with_that_error(tmp_path):
    (tmp_path / "latest").mkdir()  # a folder where the link goes: the link cannot replace it
    (tmp_path / "latest" / "mine.txt").write_text("mine")
    with pytest.raises(IsADirectoryError, match="latest"), common.RunFolder(tmp_path, now=datetime.datetime(2026, 11, 12)) as folder:
        (folder.path / "a.txt").write_text("a")
        folder.publish()
    assert (tmp_path / "latest" / "mine.txt").read_text() == "mine"


# --- a command as a user meets it -------------------------------------------------------------------------------


def test_ctrl_c_inside_a_nursery_says_interrupted_and_any_other_error_beside_it_is_raised(capsys):
    def raising(*errors: BaseException):
        def command() -> int:
            raise BaseExceptionGroup("a nursery's tasks", list(errors))

        return command

    assert common.run_command("p", raising(KeyboardInterrupt(), KeyboardInterrupt())) == common.INTERRUPTED
    assert capsys.readouterr().err == "p: interrupted\n"
    for errors in ((KeyboardInterrupt(), ValueError("bad")), (ValueError("bad"),)):
        with pytest.raises(BaseExceptionGroup) as raised:
            common.run_command("p", raising(*errors))
        assert raised.value.exceptions == errors
    assert capsys.readouterr().err == ""


def test_a_command_meets_its_stdout_as_it_is_and_one_without_stdout_runs_and_prints_nothing(monkeypatch):
    stdout, seen = sys.stdout, []

    def command() -> int:
        seen.append((sys.stdout.encoding, sys.stdout.isatty()))
        return 3

    assert common.run_command("p", command) == 3 and sys.stdout is stdout
    assert seen == [(stdout.encoding, stdout.isatty())]
    monkeypatch.setattr(sys, "stdout", None)  # started with its stdout closed (`>&-`): Python gives it none
    assert common.run_command("p", lambda: print("lost") or 3) == 3 and sys.stdout is None
