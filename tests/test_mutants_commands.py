"""The subcommands `serve` and `calibrate` held to exact values, in-process: serve's options, the server they
build, the configuration it prints, its access log, its stats, its SIGTERM drain and its exits (the listener
replaced by a stand-in, so no socket is opened; prototype/cli/serve.py); calibrate's figures, fits, printouts
and files on small made-up traces (prototype/cli/calibrate.py)."""

from __future__ import annotations

import argparse
import gc
import io
import json
import logging
import math
import os
import signal
import socket
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import trio

from prototype import metrics, profiles, traces
from prototype import workload as wl
from prototype.api.costs import ALL_SWITCHES_OFF, API_PROFILES, ZERO_COSTS, ApiCosts, CacheSwitches
from prototype.cli import calibrate, common, serve
from prototype.engine import fit
from prototype.server.config import ServerConfig
from prototype.traces import engine_calls
from tests.test_calibrate_engine_calls import CALLS, write_calls
from tests.test_calibrate_holdout import _stamp

# --- serve: options ----------------------------------------------------------------------------------------------


def serve_parser() -> common.Parser:
    parser = common.Parser(prog="serve")
    serve.add_arguments(parser)
    return parser


def serve_args(*argv: str) -> argparse.Namespace:
    return serve_parser().parse_args(list(argv))


