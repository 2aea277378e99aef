"""The HTTP client (client/http.py): what each request carries, its connections, and each way an answer can go wrong,
with the reconnect policy's retries (docs/protocol.md §8, docs/metrics.md); against the server or a scripted one."""

from __future__ import annotations

import json
import random
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
from support import make_server
from test_bad_input import first_leaf

from prototype import workload as wl
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import Rollout, RolloutRecord, task_prompt
from prototype.client.http import (
    ConnectionLost,
    ConnectionPool,
    HttpConnection,
    HttpProtocolError,
    continue_http_rollout,
    post_turn,
    request_headers,
    run_http_rollout,
)
from prototype.client.reconnect import ReconnectPolicy
from prototype.client.sse import SseProtocolError
from prototype.netem.faults import FaultyStream, Link, LinkFaults
from prototype.server.config import ServerConfig

WAIT = 100.0  # virtual seconds: every wait of these tests ends far sooner, and a hang fails at once
STEADY = ReconnectPolicy("steady", initial_delay=0.5, max_retries=2)


TASK = wl.fixed(3, initial_prompt_tokens=100, appended_tokens=20, output_tokens=30, tool_seconds=2.0)


class Tapped(trio.abc.Stream):
    """A stream that keeps every byte read from it in `tap`."""

    def __init__(self, inner: trio.abc.Stream, tap: bytearray) -> None:
        self.inner, self.tap = inner, tap

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.tap += data
        return data

    async def send_all(self, data) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class TapConnector:
    """Memory streams to `server`, each connection's bytes as the server read them kept in `taps`."""

    server: Any
    taps: list[bytearray] = attrs.Factory(list)

    @asynccontextmanager
    async def open_stream(self):
        client, server_end = trio.testing.memory_stream_pair()
        tap = bytearray()
        self.taps.append(tap)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.server.handle_stream, Tapped(server_end, tap))
            try:
                yield client
            finally:
                await client.aclose()

    def requests(self) -> list[list[tuple[dict[str, str], dict[str, Any]]]]:
        """Per connection: each request's headers (names in lower case) and JSON body (a JSON text holds no CRLF)."""
        def parse(raw: bytes) -> tuple[dict[str, str], dict[str, Any]]:
            head, _, body = raw.partition(b"\r\n\r\n")
            return {k.lower(): v for k, v in (line.split(": ", 1) for line in head.decode().split("\r\n"))}, json.loads(body)
        return [[parse(raw) for raw in bytes(tap).split(b"POST /v1/responses HTTP/1.1\r\n")[1:]] for tap in self.taps]


async def rollout(**kwargs: Any) -> tuple[RolloutRecord, list[list[tuple[dict[str, str], dict[str, Any]]]]]:
    """TASK's rollout against the server: its record, and each connection's requests as the server read them."""
    server = make_server()
    connector, metadata = TapConnector(server), {"testbed_workload": server.api.workloads.register(TASK)}
    with trio.fail_after(WAIT):
        record = await run_http_rollout(connector, TASK, metadata=metadata, **kwargs)
    return record, connector.requests()


def function_call_outputs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in items if item["type"] == "function_call_output"]


