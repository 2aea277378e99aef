"""The tables, series and sentences computed from rows (prototype/analysis.py): cells, text/Markdown/CSV tables, phase
totals, a sweep's table by (value, design), a design's curve, crossovers, and the published-results verdicts."""

from __future__ import annotations

import math

import pytest

from prototype import analysis
from prototype.client.harness import RolloutRecord, TurnRecord


@pytest.mark.parametrize("value, cell", [
    (1.23456, "1.235"), (999.9994, "999.999"), (-999.5, "-999.500"), (1000.0, "1,000"), (-1234.6, "-1,235"),
    (1234567.4, "1,234,567"), (math.nan, "-"), (1234567, "1234567"), ("text", "text"), (None, "None")])
def test_a_cell_has_three_decimals_below_1000_none_from_1000_and_nan_is_a_dash(value, cell):
    assert analysis.format_value(value) == cell


def test_write_csv_takes_its_columns_from_the_first_row_and_quotes_commas(tmp_path):
    path = tmp_path / "rows.csv"
    analysis.write_csv(path, [{"design": "http", "e2e_s": 1.5}, {"e2e_s": 2, "design": "chained, v2"}])
    assert path.read_bytes() == b'design,e2e_s\r\nhttp,1.5\r\n"chained, v2",2\r\n'
    analysis.write_csv(path, [{"a": 1}])
    assert path.read_bytes() == b"a\r\n1\r\n"


def test_print_table_right_aligns_each_column_and_the_markdown_table_escapes_pipes_and_leaves_missing_cells_empty(capsys):
    rows = [{"design": "suspended", "e2e": 1.5, "n": 3}, {"design": "http", "e2e": 12345.0}]
    analysis.print_table(rows)
    assert capsys.readouterr().out == (
        "   design     e2e  n\n"
        "suspended   1.500  3\n"
        "     http  12,345   \n")
    rows = [{"design": "suspended", "e2e": 1.5, "n": 3}, {"design": "http", "e2e": 0.25, "n": 10}]
    analysis.print_table(rows, columns=["n", "e2e"], formats={"e2e": lambda v: f"{v:.1f} s"}, headers={"n": "tasks"})
    assert capsys.readouterr().out == (
        "tasks    e2e\n"
        "    3  1.5 s\n"
        "   10  0.2 s\n")
    rows = [{"design": "a|b", "e2e": 1.5}, {"design": "http"}]
    assert analysis.markdown_table(rows) == (
        "| design | e2e |\n"
        "| --- | --- |\n"
        "| a\\|b | 1.500 |\n"
        "| http |  |")
    assert analysis.markdown_table(rows, columns=["e2e"], formats={"e2e": lambda v: f"<{v}>"}) == (
        "| e2e |\n| --- |\n| <1.5> |\n| <> |")


def a_record(design: str = "suspended") -> RolloutRecord:
    """Two turns: server phases (validate, route, post, prefill, and the post-terminal overlap, which is no part of
    a turn) and the rest of each turn's wall time as network and client time."""
    return RolloutRecord(
        design=design, workload="fixed", started_at=1.0, ended_at=5.0,
        turns=[
            TurnRecord(turn=0, sent_at=1.0, ended_at=2.0, tool_seconds=0.5, bytes_sent=100,
                       server_timing={"phases_ms": {"validate": 100.0, "prefill": 300.0, "post": 50.0, "post_overlapped": 70.0}}),
            TurnRecord(turn=1, sent_at=2.5, ended_at=3.0, tool_seconds=0.0, bytes_sent=301,
                       server_timing={"phases_ms": {"route": 200.0, "prefill": 100.0}})],
        usage={"input_tokens": 400, "cached_tokens": 100, "output_tokens": 7, "reasoning_tokens": 0},
        response_ids=["resp_1"])


def test_phase_totals_sum_each_phase_over_the_turns_and_the_state_table_says_what_each_design_keeps():
    totals = analysis.phase_totals(a_record())
    assert totals == pytest.approx({"validate": 0.1, "prefill": 0.4, "post": 0.05, "route": 0.2,
                                    "network_client": 0.55 + 0.2, "tool": 0.5})
    assert set(totals) == {"validate", "prefill", "post", "route", "network_client", "tool"}
    unknown = a_record("something-else")
    unknown.usage = {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0}
    rows = analysis.state_table([a_record(), a_record("http-stateless"), unknown])
    assert rows[0] == pytest.approx({
        "design": "suspended", "kept across the pause": "Response suspended: coroutine + context + KV held",
        "response ids": 1, "turns": 2, "e2e s": 4.0, "API work s": 0.35, "bytes sent / turn": 200.5, "cached input share": 0.25})
    kept = (rows[1]["design"], rows[1]["kept across the pause"], rows[2]["kept across the pause"], rows[2]["cached input share"])
    assert kept == ("http", "response ended; nothing kept", "?", 0.0)
    one_token = a_record()
    one_token.usage = {"input_tokens": 1, "cached_tokens": 1, "output_tokens": 0, "reasoning_tokens": 0}
    assert analysis.state_table([one_token])[0]["cached input share"] == 1.0