def refused(parser: common.Parser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_the_serve_options_and_their_defaults():
    args = vars(serve_args())
    for name in ("engine", "vllm_model", "vllm_python"):  # cli/engine_options.py's, tested there
        args.pop(name)
    assert args == {
        "host": "127.0.0.1", "port": 8000, "store": ":memory:", "api_key": None, "workload": "coding", "seed": 0,
        "costs": "default", "api_profile": "after", "switches": "on", "flush_interval": 0.05, "flush_tokens": None,
        "suspension_ttl": None, "connection_lifetime": None, "max_connections": None, "max_message_bytes": None,
        "max_body_bytes": None, "records": None, "workers": 1, "render_cache_tokens": None, "engine_sessions": None,
        "max_records": None, "kv_ttl": None, "stats_interval": None, "drain_seconds": 30.0, "max_queued_creates": None,
        "gc_unfreeze_every": 300.0, "quiet": False, "log_format": "text",
    }


def test_each_serve_option_says_what_it_does():
    helps = {a.dest: a.help for a in serve_parser()._actions}
    assert {dest: helps[dest] for dest in helps if dest not in ("help", "engine", "vllm_model", "vllm_python")} == {
        "host": "address to bind (default 127.0.0.1)",
        "port": "port to bind; 0 picks a free one (default 8000)",
        "store": "SQLite file of the response store (default: in memory)",
        "api_key": "accept only this Bearer key (repeatable); default: any non-empty key",
        "workload": "default workload when a request names none: a preset or fixed:<turns>",
        "seed": "default workload seed",
        "costs": "modeled API stage costs (zero: real CPU work only)",
        "api_profile": "API profile: before or after the pre-WebSocket single-request speed-ups (default after)",
        "switches": "the chained cache's four optimizations (all-off: a cache hit costs a full rebuild)",
        "flush_interval": "coalesce text deltas at most this often, in seconds (default 0.05; 0: one per token)",
        "flush_tokens": "with --flush-interval: at most this many tokens per delta (default: no bound)",
        "suspension_ttl": "v1 suspension time-to-live in seconds (default 300)",
        "connection_lifetime": "WebSocket connection limit in seconds (default 3600)",
        "max_connections": "connections served at once; more get 503 (default 10000)",
        "max_message_bytes": "largest inbound WebSocket frame; larger closes 1009 (default 16 MiB)",
        "max_body_bytes": "largest HTTP request body; larger gets 413 (default 16 MiB)",
        "records": ("also append the server's client records (one per response: transport, design, chaining, appends, "
                    "bytes, usage) to this JSONL file as they are made"),
        "workers": "server processes on the one port (SO_REUSEPORT), sharing the SQLite response store (default 1)",
        "render_cache_tokens": ("tokens the http design's cross-request render cache holds, least recently used dropped "
                                "first (default 5000000)"),
        "engine_sessions": ("sessions whose engine bookkeeping is kept after their KV is gone, least recently seen "
                            "forgotten first (default 100000)"),
        "max_records": "client records kept in memory, oldest dropped first (default 10000)",
        "kv_ttl": "seconds an idle prefix-cache KV entry lives (default 300)",
        "stats_interval": ("print a 'stats {json}' line this often, in seconds: trio tasks, connections, engine and "
                           "cache sizes (default: never)"),
        "drain_seconds": "on SIGTERM: seconds responses in flight get to finish before they are failed (default 30)",
        "max_queued_creates": "response.create frames waiting per connection (default 32)",
        "gc_unfreeze_every": ("freeze the survivors of each full garbage collection and walk everything again this "
                              "often, in seconds, so a pause does not grow with the sessions held open (default 300; "
                              "0: the collector's own schedule)"),
        "quiet": "no access log: print only the address and the configuration",
        "log_format": "access log: one text line (default) or one JSON object per response",
    }
    choices = {a.dest: a.choices for a in serve_parser()._actions if a.choices and a.dest not in ("engine", "vllm_model")}
    assert choices == {"costs": ["default", "zero"], "api_profile": ["after", "before"], "switches": ["on", "all-off"],
                       "log_format": ["text", "json"]}


@pytest.mark.parametrize(("argv", "accepted"), [
    (["--port", "0"], {"port": 0}), (["--port", "65535"], {"port": 65535}), (["--seed", "0"], {"seed": 0}),
    (["--flush-interval", "0"], {"flush_interval": 0.0}), (["--flush-tokens", "1"], {"flush_tokens": 1}),
    (["--suspension-ttl", "0.5"], {"suspension_ttl": 0.5}), (["--connection-lifetime", "0.5"], {"connection_lifetime": 0.5}),
    (["--max-connections", "1"], {"max_connections": 1}), (["--max-message-bytes", "1"], {"max_message_bytes": 1}),
    (["--max-body-bytes", "1"], {"max_body_bytes": 1}), (["--workers", "1"], {"workers": 1}),
    (["--render-cache-tokens", "0"], {"render_cache_tokens": 0}), (["--engine-sessions", "1"], {"engine_sessions": 1}),
    (["--max-records", "0"], {"max_records": 0}), (["--kv-ttl", "0"], {"kv_ttl": 0.0}),
    (["--stats-interval", "0.5"], {"stats_interval": 0.5}), (["--drain-seconds", "0"], {"drain_seconds": 0.0}),
    (["--max-queued-creates", "1"], {"max_queued_creates": 1}), (["--gc-unfreeze-every", "0"], {"gc_unfreeze_every": 0.0}),
    (["--api-key", "a", "--api-key", "b"], {"api_key": ["a", "b"]}), (["--quiet"], {"quiet": True}),
    (["--records", "r.jsonl", "--store", "s.db", "--host", "::1"], {"records": "r.jsonl", "store": "s.db", "host": "::1"}),
])
def test_serve_takes_each_option_at_its_edge(argv, accepted):
    args = vars(serve_args(*argv))
    assert {name: args[name] for name in accepted} == accepted


@pytest.mark.parametrize(("argv", "says"), [
    (["--port", "-1"], "--port: must be from 0 to 65535"), (["--port", "65536"], "--port: must be from 0 to 65535"),
    (["--seed", "-1"], "--seed: must be at least 0"), (["--flush-interval", "-0.1"], "--flush-interval: must be at least 0"),
    (["--flush-tokens", "0"], "--flush-tokens: must be at least 1"), (["--suspension-ttl", "0"], "--suspension-ttl: must be greater than 0"),
    (["--connection-lifetime", "0"], "--connection-lifetime: must be greater than 0"),
    (["--max-connections", "0"], "--max-connections: must be at least 1"), (["--max-message-bytes", "0"], "--max-message-bytes: must be at least 1"),
    (["--max-body-bytes", "0"], "--max-body-bytes: must be at least 1"), (["--workers", "0"], "--workers: must be at least 1"),
    (["--render-cache-tokens", "-1"], "--render-cache-tokens: must be at least 0"), (["--engine-sessions", "0"], "--engine-sessions: must be at least 1"),
    (["--max-records", "-1"], "--max-records: must be at least 0"), (["--kv-ttl", "-1"], "--kv-ttl: must be at least 0"),
    (["--stats-interval", "0"], "--stats-interval: must be greater than 0"), (["--drain-seconds", "-1"], "--drain-seconds: must be at least 0"),
    (["--max-queued-creates", "0"], "--max-queued-creates: must be at least 1"), (["--gc-unfreeze-every", "-1"], "--gc-unfreeze-every: must be at least 0"),
    (["--seed", "1.5"], "--seed: "), (["--render-cache-tokens", "1.5"], "--render-cache-tokens: "),
    (["--max-records", "1.5"], "--max-records: "),
])
def test_serve_refuses_each_option_past_its_edge(argv, says, capsys):
    assert "argument " + says in refused(serve_parser(), argv, capsys)


# --- serve: the server the options build -------------------------------------------------------------------------


def test_the_default_options_build_the_default_server():
    server = serve.build_server(serve_args("--quiet"))
    api = server.api
    assert (api.engine.max_sessions, api.engine.kv_ttl) == (type(api.engine)().max_sessions, type(api.engine)().kv_ttl)
    assert api.render_cache.max_tokens == 5_000_000
    assert api.costs == ApiCosts() and api.sprint == API_PROFILES["after"]
    assert (api.workloads.default_workload, api.workloads.default_seed) == ("coding", 0)
    assert (api.flush_interval, api.flush_tokens) == (0.05, None)
    assert server.config == ServerConfig()
    assert type(server.records) is metrics.ClientRecords  # quiet, no file, no bound: the server's own records
    server.api.store.close()


def test_every_option_reaches_the_server_it_builds(tmp_path):
    args = serve_args(
        "--engine-sessions", "7", "--kv-ttl", "2.5", "--render-cache-tokens", "123", "--costs", "zero",
        "--store", str(tmp_path / "store.db"), "--workload", "fixed:3", "--seed", "9", "--flush-interval", "0",
        "--flush-tokens", "4", "--api-profile", "before", "--api-key", "k1", "--api-key", "k2", "--switches", "all-off",
        "--suspension-ttl", "11", "--connection-lifetime", "12", "--max-connections", "13", "--max-message-bytes", "14",
        "--max-body-bytes", "15", "--max-queued-creates", "16", "--records", str(tmp_path / "records.jsonl"),
        "--max-records", "2", "--log-format", "json",
    )
    server = serve.build_server(args, worker=3)
    api = server.api
    assert (api.engine.max_sessions, api.engine.kv_ttl, api.render_cache.max_tokens) == (7, 2.5, 123)
    assert api.costs is ZERO_COSTS and api.sprint == API_PROFILES["before"]
    assert (tmp_path / "store.db").exists()
    assert (api.workloads.default_workload, api.workloads.default_seed) == ("fixed:3", 9)
    assert (api.flush_interval, api.flush_tokens) == (0.0, 4)
    assert server.config == ServerConfig(
        api_keys=frozenset({"k1", "k2"}), switches=ALL_SWITCHES_OFF, worker=3, suspension_ttl=11.0, connection_lifetime=12.0,
        max_connections=13, max_message_bytes=14, max_body_bytes=15, max_queued_creates=16)
    records = server.records
    assert isinstance(records, serve.AccessLog)
    assert (records.out, records.fmt, records.maxlen) == (sys.stdout, "json", 2)
    records.append({"n": 1})
    records.close()
    assert (tmp_path / "records.jsonl").read_text() == '{"n": 1}\n'
    api.store.close()


def test_without_quiet_the_access_log_prints_to_stdout_and_keeps_the_default_number_of_records():
    server = serve.build_server(serve_args())
    assert isinstance(server.records, serve.AccessLog)
    assert (server.records.out, server.records.fmt, server.records.maxlen, server.records.file) == (
        sys.stdout, "text", metrics.MAX_CLIENT_RECORDS, None)
    # Options a namespace built elsewhere may lack (experiments build one by hand): quiet, default bounds.
    bare = argparse.Namespace(**{k: v for k, v in vars(serve_args()).items()
                                 if k not in ("engine_sessions", "kv_ttl", "quiet", "max_records", "log_format")})
    quiet = serve.build_server(bare)
    assert type(quiet.records) is metrics.ClientRecords
    assert quiet.api.engine.max_sessions == type(quiet.api.engine)().max_sessions
    bounded = serve.build_server(argparse.Namespace(**{**vars(bare), "max_records": 5}))
    assert isinstance(bounded.records, serve.AccessLog) and bounded.records.out is None
    assert (bounded.records.maxlen, bounded.records.fmt) == (5, "text")


def test_the_server_config_takes_only_the_limits_given():
    assert serve.server_config(serve_args()) == ServerConfig(api_keys=None, switches=CacheSwitches(), worker=None)
    assert serve.server_config(serve_args("--max-connections", "3"), worker=0) == ServerConfig(max_connections=3, worker=0)


def test_serve_describes_what_a_request_runs_and_its_limits():
    assert serve.describe(serve_args()) == [
        "  workload  coding (seed 0) unless metadata.testbed_workload / testbed_seed say otherwise",
        "  speed     by model name: *spark*burst* 4000 tok/s, *spark* 1000, sim-<N> N, any other name 65; "
        "metadata.testbed_decode_tps overrides",
        "  costs     default API stage costs, profile after, chained cache switches on; deltas every 0.05 s",
        "  TTLs      v1 suspension 300 s, WebSocket connection 3600 s, HTTP keep-alive idle 600 s",
        "  limits    10000 connections, 16777216 B per WebSocket message, 16777216 B per HTTP body, 32 queued creates per connection",
        "  auth      any non-empty Bearer key",
        "  store     :memory:",
    ]
    lines = serve.describe(serve_args("--workload", "fixed:2", "--seed", "4", "--costs", "zero", "--api-profile", "before",
                                      "--switches", "all-off", "--flush-interval", "0", "--api-key", "a", "--api-key", "b",
                                      "--suspension-ttl", "1.5", "--connection-lifetime", "60", "--max-connections", "2",
                                      "--max-message-bytes", "3", "--max-body-bytes", "4", "--max-queued-creates", "5",
                                      "--store", "x.db"))
    assert lines[0] == "  workload  fixed:2 (seed 4) unless metadata.testbed_workload / testbed_seed say otherwise"
    assert lines[2:] == [
        "  costs     zero API stage costs, profile before, chained cache switches all-off; deltas every 0 s",
        "  TTLs      v1 suspension 1.5 s, WebSocket connection 60 s, HTTP keep-alive idle 600 s",
        "  limits    2 connections, 3 B per WebSocket message, 4 B per HTTP body, 5 queued creates per connection",
        "  auth      2 configured key(s)",
        "  store     x.db",
    ]


def test_the_announcement_is_the_address_first_then_the_configuration(capsys):
    serve._announce(serve_args(), "127.0.0.1", 8123, 1)
    out = capsys.readouterr().out
    assert out == "\n".join([
        "listening on http://127.0.0.1:8123  (POST /v1/responses, WebSocket ws://127.0.0.1:8123/v1/responses)",
        *serve.describe(serve_args())]) + "\n"
    serve._announce(serve_args(), "::1", 9, 4)
    assert capsys.readouterr().out.splitlines()[0] == (
        "listening on http://::1:9  (POST /v1/responses, WebSocket ws://::1:9/v1/responses)  [4 workers]")
    serve._announce(serve_args(), "h", 9, 2)
    assert capsys.readouterr().out.splitlines()[0].endswith("/v1/responses)  [2 workers]")


# --- serve: the access log ---------------------------------------------------------------------------------------


@pytest.fixture
def fixed_time(monkeypatch):
    monkeypatch.setattr(serve.time, "strftime", lambda fmt: f"<{fmt}>")


def test_an_access_line_names_the_response_its_turns_status_and_time(fixed_time):
    record = {"started_at_s": 10.0, "at_s": 10.25, "transport": "websocket", "design": "suspended",
              "response_id": "resp_1", "appends": 2, "outcome": "completed", "model": "gpt-x"}
    assert serve.access_line(record) == "<%H:%M:%S> websocket suspended resp_1 turns=3 completed 250.0 ms model=gpt-x"
    assert json.loads(serve.access_line(record, "json")) == {
        "time": "<%H:%M:%S>", "transport": "websocket", "design": "suspended", "response_id": "resp_1", "turns": 3,
        "status": "completed", "ms": 250.0, "model": "gpt-x"}
    # One turn without appends; a refused frame has no response, no start and no model.
    assert serve.access_line({**record, "appends": 0, "at_s": 10.00004}) == (
        "<%H:%M:%S> websocket suspended resp_1 turns=1 completed 0.0 ms model=gpt-x")
    assert json.loads(serve.access_line({**record, "at_s": 10.01234}, "json"))["ms"] == 12.3
    assert serve.access_line({"at_s": 3.0, "transport": "http", "design": "http", "outcome": "refused"}) == (
        "<%H:%M:%S> http http - turns=0 refused - model=-")
    assert json.loads(serve.access_line({"at_s": 3.0, "started_at_s": 1.0, "response_id": "r", "outcome": "failed"}, "json")) == {
        "time": "<%H:%M:%S>", "transport": None, "design": None, "response_id": "r", "turns": 1, "status": "failed",
        "ms": 2000.0, "model": None}


def test_the_access_log_prints_a_line_per_record_and_survives_a_closed_stdout(fixed_time, tmp_path):
    out = io.StringIO()
    log = serve.AccessLog(str(tmp_path / "r.jsonl"), out, "json", maxlen=2)
    record = {"at_s": 1.0, "transport": "http", "design": "http", "outcome": "completed"}
    for _ in range(3):
        log.append(record)
    assert len(log) == 2
    assert out.getvalue() == (serve.access_line(record, "json") + "\n") * 3
    out.close()
    log.append(record)  # ValueError: I/O operation on closed file, swallowed
    log.close()
    assert (tmp_path / "r.jsonl").read_text() == (json.dumps(record) + "\n") * 4

    class Broken(io.StringIO):
        def write(self, text):
            raise OSError("broken pipe")

    broken = serve.AccessLog(None, Broken())
    broken.append(record)
    assert list(broken) == [record] and broken.fmt == "text" and broken.maxlen == metrics.MAX_CLIENT_RECORDS

    class Flushed(io.StringIO):
        flushed = 0

        def flush(self):
            self.flushed += 1

    flushed = Flushed()
    serve.AccessLog(None, flushed).append(record)
    assert flushed.flushed == 1 and flushed.getvalue() == serve.access_line(record) + "\n"
    silent = serve.AccessLog(None, None)
    silent.append(record)
    assert list(silent) == [record]


def test_an_error_names_the_command(capsys):
    serve._error("the reason")
    assert capsys.readouterr().err == "python -m prototype serve: error: the reason\n"


# --- serve: stats, SIGTERM, the collector, the warm-up -----------------------------------------------------------


async def test_count_tasks_counts_every_live_task_the_root_included():
    before = serve.count_tasks()
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as inner:
            for _ in range(2):
                inner.start_soon(trio.sleep_forever)
            outer.start_soon(trio.sleep_forever)
            await trio.testing.wait_all_tasks_blocked()
            assert serve.count_tasks() == before + 3
            inner.cancel_scope.cancel()
        outer.cancel_scope.cancel()


def test_a_bare_run_has_three_tasks_the_root_included():
    async def main(children):
        async with trio.open_nursery() as nursery:
            for _ in range(children):
                nursery.start_soon(trio.sleep_forever)
            await trio.testing.wait_all_tasks_blocked()
            count = serve.count_tasks()
            nursery.cancel_scope.cancel()
        return count

    # trio's init task (the root), its run_sync_soon task, and main.
    assert trio.run(main, 0) == 3
    assert trio.run(main, 2) == 5


class Flushed(io.StringIO):
    flushes = 0

    def flush(self):
        self.flushes += 1


def test_every_line_serve_prints_is_flushed_at_once(monkeypatch):
    """A script or a test reads serve's stdout through a pipe, which Python buffers by the block."""
    out = Flushed()
    monkeypatch.setattr(sys, "stdout", out)
    serve._announce(serve_args(), "h", 1, 1)
    assert out.flushes == 1


async def test_stats_say_what_the_server_holds(monkeypatch):
    server = serve.build_server(serve_args("--quiet"))
    server.connections = 2
    server.sessions.update({object(), object(), object()})
    server.api.render_cache.tokens = 17
    monkeypatch.setattr(serve, "count_tasks", lambda: 5)
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 6)
    engine = server.api.engine
    engine._ranks.update({"a": 1})
    assert serve.stats(server) == {"tasks": 5, "connections": 2, "sessions": 3, "kv_entries": len(engine.kv),
                                   "engine_sessions": 1, "render_cache_tokens": 17, "gc_frozen_objects": 6}
    server.api.store.close()


