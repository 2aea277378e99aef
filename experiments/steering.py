"""Steering: from the user's steer to the first token that follows it, per design and alternative.

The scenario (virtual time, in-process server, default API costs, a network of `--rtt-ms`): a
task's first response ends in a tool call, the tool runs `--tool-seconds`, and the second response
streams its message (`--output-tokens` at `--tps`); `--after` tokens into that message the user
types a correction. What each design can do with it:

* `chained+steer` (v2 as it ships): `response.steer`; the server finishes the message item, ends
  the response (`incomplete`, `steered`) and starts the automatic successor with the correction;
* `chained+wait` (v2 without steering): keep the correction until the response ends at its tool
  call, run the tool, send it with the tool output in the next `response.create`;
* `v1+append` (v1's nearest behaviour; v1 refuses `response.steer`): keep it until the rollout
  pauses (`response.done`) at its next tool call, run the tool, send it in `response.append` with
  the tool output;
* `v1+restart`: drop the connection (the server cancels the rollout), open a new one and send the
  conversation so far, without the unfinished response, plus the correction;
* `http+wait`: let the stream end at the tool call, run the tool, POST the whole conversation with
  the tool output and the correction;
* `http+abort`: abandon the stream and POST the conversation so far plus the correction.

The figure is `steer_to_token_s`: from the instant the user steers to the first token (text or call
arguments) of a response that has the correction in its input. Holds by construction: the waiting
alternatives pay the rest of the message, the call and the tool; steering pays the rest of the
item; restarts pay a full-context request (and a handshake on a new connection).

    python -m experiments.steering [--after 50 150] [--tool-seconds 2] [--rtt-ms 20]
"""

from __future__ import annotations

import json
from typing import Any

import trio

from prototype import netem, virtual
from prototype.api.costs import ApiCosts
from prototype.api.service import ApiService
from prototype.cli.common import at_least, non_negative, positive
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import (
    CHAINED,
    FIRST_TOKEN_TYPES,
    SUSPENDED,
    Rollout,
    RolloutRecord,
    WsChannel,
    open_responses_websocket,
    request_body,
    task_prompt,
)
from prototype.client.http import ConnectionPool, post_turn, request_headers
from prototype.server.app import ResponsesServer
from prototype.workload import Workload, fixed

from .common import add_list, experiment_parser, report

ALTERNATIVES = ("chained+steer", "chained+wait", "v1+append", "v1+restart", "http+wait", "http+abort")
CORRECTION = "Stop: only touch the tests, leave the source alone."


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


class Watch(Rollout):
    """The harness's bookkeeping, plus two marks: `steer_now` is set at the `after`-th text delta of
    the watched turn; `token_at` is the first token after `armed` (a response carrying the
    correction has started)."""

    def __init__(self, workload: Workload, after: int) -> None:
        super().__init__(workload, RolloutRecord("steering", workload.name, trio.current_time()))
        self.after = after
        self.watching = False
        self.deltas = 0
        self.steer_now = trio.Event()
        self.armed = False
        self.token_at: float | None = None

    def received(self, event: dict[str, Any], size: int) -> None:
        super().received(event, size)
        kind = event.get("type")
        if self.watching and kind == "response.output_text.delta":
            self.deltas += 1
            if self.deltas == self.after:
                self.steer_now.set()
        if self.armed and kind in FIRST_TOKEN_TYPES and self.token_at is None:
            self.token_at = trio.current_time()


def calls_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


async def ws_scenario(connector, design: str, workload: Workload, watch: Watch, base: dict, alternative: str) -> float:
    """Turn 0, its tool, turn 1 up to the steer; then the alternative. Returns steer -> token."""
    task = [user(task_prompt(workload))]
    async with open_responses_websocket(connector, design) as conn:
        channel = WsChannel(conn, watch)
        watch.start_turn(task, await channel.send({"type": "response.create", **base, "input": task}))
        first = await channel.until_pause()
        outputs = await watch.run_tools(calls_of(first["response"]))
        watch.watching = True
        if design == SUSPENDED:
            await channel.send({"type": "response.append", "input": outputs})
        else:
            await channel.send({"type": "response.create", **base, "previous_response_id": first["response"]["id"], "input": outputs})
        watch.start_turn(outputs, 0)
        # Turn 1 streams until the user steers.
        target = None
        while not watch.steer_now.is_set():
            event = json.loads(await conn.get_message())
            watch.received(event, 0)
            if event["type"] == "response.created":
                target = event["response"]["id"]
        watch.watching = False
        steered_at = trio.current_time()
        if alternative == "chained+steer":
            await channel.send({"type": "response.steer", "previous_response_id": target, "input": CORRECTION})
            while True:
                event = json.loads(await conn.get_message())
                watch.received(event, 0)
                if event["type"] == "response.created" and event["response"]["previous_response_id"] == target:
                    watch.armed = True
                if watch.token_at is not None:
                    return watch.token_at - steered_at
        if alternative in ("chained+wait", "v1+append"):
            pause = await channel.until_pause()
            outputs = await watch.run_tools(calls_of(pause["response"]))
            watch.armed = True
            if design == SUSPENDED:
                await channel.send({"type": "response.append", "input": [*outputs, user(CORRECTION)]})
            else:
                await channel.send({"type": "response.create", **base, "previous_response_id": pause["response"]["id"], "input": [*outputs, user(CORRECTION)]})
            while watch.token_at is None:
                watch.received(json.loads(await conn.get_message()), 0)
            return watch.token_at - steered_at
    # v1+restart: the connection is gone (the server cancels the rollout); a new one, full context.
    history = [*task, *first["response"]["output"], *outputs, user(CORRECTION)]
    async with open_responses_websocket(connector, design) as conn:
        watch.armed = True
        await conn.send_message(json.dumps({"type": "response.create", **base, "input": history}))
        while watch.token_at is None:
            watch.received(json.loads(await conn.get_message()), 0)
    return watch.token_at - steered_at


