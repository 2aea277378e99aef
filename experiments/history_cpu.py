"""Server CPU time per turn against history length: suspended, chained, chained with the cache's
four switches off.

The server runs in a child process with every modeled cost at zero and a decode rate high enough
that real time is CPU time; the harness drives a fixed task whose history starts at H tokens, and
the server process's CPU time (/proc schedstat) is read at the end of every turn. Turn 0 renders
the whole history in every design and is left out. A benchmark, not a timed test.

    python -m experiments.history_cpu [--histories 1000 8000 32000 131072] [--turns 20]
"""

from __future__ import annotations

import statistics

import trio

from prototype import sweep
from prototype.cli.common import at_least
from prototype.client.connect import TcpConnector
from prototype.client.harness import CHAINED, SUSPENDED, run_websocket_rollout
from prototype.workload import fixed

from .common import add_list, cpu_seconds, experiment_parser, report, server_process

CONFIGS = (("suspended", SUSPENDED, ()), ("chained", CHAINED, ()), ("chained, switches off", CHAINED, ("--switches", "all-off")))
APPENDED_PER_TURN = 200  # tool output tokens per turn, small so history length dominates
OUTPUT_PER_TURN = 50
DECODE_TPS = "1000000"  # real time spent is the server's own work, not modeled decoding


def measure_rollout(port: int, pid: int, design: str, history: int, turns: int) -> list[float]:
    """CPU seconds the server spent on each turn after the first, for one rollout."""
    marks: list[float] = []
    spec = f"fixed:{turns}:{history}:{APPENDED_PER_TURN}:{OUTPUT_PER_TURN}:0"
    task = fixed(turns, initial_prompt_tokens=history, appended_tokens=APPENDED_PER_TURN, output_tokens=OUTPUT_PER_TURN, tool_seconds=0.0)

    async def run() -> None:
        await run_websocket_rollout(
            TcpConnector("127.0.0.1", port), design, task,
            metadata={"testbed_workload": spec, "testbed_decode_tps": DECODE_TPS},
            on_turn_end=lambda _turn: marks.append(cpu_seconds(pid)),
        )

    trio.run(run)
    return [b - a for a, b in zip(marks, marks[1:])]


def measure(design: str, server_args: tuple[str, ...], histories: list[int], turns: int, rounds: int) -> dict[int, list[float]]:
    """Per-turn CPU seconds by history length. One server process per configuration; the history
    lengths are interleaved over `rounds` so that drift in the machine's speed hits them alike."""
    per_history: dict[int, list[float]] = {h: [] for h in histories}
    with server_process("--costs", "zero", *server_args) as (process, port):
        for _ in range(rounds):
            for history in histories:
                per_history[history] += measure_rollout(port, process.pid, design, history, turns)
    return per_history


def main(argv: list[str] | None = None) -> list[dict]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--histories", at_least(1), [1000, 8000, 32000, 131072], "history lengths in tokens")
    parser.add_argument("--turns", type=at_least(1), default=20, help="turns per rollout (default 20)")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="rollouts per design and history length (default 3)")
    args = parser.parse_args(argv)
    rows = []
    results = sweep.measured(lambda config: measure(config[1], config[2], args.histories, args.turns, args.rounds), CONFIGS,
                             desc="history_cpu")
    for (name, _design, _server_args), measured in zip(CONFIGS, results):
        for history, per_turn in measured.items():
            rows.append({
                "design": name,
                "history_tokens": history,
                "cpu_ms_per_turn_median": 1000 * statistics.median(per_turn),
                "cpu_ms_per_turn_mean": 1000 * statistics.fmean(per_turn),
                "turns_measured": len(per_turn),
            })
    for name, *_ in CONFIGS:
        mine = [r for r in rows if r["design"] == name]
        for r in mine:
            r["vs_shortest"] = r["cpu_ms_per_turn_median"] / mine[0]["cpu_ms_per_turn_median"]
    report(rows, "history_cpu.csv")
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
