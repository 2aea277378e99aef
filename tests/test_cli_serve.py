"""`python -m prototype serve`: in-process (its options, the server they build, what it prints, its access log, stats,
SIGTERM drain and exits, with a stand-in listener), then as a user runs it, a child process on a free port."""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
import weakref
from typing import Any

import pytest
import trio
import trio.testing
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from prototype import metrics
from prototype.api.costs import ALL_SWITCHES_OFF, API_PROFILES, ZERO_COSTS, ApiCosts
from prototype.cli import common, serve, serve_report, serve_server
from prototype.cli.engine_options import model_spec
from prototype.engine.kv import Prompt
from prototype.engine.vllm_client import VllmUnavailable
from prototype.server.collector import FullCollectionPolicy
from prototype.server.config import ServerConfig
from tests.conftest import REPO
from tests.support import exit_code

# --- the options ---------------------------------------------------------------------------------------------------


def serve_parser() -> common.Parser:
    parser = common.Parser(prog="serve")
    serve.add_arguments(parser)
    return parser


def serve_args(*argv: str) -> argparse.Namespace:
    return serve_parser().parse_args(list(argv))


def option_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's help as `--help` prints it, its lines joined."""
    entries = re.split(r"\n  (?=-)", parser.format_help().split("options:", 1)[1])
    helps = {}
    for entry in entries:
        if not (words := " ".join(entry.split())):
            continue
        option = words.split()[0].rstrip(",")
        helps[option] = re.sub(r"^\S+( (\{[^}]*\}|[A-Z_]+))?\s*", "", words)
    return helps


def test_the_help_names_every_option_and_states_the_defaults_of_the_default_server():
    helps = option_helps(serve_parser())
    assert set(helps) >= {"--api-key", "--workload", "--seed", "--costs", "--switches", "--records", "--quiet", "--log-format"}
    assert all(len(text.split()) >= 3 for text in helps.values()), helps  # every option says what it does
    stated = {option: match.group(1) for option, text in helps.items()
              if option not in ("--engine", "--vllm-model", "--vllm-python") and (match := re.search(r"\(default:? ([^;)]+)[;)]", text))}
    # The choices that name the defaults are taken too.
    args, server = serve_args("--costs", "default", "--switches", "on", "--log-format", "text"), serve.build_server(serve_args("--quiet"))
    config, api = server.config, server.api
    api.store.close()
    assert stated == {  # the defaults a server built without these options runs with, as the help words them
        "--host": args.host, "--port": str(args.port), "--store": "in memory" if args.store == ":memory:" else args.store,
        "--api-profile": next(name for name, profile in API_PROFILES.items() if profile == api.sprint),
        "--flush-interval": f"{api.flush_interval:g}", "--flush-tokens": "no bound" if api.flush_tokens is None else api.flush_tokens,
        "--suspension-ttl": f"{config.suspension_ttl:g}", "--connection-lifetime": f"{config.connection_lifetime:g}",
        "--max-connections": str(config.max_connections), "--max-message-bytes": f"{config.max_message_bytes / 2**20:g} MiB",
        "--max-body-bytes": f"{config.max_body_bytes / 2**20:g} MiB", "--workers": str(args.workers),
        "--render-cache-tokens": str(api.render_cache.max_tokens), "--engine-sessions": str(api.engine.max_sessions),
        "--max-records": str(server.records.maxlen), "--kv-ttl": f"{api.engine.kv_ttl:g}",
        "--stats-interval": "never" if args.stats_interval is None else args.stats_interval,
        "--drain-seconds": f"{args.drain_seconds:g}", "--max-queued-creates": str(config.max_queued_creates),
        "--gc-unfreeze-every": f"{args.gc_unfreeze_every:g}",
    }
    # The default server itself: a default engine and configuration, the after-sprint API, its own records.
    assert (api.engine.max_sessions, api.engine.kv_ttl) == (type(api.engine)().max_sessions, type(api.engine)().kv_ttl)
    assert (api.render_cache.max_tokens, api.costs, api.sprint) == (5_000_000, ApiCosts(), API_PROFILES["after"])
    assert (api.workloads.default_workload, api.workloads.default_seed) == ("coding", 0)
    assert (api.flush_interval, api.flush_tokens) == (0.05, None)
    assert config == ServerConfig() and type(server.records) is metrics.ClientRecords