async def test_stats_are_printed_every_interval(autojump_clock, monkeypatch, capsys):
    monkeypatch.setattr(serve, "stats", lambda server: {"at": trio.current_time(), "of": server})
    flushed = Flushed()
    monkeypatch.setattr(sys, "stdout", flushed)
    with trio.move_on_after(5.5):
        await serve.print_stats("the server", 2.0)
    assert flushed.getvalue() == 'stats {"at": 2.0, "of": "the server"}\nstats {"at": 4.0, "of": "the server"}\n'
    assert flushed.flushes == 2


async def test_sigterm_drains_the_server_then_stops_it(monkeypatch):
    server = serve.build_server(serve_args("--quiet"))
    server.sessions.add(object())
    drained = []

    async def drain(server_, grace):
        drained.append((server_, grace))

    monkeypatch.setattr(serve, "drain", drain)
    out = Flushed()
    monkeypatch.setattr(sys, "stdout", out)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve.drain_on_sigterm, server, 2.5, nursery.cancel_scope)
        nursery.start_soon(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        assert out.getvalue() == ""
        os.kill(os.getpid(), signal.SIGTERM)
    assert drained == [(server, 2.5)]
    assert out.getvalue() == "SIGTERM: draining (1 WebSocket connections, 0 HTTP responses in flight)\ndrained\n"
    assert out.flushes == 2
    server.api.store.close()


def test_the_collector_freezes_the_startup_objects_and_installs_the_policy(monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(serve.FullCollectionPolicy, "install", lambda self: calls.append(("install", self.unfreeze_every)))
    serve._settle_collector(serve_args("--gc-unfreeze-every", "7"))
    assert calls == ["collect", "freeze", ("install", 7.0)]
    calls.clear()
    serve._settle_collector(serve_args("--gc-unfreeze-every", "0.5"))
    assert calls == ["collect", "freeze", ("install", 0.5)]
    calls.clear()
    serve._settle_collector(serve_args("--gc-unfreeze-every", "0"))
    assert calls == ["collect", "freeze"]


def test_the_warm_up_runs_one_short_rollout_of_each_design(monkeypatch):
    from prototype import benchmark

    runs = []
    monkeypatch.setattr(benchmark, "run_design_virtual", lambda design, tps, config: runs.append((design, tps, config)))
    serve._warm_up()
    assert [(design, tps) for design, tps, _ in runs] == [(design, 1000.0) for design in benchmark.ALL_DESIGNS]
    for _, _, config in runs:
        (task,) = config.task_list
        assert task == wl.fixed(2, initial_prompt_tokens=200, appended_tokens=20, output_tokens=10, tool_seconds=0.1)


def test_a_reuse_port_socket_is_bound_with_both_reuse_options():
    sock = serve._reuse_port_socket("127.0.0.1", 0)
    try:
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0
    finally:
        sock.close()


# --- serve: run ----------------------------------------------------------------------------------------------------


def test_a_bad_workload_is_refused_before_anything_starts(capsys, monkeypatch):
    monkeypatch.setattr(serve, "build_server", lambda args: pytest.fail("a server was built"))
    assert serve.run(serve_args("--workload", "nonsense")) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m prototype serve: error: --workload: ") and "nonsense" in err


def test_the_real_engine_is_refused_with_several_workers(capsys, monkeypatch):
    monkeypatch.setattr(serve, "run_workers", lambda args: pytest.fail("forked"))
    assert serve.run(serve_args("--workers", "2", "--engine", "vllm")) == 2
    assert capsys.readouterr().err == (
        "python -m prototype serve: error: --engine vllm serves from one process: one engine, one server (use --workers 1)\n")


def test_several_workers_are_forked_and_a_port_taken_is_named(capsys, monkeypatch):
    monkeypatch.setattr(serve, "run_workers", lambda args: 7 if args.workers == 2 else 0)
    monkeypatch.setattr(serve, "run_until_interrupted", lambda main: pytest.fail("served from this process"))
    assert serve.run(serve_args("--workers", "2")) == 7

    def taken(args):
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(serve, "run_workers", taken)
    assert serve.run(serve_args("--workers", "2", "--port", "80")) == 1
    assert capsys.readouterr().err == "python -m prototype serve: error: cannot listen on 127.0.0.1:80: Address already in use\n"

    def no_strerror(args):
        raise OSError("no such address")

    monkeypatch.setattr(serve, "run_workers", no_strerror)
    assert serve.run(serve_args("--workers", "3")) == 1
    assert capsys.readouterr().err == "python -m prototype serve: error: cannot listen on 127.0.0.1:8000: no such address\n"


def test_a_store_or_records_file_that_cannot_be_opened_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(serve, "run_until_interrupted", lambda main: pytest.fail("served"))
    store = tmp_path / "missing" / "store.db"
    assert serve.run(serve_args("--store", str(store))) == 2
    assert capsys.readouterr().err == f"python -m prototype serve: error: --store {store}: unable to open database file\n"
    records = tmp_path / "missing" / "records.jsonl"
    assert serve.run(serve_args("--records", str(records))) == 2
    assert capsys.readouterr().err == (
        f"python -m prototype serve: error: [Errno 2] No such file or directory: '{records}'\n")


class StandIn:
    """What serve_responses gives back: listeners whose socket names an address."""

    def __init__(self, address):
        self.socket = self
        self.address = address

    def getsockname(self):
        return self.address


@pytest.fixture
def serving(monkeypatch):
    """serve.run with its listener replaced: `served` records what it was asked to listen on; `then` is what the
    stand-in does once it has started (by default, Ctrl-C)."""
    state = {"served": [], "then": KeyboardInterrupt, "settled": [], "logging": [], "drains": [], "stats": []}

    async def serve_responses(server, port, *, host, task_status):
        state["served"].append((server, port, host))
        task_status.started([StandIn(("10.0.0.1", 4321, 0, 0))])
        await trio.testing.wait_all_tasks_blocked()
        siblings = trio.lowlevel.current_task().parent_nursery.child_tasks
        state["tasks"] = sorted(task.name.rsplit(".", 1)[-1] for task in siblings)
        raise state["then"]()

    monkeypatch.setattr(serve, "serve_responses", serve_responses)
    monkeypatch.setattr(serve, "run_workers", lambda args: pytest.fail("one worker is served from this process, not forked"))
    monkeypatch.setattr(serve, "_settle_collector", state["settled"].append)
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: state["logging"].append(kwargs))

    async def drain_on_sigterm(server, grace, scope):
        state["drains"].append((server, grace, type(scope)))
        await trio.sleep_forever()

    async def print_stats(server, interval):
        state["stats"].append((server, interval))
        await trio.sleep_forever()

    monkeypatch.setattr(serve, "drain_on_sigterm", drain_on_sigterm)
    monkeypatch.setattr(serve, "print_stats", print_stats)
    # Started with SIGINT ignored (a background job of a non-interactive shell): serve takes it back.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield state
    signal.signal(signal.SIGINT, previous)


def test_serve_listens_announces_and_stops_on_ctrl_c(serving, monkeypatch):
    capsys = Flushed()
    monkeypatch.setattr(sys, "stdout", capsys)
    args = serve_args("--port", "0", "--host", "0.0.0.0", "--quiet", "--drain-seconds", "4")
    assert serve.run(args) == 0
    assert capsys.flushes == 2  # the announcement, then "stopped"
    assert serving["logging"] == [{"level": logging.WARNING, "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}]
    assert serving["settled"] == [args]
    (server, port, host), = serving["served"]
    assert (port, host) == (0, "0.0.0.0")
    assert serving["drains"] == [(server, 4.0, trio.CancelScope)] and serving["stats"] == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    out = capsys.getvalue()
    assert out.splitlines()[0] == (
        "listening on http://10.0.0.1:4321  (POST /v1/responses, WebSocket ws://10.0.0.1:4321/v1/responses)")
    assert out.endswith("  store     :memory:\nstopped\n")
    # Beside the listener, the SIGTERM drain; no stats printer.
    assert serving["tasks"] == ["drain_on_sigterm", "serve_responses"]
    with pytest.raises(Exception, match="closed database"):
        server.api.store._db.execute("select 1")


def test_serve_prints_stats_when_asked(serving, capsys):
    assert serve.run(serve_args("--quiet", "--stats-interval", "30")) == 0
    assert serving["stats"] == [(serving["served"][0][0], 30.0)]
    assert serving["tasks"] == ["drain_on_sigterm", "print_stats", "serve_responses"]


def test_serve_closes_its_records_file_when_it_stops(serving, tmp_path, monkeypatch):
    closed = []
    monkeypatch.setattr(serve.AccessLog, "close", lambda self: closed.append(self))
    assert serve.run(serve_args("--records", str(tmp_path / "r.jsonl"))) == 0
    assert len(closed) == 1 and closed[0] is serving["served"][0][0].records


def test_serve_names_the_address_it_cannot_listen_on(serving, capsys):
    serving["then"] = lambda: OSError(98, "Address already in use")
    assert serve.run(serve_args("--port", "81", "--quiet")) == 1
    assert capsys.readouterr().err == "python -m prototype serve: error: cannot listen on 127.0.0.1:81: Address already in use\n"
    serving["then"] = lambda: OSError("bad address")
    assert serve.run(serve_args("--quiet")) == 1
    assert capsys.readouterr().err == "python -m prototype serve: error: cannot listen on 127.0.0.1:8000: bad address\n"


def test_serve_on_a_real_engine_that_cannot_start_says_why(serving, capsys, monkeypatch):
    from prototype.engine.vllm_client import VllmUnavailable

    def unavailable(spec, python):
        raise VllmUnavailable("no vLLM here")

    monkeypatch.setattr(serve, "open_vllm_engine", unavailable)
    assert serve.run(serve_args("--quiet", "--engine", "vllm")) == 2
    captured = capsys.readouterr()
    assert captured.out == "starting vLLM (tiny-llama-cpu); this takes minutes on a CPU\n"
    assert captured.err == "python -m prototype serve: error: --engine vllm: no vLLM here\n"
    assert serving["served"] == []


# --- calibrate: options -------------------------------------------------------------------------------------------


def calibrate_parser() -> common.Parser:
    parser = common.Parser(prog="calibrate")
    calibrate.add_arguments(parser)
    return parser


def test_the_calibrate_options_their_defaults_and_what_they_do(capsys):
    parser = calibrate_parser()
    assert vars(parser.parse_args(["t.jsonl"])) == {
        "trace": "t.jsonl", "baseline": "coding", "baseline_tasks": 300, "seed": 0, "preset_out": None, "latency_out": None,
        "holdout": 0.3}
    assert {a.dest: a.help for a in parser._actions if a.dest != "help"} == {
        "trace": ("a trace file (testbed JSONL, TraceLab JSONL or CSV, Codex rollout), a folder of Codex rollouts, or a real "
                  "engine's calls (experiments.real_engine's real_engine_calls.csv)"),
        "baseline": "preset (name or JSON file) to print beside the trace (default coding)",
        "baseline_tasks": "generated tasks for the baseline's figures (default 300)",
        "seed": "seed of the baseline's generated tasks (default 0)",
        "preset_out": "write the fitted workload preset (JSON) here",
        "latency_out": "write the fitted latency profile (JSON) here; one per provider and model",
        "holdout": "share of each group's timed rounds, the last in time, held out to score the fit (default 0.3)",
    }
    args = parser.parse_args(["t", "--baseline-tasks", "1", "--seed", "0", "--holdout", "0.5", "--baseline", "chat",
                              "--preset-out", "p.json", "--latency-out", "l.json"])
    assert (args.baseline_tasks, args.seed, args.holdout, args.baseline, args.preset_out, args.latency_out) == (
        1, 0, 0.5, "chat", "p.json", "l.json")
    assert "argument --baseline-tasks: must be at least 1" in refused(parser, ["t", "--baseline-tasks", "0"], capsys)
    assert "argument --seed: must be at least 0" in refused(parser, ["t", "--seed", "-1"], capsys)


# --- calibrate: the figures of a trace and the preset fitted to it -------------------------------------------------


def rnd(task, turn, cached, uncached, output, *, reasoning=0, tools=(), start=None, seconds=None, group=""):
    return traces.Round("s", 1, cached + uncached, cached, output, reasoning, tools, task=task, turn=turn,
                        started_at=start, ended_at=None if start is None else start + seconds, group=group)


def task_of(name, appended, tools=((1.0,), ()), hosted=(0, 0), prefix_tokens=0):
    turns = tuple(wl.TurnSpec(appended_tokens=a, output_tokens=10, tool_seconds=t, hosted_calls=((5.0, 10),) * h)
                  for a, t, h in zip(appended, tools, hosted, strict=True))
    return wl.Workload(name=name, seed=0, turns=turns, prefix_tokens=prefix_tokens)


ROUNDS = (
    rnd("a", 0, 0, 1000, 100, reasoning=50, tools=(30.0, 90.0), start=0.0, seconds=2.0),
    rnd("a", 1, 1100, 200, 40, reasoning=0, start=10.0, seconds=0.0),
    rnd("b", 0, 500, 300, 60, reasoning=30, tools=(0.0,), start=None),
    rnd("b", 1, 800, 0, 0, start=20.0, seconds=4.0),
)


def test_the_figures_of_a_trace_count_each_quantity_over_the_rounds_it_belongs_to():
    tasks = [task_of("a", (1000, 200)), task_of("b", (300, 50, 70), tools=((1.0, 2.0), (0.5,), ()), hosted=(1, 0, 0))]
    figures = calibrate.figures(tasks, ROUNDS)
    d = fit.distribution
    assert figures == {
        "turns per task": d([2, 3]),
        "prefix (cached) tokens per round": d([0, 1100, 500, 800]),
        "appended (uncached) tokens per round": d([200, 0]),
        "output tokens per round": d([100, 40, 60, 0]),
        "reasoning tokens per round": d([50, 0, 30, 0]),
        "seconds per client tool call": d([30.0, 90.0, 0.0]),
        "model seconds per round": d([2.0, 0.0, 4.0]),
        "output tokens/s per round": d([50.0, 0.0]),
        "calls_over_share": 1 / 3, "time_over_share": 90 / 120,
        "prefix_hit_rate": 2400 / 3900,
        "first_prompt_tokens": d([1000, 300]),
    }
    assert math.isnan(calibrate.figures(tasks, [rnd("a", 0, 0, 0, 5)])["prefix_hit_rate"])


def test_the_fitted_preset_reproduces_the_traces_distributions():
    tasks = [task_of("a", (1000, 200), prefix_tokens=800),
             task_of("b", (300, 50, 70), tools=((1.0, 2.0), (0.5,), ()), hosted=(1, 0, 0), prefix_tokens=100),
             task_of("c", (2000, 10), prefix_tokens=900)]
    rounds = ROUNDS + (rnd("c", 1, 2000, 40_000, 12_000, reasoning=6000, tools=(700.0,)),)
    params = calibrate.fitted_preset(tasks, rounds)
    appended = [200, 40_000]
    tools = [30.0, 90.0, 700.0]
    expected = wl.WorkloadParams(
        turns_median=fit.lognormal([2, 3, 2])[0], turns_sigma=fit.lognormal([2, 3, 2])[1], turns_max=300,
        initial_prompt_tokens=1000, appended_median=fit.lognormal(appended)[0], appended_sigma=fit.lognormal(appended)[1],
        appended_max=40_000, appended_min=50, output_median=fit.lognormal([100, 40, 60, 1, 12_000])[0],
        output_sigma=fit.lognormal([100, 40, 60, 1, 12_000])[1], output_max=12_000,
        parallel_calls_p=1 / 4, hosted_call_p=1 / 4, tool_mixture=fit.lognormal_mixture(tools), tool_cap_seconds=700.0,
        reasoning_share=calibrate.reasoning_share(rounds), shared_prefix_tokens=800)
    assert params == expected
    # Without later rounds, tools or non-final turns: the floors and the generator's own tool times.
    lone = [task_of("z", (40,), tools=((),), hosted=(0,), prefix_tokens=30)]
    params = calibrate.fitted_preset(lone, [rnd("z", 0, 0, 40, 20_000)])
    default = wl.WorkloadParams()
    assert (params.turns_max, params.appended_max, params.appended_min, params.appended_median, params.output_max) == (
        300, 32000, 1, 1.0, 20_000)
    assert (params.parallel_calls_p, params.hosted_call_p, params.initial_prompt_tokens, params.shared_prefix_tokens) == (
        0.0, 0.0, 40, 30)
    assert (params.tool_mixture, params.tool_cap_seconds) == (default.tool_mixture, default.tool_cap_seconds)
    many = [task_of("m", (10,) * 400, tools=((1.0,),) * 399 + ((),), hosted=(0,) * 400)]
    params = calibrate.fitted_preset(many, [rnd("m", 1, 0, 5, 1, tools=(0.5, 0.0))])
    assert (params.turns_max, params.output_max, params.tool_cap_seconds) == (400, 10000, 600.0)
    assert params.tool_mixture == fit.lognormal_mixture([0.5])
    # A later round of one uncached token counts; tool calls of no time are left out (no log of 0).
    params = calibrate.fitted_preset(lone, [rnd("z", 0, 0, 40, 5), rnd("z", 1, 40, 1, 5, tools=(0.0,)), rnd("z", 2, 50, 100, 5)])
    assert (params.appended_median, params.appended_min) == (fit.lognormal([1, 100])[0], 1)
    assert params.tool_mixture == default.tool_mixture


def test_the_reasoning_share_spans_the_traces_per_round_share():
    assert calibrate.reasoning_share([rnd("a", 0, 0, 1, 10, reasoning=0), rnd("a", 1, 0, 1, 0)]) == (0.0, 0.0)
    assert calibrate.reasoning_share([]) == (0.0, 0.0)
    shares = [0.2, 0.4, 0.6]
    rounds = [rnd("a", i, 0, 1, 100, reasoning=round(100 * s)) for i, s in enumerate(shares)] + [rnd("a", 3, 0, 1, 0)]
    half = math.sqrt(3) * float(np.std(shares))
    assert calibrate.reasoning_share(rounds) == (round(0.4 - half, 4), round(0.4 + half, 4))
    # Clipped to [0, 0.99].
    assert calibrate.reasoning_share([rnd("a", 0, 0, 1, 10, reasoning=10), rnd("a", 1, 0, 1, 10, reasoning=0)]) == (0.0, 0.99)
    assert calibrate.reasoning_share([rnd("a", 0, 0, 1, 10, reasoning=10)] * 2) == (0.99, 0.99)
    assert calibrate.reasoning_share([rnd("a", 0, 0, 1, 1, reasoning=1), rnd("a", 1, 0, 1, 10)]) == (0.0, 0.99)


def test_a_number_is_printed_with_three_figures_or_thousands_separators():
    assert [calibrate._fmt(v) for v in (math.nan, 0.0, 0.012345, 99.94, 100.0, -100.0, 1234.5, -0.5)] == [
        "-", "0", "0.0123", "99.9", "100", "-100", "1,234", "-0.5"]


def test_the_figures_print_as_a_table_beside_the_baseline(capsys):
    stats = {"n": 4.0, "p10": 1.0, "p50": 2.5, "p90": 1500.0, "p99": math.nan, "mean": 0.25}
    base = {"n": 9.0, "p10": 0.0, "p50": 7.0, "p90": 8.0, "p99": 9.0, "mean": 1.0}
    calibrate.print_figures(
        {"turns per task": stats, "calls_over_share": 0.25, "time_over_share": 0.5, "prefix_hit_rate": 0.875, "last": stats},
        {"turns per task": base, "calls_over_share": 0.04, "time_over_share": 0.85, "prefix_hit_rate": 0.9, "last": base},
        "coding")
    header = (f"{'quantity':<38} {'n':>7} {'p10':>9} {'p50':>9} {'p90':>9} {'p99':>9} {'mean':>9}   "
              f"{'coding p50':>12} {'coding p90':>12}")
    assert capsys.readouterr().out.split("\n") == [
        header, "-" * len(header),
        f"{'turns per task':<38} {4:>7} {'1':>9} {'2.5':>9} {'1,500':>9} {'-':>9} {'0.25':>9}   {'7':>12} {'8':>12}",
        f"{'last':<38} {4:>7} {'1':>9} {'2.5':>9} {'1,500':>9} {'-':>9} {'0.25':>9}   {'7':>12} {'8':>12}",
        "",
        f"{'tool calls over 60 s':<38}   25.0% of calls, 50.0% of tool time   (coding: 4.0%, 85.0%)",
        f"{'prefix hit rate, token-weighted':<38}   87.5%   (coding, perfect cache: 90.0%)",
        "",
    ]


FIT = fit.RoundTimeFit(fixed_s=0.25, prefill_tokens_per_s=12_345.0, decode_tokens_per_s=55.5, stderr=(0.5, 2e-6, 3e-4),
                       rmse_s=0.5, r2=0.98765, residual_quantiles=(-0.5, 0.25, 1.5), n=12)


def test_a_round_time_fit_prints_beside_the_testbeds_terms(capsys):
    calibrate.print_fit(FIT, "codex/gpt-5.4")
    assert capsys.readouterr().out.split("\n") == [
        "",
        "Fit of model seconds per round (codex/gpt-5.4, 12 timed rounds): seconds = fixed + uncached / prefill + output / decode",
        "  fixed              250.0 ms  (+/- 500.0)   testbed: engine 10 ms + API pre 250 ms + post 60 ms per http turn",
        "  prefill rate      12,345 tokens/s (s/token +/- 2e-06)   testbed: 15000",
        "  decode rate         55.5 tokens/s (s/token +/- 0.0003)   testbed: 65 / 1000 / 4000",
        "  residuals      rmse 500.0 ms, r2 0.988, p10/p50/p90 -500.0 / 250.0 / 1500.0 ms",
        "",
    ]
    calibrate.print_fit(FIT)
    assert capsys.readouterr().out.split("\n")[1].startswith("Fit of model seconds per round (12 timed rounds): ")


def test_a_latency_profile_from_a_fit_takes_its_terms_and_stands_in_for_an_absent_one():
    model = calibrate.latency_model(FIT)
    assert (model.decode_tokens_per_s, model.prefill_tokens_per_s, model.cache_attention, model.request_overhead) == (
        55.5, 12_345.0, None, 0.25)
    infinite = calibrate.latency_model(attrs.evolve(FIT, prefill_tokens_per_s=math.inf, decode_tokens_per_s=math.inf))
    assert (infinite.decode_tokens_per_s, infinite.prefill_tokens_per_s) == (1e6, 1e9)
    engine = calibrate.engine_latency_model(fit.EngineTimingFit(FIT, 77.0))
    assert (engine.decode_tokens_per_s, engine.prefill_tokens_per_s, engine.cache_attention, engine.request_overhead) == (
        77.0, 12_345.0, None, 0.25)
    engine = calibrate.engine_latency_model(fit.EngineTimingFit(attrs.evolve(FIT, prefill_tokens_per_s=math.inf), 77.0))
    assert engine.prefill_tokens_per_s == 1e9


def test_a_groups_file_takes_the_group_in_its_name():
    assert calibrate.group_path("out/profile.json", "codex/gpt-5.4") == Path("out/profile.codex-gpt-5.4.json")
    assert calibrate.group_path("p.json", "//") == Path("p.group.json")
    assert calibrate.group_path("p.json", "a b__c") == Path("p.a-b__c.json")
    assert calibrate.group_path("p.json", "X/Codex GPT-5") == Path("p.X-Codex-GPT-5.json")


def test_timed_rounds_are_grouped_by_provider_and_model_in_time_order():
    late, early, other = (rnd("a", 0, 0, 1, 1, start=5.0, seconds=1.0, group="x/y"),
                          rnd("a", 1, 0, 1, 1, start=1.0, seconds=1.0, group="x/y"), rnd("b", 0, 0, 1, 1, start=3.0, seconds=1.0))
    groups = calibrate.timed_groups([late, other, early])
    assert groups == {"x/y": [early, late], "all rounds": [other]}
    assert list(groups) == ["x/y", "all rounds"]


def test_a_group_is_scored_on_its_last_rounds_by_a_fit_on_its_first():
    rounds = [rnd("a", i, 0, u, o, start=float(i), seconds=0.5 + u / 1000 + o / 50)
              for i, (u, o) in enumerate([(100, 10), (500, 40), (900, 20), (300, 80), (700, 30)])]
    assert calibrate.held_out_score("g", rounds[:3], 0.3) is None
    score = calibrate.held_out_score("g", rounds, 0.4)
    assert (score.group, score.held_out, score.fitted.n) == ("g", 2, 3)
    assert score.fitted == calibrate.fit_rounds(rounds[:3])
    predicted = [float(score.fitted.predict(r.uncached_tokens, r.output_tokens)) for r in rounds[3:]]
    assert score.errors == fit.percentage_errors(predicted, [r.model_seconds for r in rounds[3:]])


def test_held_out_scores_print_per_group(capsys):
    score = calibrate.GroupScore("codex/gpt-5.4", FIT, 4, {"median": 1.234, "p90": 150.0, "zero": 0})
    calibrate.print_score(score)
    calibrate.print_score(attrs.evolve(score, errors={"median": 1.0, "p90": 2.0, "zero": 2}))
    calibrate.print_scores([score, attrs.evolve(score, group="all rounds", held_out=1)])
    assert capsys.readouterr().out.split("\n") == [
        "  held out       fitted on the first 12 rounds, scored on the last 4: absolute error per round median 1.23%, p90 150%",
        "  held out       fitted on the first 12 rounds, scored on the last 4: absolute error per round median 1%, p90 2% "
        "(2 round(s) of 0 s left out)",
        "",
        f"{'held-out error per round':<40} {'fitted':>7} {'scored':>7} {'median':>8} {'p90':>8}",
        f"  {'codex/gpt-5.4':<38} {12:>7} {4:>7} {'1.23':>7}% {'150':>7}%",
        f"  {'all rounds':<38} {12:>7} {1:>7} {'1.23':>7}% {'150':>7}%",
        "",
    ]


# --- calibrate: the command ----------------------------------------------------------------------------------------


def tracelab(path, groups, *, timed=True):
    """One session per (provider, model, rounds) group; round k appends 100 * (k + 1) tokens, outputs 10 * (k + 2) and
    takes 0.5 s + 1 ms per appended token + 20 ms per output token, rounds 100 s apart."""
    rows, clock = [], 0.0
    for provider, model, n in groups:
        prefix = 0
        for k in range(n):
            appended, output = 100 * (k + 1) + 37 * (k % 2), 10 * (k + 2)
            seconds = 0.5 + appended / 1000 + output / 50
            row = {"session_id": f"{provider}-{model}", "round_index": k, "provider": provider, "model": model,
                   "prefix_tokens": prefix, "newly_append_tokens": appended, "output_tokens": output,
                   "first_input_event_type": "user_message" if k == 0 else "tool_result",
                   "tools": [] if k == n - 1 else [{"tool_name": "Bash", "tool_wall_latency_ms": 1000}]}
            if timed:
                row["timing_events"] = [
                    {"event_type": "user_message" if k == 0 else "tool_result", "timestamp": _stamp(clock)},
                    {"event_type": "text", "timestamp": _stamp(clock + seconds)}]
            rows.append(row)
            prefix += appended + output
            clock += 100.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_calibrate(capsys, *argv):
    args = calibrate_parser().parse_args([str(a) for a in argv])
    status = calibrate.run(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_calibrate_prints_the_trace_beside_the_baseline_and_fits_one_group(tmp_path, capsys):
    path = tracelab(tmp_path / "t.jsonl", [("codex", "gpt-5.4", 5)])
    preset, latency_file = tmp_path / "preset.json", tmp_path / "latency.json"
    status, out, err = run_calibrate(capsys, path, "--baseline-tasks", 3, "--seed", 2, "--preset-out", preset,
                                     "--latency-out", latency_file, "--holdout", 0.25)
    assert (status, err) == (0, "")
    trace = traces.load(str(path))
    timed = [r for r in trace.rounds if r.model_seconds is not None]
    lines = out.split("\n")
    assert lines[:2] == [f"{path}: tracelab-jsonl, 1 tasks, 5 rounds, 5 timed", "beside: 3 generated 'coding' tasks, seed 2"]
    assert lines[2] == "" and lines[3].startswith("quantity ")
    base_tasks = wl.generate("coding", seed=2, n_tasks=3)
    calibrate.print_figures(calibrate.figures(trace.tasks, trace.rounds),
                            calibrate.figures(base_tasks, traces.rounds_from_workloads(base_tasks)), "coding")
    calibrate.print_fit(calibrate.fit_rounds(timed))
    calibrate.print_score(calibrate.held_out_score("all rounds", timed, 0.25))
    expected = capsys.readouterr().out
    assert "\n".join(lines[3:]).startswith(expected)
    rest = "\n".join(lines[3:])[len(expected):]
    assert rest == (f"\nwrote workload preset {preset}\n"
                    f"wrote latency profile {latency_file}\n")
    assert "providers and models" not in out
    assert profiles.load_preset(preset) == calibrate.fitted_preset(trace.tasks, trace.rounds)
    assert profiles.load_latency(latency_file) == calibrate.latency_model(calibrate.fit_rounds(timed))
    assert json.loads(latency_file.read_text())["source"] == (
        f"python -m prototype calibrate {path} (codex/gpt-5.4: 5 rounds, rmse "
        f"{calibrate.fit_rounds(timed).rmse_s * 1000:.1f} ms)")
    assert json.loads(preset.read_text())["source"] == f"python -m prototype calibrate {path}"


def test_calibrate_fits_each_group_on_its_own_and_writes_a_profile_each(tmp_path, capsys):
    path = tracelab(tmp_path / "t.jsonl", [("claude", "sonnet", 4), ("codex", "gpt", 3), ("codex", "mini", 2)])
    status, out, err = run_calibrate(capsys, path, "--baseline-tasks", 2, "--latency-out", tmp_path / "p.json")
    assert (status, err) == (0, "")
    assert ("\n3 providers and models in the trace: each is fitted on its own rounds "
            "(claude/sonnet: 4, codex/gpt: 3, codex/mini: 2)\n") in out
    assert "Fit of model seconds per round (claude/sonnet, 4 timed rounds)" in out
    assert "Fit of model seconds per round (codex/gpt, 3 timed rounds)" in out
    assert "\nno fit for codex/mini: 2 timed round(s), fewer than 3\n" in out
    assert out.count("  held out ") == 1  # three rounds are fitted but not scored
    assert "held-out error per round" not in out  # one score: no table
    assert out.endswith(f"wrote latency profile {tmp_path / 'p.claude-sonnet.json'} (claude/sonnet)\n"
                        f"wrote latency profile {tmp_path / 'p.codex-gpt.json'} (codex/gpt)\n")
    assert not (tmp_path / "p.json").exists()
    status, out, _ = run_calibrate(capsys, tracelab(tmp_path / "u.jsonl", [("a", "b", 4), ("c", "d", 4)]), "--baseline-tasks", 2)
    assert status == 0 and "\nheld-out error per round" in out and out.count("  held out ") == 2


def test_calibrate_without_timed_rounds_fits_nothing_and_refuses_a_latency_profile(tmp_path, capsys):
    path = tracelab(tmp_path / "t.jsonl", [("codex", "gpt", 3)], timed=False)
    status, out, err = run_calibrate(capsys, path, "--baseline-tasks", 2, "--latency-out", tmp_path / "l.json")
    assert status == 2
    assert out.split("\n")[0] == f"{path}: tracelab-jsonl, 1 tasks, 3 rounds, 0 timed"
    assert out.endswith("\nno fit: 0 timed rounds (the trace has no model-call timestamps)\n")
    assert err == "error: no latency profile without a fit\n"
    assert not (tmp_path / "l.json").exists()


def test_calibrate_refuses_a_bad_trace_baseline_or_holdout(tmp_path, capsys):
    assert run_calibrate(capsys, tmp_path / "missing.jsonl")[0] == 2
    path = tracelab(tmp_path / "t.jsonl", [("codex", "gpt", 4)])
    status, out, err = run_calibrate(capsys, path, "--baseline", tmp_path / "nope.json")
    assert (status, out) == (2, "")
    assert err.startswith("python -m prototype calibrate: error: ") and "nope.json" in err
    status, out, err = run_calibrate(capsys, path, "--baseline-tasks", 2, "--holdout", 1)
    assert status == 2 and err == "error: --holdout must be in (0, 1), got 1\n"
    assert "Fit of" not in out and "prefix hit rate" in out
    assert run_calibrate(capsys, path, "--baseline-tasks", 2, "--holdout", 0)[0] == 2


def test_calibrate_names_a_custom_baseline_and_prints_the_traces_notes(tmp_path, capsys):
    preset = profiles.save_preset(wl.PRESETS["chat"], tmp_path / "mine.json", "test")
    path = tracelab(tmp_path / "t.jsonl", [("codex", "gpt", 4)])
    status, out, _ = run_calibrate(capsys, path, "--baseline", preset, "--baseline-tasks", 2)
    assert status == 0 and out.split("\n")[1] == "beside: 2 generated 'custom' tasks, seed 0"
    assert "custom p50" in out
    assert calibrate._baseline("chat", 3, 4) == ("chat", wl.generate("chat", seed=4, n_tasks=3))
    note_trace = tmp_path / "n.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    note_trace.write_text("".join(lines[:2] + lines[1:]))  # a round written twice: a note says it was skipped
    trace = traces.load(str(note_trace))
    assert trace.notes
    out = run_calibrate(capsys, note_trace, "--baseline-tasks", 2)[1]
    assert out.split("\n")[1:1 + len(trace.notes)] == [f"  note: {note}" for note in trace.notes]


# --- calibrate: a real engine's calls --------------------------------------------------------------------------------


def test_calibrate_fits_a_real_engines_calls_and_scores_the_last(tmp_path, capsys):
    path = tmp_path / "real_engine_calls.csv"
    write_calls(path, slowdown_last=2, factor=30.0)  # a fit that leaves residuals
    latency_file = tmp_path / "vllm.json"
    status, out, err = run_calibrate(capsys, path, "--latency-out", latency_file)
    assert (status, err) == (0, "")
    calls = engine_calls.read(str(path))
    result = calibrate.fit_engine_calls(calls)
    first = result.first_token
    fitted, scored, ttft, whole = calibrate.engine_calls_score(calls, 0.3)
    f = calibrate._fmt
    assert out.split("\n") == [
        f"{path}: {engine_calls.FORMAT}, 10 calls (http: 3, chained: 3, suspended: 4)",
        "",
        f"Fit of the engine's timings ({first.n} calls): time to first token = overhead + prefill computed / prefill rate; "
        "decode rate = tokens after the first / their time",
        f"  overhead       {first.fixed_s * 1000:9.1f} ms  (+/- {first.stderr[0] * 1000:.1f})   testbed: 10 ms",
        f"  prefill rate   {f(first.prefill_tokens_per_s):>9} tokens/s (s/token +/- {first.stderr[1]:.2g})   testbed: 15000",
        f"  decode rate    {f(result.decode_tokens_per_s):>9} tokens/s   testbed: 65 / 1000 / 4000",
        f"  residuals      time to first token: rmse {first.rmse_s * 1000:.1f} ms, r2 {first.r2:.3f}",
        f"  held out       fitted on the first {fitted.first_token.n} calls, scored on the last {scored}: absolute "
        f"error per call, time to first token median {f(ttft['median'])}%, p90 {f(ttft['p90'])}%; "
        f"whole call median {f(whole['median'])}%, p90 {f(whole['p90'])}%",
        f"wrote latency profile {latency_file}",
        "",
    ]
    assert (fitted.first_token.n, scored) == (7, 3)
    assert first.rmse_s * 1000 > 100 and first.stderr[0] * 1000 > 100
    assert profiles.load_latency(latency_file) == calibrate.engine_latency_model(result)
    assert json.loads(latency_file.read_text())["source"] == (
        f"python -m prototype calibrate {path} ({first.n} real-engine calls, time to first token rmse "
        f"{first.rmse_s * 1000:.1f} ms)")
    score = calibrate.engine_calls_score(calls, 0.5)
    assert score[1] == 5
    held = calls[5:]
    assert score[2] == fit.percentage_errors([float(score[0].first_token.predict(c.prefill_tokens, 0.0)) for c in held],
                                             [c.ttft_s for c in held])
    assert score[3] == fit.percentage_errors([float(score[0].call_seconds(c.prefill_tokens, c.output_tokens)) for c in held],
                                             [c.ttft_s + c.decode_s for c in held])


def test_a_real_engines_calls_too_few_or_without_decode_time(tmp_path, capsys):
    path = tmp_path / "real_engine_calls.csv"
    write_calls(path, CALLS[:3])
    status, out, _ = run_calibrate(capsys, path)
    assert status == 0 and "held out" not in out and "  residuals " in out
    write_calls(path, CALLS[:4])
    assert "  held out       fitted on the first 3 calls, scored on the last 1: " in run_calibrate(capsys, path)[1]
    # One token a call: no decode time to fit a rate to.
    write_calls(path, [(d, p, f, 1) for d, p, f, _ in CALLS[:3]])
    status, out, _ = run_calibrate(capsys, path)
    assert status == 0 and out.endswith("\nno fit: ") is False and "\nno fit: " in out
    assert run_calibrate(capsys, path, "--latency-out", tmp_path / "l.json")[0] == 2
    assert not (tmp_path / "l.json").exists()
    # Only the held-out calls have decode time: the fit on the first ones cannot be made.
    write_calls(path, [(d, p, f, 1) for d, p, f, _ in CALLS[:4]] + [CALLS[4]])
    status, out, _ = run_calibrate(capsys, path, "--holdout", 0.2)
    assert status == 0 and "\n  held out       not scored: " in out


def test_a_real_engines_calls_refuse_a_preset_a_bad_holdout_and_a_bad_file(tmp_path, capsys):
    path = tmp_path / "real_engine_calls.csv"
    write_calls(path)
    status, out, err = run_calibrate(capsys, path, "--preset-out", tmp_path / "p.json")
    assert (status, out) == (2, "")
    assert err == ("python -m prototype calibrate: error: --preset-out: a real engine's calls hold no tasks (no tool times, "
                   "no requests) to fit a workload preset to\n")
    status, out, err = run_calibrate(capsys, path, "--holdout", 1)
    assert (status, out, err) == (2, "", "error: --holdout must be in (0, 1), got 1\n")
    assert run_calibrate(capsys, path, "--holdout", 0)[0] == 2
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], text[1].replace(",600,", ",-600,", 1)]) + "\n")
    status, out, err = run_calibrate(capsys, path)
    assert (status, out) == (2, "") and err.startswith(f"python -m prototype calibrate: error: {path}")


