"""Pending row copies between storage tiers, batched into TRANSFER steps.

The cache manager queues copies (a swap-out of an evicted page, a snapshot capture, a
restore into a private page, ...) as it makes decisions; the scheduler drains the queue
into TRANSFER plans, issued before the step that needs them. Each copy carries what to
do at its plan's final fence: `done` after a successful completion (publish a row,
release a reference) or `failed` after an execution failure (discard the row; a
request whose private page it was writing fails, which `failed` returns).

Ordering: one drain emits plans in ROUTE_ORDER, each route's copies in queue order, and
steps execute in issue order. ROUTE_ORDER puts every read of a row before any write
that reuses it within one drain: an evicted page is copied out (pages -> host) before
the swap-ins and restores that overwrite reused pages; a snapshot leaving its
continuation row (continuation -> host) before the capture that reuses the row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from helios_serve.engine.plan import Route, RowCopy, StepKind, StepPlan, Tier
from helios_serve.scheduler.request import FinishedRequest

Done = Callable[[], None]
Failed = Callable[[], FinishedRequest | None]

ROUTE_ORDER = (
    Route(Tier.PAGES, Tier.HOST),
    Route(Tier.CONTINUATION, Tier.HOST),
    Route(Tier.PAGES, Tier.CONTINUATION),
    Route(Tier.HOST, Tier.PAGES),
    Route(Tier.CONTINUATION, Tier.PAGES),
)


@dataclass(frozen=True)
class PendingCopy:
    """One queued copy and its fence actions."""

    copy: RowCopy
    done: Done
    failed: Failed


class TransferQueue:
    """Copies waiting for a TRANSFER step, per route.

    Args:
        capacity: copies one TRANSFER step holds (geometry.transfer_rows).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pending: dict[Route, list[PendingCopy]] = {r: [] for r in ROUTE_ORDER}
        self.copies = dict.fromkeys(ROUTE_ORDER, 0)  # queued copies per route, ever
        self._queued = 0  # copies in _pending (drain runs every step: most find none)
        # Drained TRANSFER plans (by identity: plans are compared by value) -> their copies.
        self._fences: dict[int, tuple[PendingCopy, ...]] = {}

    def add(self, route: Route, source: int, destination: int, done: Done,
            failed: Failed) -> None:
        """Queue one copy of row `source` to row `destination` along `route`.

        Raises:
            ValueError: `route` is not one of ROUTE_ORDER, or no TRANSFER step can hold
                a copy (capacity 0).
        """
        if route not in self._pending:
            raise ValueError(f"route {route} is not a transfer route")
        if self.capacity < 1:
            raise ValueError("no transfer programs: copies cannot be queued")
        self._pending[route].append(PendingCopy(RowCopy(source, destination), done, failed))
        self.copies[route] += 1
        self._queued += 1

    def __len__(self) -> int:
        return self._queued

    def drain(self) -> list[StepPlan]:
        """Every queued copy as TRANSFER plans (ROUTE_ORDER, at most `capacity` copies
        each); the queue is empty afterwards. Each plan's fence actions are kept until
        `fence(plan)` hands them out (once its step completed or failed)."""
        out: list[StepPlan] = []
        if not self._queued:
            return out  # no Route hashed (a dataclass of two enums: ~1 us each)
        self._queued = 0
        for route in ROUTE_ORDER:
            queued, self._pending[route] = self._pending[route], []
            if not queued:
                continue
            for i in range(0, len(queued), self.capacity):
                chunk = tuple(queued[i:i + self.capacity])
                plan = StepPlan(StepKind.TRANSFER, (), copies=tuple(p.copy for p in chunk),
                                route=route)
                self._fences[id(plan)] = chunk
                out.append(plan)
        return out

    def fence(self, plan: StepPlan) -> tuple[PendingCopy, ...]:
        """The copies of drained TRANSFER `plan`, for their `done` or `failed` actions;
        forgotten here afterwards.

        Raises:
            KeyError: `plan` is no drained plan whose fence is still due (a caller bug).
        """
        return self._fences.pop(id(plan))
