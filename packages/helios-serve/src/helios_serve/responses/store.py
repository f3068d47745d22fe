"""Stored responses: an embedded SQLite database (stdlib sqlite3), bounded in bytes.

One row per stored response: its id, the response object, the conversation's input
items (the previous turns' items and this request's input; what GET .../input_items
lists and what `previous_response_id` continues) and the token ids the next turn
continues exactly (this request's prompt ids followed by its generated ids).

Bound: the rows' payload bytes (`nbytes`, the sum of the three blobs) never exceed
`max_bytes`; storing a row evicts the oldest rows first (insertion order) until it fits.
A row larger than the whole bound is not stored. An evicted, deleted or never-stored id
reads as None (the HTTP layer's 404). Without a path the database is in memory (lost at
exit); with one it persists, and a file written by another program is refused at open.
Nothing here logs request contents.

The HTTP event loop is the only caller; a lock keeps the connection safe should a
preparation thread ever call it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from array import array
from dataclasses import dataclass
from typing import Any

from helios_serve.bootstrap import StartupError

DEFAULT_MAX_BYTES = 256 * 2**20
_APPLICATION_ID = 0x48525350  # "HRSP": a helios responses database (PRAGMA application_id)
_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    nbytes INTEGER NOT NULL,
    response BLOB NOT NULL,
    items BLOB NOT NULL,
    token_ids BLOB NOT NULL
)
"""


class StoreError(StartupError):
    """The database file cannot serve as a responses store (helios-serve exits 2)."""


@dataclass(frozen=True)
class StoredResponse:
    """A stored response.

    Attributes:
        response: the response object as GET /v1/responses/{id} returns it.
        items: the conversation's canonical input items, oldest first.
        token_ids: prompt ids then generated ids (int32 token ids, EOS included).
    """

    id: str
    response: dict[str, Any]
    items: list[dict[str, Any]]
    token_ids: tuple[int, ...]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class ResponseStore:
    """The stored responses of one server.

    Args:
        path: the database file, or None for an in-memory database.
        max_bytes: the bound on stored payload bytes (>= 1).

    Raises:
        StoreError: the file is not a SQLite database, or one another program wrote.
    """

    def __init__(self, path: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        where = path if path is not None else ":memory:"
        try:
            self._db = sqlite3.connect(where, check_same_thread=False, isolation_level=None)
            app, version = (self._db.execute("PRAGMA application_id").fetchone()[0],
                            self._db.execute("PRAGMA user_version").fetchone()[0])  # fmt: skip
            tables = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables and (app, version) != (_APPLICATION_ID, _SCHEMA_VERSION):
                raise StoreError(f"{path}: not a helios-serve responses database (schema "
                                 f"{version}, application id {app:#x})")  # fmt: skip
            self._db.execute(_SCHEMA)
            self._db.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
            self._db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: {exc}") from None

    def put(self, record: StoredResponse) -> bool:
        """Store `record` (replacing a row of its id), evicting the oldest rows until the
        bound holds. Returns False when the record alone exceeds the bound (not stored)."""
        blobs = (_json(record.response), _json(record.items),
                 array("i", record.token_ids).tobytes())  # fmt: skip
        nbytes = sum(len(b) for b in blobs)
        if nbytes > self.max_bytes:
            return False
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM responses WHERE id = ?", (record.id,))
                total = db.execute("SELECT coalesce(sum(nbytes), 0) FROM responses").fetchone()[0]
                excess = total + nbytes - self.max_bytes
                rows = db.execute("SELECT seq, nbytes FROM responses ORDER BY seq") \
                    if excess > 0 else ()
                last = None
                for seq, size in rows:
                    if excess <= 0:
                        break
                    excess -= size
                    last = seq
                if last is not None:
                    db.execute("DELETE FROM responses WHERE seq <= ?", (last,))
                db.execute("INSERT INTO responses (id, nbytes, response, items, token_ids) "
                           "VALUES (?, ?, ?, ?, ?)", (record.id, nbytes, *blobs))  # fmt: skip
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None (never stored, deleted or evicted)."""
        with self._lock:
            row = self._db.execute("SELECT response, items, token_ids FROM responses "
                                   "WHERE id = ?", (response_id,)).fetchone()  # fmt: skip
        if row is None:
            return None
        ids = array("i")
        ids.frombytes(row[2])
        return StoredResponse(response_id, json.loads(row[0]), json.loads(row[1]), tuple(ids))

    def delete(self, response_id: str) -> bool:
        """Delete a stored response; False when there was none."""
        with self._lock:
            cursor = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cursor.rowcount > 0

    def stats(self) -> tuple[int, int]:
        """(rows, payload bytes) stored."""
        with self._lock:
            rows, total = self._db.execute(
                "SELECT count(*), coalesce(sum(nbytes), 0) FROM responses").fetchone()
        return rows, total

    def close(self) -> None:
        with self._lock:
            self._db.close()
