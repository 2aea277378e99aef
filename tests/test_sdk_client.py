"""The SDK client (client/sdk.py) with a stand-in for openai-python's client, to exact values: the frames it writes and
counts, the options it passes, what ends a turn, the watchdog, the lanes and the steer (openai-python itself:
test_sdk_websocket.py)."""

from __future__ import annotations

import contextlib
import json
import queue
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from prototype.client import sdk
from prototype.client.connect import TcpConnector
from prototype.client.harness import BETA, CHAINED, SUSPENDED, request_body, run_websocket_rollout, task_prompt, tool_output_text
from prototype.workload import fixed

CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file", "arguments": "{}", "status": "completed"}
ANSWER = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "ok"}]}
TASK = fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=0.01, name="sdk-task")


def turn(kind: str, response_id: str, *output: dict[str, Any], stream_id: str | None = None) -> list[dict[str, Any]]:
    status = "in_progress" if kind == "response.done" else "completed"
    lane = {} if stream_id is None else {"stream_id": stream_id}
    return [{"type": "response.created", "response": {"id": response_id}, **lane},
            *({"type": "response.output_item.done", "item": item, **lane} for item in output),
            {"type": kind, "response": {"id": response_id, "status": status, "output": list(output)}, **lane}]


class FakeConnection:
    """What sdk.py uses of openai-python's connection (`conn.response` is itself). Each frame written is answered by the
    next reply of the script; `recv_bytes` blocks until a frame is there or the connection is closed."""

    def __init__(self, replies: list[list[dict[str, Any]]], *, counted: bool = True, idle: dict[str, Any] | None = None) -> None:
        self.replies, self.idle, self.response, self.closed = list(replies), idle, self, False
        self.frames: list[str] = []
        self.reads_before: list[int] = []  # for each frame written, how many events had been read
        self.reads, self.inbox = 0, queue.Queue()
        if counted:
            self._send = self._write

    def create(self, **fields: Any) -> None:
        # Compact, as openai-python writes a model's JSON: a count by our own encoding would differ from it.
        self.send_raw(json.dumps({"type": "response.create", **fields}, separators=(",", ":")))

    def steer(self, **fields: Any) -> None:
        self.send_raw(json.dumps({"type": "response.steer", **fields}))

    def _write(self, data: str) -> None:
        self.frames.append(data)
        self.reads_before.append(self.reads)
        for event in self.replies.pop(0) if self.replies else []:
            self.inbox.put(json.dumps(event).encode())

    def send_raw(self, text: str) -> None:
        getattr(self, "_send", self._write)(text)

    def recv_bytes(self) -> bytes:
        if self.idle is not None and self.inbox.empty():  # a server that keeps streaming something else
            time.sleep(0.02)
            return json.dumps(self.idle).encode()
        if (data := self.inbox.get(timeout=5)) is None:
            raise ConnectionError("closed")
        self.reads += 1
        return data

    def parse_event(self, data: bytes) -> Any:
        return types.SimpleNamespace(type=json.loads(data)["type"])

    def close(self) -> None:
        self.closed = True
        self.inbox.put(None)


class FakeOpenAI:
    """openai.OpenAI as sdk.py calls it; every client made is kept in `made`."""

    made: list[FakeOpenAI] = []
    conn: FakeConnection

    def __init__(self, **options: Any) -> None:
        self.options, self.closed, self.headers = options, False, None
        self.responses = self
        FakeOpenAI.made.append(self)

    @contextlib.contextmanager
    def connect(self, *, extra_headers: dict[str, str]) -> Iterator[FakeConnection]:
        self.headers = extra_headers
        try:
            yield FakeOpenAI.conn
        finally:
            FakeOpenAI.conn.close()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_openai(monkeypatch: pytest.MonkeyPatch) -> type[FakeOpenAI]:
    module = types.ModuleType("openai")
    module.OpenAI = FakeOpenAI  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "openai", module)
    FakeOpenAI.made = []
    return FakeOpenAI


def sent(conn: FakeConnection) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in conn.frames]