@pytest.mark.parametrize(("option", "edge", "parsed", "past", "says"), [
    ("--port", "0", 0, "-1", "must be from 0 to 65535"), ("--port", "65535", 65535, "65536", "must be from 0 to 65535"),
    ("--seed", "0", 0, "-1", "must be at least 0"), ("--flush-interval", "0", 0.0, "-0.1", "must be at least 0"),
    ("--flush-tokens", "1", 1, "0", "must be at least 1"), ("--suspension-ttl", "0.5", 0.5, "0", "must be greater than 0"),
    ("--connection-lifetime", "0.5", 0.5, "0", "must be greater than 0"),
    ("--max-connections", "1", 1, "0", "must be at least 1"),
    ("--max-message-bytes", "1", 1, "0", "must be at least 1"), ("--max-body-bytes", "1", 1, "0", "must be at least 1"),
    ("--workers", "1", 1, "0", "must be at least 1"), ("--render-cache-tokens", "0", 0, "-1", "must be at least 0"),
    ("--engine-sessions", "1", 1, "0", "must be at least 1"), ("--max-records", "0", 0, "-1", "must be at least 0"),
    ("--kv-ttl", "0", 0.0, "-1", "must be at least 0"), ("--stats-interval", "0.5", 0.5, "0", "must be greater than 0"),
    ("--drain-seconds", "0", 0.0, "-1", "must be at least 0"), ("--max-queued-creates", "1", 1, "0", "must be at least 1"),
    ("--gc-unfreeze-every", "0", 0.0, "-1", "must be at least 0"),
])
def test_serve_takes_each_option_at_its_edge_and_refuses_it_past_its_edge(option, edge, parsed, past, says, capsys):
    value = getattr(serve_args(option, edge), option[2:].replace("-", "_"))
    assert (value, type(value)) == (parsed, type(parsed))
    assert exit_code(serve_parser().parse_args, [option, past]) == 2 and f"argument {option}: {says}" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--costs none", "--switches off", "--log-format xml", "--api-profile during"])
def test_serve_refuses_a_choice_it_does_not_have(option, capsys):
    assert exit_code(serve_parser().parse_args, option.split()) == 2
    assert f"argument {option.split()[0]}: invalid choice" in capsys.readouterr().err


# --- the server the options build, and what it prints ---------------------------------------------------------------


def test_every_option_reaches_the_server_it_builds_and_without_quiet_the_access_log_prints_to_stdout(tmp_path):
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
    assert isinstance(records, serve_report.AccessLog)
    assert (records.out, records.fmt, records.maxlen) == (sys.stdout, "json", 2)
    records.append({"n": 1})
    records.close()
    assert (tmp_path / "records.jsonl").read_text() == '{"n": 1}\n'
    api.store.close()
    server = serve.build_server(serve_args())
    assert isinstance(server.records, serve_report.AccessLog)
    assert (server.records.out, server.records.fmt, server.records.maxlen, server.records.file) == (
        sys.stdout, "text", metrics.MAX_CLIENT_RECORDS, None)
    # Options a namespace built elsewhere may lack (experiments build one by hand): quiet, default bounds.
    bare = argparse.Namespace(**{k: v for k, v in vars(serve_args()).items()
                                 if k not in ("engine_sessions", "kv_ttl", "quiet", "max_records", "log_format")})
    quiet = serve.build_server(bare)
    assert type(quiet.records) is metrics.ClientRecords
    assert quiet.api.engine.max_sessions == type(quiet.api.engine)().max_sessions
    bounded = serve.build_server(argparse.Namespace(**{**vars(bare), "max_records": 5}))
    assert isinstance(bounded.records, serve_report.AccessLog) and bounded.records.out is None
    assert (bounded.records.maxlen, bounded.records.fmt) == (5, "text")
    assert serve_server.server_config(serve_args("--max-connections", "3"), worker=0) == ServerConfig(max_connections=3, worker=0)


class Flushed(io.StringIO):
    """A stdout that counts its flushes: a script reads serve's stdout through a pipe, which Python buffers by the block."""

    flushes = 0

    def flush(self):
        self.flushes += 1


