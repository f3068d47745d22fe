"""Keyed storage rows with LRU eviction: continuation rows and host-tier rows.

A pool backs `rows` physical rows (row ids 0..rows-1) of one storage tier. A row holds
the payload of one key (a snapshot, or a page evicted to the host tier) and is in
exactly one of four states:

    free        no key; on the free list
    writing     reserved for a key; a transfer writing it is in flight; invisible to
                lookups (its bytes are not valid before that transfer's fence)
    read        resident; `readers` >= 1 transfers reading it are in flight
    idle        resident; no reader; on the LRU list (evictable)

so `free + writing + read + idle == rows` always holds. A reservation takes a free row
first (FIFO, ascending ids at start) and only when none is left evicts the least
recently used idle row; writing and read rows are never evicted, so a row is reused
only after the final fence of every transfer that touches it. Every transition that
does not apply to the row's state raises ValueError: nothing is freed twice.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class Reservation:
    """A row taken for a key by `RowPool.reserve`.

    Attributes:
        row: the physical row, now writing.
        evicted: the key whose idle payload the row held (evicted to make room), or None
            when the row was free.
    """

    row: int
    evicted: Hashable | None


class RowPool:
    """Free list, reservations, readers and LRU eviction over `rows` keyed rows.

    Args:
        rows: physical rows backed at load (0 disables the pool: every reserve fails).
    """

    def __init__(self, rows: int) -> None:
        if rows < 0:
            raise ValueError(f"rows must be >= 0, got {rows}")
        self.rows = rows
        self._free: deque[int] = deque(range(rows))
        self._row_of: dict[Hashable, int] = {}  # key -> row (writing or resident)
        self._writing: set[Hashable] = set()
        self._readers: dict[Hashable, int] = {}  # resident key -> in-flight readers
        self._lru: OrderedDict[Hashable, None] = OrderedDict()  # idle keys, oldest first
        self.evictions = 0

    # -- gauges -------------------------------------------------------------------------

    @property
    def free_rows(self) -> int:
        return len(self._free)

    @property
    def writing_rows(self) -> int:
        return len(self._writing)

    @property
    def resident_rows(self) -> int:
        """Rows holding a valid payload (read or idle)."""
        return len(self._readers)

    @property
    def idle_rows(self) -> int:
        """Resident rows no transfer reads (evictable)."""
        return len(self._lru)

    @property
    def used_rows(self) -> int:
        """Rows not on the free list."""
        return self.rows - len(self._free)

    def lru_order(self) -> tuple[Hashable, ...]:
        """Idle keys, next eviction first."""
        return tuple(self._lru)

    def resident_keys(self) -> tuple[Hashable, ...]:
        """Keys with a valid payload (read or idle)."""
        return tuple(self._readers)

    def readers(self, key: Hashable) -> int:
        return self._readers.get(key, 0)

    # -- lookups ------------------------------------------------------------------------

    def lookup(self, key: Hashable) -> int | None:
        """The row holding `key`'s valid payload, or None (absent or still writing)."""
        if key in self._readers:
            return self._row_of[key]
        return None

    def holds(self, key: Hashable) -> bool:
        """Whether `key` is writing or resident (a reservation would duplicate it)."""
        return key in self._row_of

    # -- transitions ----------------------------------------------------------------------

    def reserve(self, key: Hashable) -> Reservation | None:
        """Take a row for `key` (state writing).

        Returns:
            The reservation, or None when every row is writing or read (no change).

        Raises:
            ValueError: `key` already holds a row.
        """
        if key in self._row_of:
            raise ValueError(f"{key!r} already holds row {self._row_of[key]}")
        evicted = None
        if self._free:
            row = self._free.popleft()
        elif self._lru:
            evicted, _ = self._lru.popitem(last=False)
            row = self._row_of.pop(evicted)
            del self._readers[evicted]
            self.evictions += 1
        else:
            return None
        self._row_of[key] = row
        self._writing.add(key)
        return Reservation(row, evicted)

    def commit(self, key: Hashable) -> int:
        """The transfer writing `key` completed: its row becomes resident and idle (the
        most recently used). Returns the row.

        Raises:
            ValueError: `key` is not writing.
        """
        self._check_writing(key)
        self._writing.remove(key)
        self._readers[key] = 0
        self._lru[key] = None
        return self._row_of[key]

    def abort(self, key: Hashable) -> None:
        """The transfer writing `key` failed or was dropped: free its row.

        Raises:
            ValueError: `key` is not writing.
        """
        self._check_writing(key)
        self._writing.remove(key)
        self._free.append(self._row_of.pop(key))

    def pin(self, key: Hashable) -> int:
        """A transfer reading `key` was queued: its row cannot be evicted until `unpin`.
        Returns the row.

        Raises:
            ValueError: `key` is not resident.
        """
        if key not in self._readers:
            raise ValueError(f"pin of {key!r}, which is not resident")
        self._readers[key] += 1
        self._lru.pop(key, None)
        return self._row_of[key]

    def unpin(self, key: Hashable) -> None:
        """A transfer reading `key` reached its fence: the last one makes the row idle (the
        most recently used).

        Raises:
            ValueError: `key` has no reader.
        """
        if self._readers.get(key, 0) < 1:
            raise ValueError(f"unpin of {key!r}, which has no reader")
        self._readers[key] -= 1
        if self._readers[key] == 0:
            self._lru[key] = None

    def touch(self, key: Hashable) -> None:
        """Mark an idle resident key most recently used (a lookup hit)."""
        if key in self._lru:
            self._lru.move_to_end(key)

    def drop(self, key: Hashable) -> None:
        """Free an idle resident key's row (its payload is no longer wanted).

        Raises:
            ValueError: `key` is not idle.
        """
        if key not in self._lru:
            raise ValueError(f"drop of {key!r}, which is not idle")
        del self._lru[key]
        del self._readers[key]
        self._free.append(self._row_of.pop(key))

    def _check_writing(self, key: Hashable) -> None:
        if key not in self._writing:
            raise ValueError(f"{key!r} is not being written")
