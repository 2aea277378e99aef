"""Subagents in one multi-agent response, their tool outputs injected (docs/protocol.md, "Inject").

One v2 WebSocket with `OpenAI-Beta: responses_multi_agent=v1`, one `response.create` with
`multi_agent` and `metadata.testbed_subagents = N`: the server hosts N agents in that response.
Each function call the response streams is run as the workload says (its turn's tool time, its
output's size) and answered with `response.inject` as soon as it finishes, as the multi-agent
guide's WebSocket loop does; the response ends when every agent has finished. The subagents
experiment's fourth arrangement.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio
import trio_websocket

from ..protocol.inject import BETA_MULTI_AGENT
from ..protocol.wire import RESPONSES_PATH, WS_RECEIVE_BYTES
from ..workload import Workload
from .connect import Connector
from .harness import request_body, task_prompt, tool_output_text


@attrs.define
class InjectedRun:
    """What one multi-agent response cost the client."""

    started_at: float
    ended_at: float = 0.0
    status: str = ""
    bytes_sent: int = 0
    injects: int = 0
    usage: dict[str, Any] = attrs.Factory(dict)

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started_at


async def run_injected_subagents(
    connector: Connector, workload: Workload, subagents: int, *, metadata: dict[str, str], model: str, api_key: str = "testbed",
) -> InjectedRun:
    """N subagents of `workload` in one response; every call's output is injected when its tool ends."""
    headers = [(b"authorization", f"Bearer {api_key}".encode()), (b"openai-beta", BETA_MULTI_AGENT.encode())]
    run = InjectedRun(started_at=trio.current_time())
    calls_per_agent: dict[str, int] = {}
    async with connector.open_stream() as stream, trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(
            nursery, stream, "testbed", RESPONSES_PATH, extra_headers=headers, receive_buffer_size=WS_RECEIVE_BYTES,
        )

        async def send(event: dict[str, Any]) -> None:
            data = json.dumps(event, separators=(",", ":"))
            run.bytes_sent += len(data.encode())
            await ws.send_message(data)

        async def answer(response_id: str, call: dict[str, Any]) -> None:
            agent = call["call_id"].rsplit("_", 1)[0]
            turn = calls_per_agent[agent] = calls_per_agent.get(agent, -1) + 1
            # Every agent runs the workload's turns, and only a turn with a client call asks for an output.
            await trio.sleep(workload.turns[turn].tool_seconds[0])
            output = tool_output_text(workload, turn, 0)
            await send({"type": "response.inject", "response_id": response_id,
                        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": output}]})
            run.injects += 1

        body = request_body(workload, model=model, metadata={**metadata, "testbed_subagents": str(subagents)}, store=False)
        body["multi_agent"] = {"enabled": True, "max_concurrent_subagents": subagents}
        user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workload)}]}
        await send({"type": "response.create", **body, "input": [user]})
        response_id = None
        async with trio.open_nursery() as tools:
            while True:
                event = json.loads(await ws.get_message())
                kind = event["type"]
                if kind == "response.created":
                    response_id = event["response"]["id"]
                elif kind == "response.output_item.done" and event["item"]["type"] == "function_call":
                    tools.start_soon(answer, response_id, event["item"])
                elif kind in ("response.completed", "response.failed", "response.incomplete", "error"):
                    run.status = event.get("response", {}).get("status", "error")
                    run.usage = event.get("response", {}).get("usage") or {}
                    break
        run.ended_at = trio.current_time()
        await ws.aclose()
        nursery.cancel_scope.cancel()
    return run