async def http_scenario(connector, workload: Workload, watch: Watch, base: dict, alternative: str) -> float:
    headers = request_headers(api_key="testbed", keep_alive=True, include_timing=False)
    history = [user(task_prompt(workload))]

    def body(items: list[dict[str, Any]]) -> bytes:
        return json.dumps({**base, "stream": True, "input": items}, separators=(",", ":")).encode()

    async with trio.open_nursery() as nursery:
        pool = ConnectionPool(nursery, connector, keep_alive=True)
        watch.start_turn(history, 0)
        first = (await post_turn(pool, body(history), headers, watch))["response"]
        history += first["output"]
        outputs = await watch.run_tools(calls_of(first))
        history += outputs
        watch.start_turn(outputs, 0)
        watch.watching = True
        ended: dict[str, Any] = {}
        finished = trio.Event()

        async def second_turn(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                ended.update(await post_turn(pool, body(history), headers, watch))
                finished.set()

        scope = await nursery.start(second_turn)
        await watch.steer_now.wait()
        watch.watching = False
        steered_at = trio.current_time()
        if alternative == "http+abort":
            scope.cancel()  # the stream is abandoned: its connection is discarded
            retry = [*history, user(CORRECTION)]
        else:
            await finished.wait()
            history += ended["response"]["output"]
            retry = [*history, *await watch.run_tools(calls_of(ended["response"])), user(CORRECTION)]
        watch.armed = True
        watch.start_turn(retry, 0)
        await post_turn(pool, body(retry), headers, watch)
        pool.close()
    return watch.token_at - steered_at


def run_one(alternative: str, *, after: int, tool_seconds: float, output_tokens: int, tps: int, rtt: float) -> float:
    workload = fixed(4, initial_prompt_tokens=8000, appended_tokens=800, output_tokens=output_tokens, tool_seconds=tool_seconds)
    spec = f"fixed:4:8000:800:{output_tokens}:{tool_seconds:g}"
    base = request_body(workload, model=f"sim-{tps}", metadata={"testbed_workload": spec}, store=False)

    async def main() -> float:
        server = ResponsesServer(ApiService(costs=ApiCosts()))
        connector = InMemoryConnector(server, netem.NetworkProfile(rtt=rtt))
        watch = Watch(workload, after)
        if alternative.startswith("http"):
            return await http_scenario(connector, workload, watch, base, alternative)
        design = SUSPENDED if alternative.startswith("v1") else CHAINED
        return await ws_scenario(connector, design, workload, watch, base, alternative)

    return virtual.run(main)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--after", non_negative(int), [50, 250], "tokens of the message streamed before the steer")
    parser.add_argument("--output-tokens", type=at_least(1), default=300, help="tokens of each message (default 300)")
    parser.add_argument("--tool-seconds", type=non_negative(float), default=2.0, help="client tool time per call in seconds (default 2)")
    parser.add_argument("--tps", type=positive(int), default=1000, help="decode tokens/s (default 1000)")
    parser.add_argument("--rtt-ms", type=non_negative(float), default=20.0, help="network round-trip time in ms (default 20)")
    add_list(parser, "--alternatives", str, ALTERNATIVES, "alternatives to time", choices=list(ALTERNATIVES))
    parser.add_argument("--csv", default="steering.csv", help="CSV file name in results/steering/<timestamp>/ (default steering.csv)")
    args = parser.parse_args(argv)
    rows = []
    for after in args.after:
        for alternative in args.alternatives:
            seconds = run_one(alternative, after=after, tool_seconds=args.tool_seconds, output_tokens=args.output_tokens,
                              tps=args.tps, rtt=args.rtt_ms / 1000)
            rows.append({"alternative": alternative, "after_tokens": after, "steer_to_token_s": seconds})
    report(rows, args.csv)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
