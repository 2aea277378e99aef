"""Which workload and decode rate a request selects (prototype/api/workloads.py), and each refusal's code, message and
parameter at the edges of its range (tests/test_bad_input.py shows them reach a client as 400s)."""

from __future__ import annotations

import pytest

from prototype import workload as wl
from prototype.api.workloads import WorkloadCatalog, decode_rate, decode_rate_override
from prototype.protocol.errors import (
    DECIMAL_ABOVE_MAX_VALUE,
    DECIMAL_BELOW_MIN_VALUE,
    INTEGER_ABOVE_MAX_VALUE,
    INTEGER_BELOW_MIN_VALUE,
    INVALID_VALUE,
    ProtocolError,
)


def refusal(call, *args) -> tuple[str, str, str | None, int]:
    with pytest.raises(ProtocolError) as caught:
        call(*args)
    return caught.value.code, caught.value.message, caught.value.param, caught.value.status


def bad_workload(name: str, code: str = INVALID_VALUE, message: str | None = None) -> tuple[str, str, str, int]:
    """A workload refusal: by default a name that names no workload."""
    if message is None:
        message = (f"{name[:64]!r} names no workload: use a preset (chat, coding, compact, long), "
                   f"fixed:<turns>[:<prompt tokens>[:<appended tokens>[:<output tokens>[:<tool seconds>]]]] or a registered trace key.")
    return code, f"Invalid 'metadata.testbed_workload': {message}", "metadata.testbed_workload", 400


# -- the workload --------------------------------------------------------------------------------------


def test_the_metadata_picks_the_preset_seed_and_task_else_the_catalogs_defaults_give_task_0():
    assert WorkloadCatalog().resolve({}) == wl.generate_one(wl.DEFAULT_PRESET, seed=0, index=0)
    catalog = WorkloadCatalog(default_workload="chat", default_seed=5)
    assert catalog.resolve({}) == wl.generate_one("chat", seed=5, index=0)
    assert catalog.resolve({}) != wl.generate_one("chat", seed=0, index=0)
    catalog = WorkloadCatalog(default_seed=5)
    chosen = catalog.resolve({"testbed_workload": "compact", "testbed_seed": "3", "testbed_task": "2"})
    assert chosen == wl.generate_one("compact", seed=3, index=2)
    assert catalog.resolve({"testbed_workload": "compact", "testbed_task": "1"}) == wl.generate_one("compact", seed=5, index=1)
    assert catalog.resolve({"testbed_workload": "compact", "testbed_seed": "0"}) == wl.generate_one("compact", seed=0, index=0)
    assert catalog.named("compact") == wl.generate_one("compact", seed=5, index=0)  # how `serve` checks its --workload


@pytest.mark.parametrize("key", ["testbed_seed", "testbed_task"])
@pytest.mark.parametrize(("raw", "expected"), [
    ("-1", (INTEGER_BELOW_MIN_VALUE, "-1 is out of range: expected an integer >= 0.")),
    ("x" * 65, (INVALID_VALUE, f"'{'x' * 64}' is not an integer.")),  # a bad value is echoed up to 64 characters
    ("1.5", (INVALID_VALUE, "'1.5' is not an integer.")),
    ("", (INVALID_VALUE, "'' is not an integer.")),
])
def test_a_seed_or_task_below_0_is_out_of_range_and_one_that_is_not_an_integer_invalid(key: str, raw: str, expected: tuple[str, str]):
    code, message = expected
    for name in ("coding", "fixed:2"):
        assert refusal(WorkloadCatalog().resolve, {"testbed_workload": name, key: raw}) == (
            code, f"Invalid 'metadata.{key}': {message}", f"metadata.{key}", 400)


def test_registered_workloads_get_numbered_keys_and_are_returned_as_registered():
    catalog = WorkloadCatalog()
    first, second = wl.fixed(2, name="a"), wl.fixed(3, name="b")
    assert (catalog.register(first), catalog.register(second)) == ("trace:0:a", "trace:1:b")
    assert catalog.resolve({"testbed_workload": "trace:0:a"}) is first
    assert catalog.resolve({"testbed_workload": "trace:1:b", "testbed_seed": "9"}) is second
    assert refusal(WorkloadCatalog().resolve, {"testbed_workload": "trace:0:a"}) == bad_workload("trace:0:a")


