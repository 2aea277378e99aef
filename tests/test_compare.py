"""`python -m prototype compare` and `plot` (prototype/cli/compare.py, plot.py): what a run prints and writes, its options
and refusals, the real engine's path with a stand-in engine, and whole runs as a user starts them. `drawn` stands in for
the figure (tests/test_figure_drawing.py draws it)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import attrs
import pytest

from prototype import benchmark, figures, profiles, workload
from prototype.__main__ import main as cli_main
from prototype.cli import common, compare, plot
from prototype.client.reconnect import POLICIES
from prototype.engine.latency import LatencyModel
from prototype.engine.vllm_client import VllmUnavailable
from prototype.engine.vllm_engine import RealCall
from prototype.engine.vllm_models import TINY_CPU
from tests.conftest import REPO
from tests.support import child_env, exit_code

CODEX_TRACE = REPO / "tests" / "fixtures" / "codex-rollout-serve.jsonl"


@pytest.fixture
def drawn(monkeypatch):
    calls = []
    monkeypatch.setattr(figures, "compare_figure", lambda *args, **kwargs: calls.append((args, kwargs)))
    return calls


def parsed(*argv: str) -> argparse.Namespace:
    parser = common.Parser(prog="python -m prototype compare")
    compare.add_arguments(parser)
    return parser.parse_args(list(argv))


# --- the printed table -------------------------------------------------------------------------------------


def a_table_row(**changes):
    row = {"design": "suspended", "decode_tps": 4000.0, "tasks": 3, "e2e_mean_s": 20.25, "e2e_mean_s_low": 10.0, "e2e_mean_s_high": 31.5,
           "e2e_p50_s": 12.345, "e2e_p50_s_low": 10.0, "e2e_p50_s_high": 15.25, "e2e_p90_s": 1234.5,
           "speedup_vs_http": 1.235, "speedup_vs_http_low": 1.1, "speedup_vs_http_high": 1.3,
           "gain_vs_http": 0.19, "gain_vs_http_low": 0.09, "gain_vs_http_high": 0.23,
           "ttft_p50_ms": 1234.5, "ttft_p50_ms_low": 1000.0, "ttft_p50_ms_high": 1500.0,
           "ttft_p50_ratio_vs_http": 0.5, "ttft_p50_ratio_vs_http_low": 0.25, "ttft_p50_ratio_vs_http_high": 0.75,
           "api_overhead_share": 0.0125, "bytes_sent_per_turn": 1550.0, "bytes_received_per_turn": 2050.0, "cached_share": 0.5,
           "reasoning_share": float("nan"), "web_searches_per_task": 0.125, "calls_per_tool_turn": 1.5, "reconnects": 2, "extra": 0.5}
    row.update(changes)
    return row


def test_the_table_prints_each_estimate_with_its_interval_units_in_its_headers_and_a_legend_and_wide_every_column(capsys):
    exact = {"speedup_vs_http": 1.0, "speedup_vs_http_low": 1.0, "speedup_vs_http_high": 1.0}
    compare.print_compare_table([a_table_row(), a_table_row(design="http", **exact), a_table_row(design="x", speedup_vs_http=None)])
    assert capsys.readouterr().out == (
        "   design  tok/s  e2e mean (s)        vs http (x)         TTFT p50 (ms)  API (%)  sent/turn (kB)\n"
        "suspended  4,000   20 [10, 32]  1.24 [1.10, 1.30]  1,234 [1,000, 1,500]      1.2             1.6\n"
        "     http  4,000   20 [10, 32]               1.00  1,234 [1,000, 1,500]      1.2             1.6\n"
        "        x  4,000   20 [10, 32]                  -  1,234 [1,000, 1,500]      1.2             1.6\n"
        "  e2e mean (s): end-to-end time per task, first request to final answer, mean over the tasks (as in\n"
        "      compare.png)\n"
        "  vs http (x): total http time / total time of this design, same tasks: the ratio of the means\n"
        "  TTFT p50 (ms): per turn, request sent to first output delta\n"
        "  API (%): api_overhead_share, the API's own work (validate, safety, render, route, store reads,\n"
        "      blocking post-inference) as a share of end-to-end time\n"
        "  sent/turn (kB): client-to-server payload per turn, all the tasks' bytes over all their turns (as\n"
        "      in compare.png)\n"
        "  [low, high]: the 95% interval over the tasks (bootstrap; a ratio to http resamples the tasks of\n"
        "      both designs together, as they ran the same tasks)\n")
    compare.print_compare_table([{k: v for k, v in a_table_row().items() if not k.endswith(("_low", "_high"))}])
    lines = capsys.readouterr().out.splitlines()  # without intervals: the values, and no interval legend
    assert lines[1] == "suspended  4,000            20         1.24          1,234      1.2             1.6"
    assert not any(line.startswith("  [low, high]") for line in lines)
    # The wide table: every column, an unknown one under its name.
    compare.print_compare_table([a_table_row()], wide=True)
    lines = capsys.readouterr().out.splitlines()
    assert [h.strip() for h in lines[0].split("  ") if h] == [
        "design", "tok/s", "tasks", "e2e mean (s)", "e2e p50 (s)", "e2e p90 (s)", "vs http (x)", "gain (%)", "TTFT p50 (ms)",
        "TTFT/http (x)", "API (%)", "sent/turn (kB)", "recv/turn (kB)", "cached (%)", "reasoning (%)", "searches/task",
        "calls/tool turn", "reconnects", "extra"]
    assert [c.strip() for c in lines[1].split("  ") if c] == [
        "suspended", "4,000", "3", "20 [10, 32]", "12.3 [10.0, 15.2]", "1,234.5", "1.24 [1.10, 1.30]", "19.0 [9.0, 23.0]",
        "1,234 [1,000, 1,500]", "0.50 [0.25, 0.75]", "1.2", "1.6", "2.0", "50.0", "-", "0.12", "1.50", "2", "0.500"]
    # Every column's legend; those of the default table are above, the rest here.
    legend = " ".join(lines[2:])
    assert [line.split(":")[0].strip() for line in lines[2:] if not line.startswith("      ")] == [
        "e2e mean (s)", "e2e p50 (s)", "vs http (x)", "gain (%)", "TTFT p50 (ms)", "TTFT/http (x)", "API (%)", "sent/turn (kB)",
        "recv/turn (kB)", "cached (%)", "reasoning (%)", "searches/task", "calls/tool turn", "reconnects", "[low, high]"]
    for fact in ("e2e p50 (s): the same, the median task", "gain (%): 1 - total time of this design / total http time",
                 "TTFT/http (x): this design's TTFT p50 / http's", "recv/turn (kB): server-to-client payload per turn",
                 "cached (%): cached_share, the share of input tokens", "reasoning (%): reasoning tokens as a share",
                 "searches/task: hosted web_search calls", "calls/tool turn: client function calls per turn",
                 "reconnects: new connections the clients opened", "before the task did (the"):
        assert fact in legend, fact


def tasks_of(design: str, sent_per_turn: tuple[float, float], tools: tuple[float | None, float]) -> list[dict]:
    """Two tasks of one design at 1000 tokens/s, of 2 and 4 turns; a tool time of None: the task ran no tool."""
    return [{"design": design, "decode_tps": 1000.0, "task": task, "turns": turns, "bytes_sent_per_turn": sent,
             "phase_totals_s": {"prefill": 0.5} | ({} if tool is None else {"tool": tool}), "e2e_s": e2e}
            for task, turns, sent, tool, e2e in zip("ab", (2, 4), sent_per_turn, tools, (2.0, 6.0))]


def test_the_headline_gives_each_design_against_http_calling_a_gain_only_where_its_interval_excludes_0_and_the_upload_ratio(capsys):
    table = [a_table_row(design="http"), a_table_row(),
             a_table_row(design="chained", decode_tps=65.0, gain_vs_http=0.01, gain_vs_http_low=-0.02, gain_vs_http_high=0.04),
             a_table_row(design="x", gain_vs_http=-0.2, gain_vs_http_low=-0.3, gain_vs_http_high=-0.1),
             a_table_row(design="y", gain_vs_http_low=float("nan"))]
    compare.print_headline(table)
    assert capsys.readouterr().out == (
        "\nAgainst http on the same 3 tasks, with 95% intervals (paired bootstrap over the tasks):\n"
        "  suspended   at 4,000 tok/s: TTFT p50 0.50 [0.25, 0.75] of http's; end-to-end gain +19.0% [+9.0%, +23.0%] (faster)\n"
        "  chained     at    65 tok/s: TTFT p50 0.50 [0.25, 0.75] of http's; end-to-end gain +1.0% [-2.0%, +4.0%] "
        "(not separated from 0)\n"
        "  x           at 4,000 tok/s: TTFT p50 0.50 [0.25, 0.75] of http's; end-to-end gain -20.0% [-30.0%, -10.0%] (slower)\n")
    compare.print_headline([a_table_row(design="http")])
    assert capsys.readouterr().out == ""
    figures_by_key = compare.headline_estimates(table[:2])
    assert sorted(figures_by_key) == sorted([
        "e2e_mean_s.http.4000", "ttft_p50_ms.http.4000", "e2e_mean_s.suspended.4000", "ttft_p50_ms.suspended.4000",
        "gain.suspended.4000", "speedup.suspended.4000", "ttft_ratio.suspended.4000"])
    assert figures_by_key["gain.suspended.4000"] == benchmark.Estimate(0.19, 0.09, 0.23, 3, "tasks", "paired bootstrap")
    # From the task rows: the upload, its ratio to http's and the tools' share.
    rows = tasks_of("http", (3000.0, 6000.0), (1.0, 2.0)) + tasks_of("chained", (1000.0, 2000.0), (1.0, 3.0))
    table = [a_table_row(design="http", decode_tps=1000.0), a_table_row(design="chained", decode_tps=1000.0)]
    figures_by_key = compare.headline_estimates(table, rows)
    # http sends 3x chained's bytes on every task: 3x in every resample; chained's bytes: 10,000 over 6 turns.
    assert figures_by_key["upload_ratio.chained.1000"] == benchmark.Estimate(3.0, 3.0, 3.0, 2, "tasks", "exact")
    assert figures_by_key["sent_kb.chained.1000"].value == pytest.approx(10_000 / 6 / 1000)
    assert figures_by_key["tool_share.chained.1000"].value == pytest.approx(4.0 / 8.0)
    assert "upload_ratio.http.1000" not in figures_by_key
    assert not any(k.startswith(("sent_kb", "tool_share")) for k in compare.headline_estimates(table))  # rows not given


def test_a_parameters_value_wraps_between_words_keeping_hyphenated_words_whole_and_an_empty_value_prints_blank(capsys):
    compare.print_parameters([("API work", "the API's own work, before and after prefix-cache lookups", "prototype/server/api.py"),
                              ("notes", "", "none given")])
    assert capsys.readouterr().out == (
        "  API work                                     the API's own work, before and after         prototype/server/api.py\n"
        "                                               prefix-cache lookups\n"
        "  notes                                                                                     none given\n")


def test_the_tools_share_counts_a_task_that_ran_no_tool_as_0_s_and_the_upload_ratios_interval_is_a_paired_bootstrap():
    rows = tasks_of("http", (3000.0, 4000.0), (1.0, 2.0)) + tasks_of("chained", (1000.0, 2000.0), (None, 3.0))
    table = [a_table_row(design="http", decode_tps=1000.0), a_table_row(design="chained", decode_tps=1000.0)]
    figures_by_key = compare.headline_estimates(table, rows)
    assert figures_by_key["tool_share.chained.1000"].value == pytest.approx(3.0 / 8.0)
    # http's upload over chained's: 22,000 bytes over 6 turns against 10,000 over 6; the tasks differ (3x, 2x), so an interval.
    ratio = figures_by_key["upload_ratio.chained.1000"]
    assert ratio.value == pytest.approx(2.2) and (ratio.n, ratio.of, ratio.method) == (2, "tasks", "paired bootstrap")


def test_results_written_without_a_command_name_compare_as_the_command_their_figures_come_from(tmp_path, drawn):
    rows = tasks_of("http", (3000.0, 4000.0), (1.0, 2.0)) + tasks_of("chained", (1000.0, 2000.0), (1.0, 3.0))
    table = [a_table_row(design="http", decode_tps=1000.0), a_table_row(design="chained", decode_tps=1000.0)]
    compare.write_results(tmp_path, table, rows, [("network", "RTT 20 ms", "docs/network.md")], "the 'coding' workload", "virtual time")
    section = json.loads((tmp_path / "compare.json").read_text())["headline"]
    assert (section["command"], section["workload"]) == ("python -m prototype compare", "2 tasks of the 'coding' workload, virtual time")


# --- the options and the configuration ---------------------------------------------------------------------


def test_the_options_defaults_as_each_options_help_names_them_and_vllms_own_workload_unless_told_otherwise(monkeypatch, capsys):
    args = parsed()
    assert (args.tasks, args.seed, args.preset, args.trace, args.latency, args.speeds, args.designs, args.rtt_ms, args.turns,
            args.out, args.real, args.vllm_parallel, args.reconnect, args.wide) == (
        None, 0, None, None, None, None, ["http", "chained", "suspended"], 20.0, None, None, False, False, "codex", False)
    assert exit_code(parsed, "--reconnect", "carrier-pigeon") == 2  # a policy it does not have
    assert "argument --reconnect: invalid choice: 'carrier-pigeon' (choose from " in capsys.readouterr().err
    args = parsed("--speeds", "65,", "1000", "4000", "--designs", "http,chained", "suspended")  # commas or spaces
    assert (args.speeds, args.designs) == ([65.0, 1000.0, 4000.0], ["http", "chained", "suspended"])
    # vLLM takes a workload of its own unless told otherwise.
    def defaults(*argv: str) -> tuple:
        args = parsed(*argv)
        compare.apply_engine_defaults(args)
        return args.preset, args.tasks, args.turns

    assert defaults() == (None, None, None)  # the simulated engine: the coding preset's 10 tasks (workload_config)
    assert defaults("--engine", "vllm") == ("chat", 3, 3)
    assert defaults("--engine", "vllm", "--preset", "coding") == ("coding", 3, None)  # the coding preset on request
    assert defaults("--engine", "vllm", "--tasks", "1", "--turns", "2") == ("chat", 1, 2)
    assert defaults("--engine", "vllm", "--trace", "t.jsonl") == (None, None, None)  # a trace's tasks, as they are
    parser = common.Parser(prog="c")
    compare.add_arguments(parser)
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    text = parser.format_help()
    for fact in ("(default 10; with --trace, all; with --engine vllm, 3)\n", "the same seed gives the same tasks (default 0)\n",
                 "coding, compact, chat, long (default coding), or a preset JSON file (calibrate --preset-out); with --engine vllm "
                 "the default is chat with 3 turns a task (minutes on a CPU), --preset coding on request\n",
                 "(file or folder of Codex rollouts)\n", "(calibrate --latency-out): prefill rate, overhead, decode rate\n",
                 "(default 65 1000 4000; with --latency, the profile's), separated by commas",
                 "chains previous_response_id through the store), separated by commas",
                 "(default http chained suspended); choices: http, http-stored, chained, suspended\n", "in ms (default 20)\n",
                 "(default: drawn from the preset)\n", "(default: a new results/compare/<timestamp>/, with results/compare/latest pointing at it)\n",
                 "instead of virtual time (use a small configuration: e.g. --tasks 1 --turns 3 --speeds 1000)\n",
                 "each on a vLLM worker of its own (a third of the wall time;", "but the designs share the CPU, so their times",
                 "not each design's alone)\n", "(prototype/client/reconnect.py; default codex, the agent client,",
                 "past the 60-minute limit on a new connection)\n", "print every column of compare.csv (default: the first seven)\n"):
        assert fact in text, fact


def test_a_preset_run_takes_ten_tasks_the_default_speeds_and_the_options_given_a_preset_file_and_a_latency_profile(tmp_path):
    network = benchmark.DEFAULT_NETWORK
    config, described, speeds = compare.workload_config(parsed(), network)
    assert (described, speeds) == ("the 'coding' workload", [65.0, 1000.0, 4000.0])
    assert (config.preset, config.n_tasks, config.seed, config.network, config.fixed_turns, config.latency, config.reconnect) == (
        "coding", 10, 0, network, None, LatencyModel(), POLICIES["codex"])
    args = parsed("--preset", "chat", "--tasks", "2", "--seed", "5", "--turns", "3", "--speeds", "100", "--reconnect", "codex")
    config, described, speeds = compare.workload_config(args, network)
    assert (described, speeds) == ("the 'chat' workload", [100.0])
    assert (config.preset, config.n_tasks, config.seed, config.fixed_turns, config.reconnect) == ("chat", 2, 5, 3, POLICIES["codex"])
    preset = profiles.save_preset(workload.PRESETS["chat"], tmp_path / "preset.json", "test")
    model = LatencyModel(decode_tokens_per_s=321.0, prefill_tokens_per_s=5000.0)
    latency = profiles.save_latency(model, tmp_path / "latency.json", "test")
    config, described, speeds = compare.workload_config(parsed("--preset", str(preset), "--latency", str(latency)),
                                                        benchmark.DEFAULT_NETWORK)
    assert (config.preset, config.latency, described, speeds) == (workload.PRESETS["chat"], model, f"the '{preset}' workload", [321.0])
    config, _, speeds = compare.workload_config(parsed("--latency", str(latency), "--speeds", "7"), benchmark.DEFAULT_NETWORK)
    assert speeds == [7.0]


def test_a_trace_run_replays_the_traces_first_tasks_and_prints_the_readers_notes(capsys, tmp_path, monkeypatch):
    model = LatencyModel(decode_tokens_per_s=321.0)
    latency = profiles.save_latency(model, tmp_path / "latency.json", "test")
    network = attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=0.125)
    config, _, speeds = compare.workload_config(parsed("--trace", str(CODEX_TRACE), "--latency", str(latency)), network)
    assert (config.network, config.latency, speeds) == (network, model, [321.0])
    config, described, speeds = compare.workload_config(parsed("--trace", str(CODEX_TRACE), "--seed", "4", "--reconnect", "codex"),
                                                        benchmark.DEFAULT_NETWORK)
    assert described == f"trace {CODEX_TRACE} (codex)"
    assert (config.n_tasks, config.seed, config.source, config.reconnect, speeds) == (1, 4, described, POLICIES["codex"],
                                                                                       [65.0, 1000.0, 4000.0])
    assert [len(task.turns) for task in config.task_list] == [9] and capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="^--turns applies to generated tasks, not to a trace$"):
        compare.workload_config(parsed("--trace", str(CODEX_TRACE), "--turns", "2"), benchmark.DEFAULT_NETWORK)
    folder = tmp_path / "rollouts"  # a folder of two rollouts: its first tasks, and the reader's notes printed
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"rollout-{name}.jsonl").write_text(CODEX_TRACE.read_text())
    config, *_ = compare.workload_config(parsed("--trace", str(folder)), benchmark.DEFAULT_NETWORK)
    assert config.n_tasks == 2 and len(config.task_list) == 2
    load = compare.traces.load
    monkeypatch.setattr(compare.traces, "load", lambda path: attrs.evolve(load(path), notes=("one", "two")))
    config, *_ = compare.workload_config(parsed("--trace", str(folder), "--tasks", "1"), benchmark.DEFAULT_NETWORK)
    assert config.n_tasks == 1 and config.task_list == (load(folder).tasks[0],)
    assert capsys.readouterr().err == "trace note: one\ntrace note: two\n"


def test_the_parameters_printed_leave_out_what_did_not_run():
    config, *_ = compare.workload_config(parsed(), benchmark.DEFAULT_NETWORK)
    everything = benchmark.parameters(config)
    names = [name for name, *_ in everything]
    assert "v1 suspension TTL" in names and "http connections" in names
    rows = compare.run_parameters(config, ["http", "chained", "suspended"], [65.0, 1000.5])
    assert [name for name, *_ in rows] == names and dict((n, v) for n, v, _ in rows)["decode speeds"] == "65, 1000.5 tokens/s"
    assert [r for r in rows if r[0] != "decode speeds"] == [r for r in everything if r[0] != "decode speeds"]
    assert [n for n, *_ in compare.run_parameters(config, ["chained"], [1.0])] == [
        n for n in names if n not in ("v1 suspension TTL", "http connections")]
    assert "http connections" in [n for n, *_ in compare.run_parameters(config, ["http-stored"], [1.0])]


# --- a run -------------------------------------------------------------------------------------------------


def test_a_run_prints_the_table_parameters_and_notes_writes_every_file_estimates_a_long_run_and_caches(tmp_path, drawn, capsys,
                                                                                                          monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "new" / "out"
    argv = ["compare", "--tasks", "2", "--turns", "3", "--speeds", "1000", "--designs", "http,chained", "--jobs", "1",
            "--rtt-ms", "40", "--out", str(out)]
    assert cli_main([*argv, "--no-cache"]) == 0
    printed, err = capsys.readouterr()
    assert not (tmp_path / "cache").exists() and "roughly" not in err
    # The bar counts tasks, not (design, speed) points: 2 points of 2 tasks.
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert " 4/4 [" in final and "task" in final, final
    lines = printed.splitlines()  # the default table (its columns: test_the_table_prints_each_estimate...)
    header = next(line for line in lines if "design" in line and "tok/s" in line)
    table = lines[lines.index(header): lines.index(header) + 3]
    assert [row.split()[:2] for row in table[1:]] == [["http", "1,000"], ["chained", "1,000"]]
    assert max(len(line) for line in table) <= 100  # every estimate with its interval fits a terminal
    assert any(line.split()[:4] == ["decode", "speeds", "1000", "tokens/s"] for line in lines)
    assert "suspension TTL" not in printed and "results cache" not in printed  # v1 did not run; nothing cached
    # With v1 too, a long run by the estimate's count: the estimate, before the progress bar.
    argv[argv.index("http,chained")] = "suspended,http,chained"
    monkeypatch.setattr(compare, "ESTIMATE_FROM", 6)
    clock = iter([10.0, 12.25])
    monkeypatch.setattr(compare, "time", types.SimpleNamespace(perf_counter=lambda: next(clock), process_time=time.process_time))
    assert cli_main(argv) == 0
    printed, err = capsys.readouterr()
    assert err.index("compare: 6 task runs, roughly") < err.index("%|")
    saved = json.loads((out / "compare.json").read_text())
    table, rows = saved["table"], json.loads((out / "compare_tasks.json").read_text())
    designs = ["http", "chained", "suspended"]
    assert [(r["design"], r["decode_tps"], r["tasks"]) for r in table] == [(d, 1000.0, 2) for d in designs]
    assert [(r["design"], r["decode_tps"]) for r in rows] == [(d, 1000.0) for d in designs for _ in range(2)]
    assert (out / "compare.json").read_text() == json.dumps(
        {"table": table, "parameters": saved["parameters"], "workload": "the 'coding' workload", "clock": "virtual time",
         "headline": saved["headline"]}, indent=1) + "\n"
    # The headline section the docs quote (prototype/headline.py): the command, the workload, every figure with its
    # interval and format, the docs' table, and the task rows the figure is drawn from.
    section = saved["headline"]
    assert (section["name"], section["command"], section["workload"]) == (
        "compare", "python -m prototype compare --tasks 2 --turns 3", "2 tasks of the 'coding' workload, virtual time")
    assert sorted(section["figures"]) == sorted(
        [f"{name}.{design}.1000" for name in ("e2e_mean_s", "ttft_p50_ms", "sent_kb", "tool_share") for design in designs]
        + [f"{name}.{design}.1000" for name in ("gain", "speedup", "ttft_ratio", "upload_ratio") for design in designs[1:]])
    gain = section["figures"]["gain.suspended.1000"]
    assert (gain["value"], gain["n"], gain["format"], gain["scale"]) == (table[2]["gain_vs_http"], 2, "{:.1f}%", 100.0)
    assert section["tables"]["table"]["columns"] == [c.header for c in compare.DOCS_TABLE]
    assert [r[0] for r in section["tables"]["table"]["rows"]] == designs and section["data"] == rows
    with (out / "compare.csv").open() as f:
        assert [row["design"] for row in csv.DictReader(f)] == designs
    assert sorted(p.name for p in out.iterdir()) == [
        "compare.csv", "compare.json", "compare_tasks.json", "trace_chained.json", "trace_http.json", "trace_suspended.json"]
    [_, (args, kwargs)] = drawn
    # Drawn into the run's staging folder beside `out`, whose files then move into `out` (cli/common.py RunFolder).
    assert (json.dumps(args[0]), args[1], args[2].name, args[2].parent.parent, kwargs) == (
        json.dumps(table), rows, "compare.png", out.parent, {"workload": "the 'coding' workload", "clock": "virtual time"})
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]
    assert printed.startswith("\n2 tasks of the 'coding' workload, virtual time\n\n   design  tok/s  e2e mean (s)")
    assert "coding, 2 tasks, seed 0" in printed
    assert common.plural(1000, "task") == "1,000 tasks" and common.plural(1, "task") == "1 task"
    parameters = dict((name, (value, source)) for name, value, source in saved["parameters"])
    assert parameters["decode speeds"][0] == "1000 tokens/s" and parameters["network"][0].startswith("RTT 40 ms")
    first, rest = textwrap.wrap(parameters["network"][0], 44, break_on_hyphens=False)  # too long: it wraps in its column
    network_line = ("  " + "network".ljust(44) + " " + first.ljust(44) + " " + parameters["network"][1] + "\n"
                    + "  " + " " * 44 + " " + rest + "\n")
    assert "\nModeled parameters (value, source):\n  workload preset " in printed and network_line in printed
    assert ("\n\n  tasks with a tool call longer than v1's default 300 s suspension TTL: 0 of 2. compare runs v1 with a "
            "3600 s TTL so that every task finishes and the designs are timed on the same tasks;\n  under `serve`'s default "
            "300 s, v1 would end those tasks with response.failed (server_error) and the client would have to start "
            "them again.\n") in printed
    assert ("\n\n  reconnects (codex policy): none; WebSocket connections close after 60 minutes (WS guide): under codex a "
            "task longer than that continues on a new connection\n") in printed
    assert "results cache" not in printed
    wrote = printed.splitlines()[-1]
    assert wrote == (f"wrote {out}/compare.csv, compare.json, compare_tasks.json, compare.png, trace_http.json, trace_chained.json, "
                     "trace_suspended.json in 2.2 s")
    # What each design keeps between turns orders them: end-to-end time, time to first token and upload.
    by = {r["design"]: r for r in table}
    assert by["http"]["speedup_vs_http"] == 1.0 < by["chained"]["speedup_vs_http"] < by["suspended"]["speedup_vs_http"]
    for column in ("ttft_p50_ms", "bytes_sent_per_turn"):
        assert by["http"][column] > by["chained"][column] > by["suspended"][column] > 0, column
    assert all(r["reasoning_share"] > 0.1 and r["bytes_received_per_turn"] > 0 for r in table)
    spans = [e for e in json.loads((out / "trace_suspended.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert {"turn", "time_to_first_token", "validate", "prefill", "decode", "post"} <= {e["name"] for e in spans}
    assert all(e["dur"] >= 0 for e in spans)
    # The same run again takes every point from the results cache, says so, and has nothing to estimate: the same table.
    monkeypatch.setattr(compare, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    assert cli_main(argv) == 0
    again, err = capsys.readouterr()
    assert "roughly" not in err
    assert (f"\n\n3 of 3 (design, speed) points came from the results cache ({tmp_path / 'cache'}): computed before with "
            "the same configuration and code; --no-cache computes them again.\n") in again
    assert again.split("\n3 of 3")[0].rstrip("\n") == printed.split("\nModeled")[0].rstrip("\n")


def test_a_run_counts_tasks_longer_than_v1s_ttl_and_reconnects_and_a_real_time_run_says_so(tmp_path, drawn, capsys, monkeypatch):
    slow = workload.Workload("slow", 0, (workload.TurnSpec(100, 5, (301.0,)), workload.TurnSpec(10, 5, ())))
    quick = workload.Workload("quick", 0, (workload.TurnSpec(100, 5, (300.0,)), workload.TurnSpec(10, 5, ())))
    monkeypatch.setattr(benchmark.BenchConfig, "tasks", lambda self: [slow, quick])
    monkeypatch.setattr(benchmark, "summarize", lambda rows: [
        {"design": "suspended", "decode_tps": 65.0, "reconnects": 2}, {"design": "http", "decode_tps": 1000.5, "reconnects": 0},
        {"design": "chained", "decode_tps": 4000.0, "reconnects": 1}])
    monkeypatch.setattr(compare, "print_compare_table", lambda table, wide: print(f"TABLE wide={wide}"))
    real = []
    monkeypatch.setattr(compare, "run_grid", lambda config, designs, speeds, runner, out, is_real: real.append(is_real) or [])
    assert cli_main(["compare", "--no-cache", "--wide", "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("\n2 tasks of the 'coding' workload, virtual time\n\nTABLE wide=True\n")
    assert "longer than v1's default 300 s suspension TTL: 1 of 2. " in printed
    assert "\n  reconnects (codex policy): suspended at 65: 2, chained at 4000: 1; WebSocket" in printed
    assert cli_main(["compare", "--real", "--no-cache", "--out", str(tmp_path / "b")]) == 0 and real == [False, True]
    assert capsys.readouterr().out.startswith("\n2 tasks of the 'coding' workload, real time over loopback sockets\n\nTABLE wide=False\n")
    assert drawn[1][1]["clock"] == "real time over loopback sockets"


@pytest.mark.parametrize("argv, says", [
    (["--trace", "/nonexistent/trace.jsonl"], "python -m prototype compare: error: "),
    (["--latency", "/nonexistent/latency.json"], "python -m prototype compare: error: "),
    (["--trace", str(CODEX_TRACE), "--turns", "2"],
     "python -m prototype compare: error: --turns applies to generated tasks, not to a trace (see --help)\n"),
    (["--preset", "nonsense"], "python -m prototype compare: error: --preset 'nonsense' is neither a preset (coding, compact, "
                               "chat, "
                               "long) nor a file (see --help)\n")])
def test_a_bad_trace_profile_preset_or_combination_exits_2_with_one_line(argv, says, tmp_path, drawn, capsys):
    assert cli_main(["compare", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.endswith(" (see --help)\n") and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_the_grid_runs_slowest_first_and_writes_one_trace_per_design_at_the_trace_speed(tmp_path):
    calls = []

    class Runner:
        def map(self, function, grid, *, desc, first, measured, units, unit):
            assert (unit, [units(run) for run in grid]) == ("task", [1] * len(grid))  # the bar counts the tasks
            calls.append((desc, [first(run) for run in grid], measured))
            return [function(run) for run in grid]

    class Planned:
        def map(self, function, grid, *, desc, first, measured, units, unit):
            calls.append((measured, [run.real for run in grid]))
            return [([], None) for _ in grid]

    config = benchmark.BenchConfig(n_tasks=1, fixed_turns=2)
    assert compare.run_grid(config, ["http"], [65.0], Planned(), tmp_path, real=True) == []
    assert compare.run_grid(config, ["http"], [65.0], Planned(), tmp_path) == [] and calls == [(True, [True]), (False, [False])]
    calls.clear()
    rows = compare.run_grid(config, ["http", "chained"], [1000.0, 4000.0], Runner(), tmp_path)
    assert calls == [("compare", [(1000.0, False), (1000.0, True), (4000.0, False), (4000.0, True)], False)]
    assert [(r["design"], r["decode_tps"]) for r in rows] == [("http", 1000.0), ("chained", 1000.0), ("http", 4000.0),
                                                              ("chained", 4000.0)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace_chained.json", "trace_http.json"]
    rows, traced = compare.compare_point(benchmark.DesignRun("http", 4000.0, config))
    assert traced is None and len(rows) == 1
    rows, traced = compare.compare_point(benchmark.DesignRun("http", 1000.0, config))
    assert traced is not None and traced.design == "http-stateless"


# --- the real engine's path, with a stand-in engine -------------------------------------------------------


def real_call(prompt: int, computed: int, hits: int, predicted: int) -> RealCall:
    """vLLM's record of one chained call: its prompt, the prefill vLLM computed, its prefix-cache hits, and the
    simulated engine's prediction of the prefill."""
    return RealCall(key=("chained", "c"), held=False, resumed=False, isolated=False, prompt_tokens=prompt,
                    sent_tokens=prompt, output_tokens=10, sampled_tokens=13, forced=True, off_plan_tokens=0,
                    prefill_tokens=computed, prefix_hits=hits, vllm_cached_tokens=hits, predicted_prefill_tokens=predicted,
                    ttft_s=0.1, decode_s=0.2, kv_usage=0.0, kv_blocks_used=0)


