"""The API service (prototype/api/service.py, costs.py, checks.py): stage costs on the response's schedule, sprint
switches, the call ledger, ids and owners, stored conversations. Times exact on the autojump clock."""

from __future__ import annotations

import hashlib
import re

import attrs
import numpy as np
import pytest
import trio
from support import SPARK

from prototype import metrics
from prototype.api import render
from prototype.api.checks import SPARK_CONTEXT_WINDOW, CallLedger, fewest_tokens
from prototype.api.costs import (
    AFTER_SPRINT,
    BEFORE_SPRINT,
    ZERO_COSTS,
    ApiCosts,
    SprintCosts,
    SprintSwitches,
    StageCost,
    sprint_costs,
)
from prototype.api.hosted import HostedToolService
from prototype.api.service import ApiService, IdFactory, StageModes, owner_of
from prototype.engine import tokenizer
from prototype.engine.streaming import ContextWindowExceeded
from prototype.protocol.errors import INVALID_FUNCTION_CALL_OUTPUT, ProtocolError
from prototype.protocol.events import CreateRequest
from prototype.protocol.items import Compaction, FunctionCall, FunctionCallOutput, Message, Reasoning, WebSearchCall
from prototype.protocol.response import Response

USER = Message("user", (("input_text", "fix it"),))

# --- what a stage costs -----------------------------------------------------------------------------------


def test_a_stage_costs_its_fixed_share_plus_its_rate_per_thousand_tokens() -> None:
    stage = StageCost(fixed=0.010, per_ktok=2.0)
    assert [stage.seconds(0), stage.seconds(500), stage.seconds(500, 0.25), stage.seconds(1500, 0.0)] == [
        0.010, 0.010 + 1.0, 0.0025 + 1.0, 3.0]


EXTRA = SprintCosts(config_load=0.020, intermediate_hop=0.030, slow_safety_fixed=0.050, slow_safety_per_ktok=0.004)


def test_each_sprint_switch_adds_back_only_its_own_cost() -> None:
    costs = ApiCosts()
    route, safety = costs.route, costs.safety
    assert sprint_costs(costs, AFTER_SPRINT, EXTRA) is costs
    slow_safety = StageCost(safety.fixed + 0.050, safety.per_ktok + 0.004)
    for switches, expected in ((SprintSwitches(cross_request_render_cache=False), {"route": StageCost(route.fixed + 0.020, route.per_ktok)}),
                               (SprintSwitches(direct_inference_hop=False), {"route": StageCost(route.fixed + 0.030, route.per_ktok)}),
                               (SprintSwitches(fast_safety=False), {"safety": slow_safety}),
                               (BEFORE_SPRINT, {"route": StageCost(route.fixed + 0.020 + 0.030, route.per_ktok), "safety": slow_safety})):
        assert sprint_costs(costs, switches, EXTRA) == attrs.evolve(costs, **expected)
    # Without an explicit `extra`, the documented defaults are added.
    assert sprint_costs(costs, BEFORE_SPRINT) == sprint_costs(costs, BEFORE_SPRINT, SprintCosts())
    assert sprint_costs(costs, BEFORE_SPRINT).route.fixed == route.fixed + SprintCosts().config_load + SprintCosts().intermediate_hop


# --- the checks' call ledger: the policy's turn and the offset of call ids -----------------------------


def call(call_id: str) -> FunctionCall:
    return FunctionCall(call_id, "shell", "{}", id=f"fc_{call_id}")


def user(text: str = "fix the bug") -> Message:
    return Message("user", (("input_text", text),))


def turn_after(*items) -> int:
    ledger = CallLedger()
    ledger.absorb(items)
    return ledger.turn


