"""The command line's shared parts held to exact values, in-process: the subcommands of `python -m prototype`
(prototype/__main__.py) and which function each runs, the `--engine` options (prototype/cli/engine_options.py),
and what every command line shares (prototype/cli/common.py): the one-line error, the range-checked types,
the list options and their help, and the run folders with their `latest` link."""

from __future__ import annotations

import argparse
import datetime
import os

import pytest

from prototype import __main__ as entry
from prototype.cli import calibrate, common, compare, demo, engine_options, figures, plot, serve
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, TINY_CPU

COMMANDS = {"serve": serve, "compare": compare, "plot": plot, "demo": demo, "calibrate": calibrate, "figures": figures}


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


@pytest.fixture
def built(monkeypatch):
    """`python -m prototype`'s parser as `main` builds it, stopped before parsing."""

    class Built(Exception):
        pass

    parsers = []

    def capture(self, args=None, namespace=None):
        parsers.append(self)
        raise Built

    monkeypatch.setattr(common.Parser, "parse_args", capture)
    with pytest.raises(Built):
        entry.main([])
    return parsers[0]


# --- __main__ ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_runs_its_own_function_with_its_arguments(name, monkeypatch):
    for other, module in COMMANDS.items():
        monkeypatch.setattr(module, "run", lambda args, other=other: (other, args.command))
    argv = {"calibrate": ["calibrate", "trace.jsonl"], "plot": ["plot", "results/compare/latest"]}.get(name, [name])
    assert entry.main(argv) == (name, name)


def test_the_program_names_itself_and_every_subcommand_says_what_it_does(built):
    assert built.prog == "python -m prototype"
    assert built.description == entry.__doc__
    action = subcommands(built)
    assert action.dest == "command" and action.required is True
    assert {choice.dest: choice.help for choice in action._choices_actions} == {
        "serve": "serve the Responses API (HTTP and WebSocket) on one port",
        "compare": "the main job: all designs side by side at 65, 1000 and 4000 tokens/s",
        "plot": "compare's table and figure again from results folders (one, or several merged), without running anything",
        "demo": "run one rollout per design under virtual time and print its timeline",
        "calibrate": "a trace's distributions and latency fit beside the testbed's defaults",
        "figures": "regenerate the committed figures in docs/figures/ (README, docs/notebooks.md)",
    }
    assert list(action.choices) == ["serve", "compare", "plot", "demo", "calibrate", "figures"]
    assert action.choices["compare"].prog == "python -m prototype compare"


def test_without_a_subcommand_the_error_names_it(capsys):
    with pytest.raises(SystemExit) as exited:
        entry.main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "python -m prototype: error: the following arguments are required: command (see --help)\n"


# --- engine_options ---------------------------------------------------------------------------------------


def engine_parser() -> common.Parser:
    parser = common.Parser(prog="t")
    engine_options.add_engine_arguments(parser)
    return parser


def test_the_engine_options_default_to_the_simulated_engine_and_the_tiny_model():
    args = engine_parser().parse_args([])
    assert (args.engine, args.vllm_model, args.vllm_python) == ("simulated", "tiny-llama-cpu", None)
    assert engine_options.model_spec(args) is TINY_CPU
    args = engine_parser().parse_args(["--engine", "vllm", "--vllm-model", "llama-3.1-8b-shape", "--vllm-python", "/x/python"])
    assert (args.engine, args.vllm_python) == ("vllm", "/x/python")
    assert engine_options.model_spec(args) is LLAMA_8B_SHAPE


def test_the_engine_options_refuse_an_unknown_engine_or_model(capsys):
    for argv, says in ((["--engine", "sglang"], "argument --engine: invalid choice: 'sglang' (choose from simulated, vllm)"),
                       (["--vllm-model", "gpt"], "argument --vllm-model: invalid choice: 'gpt' (choose from "
                                                 "llama-3.1-8b-shape, tiny-llama-cpu)")):
        with pytest.raises(SystemExit):
            engine_parser().parse_args(argv)
        assert capsys.readouterr().err.replace("'simulated', 'vllm'", "simulated, vllm").replace(
            "'llama-3.1-8b-shape', 'tiny-llama-cpu'", "llama-3.1-8b-shape, tiny-llama-cpu") == f"t: error: {says} (see --help)\n"


def test_the_engine_options_help_names_their_defaults():
    helps = {a.dest: a.help for a in engine_parser()._actions}
    assert helps["engine"] == ("simulated: the latency model (default); vllm: a real engine, vLLM in its own process "
                               "with dummy weights, in real time (docs/real_engine.md)")
    assert helps["vllm_model"] == "with --engine vllm: the model config (default tiny-llama-cpu; llama-3.1-8b-shape for a GPU)"
    venv = os.path.join(os.path.expanduser("~"), ".cache", "testbed", "vllm-venv")
    assert helps["vllm_python"] == ("with --engine vllm: the interpreter that has vLLM (default: $TESTBED_VLLM_PYTHON, else "
                                    f"this one if it imports vllm, else {venv}/bin/python)")


