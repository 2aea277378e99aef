"""The simulated model's tool calls: real agent calls for known tools, schema-valid values for the rest."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import attrs
import jsonschema
import numpy as np
import pytest
from scipy import stats
from support import create_event, function_calls, make_server, send, until, ws

from prototype import workload as wl
from prototype.client.harness import HARNESS_TOOLS
from prototype.engine import tokenizer, tool_calls
from prototype.engine.policy import ScriptedPolicy
from prototype.protocol.codec import parse_create_body
from prototype.protocol.events import ToolDef
from prototype.workload import HostedCall, TurnSpec, Workload

# Codex 0.101.0's function tools, trimmed to their schemas' shape (docs/codex.md).
CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}, "login": {"type": "boolean"}, "yield_time_ms": {"type": "number"}}, "required": ["cmd"], "additionalProperties": False}},
    {"type": "function", "name": "write_stdin", "parameters": {"type": "object", "properties": {
        "session_id": {"type": "number"}, "chars": {"type": "string"}}, "required": ["session_id"], "additionalProperties": False}},
    {"type": "function", "name": "update_plan", "parameters": {"type": "object", "properties": {
        "explanation": {"type": "string"},
        "plan": {"type": "array", "items": {"type": "object", "properties": {"status": {"type": "string"}, "step": {"type": "string"}},
                                            "required": ["step", "status"], "additionalProperties": False}}},
        "required": ["plan"], "additionalProperties": False}},
    {"type": "function", "name": "request_user_input", "parameters": {"type": "object", "properties": {
        "questions": {"type": "array", "items": {"type": "string"}}}, "required": ["questions"]}},
    {"type": "function", "name": "read_mcp_resource", "parameters": {"type": "object", "properties": {
        "server": {"type": "string"}, "uri": {"type": "string"}}, "required": ["server", "uri"]}},
    {"type": "web_search", "external_web_access": False}]


def tool_defs(raw: list[dict]) -> tuple[ToolDef, ...]:
    return parse_create_body({"model": "sim-1000", "input": "x", "tools": raw}).tools


def function_tools(raw: list[dict]) -> list[ToolDef]:
    return [tool for tool in tool_defs(raw) if tool.type == "function"]


def test_offered_a_shell_the_model_works_through_it_with_the_exploring_commands_in_order():
    assert [tool.name for tool in tool_calls.tools_an_agent_would_call(function_tools(CODEX_TOOLS))] == ["exec_command"]
    without_shell = [t for t in CODEX_TOOLS if t.get("name") != "exec_command"]
    assert [tool.name for tool in tool_calls.tools_an_agent_would_call(function_tools(without_shell))] == ["update_plan"]
    # Tools this module does not know (the harness's own) are all candidates, as before.
    assert [tool.name for tool in tool_calls.tools_an_agent_would_call(function_tools(HARNESS_TOOLS))] == ["read_file", "run_command"]
    (exec_command,) = function_tools(CODEX_TOOLS[:1])
    shell, shell_command = function_tools([
        {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
        {"type": "function", "name": "shell_command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
    ])
    rng = np.random.default_rng(0)
    assert [tool_calls.arguments_for(exec_command, n, rng) for n in range(5)] == [
        {"cmd": command} for command in (*tool_calls.EXPLORE_COMMANDS, tool_calls.EXPLORE_COMMANDS[0])]
    assert tool_calls.arguments_for(shell, 1, rng) == {"command": ["bash", "-lc", tool_calls.EXPLORE_COMMANDS[1]]}
    assert tool_calls.arguments_for(shell_command, 2, rng) == {"command": tool_calls.EXPLORE_COMMANDS[2]}
    policy = ScriptedPolicy(wl.fixed(5))  # the policy calls exec_command with a command on every tool turn
    calls = [call for turn in range(4) for call in policy.plan(turn, tool_defs(CODEX_TOOLS), offers_web_search=True).calls]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("exec_command", {"cmd": cmd}) for cmd in tool_calls.EXPLORE_COMMANDS]


# Codex's other built-in tools, each with the property this module recognises it by (docs/codex.md).
KNOWN_TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {prop: {"type": kind}}}}
    for name, prop, kind in (
        ("write_stdin", "session_id", "number"), ("apply_patch", "input", "string"), ("read_file", "file_path", "string"),
        ("list_dir", "dir_path", "string"), ("grep_files", "pattern", "string"), ("view_image", "path", "string"),
        ("local_shell", "command", "array"))]


def test_codex_built_in_tools_get_the_calls_an_exploring_agent_makes():
    rng = np.random.default_rng(0)
    assert [tool_calls.arguments_for(tool, 3, rng) for tool in function_tools(KNOWN_TOOLS)] == [
        {"session_id": 1, "chars": ""},
        {"input": "*** Begin Patch\n*** End Patch\n"},
        {"file_path": "README.md", "offset": 1, "limit": 40},
        {"dir_path": ".", "offset": 1, "limit": 50, "depth": 2},
        {"pattern": "def test_", "limit": 20},
        {"path": "screenshot.png"},
        {"command": ["bash", "-lc", tool_calls.EXPLORE_COMMANDS[3]]}]
    (update_plan,) = function_tools([CODEX_TOOLS[2]])
    assert [[step["status"] for step in tool_calls.arguments_for(update_plan, n, rng)["plan"]] for n in range(4)] == [
        ["in_progress", "pending", "pending"], ["completed", "in_progress", "pending"],
        ["completed", "completed", "in_progress"], ["completed", "completed", "in_progress"]]
    assert tool_calls.arguments_for(update_plan, 0, rng) == {"explanation": "Exploring before any change.", "plan": [
        {"step": "List the repository", "status": "in_progress"}, {"step": "Read the sources", "status": "pending"},
        {"step": "Run the tests", "status": "pending"}]}


def test_a_known_name_without_its_schema_is_an_unknown_tool_and_a_tool_without_a_schema_gets_an_empty_object():
    # Known by name and by the property the agent fills: a tool of the same name with other
    # parameters gets schema-valid arguments instead, and a shell without a command is not chosen.
    renamed = [{**tool, "parameters": {"type": "object", "properties": {"other": {"type": "boolean"}}, "required": ["other"]}}
               for tool in [*KNOWN_TOOLS, CODEX_TOOLS[0], CODEX_TOOLS[2]]]
    for tool in function_tools(renamed):
        assert tool_calls.known_arguments(tool, 0) is None, tool.name
        assert set(tool_calls.arguments_for(tool, 0, np.random.default_rng(0))) == {"other"}, tool.name
    # Properties that are not an object (a broken schema) make no tool known either.
    listed = function_tools([{**CODEX_TOOLS[0], "parameters": {"type": "object", "properties": ["cmd"]}}])
    assert tool_calls.known_arguments(listed[0], 0) is None
    shells = function_tools([*renamed[-2:], LOOKUP_TOOL[0]])
    assert tool_calls.tools_an_agent_would_call(shells) == shells
    (ping,) = function_tools([{"type": "function", "name": "ping"}])
    assert tool_calls.arguments_for(ping, 0, np.random.default_rng(0)) == {}


# A task whose first turn searches twice and ends in two parallel calls; its last turn is shorter.
SEARCHING_TASK = Workload("searching", 3, (
    TurnSpec(100, 9, (0.3, 0.4), (HostedCall(1.5, 70), HostedCall(2.5, 90)), reasoning_tokens=3),
    TurnSpec(50, 7, (), reasoning_tokens=2)))
LOOKUP_TOOL = [{"type": "function", "name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]


def test_a_turn_plans_its_specs_tokens_searches_and_parallel_calls():
    plan = ScriptedPolicy(SEARCHING_TASK).plan(0, tool_defs(CODEX_TOOLS), offers_web_search=True)
    assert (len(plan.reasoning), len(plan.words), plan.is_final) == (3, 6, False)
    assert [(s.seconds, s.result_tokens) for s in plan.searches] == [(1.5, 70), (2.5, 90)]
    for search in plan.searches:  # four one-token words, without the first word's leading space
        assert search.query == search.query.strip() and tokenizer.count_tokens(" " + search.query) == 4
    assert plan.searches[0].query != plan.searches[1].query
    # The task's call numbers go on across a turn's parallel calls: the first two exploring commands.
    assert [(c.name, json.loads(c.arguments)) for c in plan.calls] == [
        ("exec_command", {"cmd": tool_calls.EXPLORE_COMMANDS[0]}), ("exec_command", {"cmd": tool_calls.EXPLORE_COMMANDS[1]})]
    # Without a web_search tool on offer the same turn plans no search, and nothing else changes.
    assert ScriptedPolicy(SEARCHING_TASK).plan(0, tool_defs(CODEX_TOOLS), offers_web_search=False) == attrs.evolve(plan, searches=())


def test_a_final_answer_comes_past_the_tasks_last_turn_or_without_function_tools_after_the_searches_offered():
    # Past the task's turns (a client's own tools, a resent history) each turn is a final answer of the last turn's size.
    policy = ScriptedPolicy(SEARCHING_TASK)
    for turn in (1, 2, 5):
        plan = policy.plan(turn, tool_defs(CODEX_TOOLS), offers_web_search=True)
        assert (len(plan.reasoning), len(plan.words), plan.searches, plan.calls, plan.is_final) == (2, 5, (), (), True), turn
    plan = ScriptedPolicy(SEARCHING_TASK).plan(0, (), offers_web_search=False)
    assert (len(plan.reasoning), len(plan.words), plan.searches, plan.calls) == (3, 6, (), ())
    # Hosted searches do not end the turn: with web_search alone the final answer still searches first.
    searched = ScriptedPolicy(SEARCHING_TASK).plan(0, tool_defs([{"type": "web_search"}]), offers_web_search=True)
    assert (len(searched.reasoning), len(searched.words), searched.calls) == (3, 6, ())
    assert [(s.seconds, s.result_tokens) for s in searched.searches] == [(1.5, 70), (2.5, 90)]
    # A trace's hosted-only round is joined to the final round after it (traces/base.py): it searches as the trace did.
    task = Workload("final-search", 3, (TurnSpec(100, 9, (0.3,)), TurnSpec(50, 7, (), (HostedCall(1.0, 40),))))
    plan = ScriptedPolicy(task).plan(1, tool_defs(CODEX_TOOLS), offers_web_search=True)
    assert plan.is_final and [(s.seconds, s.result_tokens) for s in plan.searches] == [(1.0, 40)]


def test_each_task_turn_and_item_draws_its_own_content_the_same_every_run():
    tools = tool_defs([*CODEX_TOOLS[-1:], *LOOKUP_TOOL])
    plans = {
        (seed, turn): ScriptedPolicy(attrs.evolve(SEARCHING_TASK, content_seed=seed)).plan(turn, tools, offers_web_search=True)
        for seed in (1, 2) for turn in (0, 1)}
    assert ScriptedPolicy(attrs.evolve(SEARCHING_TASK, content_seed=1)).plan(0, tools, offers_web_search=True) == plans[1, 0]
    texts = [plan.words for plan in plans.values()] + [plan.reasoning for plan in plans.values()]
    # No two tasks or turns, and no reasoning and text, share words: not even their first two.
    assert len({text[:2] for text in texts}) == len(texts)
    first, other = plans[1, 0], plans[2, 0]
    assert {s.query for s in first.searches}.isdisjoint(s.query for s in other.searches)
    assert "".join(first.words[:4]).strip() not in {s.query for s in first.searches}
    arguments = [json.loads(call.arguments)["q"] for plan in (first, other) for call in plan.calls]
    assert len(set(arguments)) == 4  # each call of a turn draws its own arguments
    # ... from draws of their own, which neither the turn's text nor its reasoning repeats.
    assert {"".join(first.words[:2]).strip(), "".join(first.reasoning[:2]).strip()}.isdisjoint(arguments)


def test_each_turn_searches_for_its_own_query_and_chooses_its_own_tool():
    # Offered two tools of its harness, the model does not call the same one on every turn of every task.
    tools = tool_defs([{"type": "web_search"}, *LOOKUP_TOOL, {**LOOKUP_TOOL[0], "name": "fetch"}])
    searching = TurnSpec(10, 5, (0.1,), (HostedCall(1.0, 20),))
    chosen, queries, arguments = [], [], []
    for seed in (1, 2):
        policy = ScriptedPolicy(Workload("long", seed, (searching,) * 6 + (TurnSpec(10, 5, ()),)))
        plans = [policy.plan(turn, tools, offers_web_search=True) for turn in range(6)]
        chosen.append([plan.calls[0].name for plan in plans])
        queries += [plan.searches[0].query for plan in plans]
        arguments += [plan.calls[0].arguments for plan in plans]
    assert chosen[0] != chosen[1] and all(set(names) == {"lookup", "fetch"} for names in chosen), chosen
    assert len(set(queries)) == len(queries) and len(set(arguments)) == len(arguments)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("project", ["empty", "python"])
def test_every_exploring_command_exits_0_and_writes_nothing(tmp_path, project):
    if project == "python":
        (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        (tmp_path / "test_calc.py").write_text("import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
                                               "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    before = snapshot(tmp_path)
    for command in tool_calls.EXPLORE_COMMANDS:
        done = subprocess.run(["bash", "-lc", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (command, done.stderr)
    assert snapshot(tmp_path) == before
    if project == "python":
        assert "OK" in subprocess.run(["bash", "-lc", tool_calls.EXPLORE_COMMANDS[3]], cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout


# Schemas with the keywords a naive generator ignores.
SCHEMAS = [
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 4}}, "required": ["n"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 2.5}}, "required": ["x"]},
    {"type": "object", "properties": {"k": {"type": "integer", "minimum": 7, "multipleOf": 5}}, "required": ["k"]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 40, "maxLength": 41}}, "required": ["s"]},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 1}}, "required": ["s"]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}, "required": ["id"]},
    {"type": "object", "properties": {"mode": {"enum": ["fast", "slow"]}, "flag": {"const": True}}, "required": ["mode", "flag"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 3, "maxItems": 3, "uniqueItems": False}}, "required": ["tags"]},
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "minProperties": 2},
    {"type": "object", "required": ["free"], "additionalProperties": {"type": "integer", "maximum": -3}},
    {"type": "object", "properties": {"v": {"type": ["null", "integer"], "minimum": 1}}, "required": ["v"]},
    {"type": "object", "properties": {"u": {"anyOf": [{"type": "string", "pattern": "^x+$"}, {"type": "integer"}]}}, "required": ["u"]},
    {"type": "object", "properties": {"deep": {"type": "object", "properties": {"z": {"type": "boolean"}}, "required": ["z"], "additionalProperties": False}}, "required": ["deep"]},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_unknown_tools_get_arguments_valid_for_their_schema(schema):
    (tool,) = function_tools([{"type": "function", "name": "custom_tool", "parameters": schema}])
    for seed in range(30):
        value = tool_calls.arguments_for(tool, seed, np.random.default_rng(seed))
        jsonschema.validate(value, schema)
        assert value == tool_calls.arguments_for(tool, seed, np.random.default_rng(seed))  # seeded: runs repeat


async def test_a_tool_whose_schema_is_broken_still_gets_a_call(autojump_clock):
    # The API takes a function tool's parameters as sent: a schema breaking its metaschema (a `multipleOf` of 0) gets
    # arguments drawn as for any other, unchecked, and the response completes with its call.
    tool = {"type": "function", "name": "count", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 0}}, "required": ["n"]}}
    async with ws(make_server()) as conn:
        await send(conn, create_event(tools=[tool]))
        done = (await until(conn, "response.completed", "response.failed"))[-1]
    assert done["type"] == "response.completed"
    (call,) = function_calls(done["response"])
    assert call["name"] == "count" and set(json.loads(call["arguments"])) == {"n"}


# Schemas and every value 200 seeds draw for them: whole numbers from the tightest bound up in ten
# steps of `multipleOf` (the lower bound itself when a step passes the upper one); the first branch
# of a choice; required properties only, then declared ones up to `minProperties`.
EXACT_DRAWS = [
    ({"type": "integer", "maximum": -3}, set(range(-12, -2))),
    ({"type": "integer", "maximum": 5}, set(range(6))),
    ({"type": "integer", "maximum": 0}, {0}),
    ({"type": "integer", "minimum": 7, "maximum": 7.5}, {7}),
    ({"type": "integer", "minimum": 15, "maximum": 20}, set(range(15, 21))),
    ({"type": "integer", "exclusiveMinimum": 3}, set(range(4, 14))),
    ({"type": "integer", "minimum": 2.5}, set(range(3, 13))),
    ({"type": "integer", "minimum": -2.5, "maximum": -2}, {-2}),
    ({"type": "integer", "exclusiveMinimum": 2.5, "exclusiveMaximum": 4}, {3}),
    ({"type": "integer", "minimum": 3, "exclusiveMaximum": 5}, {3, 4}),
    ({"type": "integer", "minimum": 4, "exclusiveMaximum": 4.5}, {4}),
    ({"type": "integer", "exclusiveMinimum": 4.5, "maximum": 5}, {5}),
    ({"type": "integer", "minimum": 1, "exclusiveMinimum": 2, "maximum": 3}, {3}),
    ({"type": "integer", "minimum": 1, "maximum": 3, "exclusiveMaximum": 2}, {1}),
    ({"type": "integer", "minimum": True}, set(range(10))),  # draft 4's boolean forms are no bounds
    ({"type": "integer", "minimum": 7, "multipleOf": 5}, set(range(10, 60, 5))),
    ({"type": "integer", "minimum": -7, "multipleOf": 3}, set(range(-6, 24, 3))),
    ({"type": "integer", "maximum": -5, "multipleOf": 4}, {-12, -8}),
    ({"type": "integer", "multipleOf": 2.5}, set(range(10))),  # whole numbers only: no step
    ({"type": "integer", "multipleOf": True}, set(range(10))),
    ({"type": "integer", "multipleOf": 0}, set(range(10))),
    ({"type": "boolean"}, {False, True}),
    ({"type": "null"}, {None}),
    ({"type": ["null", "integer"], "minimum": 2, "maximum": 2}, {2}),  # the first type that is not null
    ({"type": ["null"]}, {None}),
    ({"anyOf": [{"const": 1}, {"const": 2}]}, {1}),
    ({"oneOf": [{"const": 3}]}, {3}),
    ({"allOf": [{"const": 4}]}, {4}),
    ({"type": "array", "maxItems": 0}, {()}),
    ({"type": "array", "maxItems": 3, "items": {"const": 1}}, {(1,)}),  # one item unless more are required
    ({"type": "array", "minItems": 4, "items": {"type": "integer", "minimum": 5, "maximum": 5}}, {(5, 5, 5, 5)}),
    ({"type": "object", "required": ["x"], "additionalProperties": {"const": 9}}, {(("x", 9),)}),
    ({"properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}}, "minProperties": 2}, {(("a", 1), ("b", 2))}),
    ({"properties": {"a": {"const": 1}}, "required": [1, "a"]}, {(("a", 1),)}),
    ({"type": "object", "properties": {"a": {"const": 1}}}, {()}),  # optional properties only: none
    ({"type": "object", "properties": {"a": True}, "required": ["a"]}, {(("a", ()),)})]


def hashable(value):
    if isinstance(value, dict):
        return tuple((key, hashable(v)) for key, v in value.items())
    return tuple(hashable(v) for v in value) if isinstance(value, list) else value


@pytest.mark.parametrize(("schema", "values"), EXACT_DRAWS, ids=range(len(EXACT_DRAWS)))
def test_schema_values_are_drawn_at_their_keywords_edges(schema, values):
    drawn = [tool_calls.schema_valid_value(schema, np.random.default_rng(seed)) for seed in range(200)]
    assert {hashable(value) for value in drawn} == values
    assert all(type(value) is type(next(iter(drawn))) for value in drawn)  # ints stay ints, never floats


def test_a_boolean_argument_is_a_fair_coin():
    heads = sum(tool_calls.schema_valid_value({"type": "boolean"}, np.random.default_rng(seed)) for seed in range(200))
    assert stats.binomtest(heads, 200).pvalue > 0.01


def test_strings_and_untyped_values_are_words_cut_or_padded_to_their_bounds_and_a_value_breaking_its_schema_is_logged(caplog):
    def draw(schema, seed):
        return tool_calls.schema_valid_value(schema, np.random.default_rng(seed))

    for seed in range(50):
        two_words = tokenizer.text_of(np.random.default_rng(seed), 2).strip()
        assert draw({"type": "string"}, seed) == draw({}, seed) == two_words  # no type: any JSON value
        assert draw({"type": "string", "maxLength": 3}, seed) == two_words[:3]
        assert draw({"type": "array"}, seed) == [two_words]  # one item; a string where `items` is no schema
        assert draw({"type": "array", "items": [{"type": "integer"}]}, seed) == [two_words]
        padded = draw({"type": "string", "minLength": 30}, seed)
        assert len(padded) >= 30 and padded.startswith(two_words) and len(padded.split()) % 2 == 0
        both = draw({"type": "string", "pattern": "^[ab]{1,8}$", "minLength": 6}, seed)
        assert 6 <= len(both) <= 8 and set(both) <= {"a", "b"}
        assert draw({"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "required": ["b", "zz"]}, seed) == {
            "b": 2, "zz": two_words}
    assert tool_calls.schema_valid_value(None, np.random.default_rng(0)) == {}
    # Bounds no draw of the pattern meets: the last draw, logged as invalid (a broken schema is not).
    with caplog.at_level(logging.WARNING, logger=tool_calls.__name__):
        assert draw({"type": "string", "pattern": "^a{5}$", "maxLength": 3}, 0) == "aaaaa"
        assert draw({"type": "integer", "multipleOf": 0}, 0) in range(10)
    assert [record.getMessage() for record in caplog.records] == ["generated arguments do not satisfy the tool schema: 'aaaaa' is too long"]


def test_strings_meet_their_length_bounds_exactly_when_a_draw_can():
    def draws(schema):
        return [tool_calls.schema_valid_value(schema, np.random.default_rng(seed)) for seed in range(50)]

    # A pattern whose draws vary in length: drawn again until the bounds hold, the bounds included.
    assert set(draws({"type": "string", "pattern": "^a{3,5}$", "minLength": 5})) == {"aaaaa"}
    assert set(draws({"type": "string", "pattern": "^a{3,5}$", "maxLength": 3})) == {"aaa"}
    # Without `minLength` the empty string is a string like any other.
    assert set(draws({"type": "string", "pattern": "^(ab)?$"})) == {"", "ab"}
    # Each call draws the pattern from its own seed: many values, not a handful.
    assert len(set(draws({"type": "string", "pattern": "^[a-z]{8}$"}))) == 50
    # Words padded only while shorter than `minLength`: a minimum the words meet adds none.
    for seed in range(50):
        two_words = tokenizer.text_of(np.random.default_rng(seed), 2).strip()
        schema = {"type": "string", "minLength": len(two_words)}
        assert tool_calls.schema_valid_value(schema, np.random.default_rng(seed)) == two_words
