"""Retention policies (engine/memory.py): the values a policy takes, `--policy` text, and each bad value's error."""

from __future__ import annotations

import math

import pytest

from prototype.engine import memory
from prototype.engine.memory import DISCARD_POLICY, HOLD_POLICY, SWAP_POLICY, TTL, RetentionPolicy, parse_policy, ttl

UNKNOWN = "unknown retention policy {!r}: use hold, discard, swap, ttl-<s> or pin-<s>"


def error_of(make) -> str:
    with pytest.raises(ValueError) as caught:
        make()
    return str(caught.value)


def test_a_zero_ttl_is_a_policy_and_one_without_seconds_takes_the_engines_ttl():
    policy = RetentionPolicy(TTL, 0.0)
    assert policy.ttl == 0.0 and not policy.pin and policy.label == "ttl-0s"
    assert ttl(0, pin=True).label == "pin-0s"
    assert (RetentionPolicy(TTL).label, RetentionPolicy(TTL, pin=True).label) == ("ttl-kv_ttl", "pin-kv_ttl")


@pytest.mark.parametrize(("seconds", "shown"), [(-1.0, "-1.0"), (-1e-9, "-1e-09"), (math.nan, "nan"), (-math.inf, "-inf")])
def test_a_negative_or_nan_ttl_is_refused(seconds: float, shown: str):
    assert error_of(lambda: RetentionPolicy(TTL, seconds)) == f"ttl must be >= 0, got {shown}"
    assert error_of(lambda: ttl(seconds, pin=True)) == f"ttl must be >= 0, got {shown}"


@pytest.mark.parametrize("kind", [memory.HOLD, memory.DISCARD, memory.SWAP])
def test_ttl_and_pin_belong_to_the_ttl_policy_alone(kind: str):
    assert error_of(lambda: RetentionPolicy(kind, ttl=5.0)) == "ttl and pin apply to the ttl policy only"
    assert error_of(lambda: RetentionPolicy(kind, pin=True)) == "ttl and pin apply to the ttl policy only"
    assert RetentionPolicy(kind).label == kind


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="'kind' must be in"):
        RetentionPolicy("keep")


@pytest.mark.parametrize(("text", "policy"), [
    ("hold", HOLD_POLICY), ("discard", DISCARD_POLICY), ("swap", SWAP_POLICY), ("ttl-300", RetentionPolicy(TTL, 300.0, False)),
    ("pin-300", RetentionPolicy(TTL, 300.0, True)), ("ttl-300s", RetentionPolicy(TTL, 300.0, False)), ("pin-2.5s", RetentionPolicy(TTL, 2.5, True)),
    ("ttl-0", RetentionPolicy(TTL, 0.0, False)), ("ttl-1e-3", RetentionPolicy(TTL, 0.001, False)),  # the kind ends at the first '-'
])
def test_policy_text_parses_to_its_policy(text: str, policy: RetentionPolicy):
    assert parse_policy(text) == policy


@pytest.mark.parametrize("text", ["", "ttl", "ttl-", "pin-", "keep-5", "HOLD", "hold-5", "ttl_300", "-300", "pin"])
def test_malformed_policy_text_gets_the_usage_error(text: str):
    assert error_of(lambda: parse_policy(text)) == UNKNOWN.format(text)


def test_a_negative_ttl_in_policy_text_gets_the_ttl_error():
    assert error_of(lambda: parse_policy("ttl--5")) == "ttl must be >= 0, got -5.0"
    assert error_of(lambda: parse_policy("pin--0.5s")) == "ttl must be >= 0, got -0.5"


def test_policy_labels_parse_back_to_the_same_policy():
    for policy in (HOLD_POLICY, DISCARD_POLICY, SWAP_POLICY, ttl(60), ttl(300, pin=True), ttl(0.25)):
        assert parse_policy(policy.label) == policy