def test_the_vllm_report_sums_each_designs_calls_v1s_lead_and_where_each_designs_time_went():
    chained = [real_call(1000, 1000, 0, 1000), real_call(2500, 1600, 900, 1560)]
    # v1's second call resumes a held request: 1,000 of its 2,500 prompt tokens were never sent again.
    resumed = attrs.evolve(real_call(2500, 300, 0, 250), key=("suspended", "s"), held=True, resumed=True, sent_tokens=1500,
                           off_plan_tokens=7)
    suspended = [attrs.evolve(real_call(1000, 1000, 0, 1000), key=("suspended", "s")), resumed]
    rows = [{"design": "chained", "e2e_s": 7.0, "phase_totals_s": {
                "queue": 0.5, "prefill": 1.0, "decode": 2.0, "validate": 0.5, "network_client": 0.125, "tool": 3.0}},
            {"design": "suspended", "e2e_s": 2.0, "phase_totals_s": {"prefill": 0.5, "hosted_tool": 1.0}},
            {"design": "suspended", "e2e_s": 1.5, "phase_totals_s": {"decode": 1.0}}]
    lines = compare.vllm_report({"chained": chained, "suspended": suspended}, rows, 32)
    assert lines[0] == ("vLLM's counters per design (prefill computed and prefix-cache hits: vLLM's own; predicted: the simulated "
                        "engine's bookkeeping on the same calls):")
    assert lines[1:5] == [
        "  chained      model calls    2  prompt tokens     3,500  prefill computed     2,600  predicted     2,560  prefix-cache hits       900",
        "  suspended    model calls    2  prompt tokens     3,500  prefill computed     1,300  predicted     1,250  prefix-cache hits         0"
        "  cached (derived: prompt less ids sent)     1,000  SAMPLED OFF THE PLAN 7 tokens",
        "  chained per call, vLLM against the prediction: 1 of 2 calls within one KV block (32 tokens); largest gap 40 tokens",
        "  v1's lead over chained in prefill computed: vLLM 1,300 tokens, predicted 1,310 (-0.8%)"]
    # The time split: the engine's phases (queue, prefill, decode), the API's, the network's and the tools', and end to end.
    assert lines[5:] == [
        "", "Where the time went, per design, all tasks (seconds): the engine's is measured on vLLM; the API's work, the network "
        "and the tools are modeled waits",
        "  design        vLLM (measured)  API (modeled)  network+client  tools (modeled)  end to end",
        "  chained                   3.5            0.5             0.1              3.0         7.0",
        "  suspended                 1.5            0.0             0.0              1.0         3.5",
        "  network+client: the modeled round trips and the testbed's own client and server work between them"]
    # Without v1 there is no lead to report; a design's calls without a held request derive no cached tokens.
    alone = compare.vllm_report({"chained": chained}, rows[:1], 32)
    assert not any("lead" in line or "derived" in line or "OFF THE PLAN" in line for line in alone)
    # No calls at all: no gap, and no share of a predicted lead of zero.
    empty = compare.vllm_report({"chained": [], "suspended": []}, [], 32)
    assert empty[3:5] == ["  chained per call, vLLM against the prediction: 0 of 0 calls within one KV block (32 tokens); largest gap 0 tokens",
                          "  v1's lead over chained in prefill computed: vLLM 0 tokens, predicted 0 (-)"]