def flushed_stdout(monkeypatch) -> Flushed:
    """sys.stdout replaced, in the test's body (pytest's capture sets it again after the fixtures)."""
    out = Flushed()
    monkeypatch.setattr(sys, "stdout", out)
    return out


def test_serve_announces_its_address_then_what_a_request_runs_and_its_limits(monkeypatch):
    stdout = flushed_stdout(monkeypatch)
    serve_server.announce(serve_args(), "127.0.0.1", 8123, 1)
    assert stdout.getvalue().split("\n") == [
        "listening on http://127.0.0.1:8123  (POST /v1/responses, WebSocket ws://127.0.0.1:8123/v1/responses)",
        "  workload  coding (seed 0) unless metadata.testbed_workload / testbed_seed say otherwise",
        "  speed     by model name: *spark*burst* 4000 tok/s, *spark* 1000, sim-<N> N, any other name 65; "
        "metadata.testbed_decode_tps overrides",
        "  costs     default API stage costs, profile after, chained cache switches on; deltas every 0.05 s",
        "  TTLs      v1 suspension 300 s, WebSocket connection 3600 s, HTTP keep-alive idle 600 s",
        "  limits    10000 connections, 16777216 B per WebSocket message, 16777216 B per HTTP body, 32 queued creates per connection",
        "  auth      any non-empty Bearer key",
        "  store     :memory:",
        "",
    ]
    assert stdout.flushes == 1  # one write, flushed at once: nothing can come between the address and the rest
    lines = serve_server.describe(serve_args(
        "--workload", "fixed:2", "--seed", "4", "--costs", "zero", "--api-profile", "before", "--switches", "all-off",
        "--flush-interval", "0", "--api-key", "a", "--api-key", "b", "--suspension-ttl", "1.5", "--connection-lifetime", "60",
        "--max-connections", "2", "--max-message-bytes", "3", "--max-body-bytes", "4", "--max-queued-creates", "5", "--store", "x.db"))
    assert lines[0] == "  workload  fixed:2 (seed 4) unless metadata.testbed_workload / testbed_seed say otherwise"
    assert lines[2:] == [
        "  costs     zero API stage costs, profile before, chained cache switches all-off; deltas every 0 s",
        "  TTLs      v1 suspension 1.5 s, WebSocket connection 60 s, HTTP keep-alive idle 600 s",
        "  limits    2 connections, 3 B per WebSocket message, 4 B per HTTP body, 5 queued creates per connection",
        "  auth      2 configured key(s)",
        "  store     x.db",
    ]
    for host, port, workers in (("::1", 9, 4), ("h", 9, 2)):
        serve_server.announce(serve_args(), host, port, workers)
    first_lines = [line for line in stdout.getvalue().split("\n") if line.startswith("listening")][1:]
    assert first_lines == ["listening on http://::1:9  (POST /v1/responses, WebSocket ws://::1:9/v1/responses)  [4 workers]",
                           "listening on http://h:9  (POST /v1/responses, WebSocket ws://h:9/v1/responses)  [2 workers]"]


