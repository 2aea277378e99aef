"""The real Codex CLI drives the testbed over v1 (suspended), v2 (chained) and HTTP.

`codex exec` (the `@openai/codex` npm package, pinned versions) runs one small task in a scratch
Python project against `python -m prototype serve`, configured as a custom model provider in a
throwaway `CODEX_HOME`. Codex runs the simulated model's tool calls itself (read-only commands in
the scratch folder, prototype/engine/tool_calls.py). One run per transport:

* `v1`: Codex 0.101.0 with `[features] responses_websockets = true`: one `response.create`, then a
  `response.append` per tool round (the last release with that client; Codex removed it in 0.102);
* `v2`: Codex 0.101.0 with `responses_websockets_v2`, and the current release (WebSocket v2 is on
  with `supports_websockets = true` alone): a `generate: false` warm-up, then one
  `response.create` per turn with `previous_response_id` and only the new items;
* `http`: the same Codex with `supports_websockets = false`: one POST per turn, the whole input
  resent.

The table comes from the server's records (`serve --records`, one JSON line per response):
turns (model calls), the input items and bytes Codex sent (WebSocket frames or POST bodies), the
tokens the engine prefilled (not served from its prefix cache, warm-up included), the task's time
on the server's clock (first request received to last response finished, Codex's tool runs and
its own work included) per turn, and the server's own phase time per turn (queue, pre-inference,
prefill, decode, post). Times are wall-clock on a shared machine: compare them run against run, not as
absolute figures.

    python -m experiments.codex_transports [--versions 0.101.0 0.171.0] [--transports v1 v2 http] [--costs default|zero]

Codex is installed with `npm install --prefix ~/.cache/prototype-codex/<version>` on first use
(`PROTOTYPE_CODEX_CACHE` moves the cache) and reused afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from experiments.common import add_list, experiment_parser, report, server_process
from prototype.api.workloads import WorkloadCatalog
from prototype.engine.policy import ScriptedPolicy

V1_CODEX = "0.101.0"  # the last release with the v1 WebSocket client (2026-02-25)
CURRENT_CODEX = "0.171.0"  # `npm view @openai/codex version` when this was written
CACHE = Path(os.environ.get("PROTOTYPE_CODEX_CACHE", Path.home() / ".cache" / "prototype-codex"))

# Five model calls, the first four ending in one tool call each: the model lists the folder, lists
# its files, reads the sources and runs the tests (tool_calls.EXPLORE_COMMANDS). 50 output tokens
# a turn at 100,000 tokens/s (`sim-100000`) keep a run to seconds.
WORKLOAD = "fixed:5:2000:200:50:0"
MODEL = "sim-100000"
TASK = "Run the tests of this project and tell me whether add() in calc.py is correct."
PROJECT = {
    "calc.py": "def add(a, b):\n    return a + b\n",
    "test_calc.py": (
        "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    ),
}


class CodexUnavailable(Exception):
    """Codex cannot be installed here (no npm, or the install failed); the message says why."""


@attrs.frozen
class Transport:
    name: str  # v1, v2 or http
    supports_websockets: bool
    features: dict[str, bool] = attrs.field(factory=dict)


def transport_for(name: str, version: str) -> Transport:
    """The provider setting and feature flags that make `version` speak `name`. In 0.101.0 the
    WebSocket client is behind a feature flag per protocol; later releases dropped the flags (v2 is
    on with `supports_websockets` alone) and the v1 client with them."""
    old = version == V1_CODEX
    if name == "v1":
        if not old:
            raise ValueError(f"Codex {version} has no v1 WebSocket client; use {V1_CODEX}")
        return Transport("v1", True, {"responses_websockets": True})
    if name == "v2":
        return Transport("v2", True, {"responses_websockets_v2": True} if old else {})
    if name == "http":
        return Transport("http", False)
    raise ValueError(f"unknown transport {name!r}")


def codex_binary(version: str) -> Path:
    return CACHE / version / "node_modules" / ".bin" / "codex"


def install_codex(version: str) -> Path:
    """The `codex` binary of `version`, installed from npm into the cache on first use."""
    binary = codex_binary(version)
    if binary.exists() and _version_of(binary) == version:
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise CodexUnavailable("npm is not on PATH: install Node.js and npm to run Codex")
    prefix = CACHE / version
    prefix.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", f"@openai/codex@{version}"],
        capture_output=True, text=True, timeout=900,
    )
    if done.returncode != 0 or _version_of(binary) != version:
        raise CodexUnavailable(f"npm install @openai/codex@{version} failed: {done.stderr.strip()[-500:]}")
    return binary


def _version_of(binary: Path) -> str | None:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    match = re.search(r"(\d+\.\d+\.\d+)", out)
    return match.group(1) if match else None


def config_toml(port: int, transport: Transport) -> str:
    lines = [
        f'model = "{MODEL}"',
        'model_provider = "testbed"',
        "check_for_update_on_startup = false",
        "suppress_unstable_features_warning = true",
        "",
        "[model_providers.testbed]",
        'name = "testbed"',
        f'base_url = "http://127.0.0.1:{port}/v1"',
        'wire_api = "responses"',
        'env_key = "TESTBED_API_KEY"',
        f"supports_websockets = {str(transport.supports_websockets).lower()}",
    ]
    if transport.features:
        lines += ["", "[features]", *(f"{name} = {str(on).lower()}" for name, on in transport.features.items())]
    return "\n".join(lines) + "\n"


@attrs.frozen
class CodexRun:
    version: str
    transport: str
    returncode: int
    seconds: float  # wall time of `codex exec`
    records: list[dict[str, Any]]  # the server's, in order
    events: list[dict[str, Any]]  # Codex's `--json` stdout
    rollout: list[dict[str, Any]]  # Codex's session rollout ($CODEX_HOME/sessions/**/rollout-*.jsonl)
    stderr: str
    expected_final_text: str  # the simulated model's last text

    @property
    def final_message(self) -> str | None:
        """Codex's own record of the task's final answer (the rollout's `task_complete`)."""
        for line in reversed(self.rollout):
            payload = line.get("payload") or {}
            if payload.get("type") == "task_complete":
                return payload.get("last_agent_message")
        return None

    @property
    def commands(self) -> list[tuple[str, int | None]]:
        """(command, exit code) of every command Codex ran."""
        return [
            (e["item"].get("command"), e["item"].get("exit_code"))
            for e in self.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "command_execution"
        ]

    @property
    def function_calls(self) -> list[tuple[str, Any]]:
        """(name, parsed arguments) of every function call in Codex's rollout."""
        return [
            (line["payload"].get("name"), json.loads(line["payload"].get("arguments") or "null"))
            for line in self.rollout
            if line.get("type") == "response_item" and (line.get("payload") or {}).get("type") == "function_call"
        ]

    @property
    def tool_outputs(self) -> list[str]:
        return [
            str(line["payload"].get("output"))
            for line in self.rollout
            if line.get("type") == "response_item" and (line.get("payload") or {}).get("type") == "function_call_output"
        ]


def write_project(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in PROJECT.items():
        (folder / name).write_text(text)


def expected_final_text() -> str:
    workload = WorkloadCatalog(default_workload=WORKLOAD).resolve({})
    return "".join(ScriptedPolicy(workload).plan(len(workload.turns) - 1, (), False).words)


def run_codex(version: str, transport_name: str, workdir: Path, *, costs: str = "zero", timeout: float = 300) -> CodexRun:
    """One `codex exec` of TASK over one transport, against a fresh server (`serve --costs COSTS`);
    everything it writes (CODEX_HOME, the scratch project, the server's records) goes under
    `workdir`."""
    transport = transport_for(transport_name, version)
    binary = install_codex(version)
    home, scratch, records_path = workdir / "codex_home", workdir / "scratch", workdir / "records.jsonl"
    home.mkdir(parents=True, exist_ok=True)
    write_project(scratch)
    with server_process("--costs", costs, "--workload", WORKLOAD, "--records", str(records_path)) as (_, port):
        (home / "config.toml").write_text(config_toml(port, transport))
        env = {**os.environ, "CODEX_HOME": str(home), "TESTBED_API_KEY": "testbed", "NO_COLOR": "1"}
        env.pop("OPENAI_API_KEY", None)
        start = time.perf_counter()
        done = subprocess.run(
            [str(binary), "exec", "--skip-git-repo-check", "--sandbox", "read-only", "--json", TASK],
            cwd=scratch, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        )
        seconds = time.perf_counter() - start
        _settle(records_path)
    records = [json.loads(line) for line in records_path.read_text().splitlines()] if records_path.exists() else []
    rollouts = sorted((home / "sessions").rglob("rollout-*.jsonl"))
    rollout = [json.loads(line) for path in rollouts for line in path.read_text().splitlines() if line.strip()]
    events = []
    for line in done.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return CodexRun(version, transport_name, done.returncode, seconds, records, events, rollout, done.stderr, expected_final_text())


def _settle(path: Path, quiet: float = 0.5, limit: float = 30.0) -> None:
    """Wait until the server has written its last record: the file unchanged for `quiet` seconds.
    The server writes a response's record right after its terminal event, which Codex may read
    and exit on first; on a loaded machine the server process can be scheduled later."""
    deadline = time.monotonic() + limit
    last = None
    while time.monotonic() < deadline:
        size = path.stat().st_size if path.exists() else -1
        if size == last:
            return
        last = size
        time.sleep(quiet)


def summary(run: CodexRun) -> dict[str, Any]:
    """One row of the comparison, from the server's records."""
    records = [r for r in run.records if r.get("response_id")]
    warmups = [r for r in records if r.get("warmup")]
    turns = sum(r.get("appends", 0) + 1 for r in records if not r.get("warmup"))
    started = min(r["started_at_s"] for r in records) if records else 0.0
    ended = max(r["at_s"] for r in records) if records else 0.0
    sent = sum(r.get("request_bytes", 0) for r in records)
    return {
        "codex": run.version,
        "transport": run.transport,
        "design": ",".join(sorted({r["design"] for r in records})),
        "connections": len({r["connection"] for r in records}),
        "responses": len(records),
        "warmups": len(warmups),
        "turns": turns,
        "appends": sum(r.get("appends", 0) for r in records),
        "items_sent": sum(r.get("input_items", 0) for r in records),
        "bytes_sent": sent,
        "bytes_per_turn": round(sent / turns) if turns else 0,
        "prefilled_tokens": sum(r["usage"]["input_tokens"] - r["usage"]["input_tokens_details"]["cached_tokens"] for r in records)
        + sum(r.get("warmup_prefill_tokens", 0) for r in records),
        "task_s": round(ended - started, 3),
        "ms_per_turn": round(1000 * (ended - started) / turns, 1) if turns else 0.0,
        "server_ms_per_turn": round(sum(sum(r["phases_ms"].values()) for r in records) / turns, 1) if turns else 0.0,
        "commands_ok": sum(1 for _, code in run.commands if code == 0),
        "exit": run.returncode,
    }


PLAN = [(V1_CODEX, "v1"), (V1_CODEX, "v2"), (V1_CODEX, "http"), (CURRENT_CODEX, "v2"), (CURRENT_CODEX, "http")]


def main(argv: list[str] | None = None) -> None:
    parser = experiment_parser(__doc__)
    add_list(parser, "--versions", str, [V1_CODEX, CURRENT_CODEX], "Codex CLI releases to run (npm versions)")
    add_list(parser, "--transports", str, ["v1", "v2", "http"], "transports to run (v1 only with the v1 release)", choices=["v1", "v2", "http"])
    parser.add_argument("--costs", choices=["default", "zero"], default="default",
                        help="the server's modeled API stage costs (default: modeled, as `compare` uses; zero: real CPU work only)")
    parser.add_argument("--keep", help="keep each run's CODEX_HOME, scratch folder and records under this folder")
    args = parser.parse_args(argv)
    rows = []
    for version in args.versions:
        for name in args.transports:
            if name == "v1" and version != V1_CODEX:
                continue
            with tempfile.TemporaryDirectory(prefix="codex-run-") as tmp:
                workdir = Path(args.keep) / f"{version}-{name}" if args.keep else Path(tmp)
                rows.append(summary(run_codex(version, name, workdir, costs=args.costs)))
    report(rows, "codex_transports.csv")


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
