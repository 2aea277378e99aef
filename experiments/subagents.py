"""Subagents: N agents at once over one multiplexed connection, one connection each, or v1.

An orchestrator runs N subagents (`--agents`, 2 to 32) at the same time, each a task of `--turns`
tool rounds (8,000-token prompt, 800 tokens appended per turn, `--output-tokens` per response,
`--tool-seconds` per tool call) at `--tps` decode tokens/s. Four arrangements:

* `v2 lanes`: one chained (v2) WebSocket, subagent i on `stream_id` `agent-i`;
* `v2 socket each`: one chained WebSocket per subagent;
* `v1 socket each`: one suspended (v1) response per subagent, hence one connection each (v1 has
  one response per connection and no lanes);
* `v2 inject`: one chained WebSocket with the multi-agent beta and one parent response hosting the
  N subagents; each tool output is injected into it (`response.inject`) when its tool ends, and
  each subagent resumes inside the response. Its task time is the parent response's.

Part 1, virtual time (in-process server, default API costs, a network of `--rtt-ms` with its
handshakes): `task_mean_s` / `task_max_s` (end-to-end time per subagent task), `connections` (what
the server accepted), `kv_peak_mb` (the engine's peak resident KV, 8B model) and `sent_kb` (client
bytes). Part 2, real time (`--rss`): the same arrangements against `python -m prototype serve
--costs zero` in a child process over loopback, tools shortened to 50 ms, at 100,000 tokens/s;
`server_kb_per_agent` is (peak server RSS - RSS before) / N.

What holds by construction: lanes run side by side with their own cache slot and engine key, so a
lane costs what a connection costs except the handshake and the per-connection state; v1 keeps
each subagent's KV pinned through its tool calls, v2 lets the engine's retention policy decide.

    python -m experiments.subagents [--agents 2 4 8 16 32] [--turns 6] [--rtt-ms 20] [--no-rss]
"""

from __future__ import annotations

import statistics
from typing import Any

import attrs
import trio

from prototype import netem
from prototype import virtual as virtual_time
from prototype.api.costs import ApiCosts
from prototype.api.service import ApiService
from prototype.cli.common import at_least, non_negative, positive
from prototype.client.connect import InMemoryConnector, TcpConnector
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord, run_websocket_rollout
from prototype.client.inject import run_injected_subagents
from prototype.client.lanes import run_multiplexed_rollouts
from prototype.server.app import ResponsesServer
from prototype.workload import fixed

from .common import add_list, experiment_parser, report, rss_bytes, server_process

ARRANGEMENTS = ("v2 lanes", "v2 socket each", "v1 socket each", "v2 inject")
RSS_SAMPLE_S = 0.01


@attrs.frozen
class Outcome:
    """What an arrangement's N subagents took: each task's seconds, status and client bytes."""

    seconds: list[float]
    statuses: list[str]
    sent_bytes: int


async def run_arrangement(connector, arrangement: str, n: int, workload, spec: str, model: str) -> Outcome:
    metadata = {"testbed_workload": spec}
    if arrangement == "v2 inject":
        run = await run_injected_subagents(connector, workload, n, metadata=metadata, model=model)
        return Outcome([run.seconds] * n, [run.status] * n, run.bytes_sent)
    records = await run_rollouts(connector, arrangement, n, workload, metadata, model)
    return Outcome([r.seconds for r in records], [r.status for r in records], sum(t.bytes_sent for r in records for t in r.turns))


async def run_rollouts(connector, arrangement: str, n: int, workload, metadata: dict[str, str], model: str) -> list[RolloutRecord]:
    if arrangement == "v2 lanes":
        return await run_multiplexed_rollouts(connector, [workload] * n, metadata_for=lambda i: metadata, model=model)
    design = CHAINED if arrangement.startswith("v2") else SUSPENDED
    records: list[RolloutRecord] = []

    async def one() -> None:
        records.append(await run_websocket_rollout(connector, design, workload, metadata=metadata, model=model))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return records