def test_the_access_log_prints_a_line_per_record_naming_the_response_its_turns_status_and_time_and_survives_a_closed_stdout(
        monkeypatch, tmp_path):
    monkeypatch.setattr(serve_report.time, "strftime", lambda fmt: f"<{fmt}>")
    record = {"started_at_s": 10.0, "at_s": 10.25, "transport": "websocket", "design": "suspended",
              "response_id": "resp_1", "appends": 2, "outcome": "completed", "model": "gpt-x"}
    line = serve_report.access_line
    assert line(record) == "<%H:%M:%S> websocket suspended resp_1 turns=3 completed 250.0 ms model=gpt-x"
    assert json.loads(line(record, "json")) == {
        "time": "<%H:%M:%S>", "transport": "websocket", "design": "suspended", "response_id": "resp_1", "turns": 3,
        "status": "completed", "ms": 250.0, "model": "gpt-x"}
    # One turn without appends; a refused frame has no response, no start and no model.
    assert line({**record, "appends": 0, "at_s": 10.00004}) == "<%H:%M:%S> websocket suspended resp_1 turns=1 completed 0.0 ms model=gpt-x"
    assert json.loads(line({**record, "at_s": 10.01234}, "json"))["ms"] == 12.3
    assert line({"at_s": 3.0, "transport": "http", "design": "http", "outcome": "refused"}) == "<%H:%M:%S> http http - turns=0 refused - model=-"
    assert json.loads(line({"at_s": 3.0, "started_at_s": 1.0, "response_id": "r", "outcome": "failed"}, "json")) == {
        "time": "<%H:%M:%S>", "transport": None, "design": None, "response_id": "r", "turns": 1, "status": "failed",
        "ms": 2000.0, "model": None}
    out = Flushed()
    log = serve_report.AccessLog(str(tmp_path / "r.jsonl"), out, "json", maxlen=2)
    record = {"at_s": 1.0, "transport": "http", "design": "http", "outcome": "completed"}
    for _ in range(3):
        log.append(record)
    assert (len(log), out.flushes, out.getvalue()) == (2, 3, (serve_report.access_line(record, "json") + "\n") * 3)
    out.close()
    log.append(record)  # ValueError: I/O operation on closed file, swallowed
    log.close()
    assert (tmp_path / "r.jsonl").read_text() == (json.dumps(record) + "\n") * 4

    class Broken(io.StringIO):
        def write(self, text):
            raise OSError("broken pipe")

    broken = serve_report.AccessLog(None, Broken())
    broken.append(record)
    assert list(broken) == [record] and broken.fmt == "text" and broken.maxlen == metrics.MAX_CLIENT_RECORDS
    text = Flushed()
    serve_report.AccessLog(None, text).append(record)
    assert text.getvalue() == serve_report.access_line(record) + "\n"
    silent = serve_report.AccessLog(None, None)
    silent.append(record)
    assert list(silent) == [record]


# --- stats, SIGTERM, the collector ---------------------------------------------------------------------------------


async def test_stats_say_what_the_server_holds_and_are_printed_every_interval(autojump_clock, monkeypatch):
    before = serve_report.count_tasks()  # every live task
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as inner:
            for _ in range(2):
                inner.start_soon(trio.sleep_forever)
            outer.start_soon(trio.sleep_forever)
            await trio.testing.wait_all_tasks_blocked()
            assert serve_report.count_tasks() == before + 3
            inner.cancel_scope.cancel()
        outer.cancel_scope.cancel()
    stdout = flushed_stdout(monkeypatch)
    server = serve.build_server(serve_args("--quiet"))
    server.connections = 2
    server.sessions.update({object(), object(), object()})
    server.api.render_cache.tokens = 17
    monkeypatch.setattr(serve_report, "count_tasks", lambda: 5)
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 6)
    engine = server.api.engine
    engine.end_call(await engine.begin_call("a", Prompt([1])))  # one session seen, its call ended before any KV
    assert serve_report.stats(server) == {"tasks": 5, "connections": 2, "sessions": 3, "kv_entries": len(engine.kv),
                                          "engine_sessions": 1, "render_cache_tokens": 17, "gc_frozen_objects": 6}
    server.api.store.close()
    monkeypatch.setattr(serve_report, "stats", lambda server: {"at": trio.current_time(), "of": server})
    with trio.move_on_after(5.5):
        await serve_report.print_stats("the server", 2.0)
    assert stdout.getvalue() == 'stats {"at": 2.0, "of": "the server"}\nstats {"at": 4.0, "of": "the server"}\n'
    assert stdout.flushes == 2


async def test_sigterm_drains_the_server_then_stops_it(monkeypatch):
    stdout = flushed_stdout(monkeypatch)
    server = serve.build_server(serve_args("--quiet"))
    server.sessions.add(object())
    drained = []

    async def drain(server_, grace):
        drained.append((server_, grace))

    monkeypatch.setattr(serve_server, "drain", drain)
    with trio.fail_after(30):  # a hang guard: a drain that never cancels its scope would wait for ever
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_server.drain_on_sigterm, server, 2.5, nursery.cancel_scope)
            nursery.start_soon(trio.sleep_forever)
            await trio.testing.wait_all_tasks_blocked()
            assert stdout.getvalue() == ""
            os.kill(os.getpid(), signal.SIGTERM)
    assert (drained, stdout.getvalue(), stdout.flushes) == (
        [(server, 2.5)], "SIGTERM: draining (1 WebSocket connections, 0 HTTP responses in flight)\ndrained\n", 2)
    server.api.store.close()