async def test_a_stateless_rollout_resends_the_whole_conversation_on_one_connection(autojump_clock) -> None:
    record, (requests,) = await rollout()
    assert (record.design, record.status, len(record.turns), record.reconnects) == ("http-stateless", "completed", 3, 0)
    headers = [h for h, _ in requests]
    assert headers[0] == {"host": "testbed", "content-length": headers[0]["content-length"], "authorization": "Bearer testbed",
                          "content-type": "application/json", "accept": "text/event-stream", "user-agent": "prototype-harness"}
    bodies = [b for _, b in requests]
    assert [(b["store"], b["stream"], "previous_response_id" in b, b["include"]) for b in bodies] == [
        (False, True, False, ["reasoning.encrypted_content"])] * 3
    # Each request holds the one before it, the answer's output and the tool outputs.
    for before, after in zip(bodies, bodies[1:]):
        assert after["input"][:len(before["input"])] == before["input"]
        assert function_call_outputs(after["input"][len(before["input"]):])
    assert [turn.bytes_sent for turn in record.turns] == [int(h["content-length"]) for h in headers]
    assert [len(json.dumps(b, separators=(",", ":"))) for b in bodies] == [turn.bytes_sent for turn in record.turns]
    assert record.ended_at == trio.current_time() and record.started_at == 0.0
    assert ({b["model"] for b in bodies}, record.workload) == ({"gpt-5.4"}, TASK.name)  # the default model
    # The first request carries the task as one user message.
    assert bodies[0]["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TASK)}]}]


async def test_a_stored_rollout_sends_only_the_tool_outputs_after_the_last_response(autojump_clock) -> None:
    record, (requests,) = await rollout(variant="stored", api_key="key-2", include_timing=True, instructions="be brief",
                                        compact_threshold=5000)
    assert (record.design, record.status, len(requests)) == ("http-stored", "completed", 3)
    headers, bodies = [h for h, _ in requests], [b for _, b in requests]
    assert [(b["instructions"], b["context_management"]) for b in bodies] == [
        ("be brief", [{"type": "compaction", "compact_threshold": 5000}])] * 3
    assert [(h["authorization"], h["x-responsesapi-include-timing-metrics"], "connection" in h) for h in headers] == [
        ("Bearer key-2", "true", False)] * 3
    assert [(b["store"], "include" in b) for b in bodies] == [(True, False)] * 3
    assert "previous_response_id" not in bodies[0]
    assert [b["previous_response_id"] for b in bodies[1:]] == record.response_ids[:2]
    assert all(item["type"] == "function_call_output" for b in bodies[1:] for item in b["input"])
    assert all(turn.server_timing for turn in record.turns)


async def test_without_keep_alive_every_request_asks_to_close_and_opens_its_own_connection(autojump_clock) -> None:
    record, per_connection = await rollout(keep_alive=False)
    assert [len(requests) for requests in per_connection] == [1, 1, 1]
    assert [requests[0][0]["connection"] for requests in per_connection] == ["close"] * 3
    assert (record.status, record.reconnects) == ("completed", 0)


async def test_an_unknown_variant_is_refused(autojump_clock) -> None:
    with pytest.raises(ValueError, match=r"^variant must be one of \('stateless', 'stored'\), not 'chained'$"):
        await rollout(variant="chained")


async def test_a_turn_starts_before_its_request_is_serialized(autojump_clock, monkeypatch) -> None:
    """The client's own work on a request (here 0.25 s to serialize it) is part of its turn (docs/metrics.md)."""
    from types import SimpleNamespace

    from prototype.client import http as client_http

    def slow_dumps(*args: Any, **kwargs: Any) -> str:
        autojump_clock.jump(0.25)
        return json.dumps(*args, **kwargs)

    monkeypatch.setattr(client_http, "json", SimpleNamespace(dumps=slow_dumps, loads=json.loads))
    _, record = await scripted_rollout(completed_answer())
    assert (record.turns[0].sent_at, record.timeline[0]) == (0.0, (0.25, "send", "POST /v1/responses"))


@pytest.mark.parametrize("turn_open", [False, True])
async def test_the_fallback_sends_the_whole_conversation_on_one_connection_and_adds_its_resend_to_an_open_turn(
        autojump_clock, turn_open: bool) -> None:
    """`continue_http_rollout` (Codex's fallback once its WebSocket retries are spent) with the conversation so far. With
    `turn_open`, the turn was recorded on the WebSocket (300 bytes sent there, and sent again once in full): the
    fallback's first request belongs to it, a resend of the whole conversation, and the later turns are its own."""
    server = make_server()
    connector = TapConnector(server)
    metadata = {"testbed_workload": server.api.workloads.register(TASK)}
    rollout_ = Rollout(TASK, RolloutRecord("chained", TASK.name, 0.0))
    first = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TASK)}]}]
    if turn_open:
        rollout_.start_turn(first, 300)
        rollout_.record.resent_bytes, rollout_.record.full_resends = 300, 1
    with trio.fail_after(WAIT):
        await continue_http_rollout(connector, rollout_, [], first, policy=None, model="gpt-5.4", metadata=metadata,
                                    instructions="be brief", api_key="testbed", include_timing=False, turn_open=turn_open)
    (requests,) = connector.requests()
    bodies, sizes, record = [b for _, b in requests], [int(h["content-length"]) for h, _ in requests], rollout_.record
    assert (record.status, len(bodies), len(record.turns)) == ("completed", 3, 3)
    assert [(b["instructions"], b["store"], b["stream"]) for b in bodies] == [("be brief", False, True)] * 3
    assert bodies[0]["input"] == first
    for before, after in zip(bodies, bodies[1:]):
        assert after["input"][:len(before["input"])] == before["input"]
    assert [turn.bytes_sent for turn in record.turns] == [300 * turn_open + sizes[0], *sizes[1:]]
    assert (record.resent_bytes, record.full_resends) == ((300 + sizes[0], 2) if turn_open else (0, 0))


