"""The API service's own pieces held to exact values (docs/mutation.md): ids, owner tags, session
serials, hosted results put back into client-sent items, post-inference storage and its cost, and
a stored conversation's rebuild with its read cost."""

from __future__ import annotations

import hashlib
import re

import attrs
import pytest
import trio

from prototype import metrics
from prototype.api.costs import ZERO_COSTS
from prototype.api.hosted import HostedToolService
from prototype.api.service import ApiService, IdFactory, owner_of
from prototype.protocol.items import Compaction, FunctionCallOutput, Message, WebSearchCall


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
    assert [api.new_session_serial(), api.new_session_serial()] == [1, 2]
    assert ApiService().new_session_serial() == 1


def test_a_client_sent_search_without_a_result_takes_the_hosted_services():
    hosted = HostedToolService()
    hosted.results["ws_1"] = "ten results"
    api = ApiService(hosted=hosted)
    items = [WebSearchCall("ws_1", "q"), WebSearchCall("ws_2", "q", result="mine"), WebSearchCall("ws_3", "q"),
             FunctionCallOutput("c", "ok")]
    assert api._with_hosted_results(items) == [
        WebSearchCall("ws_1", "q", result="ten results"), WebSearchCall("ws_2", "q", result="mine"),
        WebSearchCall("ws_3", "q"), FunctionCallOutput("c", "ok")]


async def test_stages_run_back_to_back_from_the_responses_schedule(autojump_clock):
    api = ApiService(costs=ZERO_COSTS)
    log = metrics.PhaseLog()
    await trio.sleep(1.0)
    await api._charge_stages(log, (("a", 0.5), ("b", 0.25)))
    assert (log.spans, log.schedule, trio.current_time()) == ([("a", 1.0, 1.5), ("b", 1.5, 1.75)], 1.75, 1.75)
    log.schedule = 1.5  # behind the clock: the stages start there, and end in the past at once
    await api._charge_stages(log, (("c", 0.125),))
    assert (log.spans[-1], log.schedule, trio.current_time()) == (("c", 1.5, 1.625), 1.625, 1.75)


async def test_a_stored_conversation_is_rebuilt_from_its_last_compaction_at_one_read_per_turn(autojump_clock):
    api = ApiService(costs=attrs.evolve(ZERO_COSTS, store_read_per_turn=0.25))
    user = Message("user", (("input_text", "fix it"),))
    put = api.store.put
    put("resp_1", previous_response_id=None, owner="o", created_at=0.0, input=[user], output=[FunctionCallOutput("x", "1")], response={})
    put("resp_2", previous_response_id="resp_1", owner="o", created_at=0.0, input=[Compaction("cmp_1", "summary")],
        output=[FunctionCallOutput("y", "2")], response={})
    log = metrics.PhaseLog()
    history = await api.load_stored_history(log, "resp_2", "o")
    assert history == [user, Compaction("cmp_1", "summary"), FunctionCallOutput("y", "2")]
    assert log.spans == [(metrics.STORE_READ, 0.0, 0.5)] and trio.current_time() == 0.5
    assert await api.load_stored_history(log, "resp_2", "other") is None
    assert await api.load_stored_history(log, "resp_9", "o") is None
    assert len(log.spans) == 1 and trio.current_time() == 0.5  # nothing charged for what is not stored


async def test_post_inference_stores_what_the_response_adds_and_takes_its_cost(autojump_clock):
    from prototype.protocol.events import CreateRequest
    from prototype.protocol.response import Response

    api = ApiService(costs=attrs.evolve(ZERO_COSTS, post=0.5))
    user = Message("user", (("input_text", "fix it"),))
    request = CreateRequest("sim-10", (user,), previous_response_id="resp_0")
    response = Response("resp_1", request, 7, status="completed")
    log = metrics.PhaseLog()
    added = [FunctionCallOutput("c", "ok")]
    await trio.sleep(1.0)
    await api.post_inference(log, response, added, owner="o")
    turn = api.store.get("resp_1")
    assert (turn.previous_response_id, turn.owner, turn.input, turn.output, turn.response) == (
        "resp_0", "o", (user,), (FunctionCallOutput("c", "ok"),), response.to_dict())
    assert log.spans == [(metrics.POST, 1.0, 1.5)]
    unstored = Response("resp_2", attrs.evolve(request, store=False), 7)
    await api.post_inference(log, unstored, added, phase="late")
    assert api.store.get("resp_2") is None and log.spans[-1] == ("late", 1.5, 2.0)
    free = ApiService(costs=ZERO_COSTS)
    await free.post_inference(log, response, added)
    assert log.spans[-1] == (metrics.POST, 2.0, 2.0) and free.store.get("resp_1").owner is None


