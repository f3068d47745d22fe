"""Physical KV cache capacity, chosen after the model is loaded.

Specification ("Serving metadata"): physical cache capacities are chosen after graph
loading and replace preparation's working-set counts. Preparation records a prepared page
count (the manifest's cache-plane shapes and ServingContract.prepared_pages); the operator
picks the physical count with exactly one of:

- ``--num-pages N``: N pages;
- ``--kv-cache-memory BYTES``: as many pages as fit in BYTES;
- ``--kv-cache-fraction F``: on cuda, F of the device memory still free once weights,
  every other buffer and the kernels are loaded (default 0.9: the rest is left for graph
  instantiation and the driver); on cpu, F of the host's available memory less the cache
  tiers' rows.

With none of them, cuda uses ``--kv-cache-fraction 0.9`` and cpu the prepared count. A
page holds ``page_tokens`` tokens of every cache plane: its size is the sum, over the
cache planes, of one page of each.

Every startup allocation an operator sizes (the KV cache, snapshot rows, the host tier)
is checked by one rule, `check_fits`, against the memory it lives in before anything is
allocated, and fails startup in one line naming the option, the bytes asked and the
bytes available.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import format_bytes
from .errors import RuntimeLoadError

DEFAULT_CUDA_FRACTION = 0.9


class CacheSizingError(RuntimeLoadError):
    """The cache options conflict, the budget holds no page, or a startup allocation does
    not fit in the memory available (check_fits)."""



@dataclass(frozen=True)
class CacheSizing:
    """The operator's choice of physical KV capacity (at most one field set).

    Raises:
        CacheSizingError: more than one choice, or a value out of range.
    """

    num_pages: int | None = None
    memory_bytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        given = [n for n, v in (("--num-pages", self.num_pages),
                                ("--kv-cache-memory", self.memory_bytes),
                                ("--kv-cache-fraction", self.fraction)) if v is not None]
        if len(given) > 1:
            raise CacheSizingError(f"{' and '.join(given)} are exclusive: choose one way to "
                                   "size the KV cache")
        if self.num_pages is not None and self.num_pages < 1:
            raise CacheSizingError(f"--num-pages must be at least 1, got {self.num_pages}")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise CacheSizingError(f"--kv-cache-memory must be positive, got "
                                   f"{self.memory_bytes}")
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise CacheSizingError(f"--kv-cache-fraction must be in (0, 1], got {self.fraction}")

    def choose(self, *, backend: str, page_bytes: int, prepared_pages: int,
               free_bytes: int | None = None, reserved: Sequence[MemoryAsk] = ()
               ) -> CacheChoice:
        """The physical page count, checked (check_fits) against the memory it lives in.

        Args:
            backend: "cpu" or "cuda" (which default applies and what a fraction is of).
            page_bytes: bytes of one page across every cache plane.
            prepared_pages: the prepared count (the cpu default).
            free_bytes: cuda: device memory free now (everything but the cache and the
                kernel scratch is allocated); cpu: None, the host's available memory is
                read (host_available_bytes).
            reserved: what that memory must also hold, counted before the cache (a
                fraction is of what they leave): cuda the kernel scratch capture will
                allocate; cpu the tier rows allocated but not yet touched, which the
                available memory does not count yet (NumPy reserves lazily: an oversized
                cache would be OOM-killed while serving, not refused).

        Raises:
            CacheSizingError: the budget holds no page, or the reserved bytes and the
                chosen pages do not fit (the message names the option and both sizes).
        """
        if backend == "cuda":
            if free_bytes is None:
                raise ValueError("the cuda backend passes its free device memory")
            memory, available = DEVICE_MEMORY, free_bytes
        else:
            memory, available = HOST_MEMORY, host_available_bytes()
        check_fits(reserved, memory=memory, available=available)  # named before the cache
        left = available - sum(r.nbytes for r in reserved)
        choice = self._choose(backend, page_bytes, prepared_pages, left)
        check_fits([*reserved, choice.ask], memory=memory, available=available)
        return choice

    def fixed_ask(self, *, backend: str, page_bytes: int, prepared_pages: int
                  ) -> MemoryAsk | None:
        """The cache's ask when its size does not depend on the memory left (--num-pages,
        --kv-cache-memory, the cpu's prepared default), so it can be checked with every
        other allocation before any is made; None for a fraction (sized once loaded)."""
        if self.fraction is not None or (backend == "cuda" and self.num_pages is None
                                         and self.memory_bytes is None):
            return None
        return self._choose(backend, page_bytes, prepared_pages, 0).ask

    def _choose(self, backend: str, page_bytes: int, prepared_pages: int,
                available: int) -> CacheChoice:
        """`available`: the bytes a fraction is of (free device / available host memory
        less what is reserved)."""
        if self.num_pages is not None:
            return CacheChoice(self.num_pages, prepared_pages, page_bytes, "--num-pages",
                               f"--num-pages {self.num_pages}")
        if self.memory_bytes is not None:
            option = f"--kv-cache-memory {self.memory_bytes}"
            budget, how = self.memory_bytes, option
        else:
            fraction = self.fraction
            if fraction is None:
                if backend != "cuda":
                    return CacheChoice(prepared_pages, prepared_pages, page_bytes,
                                       "the core's prepared pages", "the core's prepared pages")
                fraction = DEFAULT_CUDA_FRACTION
            where = "free device memory" if backend == "cuda" else "available host memory"
            option = f"--kv-cache-fraction {fraction:g}"
            budget = int(fraction * available)
            how = f"{option} of {format_bytes(available)} of {where}"
        pages = budget // page_bytes
        if pages < 1:
            raise CacheSizingError(
                f"the KV cache budget ({how}: {format_bytes(budget)}) holds no page; one page "
                f"of every cache plane needs {format_bytes(page_bytes)}")
        return CacheChoice(pages, prepared_pages, page_bytes, how, option)


@dataclass(frozen=True)
class CacheChoice:
    """The chosen physical capacity.

    Attributes:
        num_pages: physical pages backing each cache plane.
        prepared_pages: preparation's count (replaced by num_pages everywhere).
        page_bytes: bytes of one page across every cache plane.
        how: what chose it ("--num-pages", "the core's prepared pages", "--kv-cache-fraction 0.9 of ...").
        option: the option as given ("--num-pages 8", "--kv-cache-fraction 0.9"), named
            when the cache does not fit.
    """

    num_pages: int
    prepared_pages: int
    page_bytes: int
    how: str
    option: str = ""

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.page_bytes

    @property
    def ask(self) -> MemoryAsk:
        return MemoryAsk(self.option or self.how, "the KV cache", self.nbytes,
                         f"{self.num_pages} pages")

    def describe(self) -> str:
        """One line for the startup log."""
        return (f"{self.num_pages} pages (prepared {self.prepared_pages}), "
                f"{format_bytes(self.nbytes)} ({self.how})")


HOST_MEMORY = "host memory"
DEVICE_MEMORY = "free device memory"


@dataclass(frozen=True)
class MemoryAsk:
    """One allocation startup makes, checked (check_fits) before any is made.

    Attributes:
        option: what sized it, as the operator gave it ("--snapshots 100", "the core's
            prepared_snapshots 64"; "the core" for what no option sizes).
        what: what it holds, singular ("the KV cache", "snapshot storage", "the model").
        nbytes: bytes it needs.
        detail: its count or parts, shown beside `what` when it is the one that does not
            fit ("51 pages", "100 rows"; "" for none).
    """

    option: str
    what: str
    nbytes: int
    detail: str = ""


def check_fits(asks: Sequence[MemoryAsk], *, memory: str, available: int) -> None:
    """Fail startup unless `asks`, counted in order, fit in `available` bytes of `memory`.

    The one rule of startup memory, for both backends: the cpu backend's host memory
    (tier rows, KV cache), the cuda backend's free device memory (the model's buffers,
    kernel scratch, snapshot rows, KV cache) and host memory (the pinned host tier). The
    first ask that does not fit in what the earlier ones leave is named, with the bytes it
    needs, the bytes left and what took the rest.

    Args:
        asks: in the order the caller wants them blamed (what no option sizes first, the
            cache sized "from what is left" last).
        memory: where they live (HOST_MEMORY, DEVICE_MEMORY).
        available: bytes of `memory` available before any of `asks` is allocated.

    Raises:
        CacheSizingError: one line, e.g. "--snapshots 100: snapshot storage (100 rows)
            needs 51200 bytes (50.0 KiB) but host memory has 1000 bytes (1000 B)
            available".
    """
    left, counted = available, []
    for ask in asks:
        if ask.nbytes > left:
            what = f"{ask.what} ({ask.detail})" if ask.detail else ask.what
            after = " and ".join(f"{a.nbytes} bytes ({format_bytes(a.nbytes)}) for {a.what}"
                                 for a in counted)
            raise CacheSizingError(
                f"{ask.option}: {what} needs {ask.nbytes} bytes ({format_bytes(ask.nbytes)}) "
                f"but {memory} has {max(left, 0)} bytes ({format_bytes(max(left, 0))}) available"
                + (f" after {after}" if after else ""))
        left -= ask.nbytes
        if ask.nbytes:
            counted.append(ask)


def host_available_bytes() -> int:
    """Host memory available to a new allocation, in bytes: /proc/meminfo MemAvailable
    (free plus reclaimable page cache) on Linux, else free physical pages (sysconf)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