def the_client(fake_openai: type[FakeOpenAI], base_url: str, *, api_key: str = "testbed", timeout: float = 600.0,
               design: str = CHAINED, **headers: str) -> FakeOpenAI:
    """The one client made, with the options and headers the SDK run passed it."""
    [client] = fake_openai.made
    assert client.options == {"base_url": base_url, "api_key": api_key, "max_retries": 0, "timeout": timeout}
    assert client.headers == {"OpenAI-Beta": BETA[design], **headers}
    return client


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
def test_an_sdk_rollout_writes_the_harness_requests_and_counts_what_it_wrote(fake_openai, design: str) -> None:
    kind = "response.done" if design == SUSPENDED else "response.completed"
    conn = fake_openai.conn = FakeConnection([turn(kind, "resp_0", CALL), turn("response.completed", "resp_1", ANSWER)])
    ended: list[int] = []
    record = sdk.run_sdk_rollout("http://h:1/v1", design, TASK, metadata={"k": "v"}, on_turn_end=lambda t: ended.append(t.turn))
    assert (record.design, record.workload, record.status, ended) == (design, "sdk-task", "completed", [0, 1])
    assert the_client(fake_openai, "http://h:1/v1", design=design).closed and conn.closed
    base = request_body(TASK, model="gpt-5.4", metadata={"k": "v"}, store=False, include_reasoning=design == CHAINED)
    first = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TASK)}]}]
    outputs = [{"type": "function_call_output", "call_id": "call_1", "output": tool_output_text(TASK, 0, 0)}]
    second = ({"type": "response.append", "input": outputs} if design == SUSPENDED else
              {"type": "response.create", **base, "previous_response_id": "resp_0", "input": outputs})
    assert sent(conn) == [{"type": "response.create", **base, "input": first}, second]
    assert [t.bytes_sent for t in record.turns] == [len(frame) for frame in conn.frames]
    assert [t.bytes_received for t in record.turns] == [sum(len(json.dumps(e)) for e in turn(kind, "resp_0", CALL)),
                                                        sum(len(json.dumps(e)) for e in turn("response.completed", "resp_1", ANSWER))]
    assert [kind for _, direction, kind in record.timeline if direction == "send"] == [
        "response.create", "response.append" if design == SUSPENDED else "response.create"]
    assert record.turns[0].sent_at == record.started_at <= record.turns[0].ended_at <= record.turns[1].sent_at <= record.ended_at
    sends = [at for at, direction, _ in record.timeline if direction == "send"]
    assert record.turns[1].sent_at <= sends[1]  # turn 1 starts when the tool returns, before its request is written
    # The tool's wait, measured: at least its 0.01 s, and inside the gap between turn 0's end and turn 1's start.
    assert 0.01 <= record.turns[0].tool_seconds <= record.turns[1].sent_at - record.turns[0].ended_at
    assert record.turns[1].tool_seconds == 0.0
    assert record.transcript[-1] == {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}