@pytest.mark.parametrize(("name", "expected"), [
    ("fixed:2", wl.fixed(2)),
    ("fixed:1", wl.fixed(1)),
    ("fixed:1000", wl.fixed(1000)),
    ("fixed:2:0", wl.fixed(2, initial_prompt_tokens=0)),
    ("fixed:2:1000000:1000000:100000:3600", wl.fixed(2, initial_prompt_tokens=1_000_000, appended_tokens=1_000_000, output_tokens=100_000, tool_seconds=3600.0)),
    ("fixed:3:50:10:1:0", wl.fixed(3, initial_prompt_tokens=50, appended_tokens=10, output_tokens=1, tool_seconds=0.0)),
    ("fixed:3:50:10:5:0.25", wl.fixed(3, initial_prompt_tokens=50, appended_tokens=10, output_tokens=5, tool_seconds=0.25)),
    ("fixed:3:50:0", wl.fixed(3, initial_prompt_tokens=50, appended_tokens=0)),
])
def test_a_fixed_task_takes_each_field_given_and_the_defaults_after(name: str, expected: wl.Workload):
    assert WorkloadCatalog().resolve({"testbed_workload": name}) == expected


FORM = "fixed:<turns>[:<prompt tokens>[:<appended tokens>[:<output tokens>[:<tool seconds>]]]]"


@pytest.mark.parametrize(("name", "message"), [
    ("fixed:", "'fixed:' is not a fixed task: its turns '' is not an integer."),
    ("fixed:x", "'fixed:x' is not a fixed task: its turns 'x' is not an integer."),
    ("fixed:2.0", "'fixed:2.0' is not a fixed task: its turns '2.0' is not an integer."),
    ("fixed:2:1.5", "'fixed:2:1.5' is not a fixed task: its initial_prompt_tokens '1.5' is not an integer."),
    ("fixed:2:5:5:5:" + "x" * 60, f"'fixed:2:5:5:5:{'x' * 50}' is not a fixed task: its tool_seconds '{'x' * 16}' is not a number."),
    ("fixed:2:5:5:5:nan", "'fixed:2:5:5:5:nan' is not a fixed task: its tool_seconds 'nan' is not a number."),
    ("fixed:2:5:5:5:1:1" + ":1" * 24, f"'fixed:2:5:5:5:1{':1' * 24}:' is not a fixed task: {FORM} takes 1 to 5 numbers."),
    ("fixed", None), ("nope", None), ("x" * 100, None),
])
def test_a_malformed_workload_is_an_invalid_value_naming_it(name: str, message: str | None):
    assert refusal(WorkloadCatalog().resolve, {"testbed_workload": name}) == bad_workload(name, INVALID_VALUE, message)


