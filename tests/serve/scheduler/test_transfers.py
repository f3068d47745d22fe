"""TransferQueue: copies queued per route, drained in ROUTE_ORDER into TRANSFER plans of
at most `capacity` copies, with each plan's fence actions held until `fence(plan)`."""

from __future__ import annotations

import pytest
from helios_serve.engine.plan import Route, RowCopy, StepKind, Tier
from helios_serve.scheduler.transfers import ROUTE_ORDER, TransferQueue

OUT = Route(Tier.PAGES, Tier.HOST)
IN = Route(Tier.HOST, Tier.PAGES)
CAPTURE = Route(Tier.PAGES, Tier.CONTINUATION)


def test_drain_orders_routes_reads_before_writes_and_chunks_by_capacity():
    q = TransferQueue(2)
    log: list[str] = []
    for route, source, destination in [(IN, 0, 5), (OUT, 5, 0), (IN, 1, 6), (CAPTURE, 7, 3),
                                       (IN, 2, 7)]:
        q.add(route, source, destination, lambda s=source: log.append(f"done {s}"),
              lambda s=source: log.append(f"failed {s}"))
    assert len(q) == 5 and q.copies[IN] == 3
    plans = q.drain()
    assert len(q) == 0 and q.drain() == []
    assert [(p.kind, p.route, p.copies) for p in plans] == [
        (StepKind.TRANSFER, OUT, (RowCopy(5, 0),)),  # the evicted page leaves first
        (StepKind.TRANSFER, CAPTURE, (RowCopy(7, 3),)),
        (StepKind.TRANSFER, IN, (RowCopy(0, 5), RowCopy(1, 6))),
        (StepKind.TRANSFER, IN, (RowCopy(2, 7),)),
    ]
    for copy in q.fence(plans[2]):
        copy.done()
    for copy in q.fence(plans[0]):
        copy.failed()
    assert log == ["done 0", "done 1", "failed 5"]
    with pytest.raises(KeyError):
        q.fence(plans[2])  # handed out once


def test_fences_are_kept_per_plan_identity():
    q = TransferQueue(1)
    q.add(OUT, 1, 1, lambda: None, lambda: None)
    (a,) = q.drain()
    q.add(OUT, 1, 1, lambda: None, lambda: None)
    (b,) = q.drain()
    assert a == b and a is not b  # equal plans, two fences
    assert q.fence(b)[0].copy == RowCopy(1, 1) and q.fence(a)[0].copy == RowCopy(1, 1)


def test_rejected_copies():
    with pytest.raises(ValueError, match="not a transfer route"):
        TransferQueue(2).add(Route(Tier.HOST, Tier.CONTINUATION), 0, 0, lambda: None,
                             lambda: None)
    with pytest.raises(ValueError, match="no transfer programs"):
        TransferQueue(0).add(ROUTE_ORDER[0], 0, 0, lambda: None, lambda: None)