def test_a_round_of_parallel_calls_is_one_turn_and_a_user_message_starts_the_turns_again() -> None:
    assert turn_after(user()) == 0
    assert turn_after(user(), call("a"), call("b"), FunctionCallOutput("a", "x"), FunctionCallOutput("b", "y")) == 1
    # Any other item between two outputs ends the round: the next output starts another...
    between = (Reasoning("rs_1", "hm"), Message("developer", (("input_text", "note"),)))
    assert turn_after(user(), call("a"), call("b"), FunctionCallOutput("a", "x"), *between, FunctionCallOutput("b", "y")) == 2
    # ... but one between a call and its output does not keep the output from ending its round.
    assert turn_after(user(), call("a"), Message("developer", (("input_text", "note"),)), FunctionCallOutput("a", "x")) == 1
    assert turn_after(user(), call("a"), FunctionCallOutput("a", "x"), call("b"), FunctionCallOutput("b", "y")) == 2
    done = [user(), call("a"), FunctionCallOutput("a", "x"), Message("assistant", (("output_text", "fixed"),))]
    assert (turn_after(*done), turn_after(*done, user("and the next one"))) == (1, 0)
    assert turn_after(*done, Message("developer", (("input_text", "go on"),))) == 1


def test_a_compaction_carries_the_rounds_and_offset_it_summarized() -> None:
    ledger = CallLedger()
    ledger.absorb([user(), call("a"), FunctionCallOutput("a", "x")])
    ledger.absorb([Compaction("cmp_1", "summary", rounds=4, offset=9)])
    assert (ledger.turn, ledger.offset) == (4, 9)
    # An output right after it (its call in the summarized rounds' ledger) is a round of its own.
    ledger.absorb([call("b")])
    ledger.absorb([Compaction("cmp_2", "summary", rounds=5, offset=11), FunctionCallOutput("b", "y")])
    assert (ledger.turn, ledger.offset) == (6, 11)


TWICE = "function_call_output for call_id 'a' answered twice."


@pytest.mark.parametrize(("items", "start", "message", "param"), [
    # The public API's message and param (400 bodies quoted in microsoft/vscode#320060, continuedev/continue#10092).
    ([user(), FunctionCallOutput("zz", "x")], 3, "No tool call found for function call output with call_id zz.", "input"),
    ([FunctionCallOutput("a", "again")], 3, TWICE, "input[3]"),  # placed by `start`, the items' first index in the input
    ([user(), Message("developer", (("input_text", "again"),)), FunctionCallOutput("a", "again")], 3, TWICE, "input[5]"),
    ([FunctionCallOutput("a", "again")], None, TWICE, "input[0]"),  # no start: the items begin the input
])
def test_an_output_whose_call_is_unknown_or_answered_is_refused_as_the_public_api_or_with_its_place(items, start, message, param) -> None:
    ledger = CallLedger()
    ledger.absorb([user(), call("a"), FunctionCallOutput("a", "x")])
    with pytest.raises(ProtocolError) as refused:
        ledger.absorb(items) if start is None else ledger.absorb(items, start=start)
    assert (refused.value.code, refused.value.message, refused.value.param) == (INVALID_FUNCTION_CALL_OUTPUT, message, param)


# --- the service: ids, owners, the stages on the schedule, stored conversations ---------------------------


def test_ids_are_the_kind_the_servers_prefix_and_a_six_digit_count_from_one():
    new_id = IdFactory("p")
    assert [new_id("resp"), new_id("msg"), new_id("resp")] == ["resp_p000001", "msg_p000002", "resp_p000003"]
    drawn = IdFactory()
    first = drawn("resp")
    assert re.fullmatch(r"resp_[0-9a-f]{12}000001", first)
    assert IdFactory()("resp")[:17] != first[:17]  # another server's prefix
    assert IdFactory("")("x") == "x_000001"


def test_an_owner_is_a_digest_of_the_key_never_the_key():
    assert owner_of(None) is None and owner_of("") is None
    assert owner_of("sk-alice") == hashlib.sha256(b"sk-alice").hexdigest()[:32]
    assert len(owner_of("sk-alice")) == 32 and owner_of("sk-bob") != owner_of("sk-alice")


def test_session_serials_count_from_one_per_service():
    api = ApiService()
    assert ([api.new_session_serial(), api.new_session_serial()], ApiService().new_session_serial()) == ([1, 2], 1)


async def test_a_client_sent_search_without_a_result_takes_the_hosted_services(autojump_clock):
    hosted = HostedToolService()
    hosted.results["ws_1"] = "ten results"
    items = [USER, WebSearchCall("ws_1", "q"), WebSearchCall("ws_2", "q", result="mine"), WebSearchCall("ws_3", "q")]
    context = await ApiService(costs=ZERO_COSTS, hosted=hosted).pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", tuple(items)), items)
    assert context.items == [USER, WebSearchCall("ws_1", "q", result="ten results"), WebSearchCall("ws_2", "q", result="mine"),
                             WebSearchCall("ws_3", "q")]


