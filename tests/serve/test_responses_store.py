"""The stored-responses database: bound, oldest-first eviction, persistence, refusal of a
foreign file (helios_serve.responses.store)."""

from __future__ import annotations

import sqlite3

import pytest
from helios_serve.bootstrap import StartupError
from helios_serve.responses.store import ResponseStore, StoredResponse, StoreError


def _record(n: int, text: str = "x") -> StoredResponse:
    return StoredResponse(f"resp_{n}", {"id": f"resp_{n}", "output": [text]},
                          [{"type": "message", "id": f"msg_{n}"}], (1, 2, n))  # fmt: skip


def _size(record: StoredResponse) -> int:
    store = ResponseStore()
    store.put(record)
    return store.stats()[1]


def test_round_trip_replace_and_delete():
    store = ResponseStore()
    assert store.get("resp_1") is None
    assert store.put(_record(1))
    assert store.get("resp_1") == _record(1)
    assert store.put(_record(1, "y"))  # same id: replaced, not duplicated
    assert store.get("resp_1").response["output"] == ["y"] and store.stats()[0] == 1
    assert store.delete("resp_1") and not store.delete("resp_1")
    assert store.get("resp_1") is None and store.stats() == (0, 0)


def test_oldest_rows_are_evicted_first_to_keep_the_bound():
    size = _size(_record(1))
    store = ResponseStore(max_bytes=3 * size)
    for n in range(1, 4):
        assert store.put(_record(n))
    assert store.stats() == (3, 3 * size)
    assert store.put(_record(4))
    assert store.get("resp_1") is None  # the oldest went
    assert [store.get(f"resp_{n}") is not None for n in (2, 3, 4)] == [True] * 3
    assert store.put(_record(5, "x" * (size + 1)))  # twice the size: two more leave
    assert [store.get(f"resp_{n}") is not None for n in (2, 3, 4, 5)] == [False, False, True, True]
    assert store.stats()[1] <= 3 * size


def test_a_record_beyond_the_whole_bound_is_not_stored():
    size = _size(_record(1))
    store = ResponseStore(max_bytes=size)
    assert store.put(_record(1))
    assert not store.put(_record(2, "x" * size))
    assert store.get("resp_2") is None and store.get("resp_1") is not None


def test_a_file_store_persists(tmp_path):
    path = str(tmp_path / "responses.db")
    store = ResponseStore(path)
    store.put(_record(7))
    store.close()
    again = ResponseStore(path)
    assert again.get("resp_7") == _record(7)


def test_a_foreign_file_is_refused(tmp_path):
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a helios-serve responses database"):
        ResponseStore(str(path))
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, just some text " * 10)
    with pytest.raises(StartupError, match="notes.txt: file is not a database"):
        ResponseStore(str(text))