# --- common: the parser -----------------------------------------------------------------------------------


def test_the_parser_refuses_abbreviations_unless_asked_and_exits_2_with_one_line(capsys):
    parser = common.Parser(prog="p")
    parser.add_argument("--tasks", type=int)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--task", "3"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "p: error: unrecognized arguments: --task 3 (see --help)\n"
    allowing = common.Parser(prog="p", allow_abbrev=True)
    allowing.add_argument("--tasks", type=int)
    assert allowing.parse_args(["--task", "3"]).tasks == 3


def test_an_unknown_word_after_a_subcommand_is_refused_by_that_subcommand(capsys):
    parser = common.Parser(prog="top")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("run").add_argument("--n", type=int)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["run", "--n", "1", "--m", "2", "x"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "top run: error: unrecognized arguments: --m 2 x (see --help)\n"
    assert parser.parse_known_args(["run", "--n", "4"]) == (argparse.Namespace(command="run", n=4), [])


def test_a_subcommand_of_plain_argparse_leaves_the_unknown_words_to_the_top_parser(capsys):
    parser = common.Parser(prog="top")
    commands = parser.add_subparsers(dest="command", parser_class=argparse.ArgumentParser)
    commands.add_parser("run")
    assert parser.parse_known_args(["run", "--m"]) == (argparse.Namespace(command="run"), ["--m"])
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--m"])
    assert capsys.readouterr().err == "top: error: unrecognized arguments: --m (see --help)\n"


def test_the_parser_takes_its_name_as_a_positional_argument_and_fills_a_given_namespace():
    parser = common.Parser("p")
    parser.add_argument("--n", type=int)
    assert parser.prog == "p"
    namespace = argparse.Namespace(kept=True)
    assert parser.parse_args(["--n", "2"], namespace) is namespace
    assert (namespace.kept, namespace.n) == (True, 2)
    assert parser.parse_known_args(["--n", "3", "--m"], namespace) == (namespace, ["--m"])


def test_subcommands_without_a_destination_leave_unknown_words_to_the_top_parser():
    parser = common.Parser(prog="top")
    parser.add_subparsers().add_parser("run")
    assert parser.parse_known_args(["run", "--m"]) == (argparse.Namespace(), ["--m"])


def test_unknown_words_without_a_subcommand_are_the_top_parsers_to_refuse():
    parser = common.Parser(prog="top")
    parser.add_argument("--n")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("run")
    assert parser.parse_known_args(["--n", "1", "--m"]) == (argparse.Namespace(n="1", command=None), ["--m"])


# --- common: the types ------------------------------------------------------------------------------------


def refusal(kind, word) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        kind(word)
    return str(refused.value)


def test_positive_takes_anything_above_zero():
    kind = common.positive()
    assert kind("0.001") == 0.001 and isinstance(kind("2"), float)
    assert refusal(kind, "0") == "must be greater than 0, not 0"
    assert refusal(kind, "-1.5") == "must be greater than 0, not -1.5"
    assert refusal(kind, "inf") == "must be a finite number, not inf"
    assert refusal(kind, "-inf") == "must be a finite number, not -inf"
    assert refusal(kind, "nan") == "must be a finite number, not nan"
    assert kind.__name__ == "float"
    assert common.positive(int)("3") == 3 and common.positive(int).__name__ == "int"
    with pytest.raises(ValueError):
        kind("fast")


def test_non_negative_takes_zero_and_above():
    kind = common.non_negative()
    assert kind("0") == 0.0 and kind("2.5") == 2.5
    assert refusal(kind, "-0.1") == "must be at least 0, not -0.1"
    assert kind.__name__ == "float"
    assert common.non_negative(int)("0") == 0


def test_at_least_takes_whole_numbers_from_the_minimum_and_up_to_a_maximum_if_given():
    kind = common.at_least(2)
    assert kind("2") == 2 and kind("1000") == 1000
    assert refusal(kind, "1") == "must be at least 2, not 1"
    assert kind.__name__ == "int"
    with pytest.raises(ValueError):
        kind("2.5")
    bounded = common.at_least(1, 3)
    assert [bounded("1"), bounded("3")] == [1, 3]
    assert refusal(bounded, "0") == "must be from 1 to 3, not 0"
    assert refusal(bounded, "4") == "must be from 1 to 3, not 4"


def test_checked_names_the_requirement_and_keeps_a_kind_without_a_name_as_value():
    kind = common.checked(lambda word: word.upper(), lambda value: value != "NO", "anything but no")
    assert kind("yes") == "YES"
    assert refusal(kind, "no") == "must be anything but no, not no"
    assert kind.__name__ == "<lambda>"

    class Unnamed:
        def __call__(self, word):
            return word

    assert common.checked(Unnamed(), bool, "x").__name__ == "value"


def test_list_of_reads_commas_skips_empty_parts_and_names_what_it_refuses():
    kind = common.list_of(float)
    assert kind(" 65, 1000,,4000 ,") == [65.0, 1000.0, 4000.0]
    assert kind.__name__ == "float"
    assert refusal(kind, "65,fast") == "'fast' is not a valid float"
    assert refusal(kind, ", ,") == "', ,' names no value"
    assert refusal(kind, "") == "'' names no value"
    choosing = common.list_of(str, ["http", "chained"])
    assert choosing("chained,http") == ["chained", "http"]
    assert refusal(choosing, "http,v3") == "'v3' is not one of http, chained"
    assert refusal(common.list_of(int, [1, 2]), "3") == "'3' is not one of 1, 2"
    # A value out of range keeps its own message.
    assert refusal(common.list_of(common.positive()), "1,-2") == "must be greater than 0, not -2"

    class Unnamed:
        def __call__(self, word):
            raise ValueError(word)

    assert refusal(common.list_of(Unnamed()), "a") == "'a' is not a valid value"
    assert common.list_of(Unnamed()).__name__ == "value"


def test_a_list_option_joins_every_word_and_its_help_shows_default_and_choices():
    parser = common.Parser(prog="t")
    common.add_list(parser, "--speeds", float, (65.0, 1000.0, 4000.5), "decode speeds")
    common.add_list(parser, "--designs", str, ("http", "chained"), "the designs", choices=["http", "chained", "suspended"])
    common.add_list(parser, "--seeds", int, None, "seeds", nargs="*")
    common.add_list(parser, "--tool-times", float, (), "tool times")
    actions = {a.dest: a for a in parser._actions}
    assert actions["speeds"].help == "decode speeds, separated by commas or spaces (default 65 1000 4000.5)"
    assert actions["designs"].help == ("the designs, separated by commas or spaces (default http chained); "
                                       "choices: http, chained, suspended")
    assert actions["seeds"].help == "seeds, separated by commas or spaces"
    assert actions["tool_times"].help == "tool times, separated by commas or spaces"
    assert [actions[d].metavar for d in ("speeds", "designs", "seeds", "tool_times")] == ["SPEEDS", "DESIGNS", "SEEDS", "TOOL_TIMES"]
    assert [actions[d].nargs for d in ("speeds", "seeds")] == ["+", "*"]
    defaults = parser.parse_args([])
    assert (defaults.speeds, defaults.designs, defaults.seeds, defaults.tool_times) == ([65.0, 1000.0, 4000.5], ["http", "chained"], None, [])
    assert type(defaults.speeds) is list
    args = parser.parse_args(["--speeds", "1,2", "3", "--seeds", "--designs", "suspended"])
    assert (args.speeds, args.seeds, args.designs) == ([1.0, 2.0, 3.0], [], ["suspended"])
    assert refusal(actions["designs"].type, "http,v3") == "'v3' is not one of http, chained, suspended"


def test_a_list_options_default_is_a_copy():
    default = [1.0, 2.0]
    parser = common.Parser(prog="t")
    common.add_list(parser, "--speeds", float, default, "speeds")
    parser.parse_args([]).speeds.append(3.0)
    assert default == [1.0, 2.0]


# --- common: the run folders ------------------------------------------------------------------------------


def test_a_run_folder_is_named_by_its_second_and_numbered_from_2_when_taken(tmp_path):
    now = datetime.datetime(2026, 11, 12, 13, 14, 15)
    base = tmp_path / "deep" / "compare"
    names = [common.new_run_folder(base, now).name for _ in range(3)]
    assert names == ["20261112-131415", "20261112-131415-2", "20261112-131415-3"]
    assert os.readlink(base / "latest") == "20261112-131415-3"
    assert sorted(p.name for p in base.iterdir()) == [*names, "latest"]  # the temporary link is gone


def test_a_run_folder_replaces_a_left_over_temporary_link_and_takes_the_clock_by_default(tmp_path):
    left_over = tmp_path / f".latest.{os.getpid()}"
    left_over.symlink_to("nowhere")
    before = datetime.datetime.now().replace(microsecond=0)
    folder = common.new_run_folder(str(tmp_path))
    after = datetime.datetime.now()
    assert before <= datetime.datetime.strptime(folder.name, "%Y%m%d-%H%M%S") <= after
    assert folder.is_dir() and folder.parent == tmp_path
    assert os.readlink(tmp_path / "latest") == folder.name
    assert not left_over.is_symlink()
    (tmp_path / f".latest.{os.getpid()}").write_text("a file left over")
    second = common.new_run_folder(tmp_path, datetime.datetime(2000, 1, 1))
    assert os.readlink(tmp_path / "latest") == second.name == "20000101-000000"
    assert not (tmp_path / f".latest.{os.getpid()}").exists()