def a_sweep_row(tok_s, design, e2e_s, turns, phases, ttft, cached, input_tokens, api_s):
    return {"tok_s": tok_s, "design": design, "e2e_s": e2e_s, "turns": turns, "phase_totals_s": phases,
            "ttft_s": ttft, "cached_tokens": cached, "input_tokens": input_tokens, "api_overhead_s": api_s}


def sweep_rows():
    every_phase = {"validate": 0.1, "post": 0.3, "queue": 0.2, "prefill": 0.4, "decode": 1.0, "tool": 0.2,
                   "hosted_tool": 0.6, "network_client": 0.3, "post_overlapped": 9.0}
    return [
        a_sweep_row(1000, "suspended", 2.0, 2, every_phase, [0.1, 0.3], 30, 100, 0.2),
        a_sweep_row(65, "chained", 3.0, 1, {}, [0.2], 0, 10, 0.5),
        a_sweep_row(65, "chained", 3.0, 1, {}, [0.2], 0, 10, 0.5),
        a_sweep_row(1000, "suspended", 7.0, 2, {"prefill": 0.4}, [0.5, 0.9], 10, 100, 0.2),
        a_sweep_row(1000, "other", 1.0, 1, {}, [], 0, 0, 0.0),
        a_sweep_row(1000, "http", 12.0, 4, {}, [], 0, 0, 3.0),
        a_sweep_row(1000, "chained", 6.0, 2, {}, [0.25], 0, 10, 0.0)]


def test_sweep_table_gives_one_row_per_value_and_design_in_order():
    table = analysis.sweep_table(sweep_rows(), "tok_s")
    assert [(r["tok_s"], r["design"]) for r in table] == [
        (65, "chained"), (1000, "http"), (1000, "chained"), (1000, "suspended"), (1000, "other")]
    suspended = table[3]
    # http ran other tasks than suspended here: no interval for the gain (one needs the same tasks).
    assert math.isnan(suspended.pop("gain_vs_http_low")) and math.isnan(suspended.pop("gain_vs_http_high"))
    assert suspended == pytest.approx({
        "tok_s": 1000, "design": "suspended", "tasks": 2, "e2e_mean_s": 4.5, "e2e_p50_s": 4.5,
        "speedup_vs_http": 12.0 / 9.0, "gain_vs_http": 1 - 9.0 / 12.0, "ttft_p50_ms": 400.0,
        "api_s_per_turn": 0.4 / 4, "model_s_per_turn": (0.2 + 0.4 + 1.0 + 0.4) / 4, "prefill_s_per_turn": 0.8 / 4,
        "cached_share": 40 / 200, "decode_s_per_turn": 1.0 / 4, "tool_s_per_turn": 0.8 / 4,
        "network_s_per_turn": 0.3 / 4, "api_share": 0.4 / 9.0})
    http = table[1]
    assert (http["speedup_vs_http"], http["gain_vs_http"], http["api_share"]) == (1.0, 0.0, 0.25)
    assert math.isnan(http["ttft_p50_ms"]) and math.isnan(http["cached_share"])
    alone = table[0]  # two tasks, and no http row at 65 tokens/s
    assert all(math.isnan(alone[k]) for k in ("speedup_vs_http", "gain_vs_http", "gain_vs_http_low", "gain_vs_http_high"))
    assert alone["ttft_p50_ms"] == pytest.approx(200.0)


