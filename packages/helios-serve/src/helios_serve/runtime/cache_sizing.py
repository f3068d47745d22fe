"""Physical KV cache capacity, chosen after the model is loaded.

Specification ("Serving metadata"): physical cache capacities are chosen after graph
loading and replace preparation's working-set counts. Preparation records a prepared page
count (the manifest's cache-plane shapes and ServingContract.prepared_pages); the operator
picks the physical count with exactly one of:

- ``--num-pages N``: N pages;
- ``--kv-cache-memory BYTES``: as many pages as fit in BYTES;
- ``--kv-cache-fraction F``: on cuda, F of the device memory still free once weights,
  every other buffer and the kernels are loaded (default 0.9: the rest is left for graph
  instantiation and the driver); on cpu, F of the host's available memory.

With none of them, cuda uses ``--kv-cache-fraction 0.9`` and cpu the prepared count. A
page holds ``page_tokens`` tokens of every cache plane: its size is the sum, over the
cache planes, of one page of each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import RuntimeLoadError

DEFAULT_CUDA_FRACTION = 0.9


class CacheSizingError(RuntimeLoadError):
    """The cache options conflict, or the budget holds no page."""


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


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
               free_bytes: int | None = None, host_reserved: int = 0) -> CacheChoice:
        """The physical page count.

        Args:
            backend: "cpu" or "cuda" (which default applies and what a fraction is of).
            page_bytes: bytes of one page across every cache plane.
            prepared_pages: the prepared count (the cpu default).
            free_bytes: cuda: device memory free now (after everything but the cache);
                cpu: None, the host's available memory is read (host_available_bytes).
            host_reserved: cpu: bytes of host planes allocated but not yet touched (the
                tier rows), which the available memory does not count yet.

        Raises:
            CacheSizingError: the budget holds no page, or (cpu) the chosen pages do not
                fit in the host's available memory less `host_reserved` (NumPy reserves
                lazily: an oversized cache would be OOM-killed while serving, not refused).
        """
        choice = self._choose(backend, page_bytes, prepared_pages, free_bytes)
        if backend == "cuda":  # the driver's allocation refuses an oversized cache
            return choice
        available = host_available_bytes() - host_reserved
        if choice.nbytes > available:
            reserved = (f" after {_mib(host_reserved)} of cache-tier rows" if host_reserved
                        else "")
            raise CacheSizingError(f"the KV cache ({choice.how}: {choice.num_pages} pages of "
                                   f"{page_bytes} bytes, {_mib(choice.nbytes)}) does not fit "
                                   f"in available host memory ({_mib(max(available, 0))}"
                                   f"{reserved})")
        return choice

    def _choose(self, backend: str, page_bytes: int, prepared_pages: int,
                free_bytes: int | None) -> CacheChoice:
        if self.num_pages is not None:
            return CacheChoice(self.num_pages, prepared_pages, page_bytes, "--num-pages")
        if self.memory_bytes is not None:
            budget, how = self.memory_bytes, f"--kv-cache-memory {self.memory_bytes}"
        else:
            fraction = self.fraction
            if fraction is None:
                if backend != "cuda":
                    return CacheChoice(prepared_pages, prepared_pages, page_bytes,
                                       "the core's prepared pages")
                fraction = DEFAULT_CUDA_FRACTION
            if backend == "cuda":
                if free_bytes is None:
                    raise ValueError("the cuda backend passes its free device memory")
                of = f"{_mib(free_bytes)} of free device memory"
                available = free_bytes
            else:
                available = host_available_bytes()
                of = f"{_mib(available)} of available host memory"
            budget, how = int(fraction * available), f"--kv-cache-fraction {fraction:g} of {of}"
        pages = budget // page_bytes
        if pages < 1:
            raise CacheSizingError(f"the KV cache budget ({how}: {_mib(budget)}) holds no page; "
                                   f"one page of every cache plane needs {_mib(page_bytes)}")
        return CacheChoice(pages, prepared_pages, page_bytes, how)


@dataclass(frozen=True)
class CacheChoice:
    """The chosen physical capacity.

    Attributes:
        num_pages: physical pages backing each cache plane.
        prepared_pages: preparation's count (replaced by num_pages everywhere).
        page_bytes: bytes of one page across every cache plane.
        how: what chose it ("--num-pages", "the core's prepared pages", "--kv-cache-fraction 0.9 of ...").
    """

    num_pages: int
    prepared_pages: int
    page_bytes: int
    how: str

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.page_bytes

    def describe(self) -> str:
        """One line for the startup log."""
        return (f"{self.num_pages} pages (prepared {self.prepared_pages}), "
                f"{_mib(self.nbytes)} ({self.how})")


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
