"""The least a turn's critical path costs on the testbed's stack, with none of its logic.

`experiments.efficiency` sets the testbed against a limit that charges only the model, so its
figure folds in what any code on the same stack pays per turn: one WebSocket message each way
through trio, trio-websocket, wsproto and orjson, a timer waking the task at the end of a modeled
wait, over loopback on this machine. This experiment times that alone. A client and a server
(trio-websocket over TCP on 127.0.0.1, the testbed's receive buffer, the closing events in one
write as the testbed's outbox writes them, PreciseClock) play turns with nothing else to do:

1. the client waits out its tool (`--wait-s`), sends a `response.create` of `--request-bytes`
   (default ~50 KB, the size of the efficiency task's chained requests: 48-74 KB) and reads events
   until `response.completed`;
2. the server reads the request, parses it, waits out the model (`--wait-s` from the frame's
   arrival, as the testbed's response schedule starts there) and sends two small closing events and
   a `response.completed` of ~47 KB (the finished response echoes the request's instructions and
   tools; the efficiency task's terminal events are 48-52 KB in both WebSocket designs).

Per turn (the first two turns left out as warm-up): `next_request` (tool deadline to the request's
send), `way_in` (send to the server holding the frame), `timer_wake` (the model's deadline to the
server task running), `way_out` (that to the client holding the parsed `response.completed`). Their
sum is the floor: the testbed's real time per turn beyond the model cannot be less on this machine.
Each is printed as its median and its mean with a 95% bootstrap interval over the turns.
`experiments.efficiency` plays the same turns in its own run, right before each WebSocket design's
real run, and prints the efficiency that floor leaves its task (`efficiency_bound`).

    python -m experiments.stack_floor [--turns 40] [--wait-s 0.2] [--request-bytes 50000]
"""

from __future__ import annotations

import functools
import os
import statistics
from typing import Any

import numpy as np
import orjson
import trio
import trio_websocket

from prototype import uncertainty
from prototype.cli.common import at_least, positive
from prototype.clock import PreciseClock
from prototype.protocol.wire import WS_RECEIVE_BYTES
from prototype.ws_internals import received_message_nowait, send_messages

from .common import experiment_parser, report
from .idle_cost import REQUEST_BYTES, request_event

SEGMENTS = ("next_request", "way_in", "timer_wake", "way_out")
FLOOR = "floor (turn's sum)"
COLUMNS = ("segment", "median_ms", "mean_ms", "low_ms", "high_ms", "turns")
WARM_UP_TURNS = 2
MAX_MESSAGE_BYTES = 16 * 2**20
CLOSING_TYPES = ("response.function_call_arguments.done", "response.output_item.done")
# The response object a terminal event carries: the request's instructions and tools echoed back.
COMPLETED_BYTES = 47_000


def turn_messages(request_bytes: int = REQUEST_BYTES, completed_bytes: int = COMPLETED_BYTES) -> tuple[str, list[str]]:
    """The request and the server's closing events, encoded as the testbed sends them."""
    request = orjson.dumps(request_event(request_bytes)).decode()
    closing = [orjson.dumps({"type": kind, "sequence_number": i}).decode() for i, kind in enumerate(CLOSING_TYPES)]
    completed = {"type": "response.completed", "sequence_number": len(closing), "response": request_event(completed_bytes)}
    return request, [*closing, orjson.dumps(completed).decode()]