def test_sweep_tables_gain_has_an_interval_over_the_same_tasks_and_its_p50_is_the_median():
    rows = [{**a_sweep_row(1, "http", e, 1, {}, [0.1], 0, 1, 0.0), "task": f"t{i}"} for i, e in enumerate((10.0, 20.0, 40.0))]
    rows += [{**a_sweep_row(1, "chained", e * f, 1, {}, [0.1], 0, 1, 0.0), "task": f"t{i}"}
             for i, (e, f) in enumerate(zip((10.0, 20.0, 40.0), (0.5, 0.7, 0.9)))]
    chained = analysis.sweep_table(rows, "tok_s")[1]
    assert chained["gain_vs_http"] == pytest.approx(1 - 55 / 70)
    assert 0.1 - 1e-9 <= chained["gain_vs_http_low"] < chained["gain_vs_http"] < chained["gain_vs_http_high"] <= 0.5  # the per-task gains
    halved = [{**r, "e2e_s": r["e2e_s"] / 2} if r["design"] == "chained" else r for r in rows[:3]] + [
        {**r, "e2e_s": rows[i]["e2e_s"] / 2} for i, r in enumerate(rows[3:])]
    twice = analysis.sweep_table(halved, "tok_s")[1]
    assert (twice["gain_vs_http_low"], twice["gain_vs_http"], twice["gain_vs_http_high"]) == (0.5, 0.5, 0.5)
    two = analysis.sweep_table([r for r in rows if r["task"] != "t2"], "tok_s")[1]  # two tasks are enough for an interval
    assert 0.3 - 1e-9 <= two["gain_vs_http_low"] < two["gain_vs_http_high"] <= 0.5
    one = analysis.sweep_table([r for r in rows if r["task"] == "t0"], "tok_s")[1]
    assert one["gain_vs_http"] == 0.5 and math.isnan(one["gain_vs_http_low"]) and math.isnan(one["gain_vs_http_high"])
    # p50 is the median, not the mean.
    rows = [a_sweep_row(1, "http", e, 1, {}, [t], 0, 1, 0.0) for e, t in ((1.0, 0.1), (2.0, 0.2), (9.0, 0.9))]
    [row] = analysis.sweep_table(rows, "tok_s")
    assert (row["e2e_mean_s"], row["e2e_p50_s"], row["ttft_p50_ms"]) == (4.0, 2.0, pytest.approx(200.0))


def test_series_is_one_designs_curve_in_the_order_of_the_values_and_crossing_curves_have_one_length():
    table = [{"x": 4000, "design": "http", "m": 3.0}, {"x": 65, "design": "http", "m": 1.0},
             {"x": 1000, "design": "chained", "m": 9.0}, {"x": 1000, "design": "http", "m": 2.0}]
    assert analysis.series(table, "x", "m", "http") == ([65, 1000, 4000], [1.0, 2.0, 3.0])
    assert analysis.series(table, "x", "m", "suspended") == ([], [])
    with pytest.raises(ValueError):  # the crossover of curves of different lengths
        analysis.crossover([1.0, 2.0], [0.0, 1.0], [1.0])


@pytest.mark.parametrize("xs, a, b, logx, where", [
    ([1.0, 2.0, 4.0], [0.0, 0.0, 4.0], [1.0, 1.0, 2.0], False, 2.0 + 2.0 / 3.0),
    ([1.0, 2.0, 4.0], [0.0, 0.0, 4.0], [1.0, 1.0, 2.0], True, 2.0 ** (4.0 / 3.0)),  # log x by default
    ([1.0, 2.0, 4.0], [0.0, 0.0, 4.0], [1.0, 1.0, 2.0], None, 2.0 ** (4.0 / 3.0)),
    ([100, 1000, 10000], [1, 1, 1], [4, 2, 0.5], None, 1000 * 10 ** (1 / 1.5)),
    ([1.0, 2.0], [0.0, 1.5], [2.0, 1.0], False, 1.8),  # a - b is -2 then 0.5: 2/2.5 of the way
    ([1.0, 2.0, 3.0], [0.0, 2.0, 2.0], [1.0, 1.0, 1.0], False, 1.5),  # from the last point below
    ([1.0, 3.0, 9.0], [0.0, 2.0, 5.0], [1.0, 2.0, 1.0], False, 3.0),  # meeting at a point is that point
    ([1.0, 3.0], [1.0, 5.0], [1.0, 2.0], None, 1.0),
    ([2, 3], [5, 5], [1, 1], None, 2.0),
    ([1.0, 2.0, 3.0], [0.0, 1.0, 2.0], [5.0, 5.0, 5.0], None, None),  # never meet
    ([], [], [], None, None)])
def test_crossover_interpolates_where_one_curve_reaches_the_other(xs, a, b, logx, where):
    found = analysis.crossover(xs, a, b) if logx is None else analysis.crossover(xs, a, b, logx=logx)
    if where is None:
        assert found is None
    else:
        assert found == pytest.approx(where) and isinstance(found, float)