class Cycle:
    def __init__(self) -> None:
        self.me = self  # only the cyclic collector frees it


@pytest.mark.parametrize("every", [7.0, 0.5, 0.0])
def test_serve_collects_then_freezes_its_startup_objects_and_installs_the_collection_policy_asked_for(monkeypatch, every):
    installed = []
    monkeypatch.setattr(FullCollectionPolicy, "install", lambda policy: installed.append(policy))
    threshold, garbage = gc.get_threshold(), Cycle()
    dead = weakref.ref(garbage)
    del garbage
    gc.unfreeze()
    try:
        serve_server.settle_collector(serve_args("--gc-unfreeze-every", f"{every:g}"))
        assert gc.get_freeze_count() > 0  # what was alive at start-up is out of every later full collection
        assert dead() is None  # and what was garbage was collected, not frozen with it
    finally:
        gc.unfreeze()
    assert ([policy.unfreeze_every for policy in installed], gc.get_threshold()) == ([every] if every else [], threshold)


# --- run: its exits, with the listener replaced by a stand-in ------------------------------------------------------


def test_several_workers_are_forked_unless_on_a_real_engine_and_a_port_taken_is_named(capsys, monkeypatch):
    monkeypatch.setattr(serve, "run_workers", lambda args: 7 if args.workers == 2 else 0)
    monkeypatch.setattr(serve, "run_until_interrupted", lambda main: pytest.fail("served from this process"))
    assert serve.run(serve_args("--workers", "2")) == 7
    assert serve.run(serve_args("--workers", "2", "--engine", "vllm")) == 2
    assert capsys.readouterr().err == (
        "python -m prototype serve: error: --engine vllm serves from one process: one engine, one server (use --workers 1)\n")
    for error, port, says in ((OSError(98, "Address already in use"), "80", "Address already in use"),
                              (OSError("no such address"), "8000", "no such address")):
        monkeypatch.setattr(serve, "run_workers", raising(error))
        assert serve.run(serve_args("--workers", "3", "--port", port)) == 1
        assert capsys.readouterr().err == f"python -m prototype serve: error: cannot listen on 127.0.0.1:{port}: {says}\n"


def test_a_bad_workload_store_or_records_file_is_refused_before_anything_serves(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(serve, "run_until_interrupted", lambda main: pytest.fail("served"))
    with monkeypatch.context() as patched:
        patched.setattr(serve, "build_server", lambda args: pytest.fail("a server was built"))
        # Named as the option (not a request's metadata field), a range error with its range.
        for workload, says in (("nonsense", "'nonsense' names no workload"), ("fixed:100000", "a fixed task's turns is 1 to 1000")):
            assert serve.run(serve_args("--workload", workload)) == 2
            err = capsys.readouterr().err
            assert err.startswith("python -m prototype serve: error: --workload: ") and says in err and "metadata." not in err
    store = tmp_path / "missing" / "store.db"
    assert serve.run(serve_args("--store", str(store))) == 2
    assert capsys.readouterr().err == f"python -m prototype serve: error: --store {store}: unable to open database file\n"
    records = tmp_path / "missing" / "records.jsonl"
    assert serve.run(serve_args("--records", str(records))) == 2
    assert capsys.readouterr().err == f"python -m prototype serve: error: [Errno 2] No such file or directory: '{records}'\n"


def raising(error: BaseException):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.fixture
def serving(monkeypatch):
    """serve.run with its listener replaced: `served` records what it was asked to listen on; `then` is what the
    stand-in does once it has started (by default, Ctrl-C); the drain and the stats printer record their start."""
    state = {"served": [], "then": KeyboardInterrupt, "settled": [], "logging": [], "drains": [], "stats": []}

    async def serve_responses(server, port, *, host, task_status):
        state["served"].append((server, port, host))
        task_status.started([types.SimpleNamespace(socket=types.SimpleNamespace(getsockname=lambda: ("10.0.0.1", 4321, 0, 0)))])
        await trio.testing.wait_all_tasks_blocked()
        if state["then"] is None:  # served until something else ends the run
            await trio.sleep_forever()
        raise state["then"]()

    async def drain_on_sigterm(server, grace, scope):
        state["drains"].append((server, grace, type(scope)))
        await trio.sleep_forever()

    async def print_stats(server, interval):
        state["stats"].append((server, interval))
        await trio.sleep_forever()

    monkeypatch.setattr(serve, "serve_responses", serve_responses)
    monkeypatch.setattr(serve, "run_workers", lambda args: pytest.fail("one worker is served from this process, not forked"))
    monkeypatch.setattr(serve, "settle_collector", state["settled"].append)
    monkeypatch.setattr(serve, "drain_on_sigterm", drain_on_sigterm)
    monkeypatch.setattr(serve, "print_stats", print_stats)
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: state["logging"].append(kwargs))
    # Started with SIGINT ignored (a background job of a non-interactive shell): serve takes it back.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield state
    signal.signal(signal.SIGINT, previous)