# --- serve --workers: the parent and a worker, without forking -------------------------------------------------------


class Exited(Exception):
    pass


class FakeOs:
    """`os` for run_workers: fork gives the next pid from 101 (or 0, the child, when asked), read gives the scripted
    ready bytes, wait the scripted (pid, status) pairs, kill records; the rest is the real `os`."""

    def __init__(self, ready, waits, *, child=False, gone=()):
        self.ready, self.waits, self.child, self.gone = list(ready), list(waits), child, set(gone)
        self.forked, self.killed, self.reads, self.on_wait, self.ready_pipe = [], [], [], None, None

    def __getattr__(self, name):
        return getattr(os, name)

    def pipe(self):
        self.ready_pipe = os.pipe()
        return self.ready_pipe

    def fork(self):
        self.forked.append(101 + len(self.forked))
        return 0 if self.child else self.forked[-1]

    def read(self, fd, n):
        assert fd == self.ready_pipe[0]  # the ready pipe's read end
        self.reads.append(n)
        return self.ready.pop(0) if self.ready else b""

    def wait(self):
        if self.on_wait is not None:
            self.on_wait()
        if not self.waits:
            raise ChildProcessError
        return self.waits.pop(0)

    def kill(self, pid, signum):
        if pid in self.gone:
            raise ProcessLookupError
        self.killed.append((pid, signum))

    def _exit(self, code):
        raise Exited(code)