def test_on_vllm_the_parameters_are_the_engines_own_in_place_of_the_simulated_engines():
    parameters = compare.vllm_parameters([("prefill rate", "1e5 tokens/s", "fit"), ("tools", "0.5 s", "workload")], TINY_CPU)
    assert [name for name, _, _ in parameters] == ["engine", "KV cache", "tools"]
    assert parameters[2] == ("tools", "0.5 s", "workload")
    assert parameters[:2] == [
        ("engine", f"vLLM, {TINY_CPU.name}: {TINY_CPU.layers} layers, {TINY_CPU.hidden_size} wide, {TINY_CPU.dtype}, dummy weights; "
         "forced decoding; real time", "docs/real_engine.md"),
        ("KV cache", f"blocks of {TINY_CPU.block_size} tokens, prefix caching on, {TINY_CPU.cpu_kv_cache_gib} GiB (VLLM_CPU_KVCACHE_SPACE)",
         "vLLM engine arguments (prototype/engine/vllm_models.py)")]
    no_kv_space = compare.vllm_parameters([], attrs.evolve(TINY_CPU, cpu_kv_cache_gib=None))
    assert no_kv_space[1][1] == f"blocks of {TINY_CPU.block_size} tokens, prefix caching on"


def test_the_real_engine_runs_each_design_once_keeps_its_rows_traces_its_first_task_and_prints_its_calls(tmp_path, drawn, capsys,
                                                                                                           monkeypatch):
    from prototype.trace import write_chrome_trace

    seen, records = [], {}

    def designs_on_vllm(designs, config, spec, *, python, decode_tps, parallel):
        seen.append((designs, spec.name, python, decode_tps, parallel))
        records.update({d: benchmark.run_design_virtual(d, 1000.0, config) for d in designs})
        return {d: (records[d], [real_call(1000, 400, 600, 432), real_call(2500, 100, 2400, 60)]) for d in designs}

    monkeypatch.setattr(benchmark, "run_designs_on_vllm", designs_on_vllm)
    out = tmp_path / "out"
    assert cli_main(["compare", "--engine", "vllm", "--vllm-python", "/p/python", "--vllm-parallel", "--tasks", "2",
                     "--turns", "2", "--preset", "chat", "--designs", "http,chained", "--out", str(out)]) == 0
    assert seen == [(["http", "chained"], "tiny-llama-cpu", "/p/python", 1000.0, True)]
    printed = capsys.readouterr().out
    assert printed.startswith("\n2 tasks of the 'chat' workload, real time on vLLM (tiny-llama-cpu, dummy weights)\n")
    for design in ("http   ", "chained"):
        assert (f"  {design}      model calls    2  prompt tokens     3,500  prefill computed       500  predicted       492"
                "  prefix-cache hits     3,000\n") in printed
    assert "  chained per call, vLLM against the prediction: 1 of 2 calls within one KV block (32 tokens); largest gap 40 tokens" in printed
    assert "Modeled parameters" not in printed and "prefill rate" not in printed and "decode speeds" not in printed
    assert "  KV cache" in printed
    assert printed.splitlines()[-1].startswith(f"wrote {out}/compare.csv, compare.json, compare_tasks.json, compare.png, "
                                               "trace_http.json, trace_chained.json, vllm_calls.csv, vllm_calls.json in ")
    assert [(r["design"], r["call"], r["prefill_vllm"], r["prefill_sim"]) for r in json.loads((out / "vllm_calls.json").read_text())] == [
        (d, call, vllm, sim) for d in ("http", "chained") for call, vllm, sim in ((1, 400, 432), (2, 100, 60))]
    assert "results cache" not in printed and drawn[0][1]["clock"] == "real time on vLLM (tiny-llama-cpu, dummy weights)"
    # Every design's rows (the decode speed column names the model profile only), and a trace of each one's first task.
    rows = json.loads((out / "compare_tasks.json").read_text())
    assert [(r["design"], r["decode_tps"], r["task"]) for r in rows] == [
        ("http", 1000.0, "chat-0"), ("http", 1000.0, "chat-1"), ("chained", 1000.0, "chat-0"), ("chained", 1000.0, "chat-1")]
    write_chrome_trace(records["http"][:1], tmp_path / "first.json")
    assert (out / "trace_http.json").read_text() == (tmp_path / "first.json").read_text()
    # The time split, over the design's tasks: the engine's phases (measured on vLLM) apart from the modeled API work,
    # network and tools.
    mine = rows[2:]

    def spent(*phases: str) -> float:
        return sum(row["phase_totals_s"].get(phase, 0.0) for row in mine for phase in phases)

    assert (f"  chained      {spent('queue', 'prefill', 'decode'):>16.1f} {spent(*benchmark.API_OVERHEAD_PHASES):>14.1f} "
            f"{spent('network_client'):>15.1f} {spent('tool', 'hosted_tool'):>16.1f} {sum(r['e2e_s'] for r in mine):>11.1f}\n") in printed


