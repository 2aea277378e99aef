"""The persistent response store: SQLite, embedded, no server to run.

One row per stored response holds only what that turn added (its input items and output items)
and the id it chained from, so rebuilding a conversation walks the chain one read per earlier turn:
the O(turns)-per-turn rehydration of gateway backends (smg-project/smg PR #1770; docs/protocol.md).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

import attrs

from ..protocol.items import Item, Reasoning, WebSearchCall, parse_item

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    previous_response_id TEXT,
    owner TEXT,
    created_at REAL NOT NULL,
    input TEXT NOT NULL,
    output TEXT NOT NULL,
    response TEXT NOT NULL
)
"""


def _item_record(item: Item) -> dict[str, Any]:
    if isinstance(item, Reasoning):
        return item.exported().to_dict()  # the store keeps the reasoning whatever the client asked to see
    record = item.to_dict()
    if isinstance(item, WebSearchCall):
        record["testbed_result"] = item.result  # the hosted result stays server-side, as the API keeps it
    return record


def _item_from_record(record: dict[str, Any]) -> Item:
    item = parse_item(record, "store")
    if isinstance(item, WebSearchCall):
        item = attrs.evolve(item, result=record["testbed_result"])  # `_item_record` always writes it
    return item


BUSY_TIMEOUT_MS = 30_000


def _switch_to_write_ahead_log(db: sqlite3.Connection) -> None:
    """`PRAGMA journal_mode=WAL`, retried while another connection holds the lock it needs.

    The switch reads the file under a shared lock and then asks for an exclusive one. When several
    processes open one new file at once (the workers of `serve --workers N`), two can each hold the
    shared lock and want the exclusive one; SQLite then answers SQLITE_BUSY at once, without calling
    the busy handler, to avoid the deadlock (https://www.sqlite.org/c3ref/busy_handler.html). The
    other opener finishes within milliseconds, so trying again succeeds; the file stays in WAL mode
    from then on, and later opens find it there.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)


@attrs.frozen
class StoredTurn:
    id: str
    previous_response_id: str | None
    owner: str | None
    input: tuple[Item, ...]
    output: tuple[Item, ...]
    response: dict[str, Any]


class ResponseStore:
    """Stored responses in one SQLite file (":memory:" for a throwaway store)."""

    def __init__(self, path: str = ":memory:") -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        if path != ":memory:":
            # `serve --workers N`: N processes open and write one file; a writer waits for another's
            # transaction (milliseconds) instead of failing with "database is locked". Set first:
            # switching to WAL takes a lock too. The bound is generous because a lock holder on a
            # loaded machine can wait seconds for a core.
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            _switch_to_write_ahead_log(self._db)
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def put(
        self,
        response_id: str,
        *,
        previous_response_id: str | None,
        owner: str | None,
        created_at: float,
        input: list[Item] | tuple[Item, ...],
        output: list[Item],
        response: dict[str, Any],
    ) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                response_id,
                previous_response_id,
                owner,
                created_at,
                json.dumps([_item_record(i) for i in input]),
                json.dumps([_item_record(i) for i in output]),
                json.dumps(response),
            ),
        )

    def get(self, response_id: str) -> StoredTurn | None:
        row = self._db.execute(
            "SELECT id, previous_response_id, owner, input, output, response FROM responses WHERE id = ?",
            (response_id,),
        ).fetchone()
        if row is None:
            return None
        return StoredTurn(
            row[0],
            row[1],
            row[2],
            tuple(_item_from_record(r) for r in json.loads(row[3])),
            tuple(_item_from_record(r) for r in json.loads(row[4])),
            json.loads(row[5]),
        )

    def delete(self, response_id: str) -> bool:
        """Remove one stored response; False if there was none. Later responses that chained from
        it keep their own rows, but their chain can no longer be rebuilt (docs/protocol.md)."""
        return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def chain(self, response_id: str, owner: str | None = None) -> list[StoredTurn] | None:
        """The stored turns from the first to `response_id`, one read per turn; None if any link
        is missing or belongs to another owner (a stored response is readable only by its key)."""
        turns: list[StoredTurn] = []
        next_id: str | None = response_id
        while next_id is not None:
            turn = self.get(next_id)
            if turn is None or turn.owner != owner:
                return None
            turns.append(turn)
            next_id = turn.previous_response_id
        turns.reverse()
        return turns
