"""The headline numbers (prototype/headline.py): a results file's headline section copied into docs/figures/, and
every marked span of README.md and docs/*.md printed from it; the pages as committed show their data."""

from __future__ import annotations

import json
import math

import attrs
import orjson
import pytest

from experiments import faults, published, sensitivity
from prototype import benchmark, headline
from prototype import workload as wl
from prototype.cli import compare
from prototype.cli import figures as figures_command
from prototype.cli.common import Parser
from prototype.client.reconnect import POLICIES
from prototype.uncertainty import Estimate
from tests.conftest import REPO

GAIN_ESTIMATE = Estimate(0.04, 0.021, 0.063, 10, "tasks", "bootstrap")
GAIN = headline.figure(GAIN_ESTIMATE, "{:.1f}%", scale=100, label="gain")
RATIO = headline.figure(Estimate(0.391, 0.35, 0.44, 10, "tasks", "paired bootstrap"), "{:.2f}")
POINT = headline.figure(Estimate(0.5, math.nan, math.nan, 1), "{:.2f}")


def a_section(name: str = "compare", **figures) -> dict:
    return headline.section(name, command="python -m prototype compare", workload="10 coding tasks",
                            figures=figures or {"gain.chained.1000": GAIN, "ratio": RATIO},
                            tables={"table": headline.table(["design", "gain"], [["chained", "4.0% [2.1%, 6.3%]"], ["a|b", "-"]])})


def test_a_section_and_its_figures_keep_every_field_a_page_reads():
    section = a_section()
    assert (section["name"], section["command"], section["workload"]) == ("compare", "python -m prototype compare", "10 coding tasks")
    assert section["figures"]["gain.chained.1000"] == {**GAIN_ESTIMATE.as_dict(), "format": "{:.1f}%", "scale": 100, "label": "gain"}
    assert headline.figure(GAIN_ESTIMATE)["format"] == "{:.2f}" and headline.figure(GAIN_ESTIMATE)["label"] == ""
    assert headline.section("Kv_2-x", command="c", workload="w", figures={}, data={"k": 1})["data"] == {"k": 1}  # any case


@pytest.fixture
def checkout(tmp_path):
    """A checkout with a README, a docs page and a data folder holding `a_section()`."""
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    headline.write(tmp_path / "docs" / "figures" / "compare.json", a_section())
    return tmp_path


def test_a_span_prints_the_value_its_interval_and_n_in_the_figures_format_and_unit_and_a_table_as_markdown():
    assert [headline.render(GAIN), headline.render(GAIN, "interval"), headline.render(GAIN, "value"), headline.render(RATIO)] == [
        "4.0% [2.1%, 6.3%] n=10", "4.0% [2.1%, 6.3%]", "4.0%", "0.39 [0.35, 0.44] n=10"]
    assert headline.render(POINT) == "0.50 n=1"  # no interval from one sample: the value and its n
    # orjson writes NaN as null: it reads back as NaN; a figure without a scale prints in its own unit.
    empty = headline.figure(Estimate(math.nan, math.nan, math.nan, 0), "{:.2f}")
    assert [headline.render(json.loads(orjson.dumps(entry))) for entry in (POINT, empty)] == ["0.50 n=1", "nan n=0"]
    assert headline.render({k: v for k, v in RATIO.items() if k != "scale"}) == "0.39 [0.35, 0.44] n=10"
    assert headline.render(headline.text("rtt > tools ~ store"), "value") == "rtt > tools ~ store"
    with pytest.raises(headline.HeadlineError, match="unknown span style 'mean'"):
        headline.render(GAIN, "mean")
    assert headline.render(a_section()["tables"]["table"]) == (
        "\n| design | gain |\n| --- | --- |\n| chained | 4.0% [2.1%, 6.3%] |\n| a\\|b | - |\n")