async def test_instructions_are_rendered_into_the_prompt_and_a_change_renders_it_anew(autojump_clock):
    from prototype.api.service import StageModes
    from prototype.protocol.events import CreateRequest

    api = ApiService(costs=ZERO_COSTS)
    user = Message("user", (("input_text", "fix it"),))
    plain = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", (user,)), [user])
    told = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", (user,), instructions="be brief " * 20), [user])
    assert len(told.prompt) > len(plain.prompt) + 20
    modes = StageModes(incremental_checks=True, append_render=True, reuse_route=True, fixed_share=1.0)
    again = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", ()), [], base=told, modes=modes)
    assert again.prompt.ids == plain.prompt.ids  # the instructions dropped: rendered anew without them


async def test_a_chained_turn_with_incremental_checks_off_checks_the_whole_conversation_again(autojump_clock):
    from prototype.api.costs import StageCost
    from prototype.api.service import StageModes
    from prototype.protocol.errors import ProtocolError
    from prototype.protocol.events import CreateRequest
    from prototype.protocol.items import FunctionCall

    costs = attrs.evolve(ZERO_COSTS, validate=StageCost(per_ktok=1.0))  # 1 ms a token checked
    api = ApiService(costs=costs)
    user = Message("user", (("input_text", "fix it"),))
    first = await api.pre_inference(metrics.PhaseLog(), CreateRequest("sim-10", (user,)), [user])
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
    from prototype.api import render
    from prototype.api.costs import StageCost
    from prototype.api.service import StageModes
    from prototype.protocol.events import CreateRequest
    from prototype.protocol.items import FunctionCall

    # 1 ms a token rendered, 2 ms a token checked
    api = ApiService(costs=attrs.evolve(ZERO_COSTS, render=StageCost(per_ktok=1.0), validate=StageCost(per_ktok=2.0)))

    def rendered(log: metrics.PhaseLog, phase: str = metrics.RENDER) -> float:
        (span,) = [span for span in log.spans if span[0] == phase]
        return span[2] - span[1]

    user = Message("user", (("input_text", "fix the failing test in the parser " * 8),))
    call = FunctionCall("call_1", "shell", "{}")
    answer = FunctionCallOutput("call_1", "ok")
    log = metrics.PhaseLog()
    first = await api.pre_inference(log, CreateRequest("sim-10", (user,)), [user])
    assert rendered(log) == pytest.approx(len(first.prompt) / 1000)  # a first turn renders everything
    assert rendered(log, metrics.VALIDATE) == pytest.approx(2 * len(first.prompt) / 1000)  # and checks everything
    first.items.append(call)
    first.ledger.absorb([call])
    appended = StageModes(incremental_checks=True, append_render=True, reuse_route=True, fixed_share=1.0)
    log = metrics.PhaseLog()
    await api.pre_inference(log, CreateRequest("sim-10", (answer,)), [answer], base=first, modes=appended)
    assert rendered(log, metrics.VALIDATE) == pytest.approx(2 * len(render.render_items([answer])) / 1000)
    assert rendered(log) == pytest.approx(len(render.render_items([answer])) / 1000)  # only the new item's tokens

    # The http design's render cache: a rebuilt conversation tokenizes only what the cache has not seen.
    cache = render.RenderCache()
    log = metrics.PhaseLog()
    whole = await api.pre_inference(log, CreateRequest("sim-10", (user,)), [user], render_cache=cache)
    assert rendered(log) == pytest.approx(len(whole.prompt) / 1000)
    log = metrics.PhaseLog()
    again = await api.pre_inference(log, CreateRequest("sim-10", (answer,)), [answer], history=[user, call], render_cache=cache)
    assert 0 < rendered(log) < len(again.prompt) / 1000


async def test_each_stage_pays_its_whole_fixed_cost_unless_the_turn_reuses_its_earlier_form(autojump_clock):
    """A stage's fixed cost is paid at the turn's share only where the turn extends earlier state in that stage's
    cheap form: checks run incrementally, the prompt is appended to, the route is reused (same model and workload);
    routing is charged on no tokens."""
    from prototype.api.costs import StageCost
    from prototype.api.service import StageModes
    from prototype.protocol.events import CreateRequest
    from prototype.protocol.items import FunctionCall

    api = ApiService(costs=attrs.evolve(ZERO_COSTS, validate=StageCost(fixed=2.0), render=StageCost(fixed=4.0),
                                        safety=StageCost(fixed=8.0), route=StageCost(fixed=1.0, per_ktok=1000.0)))

    def charged(log: metrics.PhaseLog) -> dict[str, float]:
        return {phase: end - start for phase, start, end in log.spans}

    user = Message("user", (("input_text", "fix the failing test in the parser"),))
    log = metrics.PhaseLog()
    context = await api.pre_inference(log, CreateRequest("sim-10", (user,)), [user])
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
