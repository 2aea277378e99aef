"""The server's full-collection policy (prototype/server/collector.py): a full collection's survivors are frozen, and
handed back once per interval so that cyclic garbage that died frozen is collected then."""

from __future__ import annotations

import gc
import weakref

import pytest

from prototype.server.collector import FullCollectionPolicy


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policy():
    policy = FullCollectionPolicy(unfreeze_every=300.0, clock=Clock())
    gc.collect()
    assert gc.get_freeze_count() == 0  # the test process freezes nothing of its own
    with policy.installed():
        yield policy


def frozen(obj: object) -> bool:
    """Whether tracked `obj` is in the permanent generation (`gc.get_objects()` lists the collected ones only; the freeze
    count is no measure: another thread may free a frozen object at any moment)."""
    assert gc.is_tracked(obj)
    return not any(tracked is obj for tracked in gc.get_objects())


def test_a_full_collection_freezes_its_survivors_and_young_collections_leave_them_alone(policy):
    survivor = Node()
    assert not frozen(survivor)
    gc.collect()
    assert policy.full_collections == 1 and policy.unfreezes == 0 and frozen(survivor)
    newer = Node()
    gc.collect(0)
    gc.collect(1)
    assert policy.full_collections == 1 and not frozen(newer)  # only a full collection freezes
    gc.collect()
    assert policy.full_collections == 2 and frozen(newer) and frozen(survivor)  # the newer survivor joins them
    del survivor, newer


def test_garbage_that_died_frozen_is_collected_after_the_interval_and_not_before(policy):
    cycle = Node()
    dead = weakref.ref(cycle)
    gc.collect()  # the cycle survives this full collection and is frozen with the other survivors
    del cycle
    policy.clock.now = 299.0
    gc.collect()
    assert dead() is not None and policy.unfreezes == 0  # frozen: no collection walks it
    policy.clock.now = 300.0
    gc.collect()  # the interval has passed: after this collection everything is handed back
    assert policy.unfreezes == 1 and gc.get_freeze_count() == 0 and dead() is not None
    gc.collect()  # walks everything once
    assert dead() is None and gc.get_freeze_count() > 0  # and freezes the survivors again; the next interval counts from 300
    policy.clock.now = 599.0
    gc.collect()
    assert policy.unfreezes == 1
    policy.clock.now = 600.0
    gc.collect()
    assert policy.unfreezes == 2


def test_full_collections_follow_each_middle_one_and_uninstall_restores_the_collector(policy):
    young, middle, _ = gc.get_threshold()
    assert gc.get_threshold() == (young, middle, 1)
    policy.uninstall()
    assert gc.get_threshold() == (young, middle, 10)
    gc.collect()
    assert policy.full_collections == 0 and gc.get_freeze_count() == 0


def test_after_an_installed_block_nothing_stays_frozen_and_the_collector_is_as_it_was():
    before = gc.get_threshold()
    policy = FullCollectionPolicy(clock=Clock())
    with policy.installed():
        gc.collect()
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[2] == 1
    gc.collect()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before and policy.full_collections == 1