async def test_stages_run_back_to_back_from_the_responses_schedule(autojump_clock):
    api = ApiService(costs=attrs.evolve(ZERO_COSTS, validate=StageCost(fixed=0.5), render=StageCost(fixed=0.25), safety=StageCost(),
                                        route=StageCost(fixed=0.125)))
    log = metrics.PhaseLog()
    await trio.sleep(1.0)
    await api.pre_inference(log, CreateRequest("sim-10", (USER,)), [USER])
    assert (log.spans, log.schedule, trio.current_time()) == ([
        (metrics.VALIDATE, 1.0, 1.5), (metrics.RENDER, 1.5, 1.75), (metrics.SAFETY, 1.75, 1.75), (metrics.ROUTE, 1.75, 1.875)], 1.875, 1.875)
    log = metrics.PhaseLog()
    log.schedule = 0.5  # behind the clock: the stages start there, and end in the past at once
    await api.pre_inference(log, CreateRequest("sim-10", (USER,)), [USER])
    assert (log.spans[0], log.spans[-1], log.schedule, trio.current_time()) == (
        (metrics.VALIDATE, 0.5, 1.0), (metrics.ROUTE, 1.25, 1.375), 1.375, 1.875)


async def test_a_stored_conversation_is_rebuilt_from_its_last_compaction_at_one_read_per_turn(autojump_clock):
    api = ApiService(costs=attrs.evolve(ZERO_COSTS, store_read_per_turn=0.25))
    put = api.store.put
    put("resp_1", previous_response_id=None, owner="o", created_at=0.0, input=[USER], output=[FunctionCallOutput("x", "1")], response={})
    put("resp_2", previous_response_id="resp_1", owner="o", created_at=0.0, input=[Compaction("cmp_1", "summary")],
        output=[FunctionCallOutput("y", "2")], response={})
    log = metrics.PhaseLog()
    history = await api.load_stored_history(log, "resp_2", "o")
    assert history == [USER, Compaction("cmp_1", "summary"), FunctionCallOutput("y", "2")]
    assert log.spans == [(metrics.STORE_READ, 0.0, 0.5)] and trio.current_time() == 0.5
    assert await api.load_stored_history(log, "resp_2", "other") is None
    assert await api.load_stored_history(log, "resp_9", "o") is None
    assert len(log.spans) == 1 and trio.current_time() == 0.5  # nothing charged for what is not stored


async def test_post_inference_stores_what_the_response_adds_and_takes_its_cost(autojump_clock):
    api = ApiService(costs=attrs.evolve(ZERO_COSTS, post=0.5))
    request = CreateRequest("sim-10", (USER,), previous_response_id="resp_0")
    response = Response("resp_1", request, 7, status="completed")
    log = metrics.PhaseLog()
    added = [FunctionCallOutput("c", "ok")]
    await trio.sleep(1.0)
    await api.post_inference(log, response, added, owner="o")
    turn = api.store.get("resp_1")
    assert (turn.previous_response_id, turn.owner, turn.input, turn.output, turn.response) == (
        "resp_0", "o", (USER,), (FunctionCallOutput("c", "ok"),), response.to_dict())
    assert log.spans == [(metrics.POST, 1.0, 1.5)]
    unstored = Response("resp_2", attrs.evolve(request, store=False), 7)
    await api.post_inference(log, unstored, added, phase="late")
    assert api.store.get("resp_2") is None and log.spans[-1] == ("late", 1.5, 2.0)
    free = ApiService(costs=ZERO_COSTS)
    await free.post_inference(log, response, added)
    assert log.spans[-1] == (metrics.POST, 2.0, 2.0) and free.store.get("resp_1").owner is None