def test_an_error_ends_the_sdk_rollout_with_its_code_and_no_turn_end_and_a_turn_past_its_most_events_raises(
        fake_openai, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_openai.conn = FakeConnection([[{"type": "error", "error": {"code": "invalid_value"}}]])
    ended: list[int] = []
    record = sdk.run_sdk_rollout("http://h:1/v1", SUSPENDED, TASK, metadata={}, on_turn_end=lambda t: ended.append(t.turn))
    assert (record.status, ended, len(record.turns)) == ("error:invalid_value", [], 1)
    monkeypatch.setattr(sdk, "MAX_EVENTS_PER_TURN", 3)
    fake_openai.conn = FakeConnection([[{"type": "response.in_progress"}] * 3 + [{"type": "response.completed"}]])
    with pytest.raises(RuntimeError, match=r"^more than 3 events in one turn$"):
        sdk.run_sdk_rollout("http://h:1/v1", CHAINED, TASK, metadata={})


def test_without_the_sdks_send_the_bytes_are_our_own_encoding(fake_openai) -> None:
    conn = fake_openai.conn = FakeConnection([turn("response.done", "resp_0", CALL), turn("response.completed", "resp_0", ANSWER)],
                                             counted=False)
    record = sdk.run_sdk_rollout("http://h:1/v1", SUSPENDED, TASK, metadata={})
    assert [t.bytes_sent for t in record.turns] == [len(json.dumps(event).encode()) for event in sent(conn)]


RUNS = {"rollout": lambda timeout: sdk.run_sdk_rollout("http://h:1/v1", CHAINED, TASK, metadata={}, timeout=timeout),
        "lanes": lambda timeout: sdk.run_sdk_lanes("http://h:3/v1", [TASK], metadata_for=lambda i: {}, timeout=timeout)}


@pytest.mark.parametrize("run", ["rollout", "lanes"])
def test_a_run_past_its_timeout_is_closed_and_says_so_and_a_failure_before_it_is_raised_as_it_is(fake_openai, run: str) -> None:
    fake_openai.conn = FakeConnection([]) if run == "rollout" else LaneConnection({"agent-0": [[]]})  # never answered
    with pytest.raises(TimeoutError, match=rf"^SDK {run} did not finish within 0.2 s$"):
        RUNS[run](0.2)
    assert fake_openai.made[0].closed
    conn = fake_openai.conn = FakeConnection([]) if run == "rollout" else LaneConnection({"agent-0": [[]]})
    conn.inbox.put(None)  # the connection ends at once
    with pytest.raises(ConnectionError, match="^closed$"):
        RUNS[run](30)


async def test_from_trio_the_sdk_rollout_runs_in_a_thread_against_the_connectors_address_with_the_callers_options(fake_openai):
    conn = fake_openai.conn = FakeConnection([turn("response.completed", "resp_0", ANSWER)])
    ended: list[int] = []
    with trio.fail_after(10):
        record = await sdk.run_sdk_websocket_rollout(TcpConnector("10.0.0.9", 8123), CHAINED, TASK, metadata={"k": "v"}, model="m",
                                                     store=True, include_timing=True, api_key="k", timeout=9.0,
                                                     on_turn_end=lambda t: ended.append(t.turn))
    assert (record.status, ended) == ("completed", [0])
    timing = {"x-responsesapi-include-timing-metrics": "true"}
    the_client(fake_openai, "http://10.0.0.9:8123/v1", api_key="k", timeout=9.0, **timing)
    assert sent(conn)[0] == {"type": "response.create", **request_body(TASK, model="m", metadata={"k": "v"}, store=True),
                             "input": sent(conn)[0]["input"]}


@pytest.mark.parametrize("connector", [TcpConnector("h", 1, network=object()), object(), types.SimpleNamespace(host="h")],  # type: ignore[arg-type]
                         ids=["with-network", "no-address", "no-port"])
async def test_the_sdk_needs_a_plain_tcp_connector_and_one_of_the_websocket_designs(connector: Any, fake_openai) -> None:
    with pytest.raises(ValueError, match=r"^the SDK client needs a TcpConnector\(host, port\) without a network profile$"):
        await sdk.run_sdk_websocket_rollout(connector, CHAINED, TASK, metadata={})
    with pytest.raises(ValueError, match=r"^design must be 'suspended' or 'chained', not 'http'$"):
        sdk.run_sdk_rollout("http://h:1/v1", "http", TASK, metadata={})


def test_the_rollout_clients_by_name() -> None:
    assert sdk.rollout_client("harness") is run_websocket_rollout
    assert sdk.rollout_client("sdk") is sdk.run_sdk_websocket_rollout
    with pytest.raises(ValueError, match=r"^unknown rollout client 'x'; choose one of \['harness', 'sdk'\]$"):
        sdk.rollout_client("x")


class LaneConnection(FakeConnection):
    """Replies per lane: each create on `stream_id` is answered by that lane's next reply."""

    def __init__(self, replies: dict[str, list[list[dict[str, Any]]]]) -> None:
        super().__init__([])
        self.lane_replies = replies

    def _write(self, data: str) -> None:
        self.frames.append(data)
        lane = json.loads(data)["stream_id"]
        for event in self.lane_replies[lane].pop(0):
            self.inbox.put(json.dumps(event).encode())


def test_lanes_run_each_task_on_its_own_stream_id_and_a_lane_that_gets_an_error_ends_with_its_code(fake_openai) -> None:
    conn = fake_openai.conn = LaneConnection({
        "agent-0": [turn("response.completed", "resp_a0", CALL, stream_id="agent-0"),
                    turn("response.completed", "resp_a1", ANSWER, stream_id="agent-0")],
        "agent-1": [turn("response.completed", "resp_b0", ANSWER, stream_id="agent-1")],
    })
    tasks = [TASK, fixed(1, initial_prompt_tokens=7, output_tokens=5, name="one-turn")]
    records = sdk.run_sdk_lanes("http://h:3/v1", tasks, metadata_for=lambda i: {"lane": str(i)}, model="m", api_key="k", timeout=20.0)
    assert [(r.design, r.workload, r.status, len(r.turns), r.response_ids) for r in records] == [
        ("chained", "sdk-task", "completed", 2, ["resp_a0", "resp_a1"]), ("chained", "one-turn", "completed", 1, ["resp_b0"])]
    assert the_client(fake_openai, "http://h:3/v1", api_key="k", timeout=20.0).closed
    frames = sent(conn)
    outputs = [{"type": "function_call_output", "call_id": "call_1", "output": tool_output_text(TASK, 0, 0)}]
    assert frames == [
        {"type": "response.create", **request_body(TASK, model="m", metadata={"lane": "0"}, store=False),
         "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TASK)}]}],
         "stream_id": "agent-0"},
        {"type": "response.create", **request_body(tasks[1], model="m", metadata={"lane": "1"}, store=False),
         "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(tasks[1])}]}],
         "stream_id": "agent-1"},
        {"type": "response.create", **request_body(TASK, model="m", metadata={"lane": "0"}, store=False),
         "previous_response_id": "resp_a0", "input": outputs, "stream_id": "agent-0"},
    ]
    assert records[0].turns[0].tool_seconds == 0.01 and records[0].turns[1].tool_seconds == 0.0
    assert [t.bytes_sent for r in records for t in r.turns] == [0, 0, 0]  # the SDK's lanes do not count what they send
    assert records[0].turns[1].sent_at - records[0].turns[0].ended_at >= 0.01  # the tool ran before the next create
    assert all(r.started_at <= r.ended_at for r in records)
    # A lane that gets an error ends with its code; the defaults are the harness's.
    fake_openai.made.clear()
    fake_openai.conn = LaneConnection({"agent-0": [[{"type": "error", "stream_id": "agent-0", "error": {"code": "invalid_value"}}]]})
    [record] = sdk.run_sdk_lanes("http://h:3/v1", [TASK], metadata_for=lambda i: {})
    assert record.status == "error:invalid_value"
    the_client(fake_openai, "http://h:3/v1")
    assert json.loads(fake_openai.conn.frames[0])["model"] == "gpt-5.4"


def steer_script(successor_first: str) -> FakeConnection:
    created = {"type": "response.created", "response": {"id": "resp_0"}}
    delta = {"type": "response.output_text.delta", "delta": "a"}
    successor = {"type": "response.created", "response": {"id": "resp_1"}}
    return FakeConnection([[created, delta, delta, delta], [successor, {"type": "response.in_progress"}, {"type": successor_first}]])


def test_a_steer_is_sent_after_its_deltas_and_timed_to_the_successors_first_token(fake_openai) -> None:
    conn = fake_openai.conn = steer_script("response.function_call_arguments.delta")
    began = time.perf_counter()
    result = sdk.run_sdk_steer("http://h:4/v1", metadata={"k": "v"}, text="also this", after_deltas=2, model="m", api_key="k",
                               timeout=10.0)
    whole_run = time.perf_counter() - began
    assert [event["type"] for event in result["events"]] == [
        "response.created", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
        "response.created", "response.in_progress", "response.function_call_arguments.delta"]
    assert 0 <= result["steer_to_token_s"] <= whole_run  # a span inside the run, from the steer to the token
    assert conn.reads_before == [0, 3]  # the steer went after the created event and two deltas
    assert sent(conn) == [
        {"type": "response.create", "model": "m", "metadata": {"k": "v"}, "store": False, "tools": sdk.HARNESS_TOOLS,
         "stream_id": "main", "input": "start the task"},
        {"type": "response.steer", "input": "also this", "previous_response_id": "resp_0"},
    ]
    assert the_client(fake_openai, "http://h:4/v1", api_key="k", timeout=10.0).closed


@pytest.mark.parametrize("end", ["response.steer.failed", "error"])
def test_a_steer_that_fails_ends_without_a_time(fake_openai, end: str) -> None:
    conn = fake_openai.conn = FakeConnection([[{"type": "response.created", "response": {"id": "resp_0"}},
                                               {"type": "response.output_text.delta"}], [{"type": end}]])
    result = sdk.run_sdk_steer("http://h:4/v1", metadata={}, text="t", stream_id=None)
    assert (result["steer_to_token_s"], [e["type"] for e in result["events"]][-1]) == (None, end)
    assert "stream_id" not in sent(conn)[0] and sent(conn)[0]["model"] == "gpt-5.4"
    assert fake_openai.made[0].options["api_key"] == "testbed"


def test_a_steer_without_a_successor_token_times_out(fake_openai) -> None:
    delta = {"type": "response.output_text.delta"}
    fake_openai.conn = FakeConnection([[{"type": "response.created", "response": {"id": "resp_0"}}, delta], []], idle=delta)
    with pytest.raises(TimeoutError, match=r"^no successor token within 0.3 s$"):
        sdk.run_sdk_steer("http://h:4/v1", metadata={}, text="t", timeout=0.3)


async def test_from_trio_the_defaults_are_the_harnesses_and_any_object_with_an_address_will_do(fake_openai) -> None:
    fake_openai.conn = FakeConnection([turn("response.completed", "resp_0", ANSWER)])
    with trio.fail_after(10):
        record = await sdk.run_sdk_websocket_rollout(types.SimpleNamespace(host="h", port=5), SUSPENDED, TASK, metadata={})
    assert record.status == "completed"
    the_client(fake_openai, "http://h:5/v1", design=SUSPENDED)
    first = json.loads(fake_openai.conn.frames[0])
    assert (first["model"], first["store"]) == ("gpt-5.4", False)


async def test_a_cancelled_sdk_rollout_leaves_its_blocked_thread_behind(fake_openai) -> None:
    conn = fake_openai.conn = FakeConnection([])  # the server never answers
    with trio.move_on_after(0.1):
        await sdk.run_sdk_websocket_rollout(TcpConnector("h", 1), CHAINED, TASK, metadata={}, timeout=30)
    # Trio returned at once: the thread is still blocked in the SDK's read, inside the connection it has not closed.
    assert (conn.reads, conn.closed, len(conn.frames)) == (0, False, 1)
    conn.close()