def test_serve_listens_announces_prints_stats_closes_its_records_and_stops_on_ctrl_c_or_names_what_it_cannot_listen_on(
        serving, tmp_path, capsys, monkeypatch):
    stdout = flushed_stdout(monkeypatch)
    args = serve_args("--port", "0", "--host", "0.0.0.0", "--quiet", "--drain-seconds", "4")
    assert (serve.run(args), stdout.flushes) == (0, 2)  # the announcement, then "stopped"
    assert serving["logging"] == [{"level": logging.WARNING, "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}]
    assert serving["settled"] == [args]
    (server, port, host), = serving["served"]
    assert ((port, host), serving["drains"], serving["stats"]) == ((0, "0.0.0.0"), [(server, 4.0, trio.CancelScope)], [])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    out = stdout.getvalue()
    assert out.splitlines()[0] == "listening on http://10.0.0.1:4321  (POST /v1/responses, WebSocket ws://10.0.0.1:4321/v1/responses)"
    assert out.endswith("  store     :memory:\nstopped\n")
    with pytest.raises(Exception, match="closed database"):
        server.api.store._db.execute("select 1")
    # Stats printed when asked; the records file closed when it stops.
    assert serve.run(serve_args("--quiet", "--stats-interval", "30")) == 0
    assert serving["stats"] == [(serving["served"][1][0], 30.0)]
    closed = []
    monkeypatch.setattr(serve_report.AccessLog, "close", lambda self: closed.append(self))
    assert serve.run(serve_args("--records", str(tmp_path / "r.jsonl"))) == 0
    assert len(closed) == 1 and closed[0] is serving["served"][2][0].records
    # A listener that cannot listen: its address named (a port taken: the child process's test below).
    serving["then"] = lambda: OSError("bad address")
    assert serve.run(serve_args("--quiet")) == 1
    assert capsys.readouterr().err == "python -m prototype serve: error: cannot listen on 127.0.0.1:8000: bad address\n"


def stand_in_vllm(monkeypatch, startup_s: float = 1.0, **client) -> tuple[types.SimpleNamespace, list]:
    """serve's vLLM engine replaced by a stand-in that is ready at once; the (spec, python) it was opened with."""
    engine = types.SimpleNamespace(client=types.SimpleNamespace(
        ready=types.SimpleNamespace(vllm_version="0.9.1", device="cpu", startup_s=startup_s), died=trio.Event(), **client))
    opened = []

    @contextlib.asynccontextmanager
    async def open_vllm_engine(spec, python):
        opened.append((spec, python))
        yield engine

    monkeypatch.setattr(serve, "open_vllm_engine", open_vllm_engine)
    return engine, opened


def test_serve_on_a_real_engine_says_why_it_cannot_start_or_serves_from_it_once_ready(serving, capsys, monkeypatch):
    monkeypatch.setattr(serve, "open_vllm_engine", raising(VllmUnavailable("no vLLM here")))
    assert serve.run(serve_args("--quiet", "--engine", "vllm")) == 2
    captured = capsys.readouterr()
    assert captured.out == "starting vLLM (tiny-llama-cpu); this takes minutes on a CPU\n"
    assert (captured.err, serving["served"]) == ("python -m prototype serve: error: --engine vllm: no vLLM here\n", [])
    stdout = flushed_stdout(monkeypatch)
    engine, opened = stand_in_vllm(monkeypatch, startup_s=61.6)  # an engine that lives on (`died` is never set)
    args = serve_args("--quiet", "--engine", "vllm", "--vllm-python", "/opt/vllm/python")
    assert (serve.run(args), opened) == (0, [(model_spec(args), "/opt/vllm/python")])
    assert serving["served"][0][0].api.engine is engine
    assert stdout.getvalue().split("\n")[:2] == ["starting vLLM (tiny-llama-cpu); this takes minutes on a CPU", "vLLM 0.9.1 ready on cpu in 62 s"]
    assert stdout.flushes == 4  # starting, ready, the announcement, stopped


@pytest.mark.parametrize("failure", ["the vLLM worker exited", None])
def test_serve_on_a_real_engine_that_dies_closes_its_connections_and_exits_saying_why(serving, monkeypatch, capsys, failure):
    engine, _ = stand_in_vllm(monkeypatch, failure=failure)
    engine.client.died.set()  # the worker is gone by the time the server listens
    drained = []

    async def drain(server, grace):
        drained.append((server, grace))

    monkeypatch.setattr(serve, "drain", drain)
    serving["then"] = None
    assert serve.run(serve_args("--quiet", "--engine", "vllm")) == 1
    # Closed as a drain closes them, with no grace: the responses in flight failed with the engine.
    assert drained == [(serving["served"][0][0], 0.0)]
    reason = failure or "the vLLM worker failed"
    assert capsys.readouterr().err == f"python -m prototype serve: error: --engine vllm: the engine died ({reason}); the server stopped with it\n"


def test_ctrl_c_that_lands_in_a_task_whose_way_out_is_cancelled_still_stops_serve():
    """`reader` does what trio-websocket's reader does on its way out (cancel its nursery, checkpoint): raised there, as
    trio's default does, KeyboardInterrupt would become that checkpoint's Cancelled; `serve` raises it in the main task."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                try:
                    signal.raise_signal(signal.SIGINT)  # its Python handler runs before this returns
                    await trio.sleep_forever()
                finally:
                    nursery.cancel_scope.cancel()
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(reader)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupted = False
    try:
        serve_server.run_until_interrupted(main)
    except* KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted


# --- as a user runs it: a child process ------------------------------------------------------------------------


LISTENING = re.compile(r"^listening on http://127\.0\.0\.1:(\d+)\b")
TIMEOUT = 60.0  # a hang guard: on a loaded machine the first turn (tokenizer load) takes seconds
TERMINALS = {"response.completed", "response.failed", "response.incomplete"}


def create(**extra: Any) -> str:
    return json.dumps({"type": "response.create", "model": "sim-100000", "input": "hello", "metadata": {"testbed_workload": "fixed:1"},
                       "store": False, **extra})


def until_terminal(ws: Any) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(event := json.loads(ws.recv(timeout=TIMEOUT)))
        if event["type"] in TERMINALS or event["type"] == "error":
            return events
        assert len(events) < 5000, "no terminal event"


def open_ws(port: int, key: str | None = "x"):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return ws_connect(f"ws://127.0.0.1:{port}/v1/responses", additional_headers=headers, open_timeout=TIMEOUT, close_timeout=2, max_size=None)


def assert_stopped(server) -> str:
    code, out, err = server.stop()
    assert code == 0, f"exit code {code}\nstderr:\n{err}"
    assert out.splitlines()[-1] == "stopped", out
    assert "Traceback" not in err, err
    return out


def post(port: int, body: bytes) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses", data=body, method="POST",
                                     headers={"Authorization": "Bearer x", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_serve_prints_its_address_and_configuration_answers_logs_one_line_per_response_and_refusal_and_stops_on_sigint(cli_server):
    # Default modeled costs, one key; started with SIGINT ignored, as a non-interactive shell starts `serve &` (POSIX).
    server = cli_server("--api-key", "x", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert LISTENING.match(server.first_line) and f"ws://127.0.0.1:{server.port}/v1/responses" in server.first_line
    body = json.dumps({"model": "sim-100000", "input": "hi", "metadata": {"testbed_workload": "fixed:1"}}).encode()
    assert (post(server.port, body), post(server.port, b"{bad")) == (200, 400)
    busy = subprocess.run([sys.executable, "-m", "prototype", "serve", "--port", str(server.port)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # the port taken: one line naming it, exit 1
    assert (busy.returncode, busy.stdout, busy.stderr) == (1, "", f"python -m prototype serve: error: cannot listen on 127.0.0.1:{server.port}: "
                                                                  "Address already in use\n"), busy.stderr
    for key in ("wrong", None):  # a wrong or missing key: 401 on the handshake
        with pytest.raises(InvalidStatus) as refused:
            open_ws(server.port, key)
        assert refused.value.response.status_code == 401, key
        assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
    with open_ws(server.port) as ws:  # the configured key is accepted
        ws.send(create())
        events = until_terminal(ws)
        assert [events[0]["type"], events[-1]["type"]] == ["response.created", "response.completed"], events
        assert events[-1]["response"]["output"], "a one-turn task ends with a message"
        # An access-log line is written just after the response's last byte, so it may trail the client's read.
        deadline = time.monotonic() + TIMEOUT
        while len(server.stdout) < 8 + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        lines = assert_stopped(server).splitlines()  # SIGINT stops it with a connection open
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=TIMEOUT)
    assert [line.split()[0] for line in lines[1:8]] == ["workload", "speed", "costs", "TTLs", "limits", "auth", "store"]
    log = lines[8:-1]
    assert len(log) == 3, log
    assert log[0].split()[1:3] == ["http", "http-stateless"] and "turns=1 completed" in log[0]
    assert log[1].split()[1:3] == ["http", "http"] and "error:invalid_json" in log[1]
    assert log[2].split()[1:4] == ["websocket", "chained", events[-1]["response"]["id"]] and "turns=1 completed" in log[2]
    assert log[2].split()[7] == "ms" and float(log[2].split()[6]) >= 0


# A stand-in for vLLM's worker: it says it is ready, then exits 9 at the first request it reads (the engine dies under
# a response); it ends itself after a minute whatever happens (a hang guard).
DYING_WORKER = """#!{python} -IS
import json, os, select, signal, sys
signal.alarm(60)
os.write(1, json.dumps({{"type": "ready", "vocab_size": 128256, "block_size": 32, "kv_blocks": 2048, "startup_s": 0.25,
                        "vllm_version": "0.32.0", "device": "cpu"}}).encode() + b"\\n")
select.select([0], [], [])
sys.exit(9)
"""


def test_serve_over_vllm_exits_saying_why_when_its_engine_dies(tmp_path):
    worker = tmp_path / "python"
    worker.write_text(DYING_WORKER.format(python=sys.executable))
    worker.chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path)}  # the model's config.json goes under $HOME/.cache
    proc = subprocess.Popen([sys.executable, "-m", "prototype", "serve", "--port", "0", "--quiet", "--engine", "vllm",
                             "--vllm-python", str(worker)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    received: list[dict[str, Any]] = []
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert LISTENING.match(lines[2]), (lines, proc.stderr.read() if proc.poll() is not None else "")
        with open_ws(int(LISTENING.match(lines[2]).group(1))) as conn:  # a client connected when the engine dies
            conn.send(create(model="sim-1000", input="hi"))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    received.append(json.loads(conn.recv(timeout=TIMEOUT)))
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001  # closed as a drain closes: going away
    assert proc.returncode == 1, err
    (line,) = err.splitlines()  # one line, no traceback: the option, and the worker's reason
    assert "--engine vllm" in line and "the vLLM worker exited" in line, err
    assert "stopped\n" not in out
    # The response under way gets an answer before the close: failed as on any engine failure, or, when the server's
    # shutdown reaches it first, the drain's `server_shutting_down` (retry on a new connection).
    last = received[-1]
    assert (last["type"], last.get("response", last).get("error", {}).get("code")) in {
        ("response.failed", "server_error"), ("error", "server_shutting_down")}, received
