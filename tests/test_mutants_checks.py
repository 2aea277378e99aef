"""The per-request checks' call ledger (api/checks.py): the policy's turn index and the offset of
call ids, as a fold over the conversation's items. Written against the survivors of the mutation
run (docs/mutation.md)."""

from __future__ import annotations

import pytest

from prototype.api.checks import CallLedger
from prototype.protocol.errors import INVALID_FUNCTION_CALL_OUTPUT, ProtocolError
from prototype.protocol.items import Compaction, FunctionCall, FunctionCallOutput, Message, Reasoning


def call(call_id: str) -> FunctionCall:
    return FunctionCall(call_id, "shell", "{}", id=f"fc_{call_id}")


def user(text: str = "fix the bug") -> Message:
    return Message("user", (("input_text", text),))


def turn_after(*items) -> int:
    ledger = CallLedger()
    ledger.absorb(items)
    return ledger.turn


def test_a_round_of_parallel_calls_is_one_turn() -> None:
    assert turn_after(user()) == 0
    assert turn_after(user(), call("a"), call("b"), FunctionCallOutput("a", "x"), FunctionCallOutput("b", "y")) == 1
    # Any other item between two outputs ends the round: the next output starts another...
    between = (Reasoning("rs_1", "hm"), Message("developer", (("input_text", "note"),)))
    assert turn_after(user(), call("a"), call("b"), FunctionCallOutput("a", "x"), *between, FunctionCallOutput("b", "y")) == 2
    # ... but one between a call and its output does not keep the output from ending its round.
    assert turn_after(user(), call("a"), Message("developer", (("input_text", "note"),)), FunctionCallOutput("a", "x")) == 1
    rounds = [user(), call("a"), FunctionCallOutput("a", "x"), call("b"), FunctionCallOutput("b", "y")]
    assert turn_after(*rounds) == 2


def test_a_user_message_starts_the_turns_again_and_other_roles_do_not() -> None:
    done = [user(), call("a"), FunctionCallOutput("a", "x"), Message("assistant", (("output_text", "fixed"),))]
    assert turn_after(*done) == 1
    assert turn_after(*done, user("and the next one")) == 0
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


def test_an_output_whose_call_is_unknown_or_answered_is_refused_as_the_public_api_or_with_its_place() -> None:
    ledger = CallLedger()
    ledger.absorb([user(), call("a"), FunctionCallOutput("a", "x")])
    cases = [
        # The public API's message and param (400 bodies quoted in microsoft/vscode#320060, continuedev/continue#10092).
        ([user(), FunctionCallOutput("zz", "x")], "No tool call found for function call output with call_id zz.", "input"),
        ([FunctionCallOutput("a", "again")], "function_call_output for call_id 'a' answered twice.", "input[3]"),
    ]
    for items, message, param in cases:
        with pytest.raises(ProtocolError) as refused:
            ledger.absorb(items, start=3)  # the items' first index in the request's input
        assert (refused.value.code, refused.value.message, refused.value.param) == (INVALID_FUNCTION_CALL_OUTPUT, message, param)


def test_an_answered_twice_output_is_placed_by_its_offset_after_start_which_defaults_to_0() -> None:
    ledger = CallLedger()
    ledger.absorb([user(), call("a"), FunctionCallOutput("a", "x")])
    with pytest.raises(ProtocolError) as refused:
        ledger.absorb([user(), Message("developer", (("input_text", "again"),)), FunctionCallOutput("a", "again")], start=3)
    assert refused.value.param == "input[5]"
    with pytest.raises(ProtocolError) as refused:
        ledger.absorb([FunctionCallOutput("a", "again")])  # no start: the items begin the input
    assert refused.value.param == "input[0]"
