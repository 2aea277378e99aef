"""The real Codex CLI drives the testbed over v1, v2 and HTTP: pinned releases installed from npm into
~/.cache/prototype-codex/<version> (reused), `codex exec` on a small task in a scratch project against `python -m
prototype serve --records`; the model's read-only shell commands run under Codex's sandbox and must all exit 0."""

from __future__ import annotations

import pytest

from experiments.codex_transports import CURRENT_CODEX, V1_CODEX, CodexRun, CodexUnavailable, install_codex, run_codex, summary
from prototype.engine.kv import BLOCK_SIZE
from prototype.engine.tool_calls import EXPLORE_COMMANDS

pytestmark = pytest.mark.slow

TOOL_ROUNDS = 4  # experiments.codex_transports.WORKLOAD: five model calls, four ending in a tool call


def installed(version: str) -> str:
    try:
        install_codex(version)
    except CodexUnavailable as why:
        pytest.skip(f"Codex {version} is not available: {why}")
    return version


@pytest.fixture(scope="session")
def codex_v1() -> str:
    return installed(V1_CODEX)


@pytest.fixture(scope="session")
def codex_current() -> str:
    return installed(CURRENT_CODEX)


def assert_task_done(run: CodexRun) -> list[dict]:
    """Codex ran every command the model asked for (each exited 0) and answered its last text; the server's records."""
    assert run.returncode == 0, run.stderr[-2000:]
    assert [code for _, code in run.commands] == [0] * TOOL_ROUNDS, run.commands
    assert run.function_calls == [("exec_command", {"cmd": command}) for command in EXPLORE_COMMANDS[:TOOL_ROUNDS]]
    assert run.final_message == run.expected_final_text
    records = run.records
    agents = {r["user_agent"].split(" ")[0] for r in records}
    # 0.101.0's WebSocket handshake sends no user-agent; its POSTs and later releases do.
    assert agents == ({""} if run.version == V1_CODEX and run.transport != "http" else {f"codex_exec/{run.version}"})
    assert {r["outcome"] for r in records} == {"completed"}
    return records


def test_v1_one_response_one_append_per_tool_round(codex_v1, tmp_path):
    run = run_codex(codex_v1, "v1", tmp_path)
    (record,) = assert_task_done(run)
    row = summary(run)
    assert [row[k] for k in ("design", "connections", "responses", "warmups", "turns", "appends", "commands_ok")] == [
        "suspended", 1, 1, 0, TOOL_ROUNDS + 1, TOOL_ROUNDS, TOOL_ROUNDS]
    # One response.append per tool round, one response id throughout.
    assert [record[k] for k in ("transport", "design", "connection", "appends", "context", "warmup")] == [
        "websocket", "suspended", 1, TOOL_ROUNDS, "full", False]
    # Codex's rollout agrees: one function_call_output per append, each from a command that exited 0.
    assert len(run.tool_outputs) == TOOL_ROUNDS and all("exited with code 0" in output for output in run.tool_outputs)


def assert_chained_turns(records: list[dict]) -> None:
    """One connection; each response after the first chains from the one before, sending only the new output."""
    assert {(r["transport"], r["design"], r["connection"]) for r in records} == {("websocket", "chained", 1)}
    for before, after in zip(records, records[1:]):
        assert after["context"] == "chained" and after["previous_response_id"] == before["response_id"]
    assert [r["input_types"] for r in records[-TOOL_ROUNDS:]] == [{"function_call_output": 1}] * TOOL_ROUNDS


def test_v2_on_codex_0_101_chains_turns_with_only_new_input(codex_v1, tmp_path):
    records = assert_task_done(run_codex(codex_v1, "v2", tmp_path))
    # 0.101.0's `codex exec` sends no warm-up: its first create carries the whole prompt.
    assert (len(records), records[0]["warmup"], records[0]["context"]) == (TOOL_ROUNDS + 1, False, "full")
    assert_chained_turns(records)


def test_v2_on_current_codex_warms_up_then_chains_turns(codex_current, tmp_path):
    run = run_codex(codex_current, "v2", tmp_path)
    records = assert_task_done(run)
    warm, first = records[0], records[1]
    row = summary(run)
    assert (row["connections"], row["responses"], row["warmups"], row["turns"], row["items_sent"]) == (1, TOOL_ROUNDS + 2, 1, TOOL_ROUNDS + 1, 1 + 3 + TOOL_ROUNDS)
    assert row["bytes_sent"] == sum(r["request_bytes"] for r in records) > 0 and len(records) == TOOL_ROUNDS + 2
    assert warm["warmup"] is True and warm["usage"]["output_tokens"] == 0
    # The warm-up prefilled Codex's instructions and tools: the first real turn finds them cached.
    assert warm["warmup_prefill_tokens"] > 5000
    cached = first["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached == warm["warmup_prefill_tokens"] - warm["warmup_prefill_tokens"] % BLOCK_SIZE
    assert_chained_turns(records)


@pytest.mark.parametrize("version", [V1_CODEX, CURRENT_CODEX])
def test_http_resends_the_whole_input_every_turn(version, tmp_path):
    records = assert_task_done(run_codex(installed(version), "http", tmp_path))
    assert len(records) == TOOL_ROUNDS + 1
    assert {(r["transport"], r["design"], r["context"], r["previous_response_id"]) for r in records} == {
        ("http", "http-stateless", "full", None)}
    # Each POST repeats the last one's input plus the model's message, its call and the output.
    sizes = [r["input_items"] for r in records]
    assert [b - a for a, b in zip(sizes, sizes[1:])] == [3] * TOOL_ROUNDS
    assert [r["input_types"].get("function_call_output", 0) for r in records] == list(range(TOOL_ROUNDS + 1))
