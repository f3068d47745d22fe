"""Serial: the real scheduler over a NativeModel, one plan at a time (tests, benchmarks).

Greedy requests that end at their output limit (a publishable end: each publishes a
snapshot of its committed tokens), with every sampling row's logits collected from the
llama family's logits scratch buffer (`LOGITS`: on the CPU backend the working buffer, on
cuda a device-to-host copy after the step).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from helios_serve.engine.plan import Route, StepKind, StepPlan
from helios_serve.runtime.native_model import NativeModel
from helios_serve.scheduler import SchedRequest, Scheduler, TransferCost
from helios_serve.scheduler.finish import StopRule, check_stop

LOGITS = "scratch.logits"  # [rows, vocab] f32 of the llama family's sampling steps


class Serial:
    """Scheduler + model, serially.

    Args:
        model: a loaded NativeModel.
        transfer_cost: the swap-or-recompute costs (default: the model's).
        logits: collect each sampling row's logits in `self.logits[request]`.
    """

    def __init__(self, model: NativeModel, transfer_cost: TransferCost | None = None,
                 logits: bool = True):
        self.model = model
        self.sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending,
                               transfer_cost=transfer_cost or model.transfer_cost)
        self.collect = logits
        self.limits: dict[int, int] = {}
        self.out: dict[int, list[int]] = {}
        self.logits: dict[int, list[np.ndarray]] = {}
        self.reused: dict[int, int] = {}
        # (perf_counter(), process_time()) at add and at each request's first output token
        self.added_s: dict[int, tuple[float, float]] = {}
        self.first_token_s: dict[int, tuple[float, float]] = {}
        self.plans: list[StepPlan] = []
        self.plan_s: list[float] = []  # wall seconds of each plan's execute (submit + wait)
        # per request: index into `plans` at its add and just after its first token's step
        self.added_plan: dict[int, int] = {}
        self.first_token_plan: dict[int, int] = {}

    def add(self, rid: int, prompt: Sequence[int], limit: int, **kw) -> None:
        error = self.sched.add(SchedRequest(rid, tuple(prompt), limit, **kw))
        if error is not None:
            raise ValueError(error.detail)
        self.limits[rid], self.out[rid], self.logits[rid] = limit, [], []
        self.added_s[rid] = (time.perf_counter(), time.process_time())
        self.added_plan[rid] = len(self.plans)

    def run(self) -> None:
        """Plan, execute and complete until every request has finished."""
        while self.sched.has_work():
            plan = self.sched.schedule()
            if plan is None:
                raise RuntimeError("the scheduler has work but planned nothing")
            self.plans.append(plan)
            started = time.perf_counter()
            sampled = self.model.execute(plan)
            self.plan_s.append(time.perf_counter() - started)
            if self.collect and plan.kind is not StepKind.TRANSFER:
                logits = self._logits()
                for i, row in enumerate(plan.rows):
                    if row.sample:
                        self.logits[row.request_id].append(logits[i].copy())
            for r in self.sched.complete(plan, sampled):
                if r.token_id is None:
                    continue
                if not self.out[r.request_id]:
                    self.first_token_s[r.request_id] = (time.perf_counter(), time.process_time())
                    self.first_token_plan[r.request_id] = len(self.plans)
                self.out[r.request_id].append(r.token_id)
                if r.request_id in self.reused:
                    continue  # finished already
                stop = check_stop(StopRule(self.limits[r.request_id]), r.token_id,
                                  len(self.out[r.request_id]))
                if stop is not None:
                    s = self.sched.finish(r.request_id, stop.reason, publish=stop.publish)
                    self.reused[r.request_id] = s.reused_prompt_tokens

    def _logits(self) -> np.ndarray:
        backend = self.model.backend
        read = getattr(backend, "read_buffer", None)
        if backend.name == "cuda" and read is not None:
            return read(LOGITS)
        return backend.buffers[LOGITS]

    def ttft_s(self, rid: int) -> float:
        """Seconds from `add` to request `rid`'s first output token (wall clock)."""
        return self.first_token_s[rid][0] - self.added_s[rid][0]

    def ttft_cpu_s(self, rid: int) -> float:
        """CPU seconds this process (every thread) spent from `add` to request `rid`'s
        first output token: the work itself, less sensitive to a loaded host than
        `ttft_s` (the NumPy kernels run on this process's threads)."""
        return self.first_token_s[rid][1] - self.added_s[rid][1]

    def steps_to_first_token(self, rid: int) -> list[tuple[StepPlan, float]]:
        """(plan, execute seconds) of each plan run from request `rid`'s add up to and
        including the step that sampled its first token (with one request at a time: the
        steps its TTFT covers)."""
        window = slice(self.added_plan[rid], self.first_token_plan[rid])
        return list(zip(self.plans[window], self.plan_s[window], strict=True))

    def copies(self, route: Route) -> int:
        """Rows copied along `route` so far."""
        return sum(len(p.copies) for p in self.plans
                   if p.kind is StepKind.TRANSFER and p.route == route)
