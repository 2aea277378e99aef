"""Compaction: long tasks (contexts past 200k tokens) with and without server-side compaction.

One task per run, `--turns` tool rounds of `--appended-tokens` each after an `--initial-tokens`
prompt (the defaults reach about 250k tokens), `--output-tokens` per response, `--tool-seconds`
per call, at `--tps` decode tokens/s over a network of `--rtt-ms`, default API costs, virtual
time. Each design runs it twice: as is, and with `context_management: [{"type": "compaction",
"compact_threshold": --threshold}]` on every request, so the model compacts the context whenever
it crosses the threshold (docs/protocol.md, "Compaction"). The designs: `http stateless` (the
client resends its history; after a compaction, only the latest window), `http stored`
(`previous_response_id` through the store, rebuilt from the latest window), `chained` (v2, the
connection cache holds the compacted context) and `suspended` (v1, one response for the task).

Columns: `compactions` (compaction items the task's responses carried), `sent_mb` (what the client
sent: the resent history for http stateless), `input_mtok` (tokens the model read, every model call
counted, compaction reads included), `prefill_mtok` (of those, the tokens not found in the prefix
cache), `cache_hit` (the share found), `prefill_s` (the server's prefill time), `ttft_p50_ms` and
`ttft_max_ms` (per turn), and `task_s`.

What holds by construction: a compaction replaces the context by the user messages and a summary
(a tenth of the context, at most 2,000 tokens: an assumption), so every turn after it reads less;
the compaction itself reads the whole context once more, and the first turn after it prefills the
summary and what follows it, because only the head of the prompt is unchanged.

    python -m experiments.compaction [--turns 40] [--threshold 100000] [--designs chained suspended]
"""

from __future__ import annotations

import statistics
from typing import Any

from prototype import netem, virtual
from prototype.api.costs import ApiCosts
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord, run_websocket_rollout
from prototype.client.http import run_http_rollout
from prototype.protocol.wire import STATELESS, STORED
from prototype.server.app import ResponsesServer
from prototype.workload import fixed

from .common import add_list, experiment_parser, report

DESIGNS = ("http stateless", "http stored", "chained", "suspended")


async def run_design(connector, design: str, workload, metadata: dict[str, str], model: str, threshold: int | None) -> RolloutRecord:
    if design.startswith("http"):
        variant = STATELESS if design == "http stateless" else STORED
        return await run_http_rollout(
            connector, workload, variant=variant, metadata=metadata, model=model, include_timing=True, compact_threshold=threshold
        )
    ws_design = CHAINED if design == "chained" else SUSPENDED
    return await run_websocket_rollout(
        connector, ws_design, workload, metadata=metadata, model=model, include_timing=True, compact_threshold=threshold
    )


def run(design: str, threshold: int | None, *, turns: int, initial_tokens: int, appended_tokens: int, output_tokens: int,
        tool_seconds: float, tps: int, rtt: float) -> dict[str, Any]:
    workload = fixed(turns, initial_prompt_tokens=initial_tokens, appended_tokens=appended_tokens, output_tokens=output_tokens,
                     tool_seconds=tool_seconds)
    spec = f"fixed:{turns}:{initial_tokens}:{appended_tokens}:{output_tokens}:{tool_seconds:g}"

    async def main() -> dict[str, Any]:
        server = ResponsesServer(ApiService(costs=ApiCosts()))
        connector = InMemoryConnector(server, netem.NetworkProfile(rtt=rtt))
        record = await run_design(connector, design, workload, {"testbed_workload": spec}, f"sim-{tps}", threshold)
        assert record.status == "completed", record.status
        usage = record.usage
        ttfts = [t.ttft for t in record.turns if t.ttft is not None]
        prefill_ms = sum((t.server_timing or {}).get("phases_ms", {}).get("prefill", 0.0) for t in record.turns)
        return {
            "compactions": sum(item.get("type") == "compaction" for item in record.transcript),
            "sent_mb": sum(t.bytes_sent for t in record.turns) / 2**20,
            "input_mtok": usage["input_tokens"] / 1e6,
            "prefill_mtok": (usage["input_tokens"] - usage["cached_tokens"]) / 1e6,
            "cache_hit": usage["cached_tokens"] / usage["input_tokens"],
            "prefill_s": prefill_ms / 1000,
            "ttft_p50_ms": statistics.median(ttfts) * 1000,
            "ttft_max_ms": max(ttfts) * 1000,
            "task_s": record.seconds,
        }

    return virtual.run(main)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--turns", type=int, default=40, help="tool rounds per task (default 40)")
    parser.add_argument("--initial-tokens", type=int, default=8000, help="the first request's tokens (default 8000)")
    parser.add_argument("--appended-tokens", type=int, default=6000, help="tokens each tool output adds (default 6000)")
    parser.add_argument("--output-tokens", type=int, default=300, help="output tokens per response (default 300)")
    parser.add_argument("--tool-seconds", type=float, default=1.0, help="client tool time per call in seconds (default 1)")
    parser.add_argument("--tps", type=int, default=1000, help="decode tokens/s (default 1000)")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="network round-trip time in ms (default 20)")
    parser.add_argument("--threshold", type=int, default=100_000, help="compact_threshold in tokens, at least 1000 (default 100000)")
    add_list(parser, "--designs", str, DESIGNS, "designs to run", choices=list(DESIGNS))
    parser.add_argument("--csv", default="compaction.csv", help="CSV file name in results/compaction/<timestamp>/ (default compaction.csv)")
    args = parser.parse_args(argv)
    rows = []
    for design in args.designs:
        for threshold in (None, args.threshold):
            row: dict[str, Any] = {"design": design, "compaction": "off" if threshold is None else f"at {threshold:,}"}
            row.update(run(design, threshold, turns=args.turns, initial_tokens=args.initial_tokens, appended_tokens=args.appended_tokens,
                           output_tokens=args.output_tokens, tool_seconds=args.tool_seconds, tps=args.tps, rtt=args.rtt_ms / 1000))
            rows.append(row)
    report(rows, args.csv)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
