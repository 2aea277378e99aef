"""A hosted web_search inside a response: its time is the `hosted_tool` phase, its query's hidden sampling `decode`
and output tokens; times exact at zero API costs and 1000 tokens/s (the wire rounds spans to the microsecond)."""

from __future__ import annotations

import attrs
import pytest
import trio
from support import create_event, make_server, send, until, ws

from prototype.api.hosted import HostedToolService
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.engine import tokenizer
from prototype.engine.latency import LatencyModel
from prototype.engine.policy import PlannedSearch
from prototype.engine.streaming import EngineFailure
from prototype.workload import HostedCall, TurnSpec, Workload

SEARCH_SECONDS = 2.5
WORKLOAD = Workload("hosted", 1, (TurnSpec(500, 20, (0.3,), (HostedCall(SEARCH_SECONDS, 100),)), TurnSpec(50, 20, ())))
DECODE = LatencyModel(decode_tokens_per_s=1000.0)


def ms(seconds: float):
    return pytest.approx(1000 * seconds, abs=5e-4)


def tokens(text: str) -> int:
    return len(tokenizer.encoding().encode_ordinary(text))


def hosted_request(server, **fields) -> dict:
    key, tools = server.api.workloads.register(WORKLOAD), create_event()["tools"] + [{"type": "web_search"}]
    return create_event(metadata={"testbed_workload": key, "testbed_decode_tps": "1000"}, tools=tools, **fields)


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_a_hosted_search_is_timed_as_hosted_tool_after_its_hidden_decode(autojump_clock, design: str):
    server = make_server()
    async with ws(server, design, include_timing=True) as conn:
        await send(conn, hosted_request(server))
        response = (await until(conn, "response.completed", "response.done"))[-1]["response"]
    search, message, call = response["output"]
    assert search["type"] == "web_search_call" and search["status"] == "completed"
    query, timing = search["action"]["query"], response["testbed_timing"]
    assert timing["phases_ms"]["hosted_tool"] == ms(SEARCH_SECONDS)
    # The query is sampled, not streamed: one decode span of its tokens right before the search.
    spans = timing["spans"]
    hosted = next(i for i, span in enumerate(spans) if span[0] == "hosted_tool")
    hidden = spans[hosted - 1]
    assert hidden[0] == "decode" and hidden[2] - hidden[1] == ms(DECODE.decode_seconds(tokens(query)))
    assert spans[hosted][1] == hidden[2] and spans[hosted][2] - spans[hosted][1] == ms(SEARCH_SECONDS)
    # Every output token is counted once: the hidden query, the message's words, the call's arguments.
    assert response["usage"]["output_tokens"] == tokens(query) + 20 + tokens(call["arguments"])
    assert message["type"] == "message" and call["type"] == "function_call"


@attrs.define(eq=False)
class FailingSearch(HostedToolService):
    """A hosted tool service whose backend fails after its latency."""

    async def search(self, item_id: str, search: PlannedSearch, seed: int) -> str:
        await trio.sleep(search.seconds)
        raise EngineFailure("the search backend is down")


async def test_a_search_that_fails_leaves_its_in_progress_item_in_the_failed_response(autojump_clock):
    server = make_server(hosted=FailingSearch())
    async with ws(server, CHAINED) as conn:
        await send(conn, hosted_request(server))
        events = await until(conn, "response.failed")
    added = next(e for e in events if e["type"] == "response.output_item.added")
    failed = events[-1]["response"]
    assert failed["error"] == {"code": "server_error", "message": "The engine failed mid-response: the search backend is down"}
    assert failed["output"] == [added["item"]]
    assert added["item"]["type"] == "web_search_call" and added["item"]["status"] == "in_progress" and added["output_index"] == 0


async def test_a_search_takes_its_latency_and_keeps_a_result_of_its_token_count(autojump_clock):
    service, start = HostedToolService(), trio.current_time()
    result = await service.search("ws_1", PlannedSearch("trio docs", 1.5, 40), seed=7)
    assert trio.current_time() - start == pytest.approx(1.5) and isinstance(result, str) and tokens(result) == 40
    assert service.result_for("ws_1") == result and service.result_for("ws_unknown") == ""  # one it never ran: empty


async def test_a_searchs_result_is_drawn_from_its_seed_query_length_and_size(autojump_clock):
    """The same seed (modulo 2**32, any integer), query length and size give the same text in any service (a
    stateless client's resent item rebuilds the same context); any of them changed gives another."""

    async def result(seed: int, query: str = "trio docs", size: int = 40) -> str:
        return await HostedToolService().search("ws_1", PlannedSearch(query, 0.0, size), seed=seed)

    assert await result(7) == await result(7) and await result(-1) == await result(2**32 - 1)
    assert await result(2**32 + 7) == await result(7)
    others = {await result(6), await result(7, query="trio doc"), await result(7, size=41), await result(8)}
    assert await result(7) not in others and len(others) == 4


async def test_the_service_keeps_the_newest_results_up_to_its_bound(autojump_clock, monkeypatch):
    monkeypatch.setattr("prototype.api.hosted.MAX_KEPT_RESULTS", 3)
    service, results = HostedToolService(), {}
    for n in range(3):
        results[n] = await service.search(f"ws_{n}", PlannedSearch("q", 0.0, 5), seed=n)
    assert [service.result_for(f"ws_{n}") for n in range(3)] == [results[0], results[1], results[2]]
    results[3] = await service.search("ws_3", PlannedSearch("q", 0.0, 5), seed=3)
    assert list(service.results) == ["ws_1", "ws_2", "ws_3"]
    assert service.result_for("ws_0") == "" and service.result_for("ws_3") == results[3]