def test_a_context_at_or_past_the_models_window_is_refused_before_the_engine_starts_and_an_engine_that_cannot_start_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "run_designs_on_vllm", lambda *a, **k: pytest.fail("the engine started"))
    monkeypatch.setattr(compare, "model_spec", lambda args: attrs.evolve(TINY_CPU, max_model_len=2048))
    assert cli_main(["compare", "--engine", "vllm", "--preset", "coding", "--tasks", "1", "--turns", "2",
                     "--out", str(tmp_path)]) == 2
    [task] = benchmark.BenchConfig(n_tasks=1, fixed_turns=2).tasks()
    assert capsys.readouterr().err == (
        f"python -m prototype compare: error: --engine vllm: task coding-0 reaches {task.context_before(2):,} tokens of "
        "context, more than tiny-llama-cpu's context window of 2,048 (fewer --turns, or another --vllm-model)\n")
    context, args = task.context_before(len(task.turns)), parsed("--engine", "vllm")
    config = benchmark.BenchConfig(n_tasks=1, fixed_turns=2)
    monkeypatch.setattr(compare, "model_spec", lambda args: attrs.evolve(TINY_CPU, max_model_len=context))
    with pytest.raises(compare.ContextTooLong):  # exactly at the window: refused too
        compare.run_on_vllm(args, config, ["http"], Path(tmp_path))
    monkeypatch.setattr(compare, "model_spec", lambda args: attrs.evolve(TINY_CPU, max_model_len=context + 1))
    monkeypatch.setattr(benchmark, "run_designs_on_vllm", lambda *a, **k: {})
    assert compare.run_on_vllm(args, config, ["http"], Path(tmp_path))[0] == []
    # An engine that cannot start exits 2 with its reason.
    def unavailable(*args, **kwargs):
        raise VllmUnavailable("no vllm here")

    monkeypatch.setattr(benchmark, "run_designs_on_vllm", unavailable)
    monkeypatch.setattr(compare, "model_spec", lambda args: attrs.evolve(TINY_CPU, max_model_len=10**9))
    assert cli_main(["compare", "--engine", "vllm", "--tasks", "1", "--turns", "2", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "python -m prototype compare: error: --engine vllm: no vllm here\n"


COMPARED = ("compare.csv", "compare.json", "compare_tasks.json", "compare.png")


def run_folders(tmp_path, kind: str = "compare") -> list[str]:
    """Every entry of results/<kind>/, hidden ones included."""
    folder = tmp_path / "results" / kind
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_ctrl_c_during_compare_says_interrupted_in_one_line_and_leaves_no_results(tmp_path):
    # 40 tasks of the coding workload at 65 tokens/s: each point runs for many seconds, so the signal finds the grid running.
    child = subprocess.Popen(
        [sys.executable, "-m", "prototype", "compare", "--tasks", "40", "--speeds", "65", "--jobs", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(tmp_path), cwd=tmp_path, text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
        # Ctrl-C's default disposition, as a terminal gives it, even where the tests run as a background job
        # (which starts with SIGINT ignored, and Python then installs no KeyboardInterrupt handler).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = ""
    while "2 processes]" not in err:  # the progress bar names the worker processes: the grid has started in them
        char = child.stderr.read(1)
        assert char, f"compare ended before its progress bar: {err}"
        err += char
    os.killpg(child.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group, workers included
    err += child.stderr.read()
    assert child.wait(timeout=120) == common.INTERRUPTED
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.rstrip("\n").splitlines()[-1] == "python -m prototype compare: interrupted: no results written"
    assert run_folders(tmp_path) == []  # no folder, no hidden partial one, no `latest`
    # The worker processes and the fork server end with it.
    for _ in range(600):
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("processes of the interrupted compare are still running")


def test_a_failed_compare_leaves_no_folder_latest_on_the_last_complete_run_and_a_named_folders_files_as_they_were(
        two_runs, tmp_path, monkeypatch, capsys):
    from prototype.engine.vllm_client import PYTHON_ENV

    out, complete = two_runs  # a folder named by --out, and the last complete run of results/compare/
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == sorted(COMPARED)
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "no-python"))  # were vLLM started, this would be the error
    # Refused after the run began: the long preset's task does not fit the real engine's model.
    assert cli_main(["compare", "--engine", "vllm", "--preset", "long", "--tasks", "1"]) == 2
    assert "context window" in capsys.readouterr().err
    # Fails after the table and its files are written, at the figure: none of the new files replaces an old one.
    monkeypatch.setattr(compare.figures, "compare_figure", lambda *args, **kwargs: 1 / 0)
    argv = ["compare", "--tasks", "2", "--turns", "2", "--speeds", "4000", "--designs", "http,chained", "--jobs", "1"]
    with pytest.raises(ZeroDivisionError):
        cli_main([*argv, "--seed", "1", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["at4000", "cache", "results"]  # no staging folder left beside it
    monkeypatch.setattr(compare.benchmark, "run_design_virtual", lambda *args: 1 / 0)  # a run that crashes
    with pytest.raises(ZeroDivisionError):
        cli_main([*argv, "--no-cache"])
    assert run_folders(tmp_path) == [complete.name, "latest"]
    assert (tmp_path / "results" / "compare" / "latest").resolve() == complete


@pytest.mark.parametrize(("cpu_per_task", "of_cpu", "on_two", "on_four"), [
    (6.0, "60 s", "30 s", "30 s"),  # a point (5 tasks) runs on one worker: four workers are no faster than two
    (9.0, "2 min", "45 s", "45 s"),
    (540.0, "1 h 30 min", "45 min", "45 min"),
    (750.0, "2 h 05 min", "62 min", "62 min"),
    (17_280.0, "2.0 days", "24 h 00 min", "24 h 00 min"),
    (18_576.1, "2.2 days", "25 h 48 min", "25 h 48 min")])  # 185,761 s: 2.15001 days
def test_a_long_compare_says_roughly_how_long_before_it_starts(monkeypatch, cpu_per_task, of_cpu, on_two, on_four):
    # The estimate: the sample task (the one nearest the workload's mean length) run alone at each point, its CPU
    # time (here a clock that moves `cpu_per_task` a run) times the point's tasks; the points spread over the workers.
    config = compare.benchmark.BenchConfig(preset="coding", n_tasks=5, seed=0)
    grid = compare.grid_of(config, ["http", "chained"], [4000.0])
    turns = [len(task.turns) for task in config.tasks()]
    nearest = min(turns, key=lambda n: abs(n - sum(turns) / len(turns)))
    ticks = iter(range(10**6))
    monkeypatch.setattr(compare.time, "process_time", lambda: next(ticks) * cpu_per_task)
    measured = f"(one task of {nearest} turns, the workload's mean, took {cpu_per_task:.2f}-{cpu_per_task:.2f} s of CPU per point here)"
    assert compare.estimate(grid, workers=None) == f"compare: 10 task runs, roughly {of_cpu} of CPU {measured}"
    assert compare.estimate(grid, workers=2) == f"compare: 10 task runs, roughly {on_two} on 2 workers {measured}"
    assert compare.estimate(grid, workers=4) == f"compare: 10 task runs, roughly {on_four} on 4 workers {measured}"


def test_the_estimate_times_the_mean_length_task_alone_at_each_point_of_a_preset_a_trace_or_a_single_point(monkeypatch):
    timed = []
    monkeypatch.setattr(compare.benchmark, "run_design_virtual", lambda design, tps, alone: timed.append((design, tps, alone.tasks())))
    config = compare.benchmark.BenchConfig(preset="coding", n_tasks=5, seed=0)
    tasks = config.tasks()
    nearest = min(tasks, key=lambda task: abs(len(task.turns) - sum(len(t.turns) for t in tasks) / len(tasks)))
    assert nearest != tasks[0]
    assert compare.estimate(compare.grid_of(config, ["http", "chained"], [4000.0]), workers=None).startswith("compare: 10 task runs, roughly ")
    assert timed == [("http", 4000.0, [nearest]), ("chained", 4000.0, [nearest])]
    # A trace's tasks (its one task here), and a grid of one point (all a run may have left to compute).
    config, *_ = compare.workload_config(parsed("--trace", str(CODEX_TRACE)), benchmark.DEFAULT_NETWORK)
    timed.clear()
    assert compare.estimate(compare.grid_of(config, ["chained"], [65.0]), workers=1).startswith("compare: 1 task run, roughly ")
    assert timed == [("chained", 65.0, list(config.task_list))]


def test_a_run_under_a_policy_that_ends_tasks_says_so_names_only_the_options_given_and_estimates_on_its_workers(
        tmp_path, drawn, capsys, monkeypatch):
    network = benchmark.DEFAULT_NETWORK
    for argv in ((), ("--trace", str(CODEX_TRACE))):  # the policy chosen is the one the clients run
        config, *_ = compare.workload_config(parsed(*argv, "--reconnect", "never"), network)
        assert config.reconnect == POLICIES["never"]
    monkeypatch.setattr(benchmark, "summarize", lambda rows: [{"design": "http", "decode_tps": 4000.0, "reconnects": 0}])
    monkeypatch.setattr(compare, "print_compare_table", lambda table, wide: None)
    monkeypatch.setattr(compare, "run_grid", lambda *args: [])
    monkeypatch.setattr(compare, "ESTIMATE_FROM", 1)
    out = tmp_path / "out"
    argv = ["compare", "--preset", "coding", "--seed", "0", "--speeds", "4000", "--designs", "http", "--reconnect", "never",
            "--jobs", "1", "--no-cache"]
    assert cli_main([*argv, "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert ("\n  reconnects (never policy): none; WebSocket connections close after 60 minutes (WS guide): under never a task "
            "longer than that ends there\n") in printed
    # The options given that are compare's defaults are left out of the headline's command; no trace without 1000 tokens/s.
    assert json.loads((out / "compare.json").read_text())["headline"]["command"] == "python -m prototype compare"
    assert printed.splitlines()[-1].startswith(f"wrote {out}/compare.csv, compare.json, compare_tasks.json, compare.png in ")
    assert err.startswith("compare: 10 task runs, roughly ") and " on 1 worker (one task of " in err
    # A real-time run is not estimated: its time is the wall clock's, not CPU time.
    assert cli_main([*argv, "--real", "--out", str(tmp_path / "real")]) == 0
    assert "roughly" not in capsys.readouterr().err


def test_ctrl_c_after_some_points_says_the_cache_keeps_them_and_the_same_command_then_computes_only_the_rest(
        tmp_path, drawn, capsys, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    run_grid = compare.run_grid

    def interrupted_after_the_first(config, designs, speeds, runner, out, real):
        run_grid(config, designs[:1], speeds, runner, out, real)
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "run_grid", interrupted_after_the_first)
    argv = ["compare", "--tasks", "1", "--turns", "2", "--speeds", "4000", "--designs", "http,chained", "--jobs", "1",
            "--out", str(tmp_path / "out")]
    assert cli_main([*argv, "--no-cache"]) == common.INTERRUPTED  # nothing kept without the cache
    assert capsys.readouterr().err.rstrip("\n").splitlines()[-1] == "python -m prototype compare: interrupted: no results written"
    assert cli_main(argv) == common.INTERRUPTED
    assert capsys.readouterr().err.rstrip("\n").splitlines()[-1] == (
        "python -m prototype compare: interrupted: no results written; the results cache keeps the 1 point it finished, "
        "and the same command computes only the rest")
    monkeypatch.setattr(compare, "run_grid", run_grid)
    assert cli_main(argv) == 0
    assert "\n1 of 2 (design, speed) points came from the results cache (" in capsys.readouterr().out


# --- plot: compare's table and figure from results folders, nothing run ---------------------------------------------


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    """Two compare results folders: http and chained at 4000 tokens/s into `--out at4000`, and at 1000 into a new folder
    of results/compare/."""
    monkeypatch.setattr(compare, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    for speed, out in (("4000", ["--out", str(tmp_path / "at4000")]), ("1000", [])):
        assert cli_main(["compare", "--tasks", "2", "--turns", "2", "--speeds", speed, "--designs", "http,chained", "--jobs", "1",
                         *out]) == 0
    (folder,) = [name for name in run_folders(tmp_path) if name != "latest"]
    return [tmp_path / "at4000", tmp_path / "results" / "compare" / folder]


def test_plot_draws_a_folder_again_merges_folders_and_refuses_what_would_not_compare_like_with_like(two_runs, tmp_path, capsys,
                                                                                                      monkeypatch):
    from prototype import sweep

    monkeypatch.setattr(sweep.Runner, "map", lambda *args, **kwargs: pytest.fail("plot ran something"))
    capsys.readouterr()
    assert cli_main(["plot", str(two_runs[0])]) == 0
    printed = capsys.readouterr().out
    (folder,) = [name for name in run_folders(tmp_path, "plot") if name != "latest"]
    out = tmp_path / "results" / "plot" / "latest"
    assert out.resolve().name == folder and sorted(p.name for p in out.iterdir()) == sorted(COMPARED)
    assert (out / "compare.csv").read_bytes() == (two_runs[0] / "compare.csv").read_bytes()
    assert json.loads((out / "compare.json").read_text())["table"] == json.loads((two_runs[0] / "compare.json").read_text())["table"]
    assert f"the 'coding' workload, virtual time; from {two_runs[0]} (2 points)\n" in printed
    assert f"wrote {tmp_path / 'results' / 'plot' / folder}/compare.csv, compare.json, compare_tasks.json, compare.png in " in printed
    # Folders merged into one table, ordered by speed, then design.
    assert cli_main(["plot", *map(str, two_runs), "--out", str(tmp_path / "merged")]) == 0
    tables = [json.loads((run / "compare.json").read_text())["table"] for run in two_runs]
    merged = json.loads((tmp_path / "merged" / "compare.json").read_text())
    first = json.loads((two_runs[0] / "compare.json").read_text())
    assert merged["table"] == tables[1] + tables[0] and (merged["workload"], merged["clock"]) == (first["workload"], first["clock"])
    assert f"from {two_runs[0]} (2 points), {two_runs[1]} (2 points)\n" in capsys.readouterr().out
    # The decode speeds are both folders'; every other parameter is as the runs recorded it.
    assert [(name, value) for name, value, _ in merged["parameters"]] == [
        (name, "1000, 4000 tokens/s" if name == "decode speeds" else value) for name, value, _ in first["parameters"]]
    assert len(json.loads((tmp_path / "merged" / "compare_tasks.json").read_text())) == 8
    capsys.readouterr()
    docs = REPO / "docs" / "figures"
    before = {p.name: p.stat().st_mtime_ns for p in docs.iterdir()}
    assert cli_main(["plot", str(two_runs[0]), "--out", str(docs)]) == 2 and "inside docs/figures/" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in docs.iterdir()} == before
    assert cli_main(["plot", str(two_runs[0]), str(two_runs[0]), "--out", str(tmp_path / "x")]) == 2
    assert f"{two_runs[0]} and {two_runs[0]} both hold http at 4000 tokens/s" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    summary = json.loads((two_runs[1] / "compare.json").read_text())
    summary["parameters"] = [[n, "RTT 80 ms" if n == "network" else v, s] for n, v, s in summary["parameters"]]
    (other / "compare.json").write_text(json.dumps(summary))
    (other / "compare_tasks.json").write_bytes((two_runs[1] / "compare_tasks.json").read_bytes())
    assert cli_main(["plot", str(two_runs[0]), str(other), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m prototype plot: error: ") and "different configurations (network: RTT 20 ms" in err
    assert cli_main(["plot", str(tmp_path / "nothing-here")]) == 2
    assert capsys.readouterr().err == f"python -m prototype plot: error: {tmp_path / 'nothing-here'} is not a compare results folder (no compare.json)\n"
    assert not (tmp_path / "x").exists()


def test_plot_reads_what_a_folder_recorded_and_refuses_an_unreadable_empty_or_differently_clocked_one(two_runs, tmp_path):
    def folder(name: str, summary, rows) -> Path:
        made = tmp_path / name
        made.mkdir()
        for file, content in (("compare.json", summary), ("compare_tasks.json", rows)):
            (made / file).write_text(content if isinstance(content, str) else json.dumps(content))
        return made

    summary, rows = (json.loads((two_runs[1] / name).read_text()) for name in ("compare.json", "compare_tasks.json"))
    # A folder whose compare.json names no workload or clock: the workload from its parameters, the clock not recorded.
    older = plot.read(folder("older", {"parameters": summary["parameters"]}, rows))
    assert (older.workload, older.clock, older.rows) == (dict((n, v) for n, v, _ in summary["parameters"])["workload preset"],
                                                         "clock not recorded", rows)
    assert plot.read(folder("bare", {}, rows)).workload == "workload not recorded"
    assert plot.read(folder("trace", {"parameters": [["workload", "the trace t.csv", "--trace"]]}, rows)).workload == "the trace t.csv"
    refusals = {
        "unreadable": (folder("unreadable", "{", rows), "cannot read its results"),
        "no rows": (folder("no-rows", summary, []), "its compare_tasks.json holds no task rows")}
    for made, says in refusals.values():
        with pytest.raises(plot.PlotError, match=f"^{re.escape(str(made))}: {says}"):
            plot.read(made)
    first = plot.read(two_runs[0])
    clocks = f"^{re.escape(str(two_runs[0]))} ran in virtual time and {re.escape(str(tmp_path / 'older'))} in clock not recorded"
    with pytest.raises(plot.PlotError, match=clocks):
        plot.merge([first, older])
    # A parameter only one folder recorded does not keep them apart; the merged rows are both folders', under the first's name.
    fewer = plot.read(folder("fewer", {**summary, "parameters": [row for row in summary["parameters"] if row[0] != "network"]}, rows))
    merged = plot.merge([first, fewer])
    assert (merged.folder, len(merged.rows)) == (two_runs[0], len(first.rows) + len(rows))


def test_plot_wide_prints_every_column_as_compare_wide_does_and_says_how_long_it_took(two_runs, drawn, tmp_path, capsys,
                                                                                     monkeypatch):
    clock = iter([100.0, 102.5])  # plot's start and end
    monkeypatch.setattr(plot, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    capsys.readouterr()
    assert cli_main(["plot", str(two_runs[0]), "--out", str(tmp_path / "wide"), "--wide"]) == 0
    printed = capsys.readouterr().out
    compare.print_compare_table(json.loads((two_runs[0] / "compare.json").read_text())["table"], wide=True)
    assert capsys.readouterr().out in printed
    assert printed.endswith(f"\nwrote {tmp_path / 'wide'}/{', '.join(COMPARED)} in 2.5 s\n")


def test_plot_merges_a_design_it_does_not_know_and_a_refusal_names_the_known_one_first(tmp_path):
    rows = [{"design": design, "decode_tps": 4000.0} for design in ("v3", "http")]  # v3: a design of another version
    folder = plot.Results(tmp_path, rows, [], "a workload", "virtual time")
    assert plot.merge([folder]).rows == rows
    with pytest.raises(plot.PlotError) as refused:
        plot.merge([folder, folder])
    assert str(refused.value) == f"{tmp_path} and {tmp_path} both hold http at 4000 tokens/s: give each point once"
