"""openai-agents, a client nobody here wrote, drives the testbed (docs/protocol.md): an Agent with two `@function_tool`
tools runs under `Runner` on a real socket, over the Responses WebSocket (full context, or chained with
`auto_previous_response_id`) and over HTTP (`Runner.run`, `Runner.run_streamed`), each run on its own asyncio loop in a
worker thread; `metadata.testbed_workload = "fixed:3"`: two turns end in a tool call, the third answers."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import trio

agents = pytest.importorskip("agents")  # the `test` extra installs openai-agents

from agents import Agent, ModelSettings, RunConfig, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.models.openai_provider import OpenAIProvider  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

set_tracing_disabled(True)

MODEL = "sim-100000"  # 100k tokens/s: a turn decodes in milliseconds
TURNS = 3
RUN_TIMEOUT = 20.0  # seconds for one agent run; a healthy one takes well under a second
USER_AGENT_PREFIX = "Agents/Python"


class ToolCalls:
    """Counts how often each Python tool function actually ran."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def make_agent(self) -> Agent:
        @function_tool
        def read_file(path: str, max_lines: int) -> str:
            """Read the first lines of a file of the repository."""
            self.counts["read_file"] += 1
            return f"{path}: {max_lines} lines of code"

        @function_tool
        def run_tests(suite: str, verbose: bool) -> str:
            """Run a test suite and report the failures."""
            self.counts["run_tests"] += 1
            return f"suite {suite}: 2 passed, 0 failed (verbose={verbose})"

        return Agent(
            name="fixer",
            instructions="Fix the failing test, using the tools.",
            model=MODEL,
            tools=[read_file, run_tests],
            model_settings=ModelSettings(metadata={"testbed_workload": f"fixed:{TURNS}"}))


async def run_in_thread(main) -> Any:
    with trio.fail_after(RUN_TIMEOUT):
        return await trio.to_thread.run_sync(lambda: asyncio.run(main()), abandon_on_cancel=True)


def records_of(server, prefix: str = USER_AGENT_PREFIX) -> list[dict[str, Any]]:
    return [r for r in server.records if r.get("user_agent", "").startswith(prefix)]


def assert_run_ok(result, tools: ToolCalls) -> None:
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert (sum(tools.counts.values()), len(result.raw_responses)) == (TURNS - 1, TURNS)  # one tool call per non-final turn
    assert all(r.response_id and r.response_id.startswith("resp_") for r in result.raw_responses)


@pytest.mark.parametrize("chain", [False, True], ids=["full-context", "previous_response_id"])
async def test_agents_runner_over_websocket(live_server, chain):
    from agents import responses_websocket_session

    server, port = live_server
    tools = ToolCalls()
    agent = tools.make_agent()

    async def main():  # openai-agents sends `"stream": true` and shorthand messages; the server takes both
        async with responses_websocket_session(api_key="testbed", base_url=f"http://127.0.0.1:{port}/v1") as session:
            return await session.run(agent, "The unit tests fail; fix them.", auto_previous_response_id=chain)

    result = await run_in_thread(main)
    assert_run_ok(result, tools)

    # The server saw every response, on one connection, from openai-agents, as a v2 client.
    records = records_of(server)
    assert [r["response_id"] for r in records] == [r.response_id for r in result.raw_responses]
    assert {(r["outcome"], r["connection"], r["transport"], r["design"], r["stream"], r["warmup"], r["stream_id"])
            for r in records} == {("completed", records[0]["connection"], "websocket", "chained", True, False, False)}
    assert records[0]["context"] == "full" and records[0]["input_types"] == {"message": 1}  # the shorthand message
    if chain:
        # Later turns send only the tool output and chain from the response before.
        assert [r["context"] for r in records[1:]] == ["chained"] * (TURNS - 1)
        assert [r["previous_response_id"] for r in records[1:]] == [r["response_id"] for r in records[:-1]]
        assert all(r["input_types"] == {"function_call_output": 1} for r in records[1:])
    else:
        # openai-agents' default: every turn resends the whole conversation, its function calls included.
        assert [r["context"] for r in records] == ["full"] * TURNS
        # Each earlier turn added its text message, its function call and the tool output.
        assert [r["input_items"] for r in records] == [1 + 3 * turn for turn in range(TURNS)]
    assert all(r["usage"]["output_tokens"] > 0 for r in records)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_agents_runner_over_http(live_server, streamed):
    server, port = live_server
    tools = ToolCalls()
    agent = tools.make_agent()

    async def main():
        # A client of this run's own: openai-agents' default one shares an httpx pool across event
        # loops, which breaks when each run has its own `asyncio.run`.
        async with AsyncOpenAI(api_key="testbed", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0) as client:
            provider = OpenAIProvider(openai_client=client, use_responses=True, use_responses_websocket=False)
            config = RunConfig(model_provider=provider)
            if not streamed:
                return await Runner.run(agent, "The unit tests fail; fix them.", run_config=config)
            result = Runner.run_streamed(agent, "The unit tests fail; fix them.", run_config=config)
            async for _ in result.stream_events():
                pass
            return result

    result = await run_in_thread(main)
    assert_run_ok(result, tools)
    # No WebSocket was opened, and the server stored every response the client saw (store defaults
    # to true on the POST API), so the server saw exactly these turns.
    assert all(server.api.store.get(r.response_id) is not None for r in result.raw_responses)
    http_records = records_of(server)
    assert [(r["transport"], r["response_id"]) for r in http_records] == [("http", r.response_id) for r in result.raw_responses]
    assert all(r["stream"] is streamed and r["context"] == "full" for r in http_records)
