"""What each issued DECODE or SPECULATIVE step cost the batch, fed to the width policy.

Rule: a step's cost is what a run of such steps costs the batch per step. A SPECULATIVE
step is always planned after the previous completion (its lanes need it), so every one
waits for the host's work since then -- completing that step, delivering its tokens,
proposing copied candidates, choosing, packing -- and costs from the previous plan's
completion to its own. A DECODE step costs from its issue or the previous completion,
whichever is later: in steady pipelined decode the interval between completions, its host
work hidden behind the device step before it. The host work before the first decode after
a SPECULATIVE step (a switch back: that decode could not be planned ahead) is charged to
the speculative program (`WidthPolicy.observe_switch`): speculating caused it, and a
decode run pays it once, not per step. Issue-to-completion costs for SPECULATIVE steps
(the rule before) left their host work out, so the policy ran W = 4 at batch 64 where it
lost (docs/speculative.md, "The width policy"). Time with nothing to run and nothing in
flight (`rest`) is charged to no step; TRANSFER steps and failed steps are no program's
cost the policy weighs (`skip`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from helios_serve.engine.plan import StepKind, StepPlan
from helios_serve.scheduler.capacity import smallest_capacity
from helios_serve.speculation import WidthPolicy
from helios_serve.speculation.policy import Choice


class StepClock:
    """Issue and completion clock readings of the outstanding plans, in issue order.

    Args:
        clock: seconds (time.perf_counter in service).
        policy: the width policy fed; None: readings are kept (plans are popped in
            order) but no cost is observed.
        widths: the served speculative widths W, ascending (a SPECULATIVE step's program
            is the narrowest holding its longest lane; ascending).
    """

    def __init__(self, clock: Callable[[], float], policy: WidthPolicy | None,
                 widths: tuple[int, ...]) -> None:
        self._clock = clock
        self.policy = policy
        self._widths = widths
        self._issued: deque[tuple[float, tuple | None]] = deque()  # per outstanding plan
        # clock at the latest completion (any plan), or when `wake` found work after
        # `rest` (the machine idled until then)
        self._completed_at = -float("inf")
        self._resting = True
        self._completed_key: tuple | None = None  # program key of the latest completion

    def wake(self) -> None:
        """The scheduler was asked for a plan: idle time (since `rest`) ends now."""
        if self._resting:
            self._resting = False
            self._completed_at = self._clock()

    def rest(self) -> None:
        """Nothing in flight and nothing to run: the time until `wake` is no step's."""
        self._resting = True

    def issue(self, plan: StepPlan) -> None:
        """Note `plan`'s issue (every kind: plans complete in issue order)."""
        key = None
        if self.policy is not None and plan.kind in (StepKind.DECODE, StepKind.SPECULATIVE):
            choice = Choice(0) if plan.kind is StepKind.DECODE else Choice(
                smallest_capacity(self._widths, max(r.lane_length for r in plan.rows))
                or max(self._widths), plan.packed_rows)
            key = self.policy.program_key(len(plan.rows), choice)
        self._issued.append((self._clock(), key))

    def complete(self) -> None:
        """The oldest plan completed: a DECODE or SPECULATIVE step feeds the policy its
        cost (the module's rule)."""
        issued, key = self._issued.popleft()
        now = self._clock()
        start = self._completed_at
        previous, self._completed_key = self._completed_key, key
        if key is None or key[0] == "decode":
            if key is not None and previous is not None and previous[0] != "decode" \
                    and issued > start:
                self.policy.observe_switch(previous, issued - start)  # type: ignore[union-attr]
            start = max(issued, start)
        self._completed_at = now
        if key is not None:
            self.policy.observe_step(key, now - start)  # type: ignore[union-attr]

    def skip(self) -> None:
        """The oldest plan completed without a cost to observe (a TRANSFER step, or an
        execution failure): the next step's cost starts now."""
        self._issued.popleft()
        self._completed_at = self._clock()
        self._completed_key = None