@pytest.fixture
def workers(monkeypatch):
    """run_workers with the warm-up skipped and its signal handlers recorded, not installed."""
    handlers = {}
    monkeypatch.setattr(serve, "_warm_up", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: handlers.__setitem__(signum, handler))

    def with_os(fake):
        monkeypatch.setattr(serve, "os", fake)
        return fake

    return handlers, with_os


EXIT_1 = 256  # os.wait's status of a child that exited with 1


def test_the_workers_are_announced_once_all_listen_and_ctrl_c_stops_them(workers, capsys, tmp_path):
    handlers, with_os = workers
    fake = with_os(FakeOs([b"1", b"11"], [(102, 0), (101, 0), (103, 0)], gone={103}))
    fake.on_wait = lambda: handlers[signal.SIGINT](signal.SIGINT, None) if not fake.killed else None
    args = serve_args("--workers", "3", "--port", "0", "--quiet")
    assert serve.run_workers(args) == 0
    assert fake.forked == [101, 102, 103]
    assert fake.reads == [3, 3]
    assert set(handlers) == {signal.SIGINT, signal.SIGTERM}
    assert fake.killed == [(101, signal.SIGINT), (102, signal.SIGINT)]
    out = capsys.readouterr().out.split("\n")
    assert out[0].startswith("listening on http://127.0.0.1:") and out[0].endswith("/v1/responses)  [3 workers]")
    port = int(out[0].split(":")[2].split()[0])
    assert port > 0
    assert out[-2:] == ["stopped", ""]
    # One store for every worker: a temporary file, removed at exit.
    store = args.store
    assert store.endswith("/responses.db") and os.path.basename(os.path.dirname(store)).startswith("testbed-store-")
    assert not os.path.exists(os.path.dirname(store))
    handlers[signal.SIGTERM](signal.SIGTERM, None)
    assert fake.killed[2:] == [(101, signal.SIGTERM), (102, signal.SIGTERM)]  # 103 is gone: skipped
    given = serve_args("--workers", "2", "--port", "0", "--store", str(tmp_path / "s.db"), "--quiet")
    with_os(FakeOs([b"11"], [(101, 0), (102, 0)]))
    assert serve.run_workers(given) == 0
    assert given.store == str(tmp_path / "s.db")
    assert capsys.readouterr().out.split("\n")[-2] != "stopped"  # ended by themselves: nothing stopped them