async def test_instructions_are_rendered_into_the_prompt_and_a_change_renders_it_anew(autojump_clock):
    api = ApiService(costs=ZERO_COSTS)
    plain = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", (USER,)), [USER])
    told = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", (USER,), instructions="be brief " * 20), [USER])
    assert len(told.prompt) > len(plain.prompt) + 20
    modes = StageModes(incremental_checks=True, append_render=True, reuse_route=True, fixed_share=1.0)
    again = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", ()), [], base=told, modes=modes)
    assert again.prompt.ids == plain.prompt.ids  # the instructions dropped: rendered anew without them


async def test_a_chained_turn_with_incremental_checks_off_checks_the_whole_conversation_again(autojump_clock):
    costs = attrs.evolve(ZERO_COSTS, validate=StageCost(per_ktok=1.0))  # 1 ms a token checked
    api = ApiService(costs=costs)
    first = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", (USER,)), [USER])
    first.items.append(FunctionCall("call_1", "shell", "{}"))
    first.ledger.absorb([FunctionCall("call_1", "shell", "{}")])
    full = StageModes(incremental_checks=False, append_render=True, reuse_route=True, fixed_share=1.0)
    log = metrics.PhaseLog()
    answer = FunctionCallOutput("call_1", "ok")
    context = await api.pre_inference(log, CreateRequest("sim-10", (answer,)), [answer], base=first, modes=full)
    (validate,) = [span for span in log.spans if span[0] == metrics.VALIDATE]
    assert validate[2] - validate[1] == len(context.prompt) / 1000  # every token checked again
    assert list(context.ledger.calls) == ["call_1"]
    with pytest.raises(ProtocolError):  # answered twice: the rebuilt ledger still knows
        await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", (answer,)), [answer], base=context, modes=full)


async def test_rendering_is_charged_for_the_tokens_a_turn_renders(autojump_clock):
    # 1 ms a token rendered, 2 ms a token checked
    api = ApiService(costs=attrs.evolve(ZERO_COSTS, render=StageCost(per_ktok=1.0), validate=StageCost(per_ktok=2.0)))

    def rendered(log: metrics.PhaseLog, phase: str = metrics.RENDER) -> float:
        (span,) = [span for span in log.spans if span[0] == phase]
        return span[2] - span[1]

    task = Message("user", (("input_text", "fix the failing test in the parser " * 8),))
    call = FunctionCall("call_1", "shell", "{}")
    answer = FunctionCallOutput("call_1", "ok")
    log = metrics.PhaseLog()
    first = await api.pre_inference(log, CreateRequest("sim-10", (task,)), [task])
    assert rendered(log) == pytest.approx(len(first.prompt) / 1000)  # a first turn renders everything
    assert rendered(log, metrics.VALIDATE) == pytest.approx(2 * len(first.prompt) / 1000)  # and checks everything
    first.items.append(call)
    first.ledger.absorb([call])
    appended = StageModes(incremental_checks=True, append_render=True, reuse_route=True, fixed_share=1.0)
    log = metrics.PhaseLog()
    await api.pre_inference(log, CreateRequest("sim-10", (answer,)), [answer], base=first, modes=appended)
    new_tokens = len(render.render_items([answer]))  # only the new item's tokens
    assert (rendered(log, metrics.VALIDATE), rendered(log)) == pytest.approx((2 * new_tokens / 1000, new_tokens / 1000))

    # The http design's render cache: a rebuilt conversation tokenizes only what the cache has not seen.
    cache = render.RenderCache()
    log = metrics.PhaseLog()
    whole = await api.pre_inference(log, CreateRequest("sim-10", (task,)), [task], render_cache=cache)
    assert rendered(log) == pytest.approx(len(whole.prompt) / 1000)
    log = metrics.PhaseLog()
    again = await api.pre_inference(log, CreateRequest("sim-10", (answer,)), [answer], history=[task, call], render_cache=cache)
    assert 0 < rendered(log) < len(again.prompt) / 1000


