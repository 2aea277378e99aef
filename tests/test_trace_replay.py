"""Fair trace replay: every task a trace makes has its own content and shares with the others only the common prefix
the trace says they share."""

from __future__ import annotations

import pytest
from support import make_server
from test_fairness import DESIGNS, common_prefix_tokens, first_prompt, run
from test_traces import tracelab_row, write_jsonl

from prototype import traces
from prototype.client import harness
from prototype.engine.kv import BLOCK_SIZE
from prototype.engine.kv import common_prefix as _common_prefix

SYSTEM_PROMPT = 2000  # what the second and third sessions' first prompts found cached: the group's common prefix


def round_row(session: str, prefix: int, append: int, output: int, reasoning: int, start: float) -> dict:
    """A one-round request of a TraceLab round trace: a user message at `start`, the answer a second later."""
    row = tracelab_row(session, 0, prefix, append, output, [], reasoning=reasoning, start=start, end=start + 1.0, user=True)
    return {**row, "provider": "codex", "model": "gpt-5.4"}


@pytest.fixture
def trace(tmp_path) -> traces.Trace:
    rows = [round_row("s1", 0, 3000, 50, 20, 0.0),  # the first session finds nothing cached
            round_row("s2", SYSTEM_PROMPT, 1500, 60, 25, 10.0),  # the next ones find the system prompt
            round_row("s3", SYSTEM_PROMPT, 2500, 40, 0, 20.0)]
    return traces.load(write_jsonl(tmp_path / "round_trace.jsonl", rows))


def test_two_replayed_tasks_share_exactly_the_common_prefix_the_trace_names(trace) -> None:
    s1, s2, s3 = trace.tasks
    assert {t.prefix for t in trace.tasks} == {"trace:codex/gpt-5.4"}
    assert ([t.prefix_tokens for t in trace.tasks], len({t.text_seed for t in trace.tasks})) == ([SYSTEM_PROMPT] * 3, 3)
    shared = common_prefix_tokens(s1)
    assert shared > SYSTEM_PROMPT  # the system prompt, the tools and the user item's header
    prompts = [first_prompt(t) for t in trace.tasks]
    for other in prompts[1:]:
        assert _common_prefix(prompts[0], other) == shared  # and not one token of the task after it
    assert harness.task_prompt(s2) != harness.task_prompt(s3)


@pytest.mark.parametrize("design", DESIGNS)
async def test_no_design_finds_more_of_a_replayed_task_than_the_common_prefix(autojump_clock, trace, design) -> None:
    server = make_server()
    records = [await run(server, design, task) for task in trace.tasks]  # one after another on one engine
    shared = common_prefix_tokens(trace.tasks[0])
    assert records[0].usage["cached_tokens"] == 0
    for record in records[1:]:
        assert record.usage["cached_tokens"] == shared - shared % BLOCK_SIZE  # whole blocks of the prefix, no more