def virtual(arrangement: str, n: int, *, turns: int, output_tokens: int, tool_seconds: float, tps: int, rtt: float) -> dict[str, Any]:
    workload = fixed(turns, initial_prompt_tokens=8000, appended_tokens=800, output_tokens=output_tokens, tool_seconds=tool_seconds)
    spec = f"fixed:{turns}:8000:800:{output_tokens}:{tool_seconds:g}"

    async def main() -> dict[str, Any]:
        server = ResponsesServer(ApiService(costs=ApiCosts()))
        connector = InMemoryConnector(server, netem.NetworkProfile(rtt=rtt))
        outcome = await run_arrangement(connector, arrangement, n, workload, spec, f"sim-{tps}")
        engine = server.api.engine
        assert outcome.statuses == ["completed"] * n, outcome.statuses
        return {
            "task_mean_s": statistics.fmean(outcome.seconds),
            "task_max_s": max(outcome.seconds),
            "connections": server.connections_opened,
            "kv_peak_mb": engine.stats.peak_resident_tokens * engine.kv_bytes_per_token / 2**20,
            "sent_kb": outcome.sent_bytes / 1024,
        }

    return virtual_time.run(main)


def real_memory(arrangement: str, n: int, *, turns: int) -> float:
    """Server KB per subagent, real time, against a child server process."""
    spec = f"fixed:{turns}:8000:800:20:0.05"
    workload = fixed(turns, initial_prompt_tokens=8000, appended_tokens=800, output_tokens=20, tool_seconds=0.05)
    with server_process("--costs", "zero") as (process, port):
        connector = TcpConnector("127.0.0.1", port)

        async def main() -> float:
            await run_arrangement(connector, arrangement, 1, workload, spec, "sim-100000")  # warm: imports, tokenizer
            before = rss_bytes(process.pid)
            peak = before
            done = trio.Event()

            async def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, rss_bytes(process.pid))
                    await trio.sleep(RSS_SAMPLE_S)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                outcome = await run_arrangement(connector, arrangement, n, workload, spec, "sim-100000")
                done.set()
            assert outcome.statuses == ["completed"] * n
            return (peak - before) / 1024 / n

        return trio.run(main)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--agents", at_least(1), [2, 4, 8, 16, 32], "concurrent subagents")
    parser.add_argument("--turns", type=at_least(1), default=6, help="turns per subagent task (default 6)")
    parser.add_argument("--output-tokens", type=at_least(1), default=300, help="output tokens per response (default 300)")
    parser.add_argument("--tool-seconds", type=non_negative(float), default=2.0, help="client tool time per call in seconds (default 2)")
    parser.add_argument("--tps", type=positive(int), default=1000, help="decode tokens/s (default 1000)")
    parser.add_argument("--rtt-ms", type=non_negative(float), default=20.0, help="network round-trip time in ms (default 20)")
    parser.add_argument("--no-rss", dest="rss", action="store_false", help="skip the real-time memory part")
    add_list(parser, "--arrangements", str, ARRANGEMENTS, "arrangements to run", choices=list(ARRANGEMENTS))
    parser.add_argument("--csv", default="subagents.csv", help="CSV file name in results/subagents/<timestamp>/ (default subagents.csv)")
    args = parser.parse_args(argv)
    rows = []
    for n in args.agents:
        for arrangement in args.arrangements:
            row = {"arrangement": arrangement, "agents": n}
            row.update(virtual(arrangement, n, turns=args.turns, output_tokens=args.output_tokens, tool_seconds=args.tool_seconds,
                               tps=args.tps, rtt=args.rtt_ms / 1000))
            if args.rss:
                row["server_kb_per_agent"] = real_memory(arrangement, n, turns=args.turns)
            rows.append(row)
    report(rows, args.csv)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