async def play(turns: int, wait_s: float, request_bytes: int = REQUEST_BYTES,
               completed_bytes: int = COMPLETED_BYTES) -> list[dict[str, float]]:
    """`turns` turns between a client and a server in this process; each turn's segments in seconds."""
    request, closing = turn_messages(request_bytes, completed_bytes)
    served: list[dict[str, float]] = []

    async def serve(ws_request: trio_websocket.WebSocketRequest) -> None:
        ws = await ws_request.accept()
        while True:
            try:
                message = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                return
            arrived = trio.current_time()  # the frame read: the testbed's response schedule starts here
            orjson.loads(message)  # within the modeled wait, as the testbed's preparation is
            deadline = arrived + wait_s
            await trio.sleep_until(deadline)
            woke = trio.current_time()
            await send_messages(ws, closing)
            served.append({"arrived": arrived, "deadline": deadline, "woke": woke})

    async def next_event(ws: trio_websocket.WebSocketConnection) -> dict[str, Any]:
        message = received_message_nowait(ws)
        return orjson.loads(message if message is not None else await ws.get_message())

    rows = []
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(
            trio_websocket.serve_websocket, serve, "127.0.0.1", 0, ssl_context=None,
            max_message_size=MAX_MESSAGE_BYTES, receive_buffer_size=WS_RECEIVE_BYTES,
        ))
        url = f"ws://127.0.0.1:{server.port}/v1/responses"
        async with trio_websocket.open_websocket_url(url, max_message_size=MAX_MESSAGE_BYTES, receive_buffer_size=WS_RECEIVE_BYTES) as ws:
            tool_end = trio.current_time() + wait_s
            for _ in range(turns):
                await trio.sleep_until(tool_end)
                sent = trio.current_time()
                await ws.send_message(request)
                while (await next_event(ws))["type"] != "response.completed":
                    pass
                received = trio.current_time()
                turn = served[-1]
                rows.append({
                    "next_request": sent - tool_end,
                    "way_in": turn["arrived"] - sent,
                    "timer_wake": turn["woke"] - turn["deadline"],
                    "way_out": received - turn["woke"],
                })
                tool_end = received + wait_s
        nursery.cancel_scope.cancel()
    return rows


def played_turns(turns: int, wait_s: float, request_bytes: int = REQUEST_BYTES,
                 completed_bytes: int = COMPLETED_BYTES) -> list[dict[str, float]]:
    """`play` in a run of its own (after two turns of warm-up): the timed turns' segments in seconds."""
    played = trio.run(play, turns + WARM_UP_TURNS, wait_s, request_bytes, completed_bytes, clock=PreciseClock())
    return played[WARM_UP_TURNS:]


def floor_seconds(played: list[dict[str, float]]) -> list[float]:
    """Each played turn's floor: the sum of its segments."""
    return [sum(turn[name] for name in SEGMENTS) for turn in played]


def efficiency_bound(floor_s: float, turns: int, limit_s: float) -> float:
    """The highest efficiency a task of `turns` turns and limit `limit_s` could show if every turn
    cost `floor_s` beyond the model: limit / (limit + turns x floor)."""
    return limit_s / (limit_s + turns * floor_s)


def segment_row(name: str, seconds: list[float]) -> dict[str, Any]:
    mean = uncertainty.bootstrap(seconds, np.mean, of="turns").scaled(1000)
    return {"segment": name, "median_ms": 1000 * statistics.median(seconds), "mean_ms": mean.value,
            "low_ms": mean.low, "high_ms": mean.high, "turns": mean.n}


def measure(turns: int, wait_s: float, request_bytes: int = REQUEST_BYTES) -> list[dict[str, Any]]:
    played = played_turns(turns, wait_s, request_bytes)
    rows = [segment_row(name, [turn[name] for turn in played]) for name in SEGMENTS]
    return [*rows, segment_row(FLOOR, floor_seconds(played))]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--turns", type=at_least(2), default=40, help="turns timed, after two of warm-up (default 40)")
    parser.add_argument("--wait-s", type=positive(float), default=0.2, help="the modeled wait at each end, in seconds (default 0.2)")
    parser.add_argument("--request-bytes", type=at_least(1000), default=REQUEST_BYTES,
                        help=f"the request's size in bytes (default {REQUEST_BYTES})")
    parser.add_argument("--csv", default="stack_floor.csv", help="CSV file name in results/stack_floor/<timestamp>/ (default stack_floor.csv)")
    args = parser.parse_args(argv)
    print(f"{args.turns} turns over loopback, {args.wait_s:g} s of tool and of model each, a {args.request_bytes:,}-byte "
          f"request and a {COMPLETED_BYTES:,}-byte terminal event, no testbed logic; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    rows = measure(args.turns, args.wait_s, args.request_bytes)
    report(rows, args.csv, COLUMNS)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