def a_published_row(**changes):
    row = {"compare": "suspended vs http", "tok_s": 1000.0, "turns": 20.0, "metric": "e2e", "published_gain": 0.4,
           "measured_gain": 0.42, "testbed_ms_per_turn": 150.0, "implied_ms_per_turn": 100.0}
    row.update(changes)
    return row


HEAD = "suspended vs http at 1000 tokens/s, 20 turns: the testbed cuts end-to-end time by "
TAIL = (" Read through the testbed's model, the published gain implies 100 ms of removable overhead per turn; "
        "the testbed removes 150 ms, 1.50x that.")
UP_TO = "an 'up to' figure allows: the published value is a ceiling, not a typical value)."


@pytest.mark.parametrize("changes, options, middle", [
    ({}, {}, "42% against the published 40% (within 5 points: the testbed matches)."),
    ({"published_gain": 0.25, "measured_gain": 0.5}, {"tolerance": 0.25}, "50% against the published 25% (within 25 points: the testbed matches)."),
    ({"measured_gain": 0.5}, {}, "50% against the published 40% (10 points more than published: the testbed overstates this gain)."),
    ({"measured_gain": 0.3}, {}, "30% against the published 40% (10 points less than published: the testbed understates this gain)."),
    ({"measured_gain": 0.3}, {"ceiling": False}, "30% against the published 40% (10 points less than published: the testbed understates this gain)."),
    ({"measured_gain": 0.3}, {"ceiling": True}, "30% against the published 40% (10 points less, which " + UP_TO),
    # Each percentage rounded from the gains themselves: 60 points below, not 61.
    ({"measured_gain": 0.6, "published_gain": 0.8}, {}, "60% against the published 80% (20 points less than published: the testbed understates this gain)."),
    ({"measured_gain": 0.6, "published_gain": 0.8}, {"tolerance": 0.7}, "60% against the published 80% (within 70 points: the testbed matches)."),
    ({"measured_gain": 0.6, "published_gain": 0.8}, {"ceiling": True}, "60% against the published 80% (20 points less, which " + UP_TO),
    ({"measured_gain": 0.2, "published_gain": 0.8}, {}, "20% against the published 80% (60 points less than published: the testbed understates this gain)."),
    ({"measured_gain": 0.2, "published_gain": 0.8}, {"ceiling": True}, "20% against the published 80% (60 points less, which " + UP_TO),
    ({"measured_gain": 0.8, "published_gain": 0.2}, {}, "80% against the published 20% (60 points more than published: the testbed overstates this gain)."),
])
def test_the_verdict_compares_the_gains_in_whole_points_against_the_tolerance(changes, options, middle):
    assert analysis.published_verdict(a_published_row(**changes), **options) == HEAD + middle + TAIL


def test_a_ttft_row_speaks_of_the_first_token_and_a_zero_implied_overhead_is_infinitely_exceeded():
    sentence = analysis.published_verdict(a_published_row(metric="ttft", implied_ms_per_turn=0.0, tok_s=65.5))
    assert sentence.startswith("suspended vs http at 65.5 tokens/s, 20 turns: the testbed cuts time to first token (p50) by 42%")
    assert sentence.endswith("implies 0 ms of removable overhead per first token; the testbed removes 150 ms, infx that.")


@pytest.mark.parametrize("changes, added", [
    ({"verdict": "agrees"}, " Under the experiment's one verdict rule the row agrees."),
    ({"verdict": "disagrees"}, " Under the experiment's one verdict rule the row disagrees."),
    ({"verdict": "unknown"}, ""),
    ({"implied_vs_calibration": "-"}, ""),
    ({"implied_vs_calibration": "calibration"}, " This is the calibration row: the default cost knobs were chosen near it, so "
                                                "agreement here confirms nothing; it anchors the other rows."),
    ({"implied_vs_calibration": "3.2x DISAGREES"}, " Against the calibration row's implied overhead it is 3.2x: outside the "
     "agreement band, so this figure and the calibration figure cannot both hold under one set of knobs of the testbed's model."),
    ({"implied_vs_calibration": "1.1x agrees"}, " Against the calibration row's implied overhead it is 1.1x: inside the "
                                                "agreement band, consistent with one set of knobs.")])
def test_the_verdict_and_the_calibration_comparison_are_added_when_given(changes, added):
    base = HEAD + "42% against the published 40% (within 5 points: the testbed matches)." + TAIL
    assert analysis.published_verdict(a_published_row(**changes)) == base + added