def test_a_worker_that_dies_before_listening_stops_the_others(workers, capsys):
    _, with_os = workers
    fake = with_os(FakeOs([b"1"], [(102, EXIT_1), (101, 0)]))
    assert serve.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 1
    assert fake.killed == [(101, signal.SIGTERM), (102, signal.SIGTERM)]
    assert capsys.readouterr().out == ""


def test_a_worker_that_fails_while_serving_stops_the_others(workers, capsys):
    _, with_os = workers
    fake = with_os(FakeOs([b"11"], [(101, EXIT_1), (102, 0)]))
    assert serve.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 1
    assert fake.killed == [(101, signal.SIGTERM), (102, signal.SIGTERM)]
    out = capsys.readouterr().out
    assert out.startswith("listening on ") and "stopped" not in out
    fake = with_os(FakeOs([b"11"], [(101, EXIT_1)]))  # the other already gone: no child left to wait for
    assert serve.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 1


def test_a_stopped_worker_that_exits_non_zero_fails_nothing(workers, monkeypatch):
    handlers, with_os = workers
    out = Flushed()
    monkeypatch.setattr(sys, "stdout", out)
    fake = with_os(FakeOs([b"11"], [(101, EXIT_1), (102, 0)]))
    fake.on_wait = lambda: handlers[signal.SIGTERM](signal.SIGTERM, None) if not fake.killed else None
    assert serve.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 0
    assert fake.killed == [(101, signal.SIGTERM), (102, signal.SIGTERM)]
    assert out.getvalue().endswith("stopped\n")
    assert out.flushes == 2  # the announcement, then "stopped": a script reading through a pipe sees each at once