CLOSE = object()  # in a scripted answer: close the connection there


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def completed_answer(status: str = "completed", *, content_type: bytes = b"text/event-stream; charset=utf-8", output=()) -> list:
    """A stream whose one event ends the response with `output` (without calls, the rollout ends with it)."""
    response = {"id": "resp_1", "status": status, "output": list(output)}
    event = {"type": f"response.{status}", "sequence_number": 0, "response": response}
    return [h11.Response(status_code=200, headers=[(b"content-type", content_type), (b"transfer-encoding", b"chunked")]),
            h11.Data(data=sse(event)), h11.EndOfMessage()]


def calling_answer() -> list:
    """A stream whose response asks for one function call (the rollout goes on with its output)."""
    call = {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}", "status": "completed"}
    return completed_answer(content_type=b"text/event-stream", output=[call])


def json_answer(status: int, body: bytes) -> list:
    return [h11.Response(status_code=status, headers=[(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]),
            h11.Data(data=body), h11.EndOfMessage()]


@attrs.define(eq=False)
class Scripted:
    """A server that answers each request with the next answer of `answers` (h11 events, or CLOSE),
    whatever the connection it comes on."""

    answers: list
    connections: int = 0
    requests: list = attrs.Factory(list)  # (connection number, time) of each request read

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        number, conn = self.connections, h11.Connection(h11.SERVER)
        try:
            while self.answers:
                while not isinstance(event := conn.next_event(), h11.EndOfMessage):
                    if isinstance(event, h11.ConnectionClosed):
                        return
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(65536))
                self.requests.append((number, trio.current_time()))
                for item in self.answers.pop(0):
                    if item is CLOSE:
                        return
                    if isinstance(item, float):  # a pause of that many seconds inside the answer
                        await trio.sleep(item)
                        continue
                    if callable(item):  # an action on the link there (a reset: `faulty_rollout`)
                        item()
                        continue
                    await stream.send_all(conn.send(item))
                if conn.our_state is h11.MUST_CLOSE:  # the answer said `Connection: close`
                    return
                conn.start_next_cycle()
            while await stream.receive_some(65536):  # until the client closes
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


ONE_TURN = wl.fixed(1, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5)


RESET = object()  # in a scripted answer: the link is reset there (a TCP RST), every open link cut


async def scripted_rollout(*answers: list, workload: wl.Workload = ONE_TURN, **kwargs: Any):
    server = Scripted([])
    connector = InMemoryConnector(server, faults=LinkFaults())

    def reset() -> None:
        connector.links.cut_all("reset by peer")

    server.answers = [[reset if item is RESET else item for item in answer] for answer in answers]
    with trio.fail_after(WAIT):
        record = await run_http_rollout(connector, workload, metadata={}, **kwargs)
    return server, record


async def scripted_failure(*answers: list, **kwargs: Any) -> BaseException:
    with pytest.raises(BaseExceptionGroup) as raised:
        await scripted_rollout(*answers, **kwargs)
    return first_leaf(raised.value)


