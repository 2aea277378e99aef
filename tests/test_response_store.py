"""The response store (prototype/api/store.py): turns come back as put, chains for their owner only, a WAL file
store shared by processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from prototype.api import store as store_module
from prototype.api.store import ResponseStore, StoredTurn
from prototype.protocol.items import Message, Reasoning, WebSearchCall

USER = Message("user", (("input_text", "fix the bug"),))
REASONING = Reasoning("rs_1", "the test fails on an empty list")
SEARCH = WebSearchCall("ws_1", "python list index", result="IndexError: list index out of range")
ANSWER = Message("assistant", (("output_text", "done"),), id="msg_1", status="completed")


def put(store: ResponseStore, response_id: str, previous: str | None, owner: str | None = "key-a", **fields) -> None:
    store.put(
        response_id, previous_response_id=previous, owner=owner, created_at=fields.pop("created_at", 1.0),
        input=fields.pop("input", [USER]), output=fields.pop("output", [ANSWER]), response={"id": response_id, **fields})


def test_a_stored_turn_comes_back_as_it_was_put_with_its_reasoning_and_hosted_result():
    store = ResponseStore()
    put(store, "resp_1", None, input=(USER,), output=[REASONING, SEARCH, ANSWER], status="completed")
    turn = store.get("resp_1")
    assert turn == StoredTurn("resp_1", None, "key-a", (USER,), (REASONING.exported(), SEARCH, ANSWER), {"id": "resp_1", "status": "completed"})
    assert turn.output[0].text == REASONING.text and turn.output[1].result == SEARCH.result
    put(store, "resp_2", "resp_1", owner=None, input=[WebSearchCall("ws_2", "q")])
    assert store.get("resp_2") == StoredTurn("resp_2", "resp_1", None, (WebSearchCall("ws_2", "q"),), (ANSWER,), {"id": "resp_2"})
    assert store.get("resp_3") is None


def test_a_put_with_a_stored_id_replaces_the_row_and_a_delete_says_whether_there_was_one():
    store = ResponseStore()
    put(store, "resp_1", None, status="in_progress")
    put(store, "resp_1", None, status="completed")
    assert store.get("resp_1").response == {"id": "resp_1", "status": "completed"} and store.delete("resp_1") is True
    assert store.get("resp_1") is None and store.delete("resp_1") is False


def test_a_chain_runs_from_the_first_turn_to_the_one_asked_and_only_for_its_owner():
    store = ResponseStore()
    for response_id, previous in (("resp_1", None), ("resp_2", "resp_1"), ("resp_3", "resp_2")):
        put(store, response_id, previous)
    assert [turn.id for turn in store.chain("resp_3", "key-a")] == ["resp_1", "resp_2", "resp_3"]
    assert [turn.id for turn in store.chain("resp_1", "key-a")] == ["resp_1"] and store.chain("resp_3", "key-b") is None
    assert store.chain("resp_3") is None  # the owner defaults to none, and these have one
    assert store.chain("resp_9", "key-a") is None
    put(store, "resp_4", "resp_3", owner="key-b")
    assert store.chain("resp_4", "key-b") is None  # an earlier turn belongs to another key
    store.delete("resp_2")
    assert store.chain("resp_3", "key-a") is None  # a missing link
    put(store, "anon_1", None, owner=None)
    put(store, "anon_2", "anon_1", owner=None)
    assert [turn.id for turn in store.chain("anon_2")] == ["anon_1", "anon_2"]


def test_a_file_store_is_shared_by_processes_in_wal_mode_and_each_write_is_committed_at_once(tmp_path):
    path = str(tmp_path / "responses.sqlite")
    store = ResponseStore(path)
    pragma = {name: store._db.execute(f"PRAGMA {name}").fetchone()[0] for name in ("journal_mode", "busy_timeout", "synchronous")}
    assert pragma == {"journal_mode": "wal", "busy_timeout": 30000, "synchronous": 1}  # 1: NORMAL
    put(store, "resp_1", None)
    other = ResponseStore(path)  # another worker's connection sees the row without any commit call
    assert other.get("resp_1").id == "resp_1"
    with ThreadPoolExecutor(1) as pool:  # a store is used from the server's threads too
        assert pool.submit(store.get, "resp_1").result().id == "resp_1"
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        store.get("resp_1")
    assert ResponseStore()._db.execute("PRAGMA journal_mode").fetchone()[0] == "memory"


def _open_store_at_once(path: str, start: multiprocessing.synchronize.Barrier, outcome: multiprocessing.Queue) -> None:
    start.wait()
    try:
        ResponseStore(path).close()
        outcome.put("opened")
    except sqlite3.Error as error:
        outcome.put(repr(error))


def test_processes_that_open_one_new_file_store_at_the_same_moment_all_open_it(tmp_path):
    # `serve --workers 4` on a new file: without the retried switch to WAL, one trial in ten here
    # had a worker fail with "database is locked" (SQLite's deadlock answer skips the busy handler).
    context = multiprocessing.get_context("fork")
    for trial in range(20):
        path = str(tmp_path / f"responses-{trial}.sqlite")
        start, outcome = context.Barrier(4), context.Queue()
        openers = [context.Process(target=_open_store_at_once, args=(path, start, outcome)) for _ in range(4)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(timeout=60)
        assert sorted(outcome.get(timeout=10) for _ in openers) == ["opened"] * 4, f"trial {trial}"


class RefusingConnection:
    """A connection whose `PRAGMA journal_mode=WAL` is refused with `errors` first, then done."""

    def __init__(self, errors: list[sqlite3.OperationalError]) -> None:
        self.errors = errors
        self.statements: list[str] = []

    def execute(self, statement: str) -> None:
        self.statements.append(statement)
        if self.errors:
            raise self.errors.pop(0)


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code
    return error


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return round(self.now, 9)  # 6,000 steps of 5 ms land on 30 s exactly, not a float's sum either side of it

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_switch_to_wal_is_retried_while_busy_and_gives_up_at_the_busy_timeout(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(store_module.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(store_module.time, "sleep", clock.sleep)
    busy = sqlite3.SQLITE_BUSY
    db = RefusingConnection([sqlite_error("database is locked", busy) for _ in range(3)])
    store_module._switch_to_write_ahead_log(db)
    assert db.statements == ["PRAGMA journal_mode=WAL"] * 4 and clock.now == pytest.approx(100.015)  # three waits of 5 ms
    # Any other error is the caller's at once: a read-only file, say.
    other = sqlite_error("attempt to write a readonly database", sqlite3.SQLITE_READONLY)
    db = RefusingConnection([other])
    with pytest.raises(sqlite3.OperationalError) as caught:
        store_module._switch_to_write_ahead_log(db)
    assert caught.value is other and len(db.statements) == 1
    # Busy for longer than the 30 s busy timeout: the last refusal is raised.
    clock.now = 100.0
    refusals = [sqlite_error("database is locked", busy) for _ in range(7000)]
    db = RefusingConnection(list(refusals))
    with pytest.raises(sqlite3.OperationalError) as caught:
        store_module._switch_to_write_ahead_log(db)
    assert len(db.statements) == 6001  # every 5 ms from 0 to 30 s, that last one included
    assert caught.value is refusals[6000] and clock.monotonic() == 130.0