def test_the_forked_child_runs_its_worker_and_exits_with_its_code(workers, monkeypatch, caplog):
    _, with_os = workers
    fake = with_os(FakeOs([], [], child=True))
    ran = []

    def worker(args, index, port, ready):
        ran.append((args, index, port, ready))
        return 5

    monkeypatch.setattr(serve, "_worker", worker)
    given = serve_args("--workers", "2", "--port", "0", "--quiet")
    with pytest.raises(Exited) as exited:
        serve.run_workers(given)
    assert exited.value.args == (5,)
    ((args, index, port, ready),) = ran
    assert args is given and index == 0 and port > 0 and ready == fake.ready_pipe[1]

    def failing(args, index, port, ready):
        raise RuntimeError("worker broke")

    monkeypatch.setattr(serve, "_worker", failing)
    with pytest.raises(Exited) as exited:
        serve.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet"))
    assert exited.value.args == (1,)
    # The failure is logged with its traceback, naming the worker, by serve's logger.
    (record,) = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert (record.name, record.getMessage()) == ("prototype.cli.serve", "worker 0 failed")
    assert record.exc_info[0] is RuntimeError


def test_a_worker_listens_on_its_own_socket_says_it_is_ready_and_stops_on_ctrl_c(monkeypatch):
    died, settled, served = [], [], []
    monkeypatch.setattr(serve, "_die_with_parent", lambda: died.append(True))
    monkeypatch.setattr(serve, "_settle_collector", lambda args: settled.append(args.gc_unfreeze_every))

    async def serve_listeners(handler, listeners, *, task_status):
        (listener,) = listeners
        served.append((handler.__self__, listener.socket.getsockname()))
        task_status.started()
        await trio.testing.wait_all_tasks_blocked()
        siblings = trio.lowlevel.current_task().parent_nursery.child_tasks
        served.append(sorted(task.name.rsplit(".", 1)[-1] for task in siblings))
        raise KeyboardInterrupt

    monkeypatch.setattr(trio, "serve_listeners", serve_listeners)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    read, write = os.pipe()
    try:
        args = serve_args("--quiet", "--gc-unfreeze-every", "9")
        assert serve._worker(args, 4, 0, write) == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert os.read(read, 10) == b"1"
    os.close(read)
    with pytest.raises(OSError):
        os.close(write)  # the worker closed its end
    (server, address), tasks = served
    assert server.config.worker == 4 and address[0] == "127.0.0.1"
    assert tasks == ["drain_on_sigterm", "serve_listeners"]
    assert died == [True] and settled == [9.0]
    with pytest.raises(Exception, match="closed database"):
        server.api.store._db.execute("select 1")