CONTINUE = h11.InformationalResponse(status_code=100, headers=[])
STREAM_HEAD = h11.Response(status_code=200, headers=[(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")])
REFUSAL = json.dumps({"error": {"code": "rate_limit_exceeded", "message": "Slow down."}}).encode()
TOO_LARGE = json.dumps({"error": {"code": "request_too_large", "message": "Too large."}}).encode()
FLAT_ERROR = {"type": "error", "code": "server_error", "message": "x", "param": None, "sequence_number": 0}
CREATED = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1", "status": "in_progress", "output": []}}
CLOSING = (b"connection", b"close")
H11_CLOSED = "can't handle event type ConnectionClosed when role=SERVER and state=SEND_RESPONSE"


@pytest.mark.parametrize(("answer", "status", "last"), [
    ([CONTINUE, CONTINUE, *completed_answer()], "completed", (0.0, "recv", "response.completed")),
    (completed_answer("incomplete", content_type=b"text/event-stream"), "incomplete", (0.0, "recv", "response.incomplete")),
    (json_answer(429, REFUSAL), "error:rate_limit_exceeded", (0.0, "recv", "http 429")),
    ([json_answer(429, REFUSAL)[0], h11.Data(data=REFUSAL[:20]), 1.0, h11.Data(data=REFUSAL[20:]), h11.EndOfMessage()],
     "error:rate_limit_exceeded", (1.0, "recv", "http 429")),
    ([STREAM_HEAD, h11.Data(data=sse(FLAT_ERROR)), h11.EndOfMessage()], "error:server_error", (0.0, "recv", "error")),
    ([h11.Response(status_code=413, headers=[*json_answer(413, TOO_LARGE)[0].headers, CLOSING]), h11.Data(data=TOO_LARGE),
      h11.EndOfMessage()], "error:request_too_large", (0.0, "recv", "http 413")),
], ids=["past informational answers", "plain text/event-stream", "an error answer", "an error body in chunks",
        "a flat error event", "an error answer that closes its connection"])
async def test_an_answer_ends_the_rollout_with_its_status(autojump_clock, answer: list, status: str, last: tuple) -> None:
    _, record = await scripted_rollout(answer)
    assert (record.status, record.timeline[-1], record.turns[0].ended_at, record.ended_at, len(record.turns)) == (
        status, last, last[0], last[0], 1)


@pytest.mark.parametrize(("answer", "error", "message"), [
    (json_answer(500, b"oops, not JSON"), HttpProtocolError, "HTTP 500 without an error body: b'oops, not JSON'"),
    (json_answer(502, b'{"no": "error"}'), HttpProtocolError, "HTTP 502 without an error body: b'{\"no\": \"error\"}'"),
    (json_answer(500, b"x" * 300), HttpProtocolError, f"HTTP 500 without an error body: {b'x' * 200!r}"),
    (completed_answer(content_type=b"application/json"), HttpProtocolError,
     "a stream was asked for, got Content-Type 'application/json'"),
    ([h11.Response(status_code=200, headers=[(b"transfer-encoding", b"chunked")]), *completed_answer()[1:]], HttpProtocolError,
     "a stream was asked for, got Content-Type ''"),
    ([STREAM_HEAD, h11.Data(data=sse(CREATED)), h11.EndOfMessage()], SseProtocolError,
     "SSE line 3: the body ends before an end event (response.completed, .failed, .incomplete, error)"),
], ids=["not JSON", "no error in the body", "a long body cut", "JSON for a stream", "no content type", "no terminal event"])
async def test_an_answer_that_breaks_its_framing_is_a_protocol_error(autojump_clock, answer: list, error: type, message: str):
    failure = await scripted_failure(answer)
    assert (type(failure), str(failure)) == (error, message)


@pytest.mark.parametrize(("answers", "message", "answered"), [
    ([[CLOSE]], H11_CLOSED, False),
    ([[STREAM_HEAD, CLOSE]], None, True),
    ([[CONTINUE, CLOSE]], H11_CLOSED, False),  # a `100 Continue` is not the answer
    ([calling_answer(), [STREAM_HEAD, CLOSE], completed_answer()], None, True),  # cut mid-answer: not sent again
    ([[CLOSE], [CLOSE]], H11_CLOSED, False),  # a first request's connection was new: not sent again
], ids=["before any answer", "mid-answer", "after an informational answer", "a reused one mid-answer", "a new one"])
async def test_a_connection_closed_under_a_request_is_lost_saying_whether_an_answer_came(
        autojump_clock, answers: list, message: str | None, answered: bool) -> None:
    failure = await scripted_failure(*answers)
    assert (type(failure), failure.answered) == (ConnectionLost, answered)
    assert message is None or str(failure) == message


@pytest.mark.parametrize(("answers", "reconnects"), [
    ([calling_answer(), [CLOSE], completed_answer()], 1),
    ([calling_answer(), [CONTINUE, CLOSE], completed_answer()], 1),
    ([[h11.Response(status_code=200, headers=[*calling_answer()[0].headers, CLOSING]), *calling_answer()[1:]],
      completed_answer()], 0),
], ids=["closed before any answer", "closed after an informational answer", "an answer that said Connection: close"])
async def test_a_reused_connection_that_closed_before_the_next_answer_is_replaced(autojump_clock, answers: list, reconnects: int):
    server, record = await scripted_rollout(*answers)
    assert (record.status, record.reconnects, server.connections, len(record.turns)) == ("completed", reconnects, 2, 2)


async def test_a_lost_request_is_sent_again_under_the_policy_and_gives_up_after_its_retries(autojump_clock) -> None:
    server, record = await scripted_rollout([CLOSE], [CLOSE], [CLOSE], policy=STEADY)
    assert (record.status, record.reconnects, server.connections) == ("error:gave_up", 2, 3)
    assert [at for _, at in server.requests] == [0.0, 0.5, 1.5]  # 0.5 s, then 1 s of backoff
    sent = record.turns[0].bytes_sent // 3
    assert (record.resent_bytes, record.turns[0].bytes_sent) == (2 * sent, 3 * sent)
    server, record = await scripted_rollout([CLOSE], completed_answer(), policy=STEADY)
    assert (record.status, record.reconnects, record.recovery_seconds, record.retried_responses) == ("completed", 1, [0.5], 0)
    _, record = await scripted_rollout([CLOSE], json_answer(429, REFUSAL), policy=STEADY)  # a refusal ends the recovery
    assert (record.status, record.reconnects, record.recovery_seconds) == ("error:rate_limit_exceeded", 1, [0.5])


async def test_a_failed_response_is_asked_for_again_only_if_the_policy_says_so(autojump_clock) -> None:
    server, record = await scripted_rollout(completed_answer("failed"), completed_answer(), policy=STEADY)
    assert (record.status, record.retried_responses, record.reconnects, server.connections) == ("completed", 1, 0, 1)
    assert (record.recovery_seconds, record.transcript[-1]["role"]) == ([0.5], "user")
    keep = ReconnectPolicy("keep", initial_delay=0.5, max_retries=2, retry_failed_responses=False)
    _, record = await scripted_rollout(completed_answer("failed"), completed_answer(), policy=keep)
    assert (record.status, record.retried_responses) == ("failed", 0)
    _, record = await scripted_rollout(completed_answer("failed"))
    assert record.status == "failed"


async def test_recovery_is_timed_from_the_first_loss_to_the_first_answer_and_each_retry_counted(autojump_clock) -> None:
    head, event, end = completed_answer()
    # Lost at 0 and again at 0.5 (after 0.5 s of backoff); answered at 1.5 (after 1 s more), its end 2 s later.
    server, record = await scripted_rollout([CLOSE], [CLOSE], [head, event, 2.0, end], policy=STEADY)
    assert (record.status, record.reconnects, record.recovery_seconds) == ("completed", 2, [1.5])
    assert (record.turns[0].ended_at, trio.current_time()) == (1.5, 3.5)
    server, record = await scripted_rollout(completed_answer("failed"), completed_answer("failed"), [head, 1.0, event, end], policy=STEADY)
    # Two failed responses asked for again; the turn ends with the third answer, at 0.5 + 1 + 1 (its event after a 1 s pause),
    # and a retried turn forgets what the failed answers set (none of them had a token).
    assert (record.status, record.retried_responses, record.recovery_seconds) == ("completed", 2, [2.5])
    assert (record.turns[0].first_token_at, record.turns[0].ended_at - record.started_at) == (None, 2.5)


async def test_the_backoffs_jitter_is_drawn_from_the_tasks_own_seed(autojump_clock) -> None:
    policy = ReconnectPolicy("jittered", initial_delay=0.5, max_retries=2, jitter=(0.5, 1.5))
    server, record = await scripted_rollout([CLOSE], [CLOSE], completed_answer(), policy=policy)
    rng = random.Random(f"reconnect:http:{ONE_TURN.name}")
    first, second = policy.delay(1, rng), policy.delay(2, rng)
    assert [at for _, at in server.requests] == [0.0, first, first + second]


async def test_a_connection_reset_while_the_answer_is_read_is_lost_with_why_and_whether_any_came(autojump_clock) -> None:
    broke = "the connection broke: the link broke (reset by peer)"
    failure = await scripted_failure([RESET])
    assert (type(failure), str(failure), failure.answered) == (ConnectionLost, broke, False)
    failure = await scripted_failure([completed_answer()[0], 0.5, RESET])  # cut once the head has arrived
    assert (type(failure), str(failure), failure.answered) == (ConnectionLost, broke, True)
    # An error answer cut in its body was answered: the request is not sent again, even on a reused connection.
    error_head = h11.Response(status_code=429, headers=[(b"content-type", b"application/json"), (b"content-length", b"100")])
    failure = await scripted_failure([error_head, h11.Data(data=b'{"error": '), 0.5, RESET])
    assert (type(failure), str(failure), failure.answered) == (ConnectionLost, broke, True)
    failure = await scripted_failure(calling_answer(), [error_head, h11.Data(data=b'{"error": '), 0.5, RESET], completed_answer())
    assert (type(failure), failure.answered) == (ConnectionLost, True)


async def test_a_kept_alive_connection_reset_or_closed_while_idle_is_replaced_when_the_next_request_is_sent(autojump_clock):
    """The link is reset (or the server closes the idle connection) while the tools run: the next request goes on a new one."""
    with_a_tool = wl.fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0)
    server, record = await scripted_rollout([*calling_answer(), 1.0, RESET], completed_answer(), workload=with_a_tool)
    assert (record.status, record.reconnects, server.connections, len(record.turns)) == ("completed", 1, 2, 2)
    assert server.requests == [(1, 0.0), (2, 2.0)]
    three_turns = wl.fixed(3, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=5.0)
    served = make_server(config=ServerConfig(http_idle_timeout=1.0))
    with trio.fail_after(WAIT):
        record = await run_http_rollout(InMemoryConnector(served), three_turns,
                                        metadata={"testbed_workload": served.api.workloads.register(three_turns)})
    assert (record.status, record.reconnects, served.connections_opened) == ("completed", 2, 3)


async def test_a_request_sent_on_a_broken_or_closed_connection_is_lost_unanswered(autojump_clock) -> None:
    rollout_ = Rollout(ONE_TURN, RolloutRecord("http-stateless", ONE_TURN.name, 0.0))
    client, _ = trio.testing.memory_stream_pair()
    link = Link()
    link.cut("reset by peer")
    with pytest.raises(ConnectionLost) as lost:
        await HttpConnection(FaultyStream(client, link, server_side=False), trio.Event()).post(b"{}", [], rollout_)
    assert (str(lost.value), lost.value.answered) == ("the connection broke: the link broke (reset by peer)", False)
    client, _ = trio.testing.memory_stream_pair()
    await client.aclose()
    with pytest.raises(ConnectionLost) as lost:
        await HttpConnection(client, trio.Event()).post(b"{}", [], rollout_)
    assert (str(lost.value), lost.value.answered) == ("the connection broke: virtual connection closed", False)
    assert rollout_.record.timeline == [(0.0, "send", "POST /v1/responses")] * 2


async def test_a_pooled_connection_serves_on_after_an_error_answer_and_closing_the_pool_drops_it(autojump_clock) -> None:
    """The pool as a caller of `post_turn` uses it (experiments/steering.py): a refusal leaves the connection
    reusable; once the pool is closed, the next request opens a new connection."""
    server = Scripted([json_answer(429, REFUSAL), completed_answer(), completed_answer()])
    rollout_ = Rollout(ONE_TURN, RolloutRecord("http-stateless", ONE_TURN.name, 0.0))
    rollout_.start_turn([], 2)
    headers = request_headers(api_key="k", keep_alive=True, include_timing=False)
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            pool = ConnectionPool(nursery, InMemoryConnector(server), keep_alive=True)
            refused = await post_turn(pool, b"{}", headers, rollout_)
            answered = await post_turn(pool, b"{}", headers, rollout_)
            pool.close()
            assert pool.idle is None
            again = await post_turn(pool, b"{}", headers, rollout_)
            pool.close()
    assert (refused["status"], refused["error"]["code"], answered["type"], again["type"]) == (
        429, "rate_limit_exceeded", "response.completed", "response.completed")
    assert [number for number, _ in server.requests] == [1, 1, 2]