async def test_each_stage_pays_its_whole_fixed_cost_unless_the_turn_reuses_its_earlier_form(autojump_clock):
    """A stage's fixed cost is paid at the turn's share only where the turn extends earlier state in its cheap form
    (incremental checks, an appended prompt, the same route for the same model and workload); routing costs no tokens."""
    api = ApiService(costs=attrs.evolve(ZERO_COSTS, validate=StageCost(fixed=2.0), render=StageCost(fixed=4.0),
                                        safety=StageCost(fixed=8.0), route=StageCost(fixed=1.0, per_ktok=1000.0)))

    def charged(log: metrics.PhaseLog) -> dict[str, float]:
        return {phase: end - start for phase, start, end in log.spans}

    log = metrics.PhaseLog()
    context = await api.pre_inference(log, CreateRequest("sim-10", (USER,)), [USER])
    assert charged(log) == {metrics.VALIDATE: 2.0, metrics.RENDER: 4.0, metrics.SAFETY: 8.0, metrics.ROUTE: 1.0}
    first_route = context.route

    async def turn(n: int, modes: StageModes, model: str = "sim-10") -> dict[str, float]:
        call = FunctionCall(f"call_{n}", "shell", "{}")
        context.items.append(call)
        context.ledger.absorb([call])
        answer = FunctionCallOutput(f"call_{n}", "ok")
        log = metrics.PhaseLog()
        await api.pre_inference(log, CreateRequest(model, (answer,)), [answer], base=context, modes=modes)
        return charged(log)

    cheap = StageModes(incremental_checks=True, append_render=True, reuse_route=True, fixed_share=0.25)
    assert await turn(1, cheap) == {metrics.VALIDATE: 0.5, metrics.RENDER: 1.0, metrics.SAFETY: 2.0, metrics.ROUTE: 0.25}
    assert context.route is first_route  # the cached decision, not a new one
    # Another model: routed again, at the whole fixed cost.
    assert (await turn(2, cheap, model="sim-20"))[metrics.ROUTE] == 1.0
    assert context.route is not first_route and context.route.latency.decode_tokens_per_s == 20.0
    rerouted = context.route
    # Reuse switched off: routed again though nothing changed.
    assert (await turn(3, attrs.evolve(cheap, reuse_route=False), model="sim-20"))[metrics.ROUTE] == 1.0
    assert context.route is not rerouted and context.route.key == rerouted.key
    # Full checks and a full render: their whole fixed costs, the route still at the share.
    full_forms = attrs.evolve(cheap, incremental_checks=False, append_render=False)
    assert await turn(4, full_forms, model="sim-20") == {
        metrics.VALIDATE: 2.0, metrics.RENDER: 4.0, metrics.SAFETY: 8.0, metrics.ROUTE: 0.25}
    assert (await turn(5, attrs.evolve(cheap, append_render=False), model="sim-20"))[metrics.RENDER] == 4.0
    assert (await turn(6, attrs.evolve(cheap, incremental_checks=False), model="sim-20"))[metrics.VALIDATE] == 2.0


@pytest.mark.parametrize("within_response", [False, True])
async def test_input_that_cannot_fit_however_it_tokenizes_is_refused_by_the_bound_as_the_input_it_joins(autojump_clock, within_response):
    # 40,000 "x" are at least 5,000 tokens (cl100k's longest run of "x" in one token is 8): more than the room a
    # 125,000-token prompt leaves in Spark's window, so they are refused before they are tokenized. Joining a response
    # under way they fail that response instead of a 400, reporting the prompt they extend plus the bound.
    api = ApiService(costs=ZERO_COSTS)
    long_task = Message("user", (("input_text", tokenizer.text_of(np.random.default_rng(1), 125_000)),))
    first = await api.pre_inference(metrics.PhaseLog(), CreateRequest(SPARK, (long_task,)), [long_task])
    first.items.append(call("call_1"))
    first.ledger.absorb([call("call_1")])
    answer = FunctionCallOutput("call_1", "x" * 40_000)
    room = SPARK_CONTEXT_WINDOW - len(first.prompt)
    appended = StageModes(incremental_checks=True, append_render=True, reuse_route=True, fixed_share=1.0)
    with pytest.raises(ContextWindowExceeded if within_response else ProtocolError) as refused:
        await api.pre_inference(metrics.PhaseLog(), CreateRequest(SPARK, (answer,)), [answer], base=first, modes=appended,
                                within_response=within_response)
    if within_response:
        bound = len(first.prompt) + fewest_tokens([render.item_text(answer)], room)
        assert (refused.value.tokens, refused.value.window) == (bound, SPARK_CONTEXT_WINDOW)
    else:
        assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "input")
