"""Execution frames: plans built and not yet issued, plans issued and not yet completed.

Plans are issued in the order they were built and complete in issue order, so both are
FIFO queues. A second plan may be issued before the first completes only while
`may_issue` says so (the specification: completion feedback): fewer than `frames` plans
are outstanding, no live request needs feedback, and the newest outstanding plan either
samples nothing (non-final prefill chunks) or is a DECODE whose pending tokens the device
owns (`device_pending`).
"""

from __future__ import annotations

import dataclasses
from collections import deque

from helios_serve.engine.plan import StepKind, StepPlan
from helios_serve.scheduler.request import CompletionError


class Frames:
    """The ready queue, the outstanding frames and the per-kind step counts.

    Args:
        frames: execution frames the runtime offers (>= 1).
        device_pending: decode graphs read the pending token on the device.
    """

    def __init__(self, frames: int, device_pending: bool) -> None:
        self.frames = frames
        self.device_pending = device_pending
        self._ready: deque[StepPlan] = deque()  # built, not yet issued; issue order
        self._outstanding: deque[StepPlan] = deque()  # issued, not completed; issue order
        self.step = 0  # plans issued (the step index of the next one)
        self.last_kind: StepKind | None = None  # of the latest PREFILL/DECODE/SPECULATIVE
        self.issued = dict.fromkeys(StepKind, 0)  # plans issued per kind
        self.prefill_tokens = 0  # prompt tokens of the PREFILL and MIXED plans issued

    @property
    def outstanding(self) -> int:
        """Plans issued and not yet completed."""
        return len(self._outstanding)

    @property
    def ready(self) -> int:
        """Plans built and not yet issued."""
        return len(self._ready)

    def may_issue(self, feedback: bool) -> bool:
        """Whether another plan may be issued now (the module's rule); `feedback`: some
        live request needs each sampled token before its next row."""
        if not self._outstanding:
            return True
        if len(self._outstanding) >= self.frames or feedback:
            return False
        newest = self._outstanding[-1]
        if newest.kind is StepKind.DECODE:
            # Every decode row samples: ahead only from the device (no row scan, so a plan
            # whose rows stay unbuilt keeps them so).
            return self.device_pending
        return not any(r.sample for r in newest.rows)

    def hold(self, plans: list[StepPlan]) -> None:
        """Queue built plans to be issued after the ones already ready."""
        self._ready.extend(plans)

    def next_ready(self) -> StepPlan | None:
        """The oldest built plan, taken off the ready queue, or None."""
        return self._ready.popleft() if self._ready else None

    def issue(self, plan: StepPlan) -> StepPlan:
        """Note `plan` as issued (outstanding until `pop`)."""
        self._outstanding.append(plan)
        self.step += 1
        self.issued[plan.kind] += 1
        if plan.kind is StepKind.TRANSFER:
            return plan  # copies only: the generation plans decide decode_first
        self.last_kind = plan.kind
        if plan.kind is StepKind.PREFILL:
            self.prefill_tokens += plan.token_count
        elif plan.kind is StepKind.MIXED:  # its chunks' tokens, after the lanes' one each
            self.prefill_tokens += plan.token_count - plan.lanes
        return plan

    def check_oldest(self, plan: StepPlan) -> None:
        """Raises CompletionError unless `plan` equals the oldest outstanding plan."""
        if not self._outstanding or plan != self._outstanding[0]:
            raise CompletionError("plan is not the oldest outstanding plan")

    def pop(self, plan: StepPlan) -> StepPlan:
        """Take the oldest outstanding plan, which `plan` must equal (`check_oldest`).

        Returns:
            The plan as issued (the caller's may be an equal copy).
        """
        self.check_oldest(plan)
        return self._outstanding.popleft()

    def unplan(self, request_id: int) -> list:
        """Remove a request's rows from the plans built and not yet issued (their inputs
        are invalid); a plan left without rows is dropped.

        Returns:
            The rows removed (RowPlan), in queue order.
        """
        removed = []
        kept: deque[StepPlan] = deque()
        for plan in self._ready:
            rows = tuple(r for r in plan.rows if r.request_id != request_id)
            if len(rows) != len(plan.rows):
                removed += [r for r in plan.rows if r.request_id == request_id]
                if not rows:
                    continue
                plan = dataclasses.replace(plan, rows=rows)
            kept.append(plan)
        self._ready = kept
        return removed
