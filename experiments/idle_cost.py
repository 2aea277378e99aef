"""What the same piece of a turn's work costs right after the same work, and after a wait.

Every step on a turn's critical path in a real-time run follows a wait: the prefill, the decode's
last flush, the client's tool time (tens to hundreds of milliseconds each). A microbenchmark times
a step back to back, with the caches and the branch predictors holding what the step touched; on a
shared machine the core's other work evicts that during a wait. This experiment times one fixed
step of the testbed's own, a chained request's way into the server without the socket and the
scheduler (the client's wsproto frames and masks a ~50 KB `response.create`, the server's wsproto
parses and unmasks it, orjson reads the event), in three conditions:

* `back to back`: right after the same step (the microbenchmark's figure);
* `after sleep` of W ms (each of `--waits-ms`): the process blocked in the kernel (`time.sleep`),
  as trio's run loop is between a turn's events;
* `after busy wait` of W ms: the process kept its core, spinning on the clock; if this is as slow
  as after a sleep, it is the time passing (other work on the core and its caches), not the core
  idling (its frequency, its sleep states), that costs.

Each figure is the median over `--repeats` steps; `x back to back` divides it by the first row's.
docs/speed.md gives the figures for the machine the efficiency figures were measured on.

    python -m experiments.idle_cost [--waits-ms 1 20 200] [--repeats 25]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import wsproto
from wsproto.events import AcceptConnection, Request, TextMessage

from prototype.cli.common import at_least, positive

from .common import add_list, experiment_parser, report

COLUMNS = ("condition", "wait_ms", "repeats", "median_us", "x_back_to_back")
REQUEST_BYTES = 50_000  # a chained request of the efficiency task carries 48-74 KB


def request_event(size: int = REQUEST_BYTES) -> dict[str, Any]:
    """A `response.create` of `size` bytes of JSON (a few bytes less where a cut falls on an escaped
    newline): instructions, a tool, one function call's output."""
    words = ("def parse(line): return line.split(':', 1)  # the repository's code, as a tool printed it\n" * (size // 90 + 1))
    event = {
        "type": "response.create",
        "model": "gpt-5-codex",
        "instructions": words[: size // 2],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": words[: size - size // 2]}],
        "previous_response_id": "resp_1",
    }
    output = event["input"][0]
    output["output"] = output["output"][: max(0, len(output["output"]) - (len(orjson.dumps(event)) - size))]
    return event


def connected_pair() -> tuple[wsproto.WSConnection, wsproto.WSConnection]:
    """A client and a server wsproto connection past the handshake, joined by hand."""
    client = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    server = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="testbed", target="/v1/responses")))
    list(server.events())  # the Request: the server may accept it now
    client.receive_data(server.send(AcceptConnection()))
    list(client.events())  # the acceptance: both are open
    return client, server


def way_in(event: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """The step: frame `event` at the client, read it at the server; returns what the server read."""
    client, server = connected_pair()
    text = orjson.dumps(event).decode()

    def step() -> dict[str, Any]:
        server.receive_data(client.send(TextMessage(data=text)))
        (message,) = [e for e in server.events() if isinstance(e, TextMessage)]
        return orjson.loads(message.data)

    return step


def busy_wait(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def timed(step: Callable[[], object], before: Callable[[], None], repeats: int) -> float:
    """Median seconds of `step` over `repeats`, each right after `before()`."""
    samples = []
    for _ in range(repeats):
        before()
        started = time.perf_counter()
        step()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(waits_ms: list[float], repeats: int) -> list[dict[str, Any]]:
    step = way_in(request_event())
    for _ in range(repeats):  # warm-up: imports, first-call paths
        step()
    rows = [{"condition": "back to back", "wait_ms": 0.0, "repeats": repeats, "median_us": 1e6 * timed(step, lambda: None, repeats)}]
    for wait in waits_ms:
        for condition, wait_for in (("after sleep", time.sleep), ("after busy wait", busy_wait)):
            seconds = wait / 1000
            median = timed(step, lambda: wait_for(seconds), repeats)  # noqa: B023 - called within this iteration
            rows.append({"condition": condition, "wait_ms": wait, "repeats": repeats, "median_us": 1e6 * median})
    for row in rows:
        row["x_back_to_back"] = row["median_us"] / rows[0]["median_us"]
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--waits-ms", positive(float), [1.0, 20.0, 200.0], "waits before the step, in milliseconds")
    parser.add_argument("--repeats", type=at_least(1), default=25, help="steps per condition (default 25)")
    parser.add_argument("--csv", default="idle_cost.csv", help="CSV file name in results/idle_cost/<timestamp>/ (default idle_cost.csv)")
    args = parser.parse_args(argv)
    print(f"one step: a {REQUEST_BYTES:,}-byte response.create framed and masked by a wsproto client, read by a wsproto server, parsed by orjson")
    rows = measure(args.waits_ms, args.repeats)
    report(rows, args.csv, COLUMNS)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