@pytest.mark.parametrize(("name", "code", "message"), [
    ("fixed:0", INTEGER_BELOW_MIN_VALUE, "turns 0 is out of range: a fixed task's turns is 1 to 1000 (in 'fixed:0')."),
    ("fixed:-1", INTEGER_BELOW_MIN_VALUE, "turns -1 is out of range: a fixed task's turns is 1 to 1000 (in 'fixed:-1')."),
    ("fixed:1001", INTEGER_ABOVE_MAX_VALUE, "turns 1001 is out of range: a fixed task's turns is 1 to 1000 (in 'fixed:1001')."),
    ("fixed:" + "0" * 60 + "100000", INTEGER_ABOVE_MAX_VALUE,
     f"turns 100000 is out of range: a fixed task's turns is 1 to 1000 (in 'fixed:{'0' * 58}')."),
    ("fixed:2:-1", INTEGER_BELOW_MIN_VALUE, "initial_prompt_tokens -1 is out of range: a fixed task's initial_prompt_tokens is 0 to 1000000 (in 'fixed:2:-1')."),
    ("fixed:2:1000001", INTEGER_ABOVE_MAX_VALUE, "initial_prompt_tokens 1000001 is out of range: a fixed task's initial_prompt_tokens is 0 to 1000000 (in 'fixed:2:1000001')."),
    ("fixed:2:5:-1", INTEGER_BELOW_MIN_VALUE, "appended_tokens -1 is out of range: a fixed task's appended_tokens is 0 to 1000000 (in 'fixed:2:5:-1')."),
    ("fixed:2:5:1000001", INTEGER_ABOVE_MAX_VALUE, "appended_tokens 1000001 is out of range: a fixed task's appended_tokens is 0 to 1000000 (in 'fixed:2:5:1000001')."),
    ("fixed:2:5:5:0", INTEGER_BELOW_MIN_VALUE, "output_tokens 0 is out of range: a fixed task's output_tokens is 1 to 100000 (in 'fixed:2:5:5:0')."),
    ("fixed:2:5:5:100001", INTEGER_ABOVE_MAX_VALUE, "output_tokens 100001 is out of range: a fixed task's output_tokens is 1 to 100000 (in 'fixed:2:5:5:100001')."),
    ("fixed:2:5:5:-1", INTEGER_BELOW_MIN_VALUE, "output_tokens -1 is out of range: a fixed task's output_tokens is 1 to 100000 (in 'fixed:2:5:5:-1')."),
    ("fixed:2:5:5:5:-1e-07", DECIMAL_BELOW_MIN_VALUE, "tool_seconds -1e-07 is out of range: a fixed task's tool_seconds is 0 to 3600 (in 'fixed:2:5:5:5:-1e-07')."),
    ("fixed:2:5:5:5:3600.5", DECIMAL_ABOVE_MAX_VALUE, "tool_seconds 3600.5 is out of range: a fixed task's tool_seconds is 0 to 3600 (in 'fixed:2:5:5:5:3600.5')."),
])
def test_a_fixed_task_number_out_of_its_range_is_a_range_error_naming_the_range(name: str, code: str, message: str):
    assert refusal(WorkloadCatalog().resolve, {"testbed_workload": name}) == bad_workload(name, code, message)


# -- the decode rate -----------------------------------------------------------------------------------


def test_the_decode_rate_is_the_override_else_the_models():
    assert decode_rate_override({}) is None
    for model, metadata, rate in (("sim-7", {}, 7.0), ("sim-7", {"testbed_decode_tps": "0.5"}, 0.5), ("sim-0.5", {}, 0.5),
                                  ("sim-0", {"testbed_decode_tps": "9999999"}, 9_999_999.0), ("sim-9999999.5", {}, 9_999_999.5),
                                  ("sim-1", {}, 1.0)):
        assert decode_rate(model, metadata) == rate, (model, metadata)


@pytest.mark.parametrize(("raw", "code", "message"), [
    ("0", DECIMAL_BELOW_MIN_VALUE, "0 tokens/s is out of range: expected more than 0 and less than 10000000."),
    ("-1", DECIMAL_BELOW_MIN_VALUE, "-1 tokens/s is out of range: expected more than 0 and less than 10000000."),
    ("1e7", DECIMAL_ABOVE_MAX_VALUE, "1e+07 tokens/s is out of range: expected more than 0 and less than 10000000."),
    ("10000001", DECIMAL_ABOVE_MAX_VALUE, "1e+07 tokens/s is out of range: expected more than 0 and less than 10000000."),
    ("inf", DECIMAL_ABOVE_MAX_VALUE, "inf tokens/s is out of range: expected more than 0 and less than 10000000."),
    ("fast" * 17, INVALID_VALUE, f"'{'fast' * 16}' is not a number."),  # echoed up to 64 characters
    ("nan", INVALID_VALUE, "'nan' is not a number."),
])
def test_a_decode_rate_override_outside_0_to_10_million_is_a_range_error(raw: str, code: str, message: str):
    expected = (code, f"Invalid 'metadata.testbed_decode_tps': {message}", "metadata.testbed_decode_tps", 400)
    assert refusal(decode_rate, "sim-7", {"testbed_decode_tps": raw}) == expected


@pytest.mark.parametrize(("model", "shown"), [("sim-0", "'sim-0'"), ("sim-10000000", "'sim-10000000'"), ("sim-" + "0" * 80, repr("sim-" + "0" * 60))])
def test_a_sim_model_without_a_usable_rate_is_refused_naming_the_model(model: str, shown: str):
    rate = float(model[4:])
    expected = (INVALID_VALUE, f"Invalid 'model': {shown} asks for {rate:g} tokens/s; a sim-<N> model needs 0 < N < 10000000.",
                "model", 400)
    assert refusal(decode_rate, model, {}) == expected