def test_every_span_is_rewritten_from_its_key_the_rest_of_the_page_left_alone_and_a_missing_data_file_or_figure_named(checkout):
    readme = checkout / "README.md"
    readme.write_text("Gain <!-- fig:compare.gain.chained.1000 -->40%<!-- /fig --> (typed), ratio "
                      "<!-- fig:compare.ratio interval -->0.4<!-- /fig -->.\n\n<!-- fig:compare.table -->\nold\n<!-- /fig -->\nend\n")
    (checkout / "docs" / "results.md").write_text("nothing marked\n")
    assert headline.pages(checkout) == [readme, checkout / "docs" / "results.md"]
    assert headline.spans("\n\n<!-- fig:compare.ratio value -->x<!-- /fig -->") == [headline.Span("", "compare.ratio", "value", "x", 3)]
    # A key's style defaults to the full figure; a data file without tables still resolves its figures.
    headline.write(checkout / "docs" / "figures" / "old.json", {"figures": {"top": RATIO}})
    resolve = headline.resolver(checkout / "docs" / "figures")
    assert resolve("compare.ratio") == resolve("old.top") == "0.39 [0.35, 0.44] n=10"
    assert [str(m) for m in headline.stale_spans(checkout, checkout / "docs" / "figures")] == [
        "README.md:1: fig:compare.gain.chained.1000 shows '40%', the data give '4.0% [2.1%, 6.3%] n=10'",
        "README.md:1: fig:compare.ratio shows '0.4', the data give '0.39 [0.35, 0.44]'",
        "README.md:3: fig:compare.table shows '\\nold\\n', the data give "
        "'\\n| design | gain |\\n| --- | --- |\\n| chained | 4.0% [2.1%, 6.3%] |\\n| a\\\\|b | - |\\n'",
    ]
    assert headline.update_pages(checkout, checkout / "docs" / "figures") == [readme]
    assert readme.read_text() == (
        "Gain <!-- fig:compare.gain.chained.1000 -->4.0% [2.1%, 6.3%] n=10<!-- /fig --> (typed), ratio "
        "<!-- fig:compare.ratio interval -->0.39 [0.35, 0.44]<!-- /fig -->.\n\n<!-- fig:compare.table -->\n"
        "| design | gain |\n| --- | --- |\n| chained | 4.0% [2.1%, 6.3%] |\n| a\\|b | - |\n<!-- /fig -->\nend\n")
    assert headline.stale_spans(checkout, checkout / "docs" / "figures") == []
    assert headline.update_pages(checkout, checkout / "docs" / "figures") == []  # nothing left to change
    # A span whose data file or figure is missing: an error that names it.
    (checkout / "README.md").write_text("<!-- fig:compare.gain.http.1000 -->x<!-- /fig -->")
    with pytest.raises(headline.HeadlineError, match="docs/figures/compare.json has no figure or table 'gain.http.1000'"):
        headline.stale_spans(checkout, checkout / "docs" / "figures")
    (checkout / "README.md").write_text("<!-- fig:faults.lost -->x<!-- /fig -->")
    with pytest.raises(headline.HeadlineError, match="no data file .*faults.json"):
        headline.update_pages(checkout, checkout / "docs" / "figures")


def test_a_results_files_headline_section_becomes_the_committed_data_of_its_name_and_the_same_content_the_same_bytes(tmp_path):
    run = tmp_path / "results" / "compare" / "2026"
    headline.write(run / "compare.json", {"table": [1, 2], "headline": a_section("compare", gain=GAIN)})
    headline.write(run / "other.json", {"table": []})  # no headline section: not imported from a folder
    data = tmp_path / "figures"
    (run / "broken.json").write_text("{")  # not JSON, or JSON but not an object: not results either
    (run / "list.json").write_text("[1]")
    assert headline.results_files([run]) == [run / "compare.json"]
    assert headline.results_files([run / "other.json", run]) == [run / "other.json", run / "compare.json"]
    written = headline.import_results(run / "compare.json", data)
    assert (written, json.loads(written.read_text())) == (data / "compare.json", a_section("compare", gain=GAIN))
    assert headline.load("compare", data)["figures"]["gain"]["value"] == 0.04
    with pytest.raises(headline.HeadlineError, match="has no 'headline' section"):
        headline.import_results(run / "other.json", data)
    with pytest.raises(headline.HeadlineError, match="no results JSON with a 'headline' section"):
        headline.results_files([data])  # the data files themselves are not results
    with pytest.raises(headline.HeadlineError, match="no such file or folder"):
        headline.results_files([tmp_path / "nothing"])
    with pytest.raises(headline.HeadlineError, match="a headline's name is a file name"):
        headline.section("../x", command="", workload="", figures={})
    # The same content is written as the same bytes.
    headline.write(tmp_path / "a.json", a_section())
    headline.write(tmp_path / "b.json", json.loads((tmp_path / "a.json").read_text()))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "a.json").read_text().endswith("}\n")


def test_the_figures_command_imports_results_and_rewrites_or_checks_the_spans_without_running(checkout, monkeypatch, capsys):
    monkeypatch.setattr(figures_command, "REPO", checkout)
    data = checkout / "docs" / "figures"
    run = checkout / "results" / "sensitivity" / "latest"
    headline.write(run / "sensitivity.json", {"headline": a_section("sensitivity", top=RATIO)})
    for page in ("README.md", "docs/results.md"):
        (checkout / page).write_text("<!-- fig:sensitivity.top -->?<!-- /fig -->\n")
    assert figures_command.run(figures_command_args("--check", "--out", str(data))) == 2  # no data yet: named
    assert "no data file" in capsys.readouterr().err
    assert figures_command.run(figures_command_args("--no-run", str(run), "--out", str(data))) == 0
    assert (checkout / "README.md").read_text() == "<!-- fig:sensitivity.top -->0.39 [0.35, 0.44] n=10<!-- /fig -->\n"
    assert figures_command.run(figures_command_args("--no-run", "--out", str(data))) == 0  # nothing left to rewrite
    assert capsys.readouterr().out.endswith(
        "rewrote the spans of README.md, docs/results.md\nevery span already shows its data\n")
    assert figures_command.run(figures_command_args("--check", "--out", str(data))) == 0
    assert capsys.readouterr().out == f"every span shows the data in {data}\n"
    (checkout / "README.md").write_text("<!-- fig:sensitivity.top -->0.40 [0.35, 0.44] n=10<!-- /fig -->\n")
    assert figures_command.run(figures_command_args("--check", "--out", str(data))) == 1
    out = capsys.readouterr().out
    assert "README.md:1: fig:sensitivity.top shows '0.40 [0.35, 0.44] n=10'" in out
    assert out.endswith(f"\n1 span(s) differ from the data in {data}\n")