def test_a_worker_drains_its_own_server_on_sigterm(monkeypatch):
    """The drain task of a worker gets the worker's server, the --drain-seconds grace and the scope it cancels."""
    drained, served = [], []
    monkeypatch.setattr(serve, "_die_with_parent", lambda: None)
    monkeypatch.setattr(serve, "_settle_collector", lambda args: None)

    async def serve_listeners(handler, listeners, *, task_status):
        served.append(handler.__self__)
        task_status.started()
        await trio.sleep_forever()

    async def drain_on_sigterm(server, grace, scope):
        drained.append((server, grace))
        scope.cancel()  # what the drain does once SIGTERM's responses have ended

    monkeypatch.setattr(trio, "serve_listeners", serve_listeners)
    monkeypatch.setattr(serve, "drain_on_sigterm", drain_on_sigterm)
    previous = signal.getsignal(signal.SIGINT)
    read, write = os.pipe()
    try:
        assert serve._worker(serve_args("--quiet", "--drain-seconds", "7"), 2, 0, write) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
        os.close(read)
    ((server, grace),) = drained
    assert served == [server] and server.config.worker == 2 and grace == 7.0


def test_a_worker_asks_the_kernel_to_end_it_with_its_parent(monkeypatch):
    import ctypes

    calls = []

    class Libc:
        def __init__(self, name, use_errno):
            calls.append((name, use_errno))

        def prctl(self, option, signum):
            calls.append((option, signum))

    monkeypatch.setattr(ctypes, "CDLL", Libc)
    serve._die_with_parent()
    assert calls == [(None, True), (1, signal.SIGTERM)]

    def no_libc(name, use_errno):
        raise OSError("no libc")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    serve._die_with_parent()  # not Linux: nothing to ask, and no error


def test_serve_on_a_real_engine_serves_from_it_once_ready(serving, monkeypatch):
    import contextlib
    import types

    from prototype.cli.engine_options import model_spec

    engine = types.SimpleNamespace(client=types.SimpleNamespace(
        ready=types.SimpleNamespace(vllm_version="0.9.1", device="cpu", startup_s=61.6)))
    opened = []

    @contextlib.asynccontextmanager
    async def open_vllm_engine(spec, python):
        opened.append((spec, python))
        yield engine

    monkeypatch.setattr(serve, "open_vllm_engine", open_vllm_engine)
    out = Flushed()
    monkeypatch.setattr(sys, "stdout", out)
    args = serve_args("--quiet", "--engine", "vllm", "--vllm-python", "/opt/vllm/python")
    assert serve.run(args) == 0
    assert opened == [(model_spec(args), "/opt/vllm/python")]
    assert serving["served"][0][0].api.engine is engine
    lines = out.getvalue().split("\n")
    assert lines[:2] == ["starting vLLM (tiny-llama-cpu); this takes minutes on a CPU", "vLLM 0.9.1 ready on cpu in 62 s"]
    assert out.flushes == 4  # starting, ready, the announcement, stopped