def figures_command_args(*argv: str):
    parser = Parser(prog="python -m prototype figures")
    figures_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_marked_span_in_readme_and_docs_shows_its_committed_data():
    stale = headline.stale_spans(REPO)
    assert not stale, "\n".join(map(str, stale)) + "\n(python -m prototype figures --no-run rewrites them)"


# --- the committed data against a fresh run ----------------------------------------------------------------------


def json_round_trip(value):
    return json.loads(json.dumps(value))


def test_the_committed_compare_data_match_a_fresh_run_of_its_first_task():
    data = headline.load("compare")
    parser = Parser(prog="compare")
    compare.add_arguments(parser)
    args = parser.parse_args(data["command"].removeprefix("python -m prototype compare").split())
    config, _, _ = compare.workload_config(args, attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=args.rtt_ms / 1000))
    first = attrs.evolve(config, n_tasks=1)  # task i of a seeded workload does not depend on how many are drawn
    rows = data["data"]
    for design in ("http", "chained"):
        [fresh] = benchmark.design_rows(benchmark.DesignRun(design, 1000.0, first))
        [kept] = [r for r in rows if (r["design"], r["decode_tps"], r["task"]) == (design, 1000.0, fresh["task"])]
        assert json_round_trip(fresh) == kept, f"{design}'s first task at 1000 tokens/s differs from docs/figures/compare.json"


def test_the_committed_compare_figures_follow_from_the_committed_task_rows():
    data = headline.load("compare")
    recomputed = compare.headline_estimates(benchmark.summarize(data["data"]), data["data"])
    assert sorted(recomputed) == sorted(data["figures"])
    for key, estimate in recomputed.items():
        entry = data["figures"][key]
        assert (entry["value"], entry["low"], entry["high"], entry["n"]) == pytest.approx(
            (estimate.value, estimate.low, estimate.high, estimate.n), nan_ok=True), key


def test_the_committed_published_data_match_a_fresh_run_of_the_decode_speed_checks_first_task():
    data = headline.load("published")
    argv = data["command"].split()[3:]
    turns = int(argv[argv.index("--trend-turns") + 1]) if "--trend-turns" in argv else 20
    tasks = data["data"]["trend_tasks"]
    for run in published.trend_runs(1, turns):
        if run.decode_tps == 1000.0:
            [fresh] = benchmark.design_rows(run)
            assert fresh["e2e_s"] == tasks[f"{run.design}@1000"][0], run.design
    for key, entry in data["figures"].items():  # the decode-speed check's gains follow from the tasks' times
        if key.startswith("trend."):
            tps = key.split(".", 1)[1]
            chained, http = ([{"e2e_s": t} for t in tasks[f"{d}@{tps}"]] for d in ("chained", "http"))
            gain = published._statistic(published.E2E, http, chained)
            assert (entry["value"], entry["low"], entry["high"]) == pytest.approx((gain.value, gain.low, gain.high)), key


def test_the_committed_sensitivity_data_match_a_fresh_run_of_the_default_configuration():
    names = sorted(p.stem for p in headline.FIGURES.glob("sensitivity_seed*.json"))
    assert names, "docs/figures/ holds no sensitivity run"
    base = benchmark.BenchConfig(preset=attrs.evolve(wl.CODING, fixed_tool_seconds=0.3), n_tasks=sensitivity.DEFAULT_TASKS)
    rows = [row for design in ("http", "chained") for row in benchmark.design_rows(benchmark.DesignRun(design, 1000.0, base))]
    gain = sensitivity.Headline("g", "g", "%", sensitivity.gain(sensitivity.CHAINED, sensitivity.HTTP, 1000.0))
    fresh = gain.value(sensitivity.samples_of(rows))
    for name in names:
        data = headline.load(name)
        assert data["data"]["oat"][0] == "default"
        assert data["data"]["values"][0]["e2e gain chained vs http @1000"] == pytest.approx(fresh, abs=1e-12), name
        assert data["figures"]["gain.chained_vs_http.1000.default"]["value"] == pytest.approx(100 * fresh), name


@pytest.mark.parametrize("design, fault, policy", [("suspended", "drops", "openai-python"), ("chained-stored", "restart", "codex")])
def test_the_committed_faults_data_match_a_fresh_run_of_a_cells_first_task(design, fault, policy):
    data = headline.load("faults")
    (first,) = [row for row in data["data"] if (row["design"], row["fault"], row["policy"]) == (design, fault, policy)]
    run = faults.FaultRun(design, faults.FAULT_MODELS[fault], POLICIES[policy], 1000.0, benchmark.BenchConfig(n_tasks=1))
    (fresh,) = faults.task_csv_rows(faults.fault_records(run))
    assert json_round_trip(fresh) == first
