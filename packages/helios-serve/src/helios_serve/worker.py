"""The model worker: one thread that owns the backend and the scheduler.

    admit -> schedule -> submit [-> schedule -> submit] -> wait -> scheduler.complete
          -> validate -> publish events

The HTTP event loop never blocks on model work: it hands prepared requests to a
bounded ingress channel (`submit`) and cancellations to an unbounded one (`cancel`),
and reads events from each request's `EventSink`. Every backend call, scheduler call
and output-pipeline call after submission happens on this thread.

Termination semantics stay distinct (the specification, "Frontend implementations"):
EOS ids and user stops finish with `stop`, the output limit with `length`, a dropped
reader cancels (no event), scheduler admission rejection is `Rejected`, and execution,
device or output failures are `Failed` for exactly the requests of the failed step;
the worker keeps serving the others.

Two execution frames: when the scheduler allows it (`can_schedule_ahead`: device-owned
pending tokens, no live request needing feedback), the worker submits step N + 1 before
waiting for step N, so packing and launch overlap the device; otherwise it submits one
step and waits for it. Completions are processed in submission order.

Host-stop barrier ("String stops"): the worker determines every stop before it submits
another round. While a string-stop, token-stop or constrained request is live the
scheduler keeps one round outstanding, and rounds are one token wide.

Output work off the critical path: right after `scheduler.complete` the worker stamps the
step and decides what changes scheduling (EOS, the output limit: `scheduler.finish` at
once); the output work of requests that need no feedback (pipeline: detokenize, parse;
events) runs after the next step is submitted when a step is still in flight, so the
device always has the next step queued while the host turns tokens into text. With
nothing in flight, or for requests that need feedback, it runs before the next
submission. All responses' events of one step reach the HTTP loop in one wake-up
(`events.deliver`); gauges are published at most every GAUGE_PERIOD_S and when idle.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from helios_serve.clock import ObservationClock
from helios_serve.engine.min_tokens import MinTokensBan
from helios_serve.engine.plan import (
    ModelGeometry,
    StepCompletion,
    StepKind,
    StepPlan,
    TokenLogprob,
)
from helios_serve.events import (
    Cancel,
    ChoiceState,
    Event,
    EventSink,
    Failed,
    Finished,
    FinishReason,
    GenerationRequest,
    Output,
    PromptScores,
    Rejected,
    TokenObserved,
    deliver,
)
from helios_serve.metrics import REJECT_SCHEDULER, HistogramBatch, Metrics
from helios_serve.runtime.errors import RankFailure
from helios_serve.scheduler import (
    CompletionError,
    FinishedRequest,
    RowResult,
    RowResults,
    SchedRequest,
    Scheduler,
)
from helios_serve.scheduler.finish import Stop, StopRule, check_stop, ending_eos_ids
from helios_serve.speculation import PROPOSERS

log = logging.getLogger(__name__)

GAUGE_PERIOD_S = 0.02  # gauges while busy: /metrics is scraped, not read per step


class ModelBackend(Protocol):
    """What the worker needs of NativeModel (or the test-only ScriptedModel)."""

    @property
    def manifests(self) -> ModelGeometry: ...

    @property
    def frames(self) -> int: ...

    @property
    def device_pending(self) -> bool: ...

    @property
    def outstanding(self) -> int: ...

    def submit(self, plan: StepPlan) -> Any: ...

    def wait_step(self, ticket: Any) -> StepCompletion: ...

    def close(self) -> None: ...


@dataclass
class _Live:
    """Worker-thread state of one admitted choice (one scheduler request)."""

    request: GenerationRequest
    choice: ChoiceState
    sched_id: int
    stop: StopRule  # what ends it (scheduler/finish.py)
    ban: MinTokensBan | None = None  # min_tokens: ids masked before the minimum output
    scheduled_s: float | None = None  # step clock (seconds) of its first planned row
    first_token_s: float | None = None  # step clock (seconds) of the first token
    last_token_s: float | None = None
    events: list[Event] = dataclasses.field(default_factory=list)
    undelivered: int = 0  # tokens whose events are held (stream_interval > 1)
    delivered: bool = False  # its first token's events reached the reader
    # Set when the worker ended the request in the scheduler (EOS, output limit) before
    # its last token's output work ran: the scheduler's summary for the Finished event.
    ended: FinishedRequest | None = None
    # The prepared request's needs_feedback (a property over its stops and grammar, both
    # fixed), read once: `_validate` asks it for every token.
    feedback: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.feedback = self.request.prepared.needs_feedback

    @property
    def constrained(self) -> bool:
        return self.choice.grammar is not None


@dataclass
class _Request:
    """Worker-thread state of one admitted request: its choices still generating."""

    request: GenerationRequest
    sched_ids: list[int]


@dataclass(slots=True)
class _Output:
    """A validated token whose output work (grammar, pipeline, events) is still to run."""

    live: _Live
    token: int
    output_tokens: int  # the request's output length after this token
    stamp_ns: int | None  # observation stamp (timed requests), taken after complete
    now_s: float  # the step's clock reading (latency metrics, Finished)
    logprob: TokenLogprob | None = None  # the row's logprobs record, when it asked
    # check_stop's answer for this token when `_validate` already asked it (requests
    # without feedback): the rule is the request's and fixed, so `_feed` reuses it.
    stop: Stop | None = None
    stop_checked: bool = False


@dataclass
class _Submitted:
    """A plan handed to the model: its ticket, or the error its submission raised."""

    plan: StepPlan  # as the scheduler issued it (completion is checked against it)
    ticket: Any | None
    error: Exception | None = None


class OutputError(RuntimeError):
    """A request's output cannot continue (a grammar rejected a sampled token)."""


def _request_ids(plan: StepPlan) -> list[int] | list:
    """Each row's request id, in row order, without building a plan's unbuilt rows
    (engine.plan.RowColumns)."""
    columns = plan.columns
    if columns is not None and columns.complete and columns.describes(plan):
        return columns.request_ids
    return [r.request_id for r in plan.rows]


def serving_geometry(geometry: ModelGeometry, max_active: int) -> ModelGeometry:
    """The geometry the scheduler plans against: at most `max_active` running requests.

    Slots beyond max_active stay unused; decode capacities keep every captured
    variant up to the smallest one that holds max_active rows.
    """
    slots = max(1, min(geometry.slots, max_active))
    caps = [c for c in geometry.decode_capacities if c < slots]
    caps += [c for c in geometry.decode_capacities if c >= slots][:1]
    return dataclasses.replace(geometry, slots=slots, decode_capacities=tuple(caps))


class ModelWorker:
    """Owns the backend and the scheduler on one thread.

    Args:
        model: NativeModel or ScriptedModel (`manifests`, `execute`, `close`).
        clock: the observation clock (origin at runtime startup).
        metrics: the server's metrics.
        max_active: running requests at most (model slots used).
        queue_capacity: bound of the ingress channel and of the scheduler's waiting deque.
        stream_interval: a choice's events are delivered every this many tokens (its
            first token's and its last at once); 1 delivers every step's.
    """

    def __init__(
        self,
        model: ModelBackend,
        clock: ObservationClock,
        metrics: Metrics,
        *,
        max_active: int,
        queue_capacity: int,
        history_drafting: bool = False,
        history_proposer: str = "copy",
        width_policy: bool = False,
        stream_interval: int = 1,
    ) -> None:
        self.model = model
        self.clock = clock
        self.metrics = metrics
        self.queue_capacity = queue_capacity
        self.stream_interval = stream_interval
        self._held: dict[int, _Live] = {}  # choices whose events wait for the interval
        self.geometry = serving_geometry(model.manifests, max_active)
        self.scheduler = Scheduler(self.geometry, frames=model.frames,
                                   device_pending=model.device_pending,
                                   history_drafting=history_drafting,
                                   history_index=PROPOSERS[history_proposer],
                                   width_policy=width_policy,
                                   transfer_cost=getattr(model, "transfer_cost", None))
        self._inflight: deque[_Submitted] = deque()  # submission order
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._ingress: deque[GenerationRequest] = deque()  # <= queue_capacity
        self._cancels: deque[Cancel] = deque()
        self._live: dict[int, _Live] = {}  # scheduler request id -> choice
        self._requests: dict[int, _Request] = {}  # request id -> its live choices
        self._sched_ids = itertools.count(1)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="helios-model-worker", daemon=True)
        self._reported = self.scheduler.stats()
        self._last_stats = self._reported  # published after each step (read by any thread)
        self._live_count = 0
        self._outputs: list[_Output] = []  # validated tokens awaiting output work, in order
        self._gauges_at = 0.0  # clock (s) of the last gauge publication
        self._itl = HistogramBatch(metrics.inter_token_latency)  # per token, added per step
        self._constrained_max_inflight = 0
        metrics.pages_capacity.set(self.geometry.num_pages)
        metrics.snapshot_capacity.set(self.geometry.snapshot_rows)
        metrics.host_cache_bytes_capacity.set(self.geometry.host_rows * self.geometry.page_bytes)
        metrics.slots_capacity.set(self.geometry.slots)
        metrics.window_pages_capacity.set(self.geometry.window_pages)
        metrics.cache_config_info.labels(str(self.geometry.page_tokens),
                                         str(self.geometry.num_pages)).set(1)
        metrics.lora_requests_info.labels("0", "", "").set(time.time())
        metrics.kv_cache_usage.set(0.0)
        for tokens in sorted({t for _, t in self.geometry.mixed_capacities}):
            metrics.mixed_steps.labels(str(tokens))  # each budget shown from 0
        self.crashed: BaseException | None = None
        # Liveness (liveness.StallWatch, read by any thread): one per turn of the loop, so
        # a step stuck in the model (a hung device call) stops it while work waits.
        self.steps = 0

    # -- HTTP side (any thread) -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest) -> bool:
        """Hand a prepared request to the worker; False when the ingress channel is full.

        The channel is drained only between steps, so it holds the requests that free
        slots will take as well as those that will queue: its bound is queue_capacity
        plus the slots. Whether the admission queue is full is decided in `_admit`, on
        the scheduler's state after the cancels received with the request.
        """
        with self._lock:
            if self._stopping or self.crashed is not None or not self._thread.is_alive():
                return False
            if len(self._ingress) >= self.queue_capacity + self.geometry.slots:
                return False
            self._ingress.append(request)
            self._wake.notify()
        return True

    def cancel(self, request_id: int) -> None:
        """The reader dropped the response: stop generating and release its resources.

        A request still in the ingress channel leaves it at once, so its place is free
        for the next submission (a dropped stream must not make a later one a 503).
        """
        with self._lock:
            for i, request in enumerate(self._ingress):
                if request.request_id == request_id:
                    del self._ingress[i]
                    self.metrics.requests_finished.labels("cancelled").inc()
                    return
            self._cancels.append(Cancel(request_id))
            self._wake.notify()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop (live requests fail), join the thread, close the backend."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.model.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def busy(self) -> bool:
        """It has work: a request in its ingress channel or live in the scheduler (read
        without the lock by the liveness check: a snapshot is enough)."""
        return bool(self._ingress) or bool(self._requests)

    # -- worker thread ----------------------------------------------------------------

    def _run(self) -> None:
        message = "the server is shutting down"
        try:
            while self._step():
                pass
        except RankFailure as exc:  # designed: the ranks cannot run on (one line, no trace)
            log.error("model worker stopped: %s", exc)
            self.crashed = exc
            message = f"model worker stopped: {exc}"
        except BaseException as exc:  # a bug: fail every request, mark unhealthy
            log.exception("model worker crashed")
            self.crashed = exc
            message = f"model worker crashed: {exc}"  # logged above; /health reports it
        finally:
            with self._lock:
                pending = list(self._ingress)
                self._ingress.clear()
            failed = [*pending, *(state.request for state in self._requests.values())]
            for request in failed:  # counted as _fail_request counts: once per request
                self.metrics.requests_finished.labels("error").inc()
                request.sink.publish([Failed(message)])
            self._live.clear()
            self._requests.clear()

    def _step(self) -> bool:
        """One iteration: submit a plan if the scheduler allows one, then complete the
        oldest in-flight plan unless another may still be submitted ahead of it.
        False when stopping."""
        self.steps += 1
        if not self._drain_ingress():
            return False
        submitted = False
        if self.scheduler.can_schedule_ahead():
            plan = self.scheduler.schedule()
            if plan is not None:
                self._submit(plan)
                submitted = True
        self._flush_outputs()  # the last completion's output work, behind the new step
        if self._inflight:
            if not (submitted and self.scheduler.can_schedule_ahead()):
                self._complete_oldest()
        elif not submitted:
            if self._held:
                self._deliver({})  # nothing runs: every held event goes now
            self._gauges_at = -GAUGE_PERIOD_S  # idle: publish now
            self._publish_gauges()
            with self._lock:  # nothing runnable: sleep until ingress or a cancel arrives
                if not self._ingress and not self._cancels and not self._stopping:
                    self._wake.wait(0.05 if self.scheduler.has_work() else 1.0)
            return True
        self._publish_gauges()
        return True

    def _drain_ingress(self) -> bool:
        with self._lock:
            if self._stopping:
                return False
            requests = list(self._ingress)
            cancels = list(self._cancels)
            self._ingress.clear()
            self._cancels.clear()
        # Cancels first: a queued request whose reader left must free its queue room
        # before the requests HTTP admitted meanwhile are queued (else a spurious 503).
        for cancel in cancels:
            self._cancel(cancel.request_id)
        for request in requests:
            self._admit(request)
        return True

    def _admit(self, request: GenerationRequest) -> None:
        # The pending admission deque holds requests waiting for a slot; those that free
        # slots take at the next schedule are not pending. A slot whose request already
        # ended (finished or cancelled) but still drains an in-flight frame counts as
        # free: with two frames it is released when that frame completes. The choices of
        # a request of n are n scheduler requests; choice i > 0 forks from choice 0's
        # computed prompt (shared complete pages, one prefill).
        stats = self.scheduler.stats()
        n = len(request.choices)
        if stats.waiting - (stats.slots_total - stats.running) + n > self.queue_capacity:
            self._reject(request, f"the admission queue is full ({self.queue_capacity} waiting)")
            return
        prepared = request.prepared
        sched_ids = [next(self._sched_ids) for _ in request.choices]
        for choice, sched_id in zip(request.choices, sched_ids, strict=True):
            error = self.scheduler.add(
                SchedRequest(
                    request_id=sched_id,
                    prompt_tokens=prepared.prompt_token_ids,
                    max_output_tokens=prepared.max_output_tokens,
                    sampling=choice.sampling,
                    needs_feedback=prepared.needs_feedback,
                    width_one=prepared.constrained,
                    candidate_filter=(choice.grammar.candidate_prefix
                                      if choice.grammar is not None else None),
                    fork_of=sched_ids[0] if sched_id != sched_ids[0] else None,
                    publish_endpoints=prepared.publish_endpoints,
                    # the prompt's scores are the same for every choice: the first's
                    score_prompt=prepared.prompt_logprobs is not None
                    and sched_id == sched_ids[0],
                    images=prepared.images,
                )
            )
            if error is not None:  # prepared against the same rule: only a geometry bug
                for added in sched_ids[: sched_ids.index(sched_id)]:
                    self.scheduler.cancel(added)
                    del self._live[added]
                self._reject(request, error.detail, error.reason)
                return
            sampling = choice.sampling
            ban = None
            if sampling.min_tokens > 0 and sampling.min_tokens_banned:
                ban = MinTokensBan(len(prepared.prompt_token_ids), sampling.min_tokens,
                                   sampling.min_tokens_banned, self.geometry.mask_words)
            stop = StopRule(prepared.max_output_tokens,
                            ending_eos_ids(self.geometry.eos_token_ids, prepared.ignore_eos),
                            prompt_tokens=len(prepared.prompt_token_ids),
                            context_tokens=self.geometry.context_tokens)
            self._live[sched_id] = _Live(request, choice, sched_id, stop, ban)
        self._requests[request.request_id] = _Request(request, sched_ids)
        self.metrics.prompt_tokens.inc(len(prepared.prompt_token_ids))

    def _reject(self, request: GenerationRequest, message: str, reason=None) -> None:
        self.metrics.requests_rejected.labels(REJECT_SCHEDULER).inc()
        request.sink.publish([Rejected(message, reason)])

    def _cancel(self, request_id: int) -> None:
        state = self._requests.get(request_id)
        if state is None:
            return  # already finished: the reader released a finished response
        cancelled = False
        for sched_id in list(state.sched_ids):
            live = self._live[sched_id]
            if live.ended is not None:
                continue  # ended in the scheduler; its output work delivers the end
            del self._live[sched_id]
            self._held.pop(id(live), None)  # its reader is gone
            state.sched_ids.remove(sched_id)
            self.scheduler.cancel(sched_id)
            cancelled = True
        if not state.sched_ids:
            del self._requests[request_id]
        if cancelled:
            self.metrics.requests_finished.labels("cancelled").inc()

    def _submit(self, plan: StepPlan) -> None:
        """Hand `plan` (grammar masks filled) to the model without waiting for it."""
        submitted = self._with_masks(plan)
        now_s = self.clock.now_ns() / 1e9
        constrained = []
        for request_id in _request_ids(plan):
            live = self._live.get(request_id)
            constrained.append(live is not None and live.constrained)
            if live is not None and live.scheduled_s is None:
                live.scheduled_s = now_s
                if live.request.enqueue_ns is not None:
                    self.metrics.queue_time.observe(
                        max(0.0, now_s - live.request.enqueue_ns / 1e9))
        try:
            ticket = self.model.submit(submitted)
        except Exception as exc:  # packing or launch failure: failed in submission order
            self._inflight.append(_Submitted(plan, None, exc))
            return
        self._inflight.append(_Submitted(plan, ticket))
        self.metrics.graph_launches.labels(plan.kind.value).inc()
        if plan.kind is StepKind.DECODE:
            rows = plan.row_count
            self.metrics.decode_rows.inc(rows)
            self.metrics.decode_padded_rows.inc(self._decode_bucket(rows) - rows)
        elif plan.kind is StepKind.MIXED:
            self.metrics.mixed_lanes.inc(plan.lanes)
            self.metrics.mixed_steps.labels(str(plan.token_budget)).inc()
        if any(constrained):
            # Frames outstanding right after a constrained submission (the scheduler keeps
            # it at one); the gauge records the maximum ever seen.
            self._constrained_max_inflight = max(self._constrained_max_inflight,
                                                 self.model.outstanding)
            self.metrics.constrained_max_inflight.set(self._constrained_max_inflight)
            if plan.kind in (StepKind.DECODE, StepKind.SPECULATIVE) and not all(constrained):
                self.metrics.mixed_grammar_decode_steps.inc()

    def _decode_bucket(self, rows: int) -> int:
        """Rows of the captured decode variant a DECODE step of `rows` rows runs (the
        smallest that holds them, as NativeModel.select_graph picks)."""
        return min((c for c in self.model.manifests.decode_capacities if c >= rows),
                   default=rows)

    def _complete_oldest(self) -> None:
        """Wait for the oldest submitted plan and apply its completion."""
        item = self._inflight.popleft()
        plan = item.plan
        try:
            if item.error is not None:
                raise item.error
            completion = self.model.wait_step(item.ticket)
        except RankFailure:  # the tensor-parallel ranks cannot run on: the model is gone
            raise  # _run fails every request and marks the worker crashed (unhealthy)
        except Exception as exc:  # submission, execution or device failure: this step only
            log.warning("execution failed: %s", exc)
            self.metrics.execution_failures.inc()
            self._fail_plan(plan, f"model execution failed: {exc}")
            return
        try:
            if plan.scored and (completion.scores is None
                                or len(completion.scores) < plan.token_count):
                raise CompletionError("a scored step's record holds no score for every "
                                      "packed token")
            results = self.scheduler.complete(plan, completion.sampled,
                                              confidence=completion.confidence)
        except CompletionError as exc:  # the completion record is invalid: output error
            log.warning("invalid completion record: %s", exc)
            self._fail_plan(plan, f"invalid completion record: {exc}")
            return
        if plan.scored:
            self._prompt_scores(plan, completion)
        self._validate(results, self._logprobs(plan, completion))

    def _prompt_scores(self, plan: StepPlan, completion: StepCompletion) -> None:
        """Queue the PromptScores of each scoring row of a completed scored step on its
        choice's events (they reach the reader with its next delivery, ahead of the
        choice's first Output)."""
        tops = {row.request_id: live.request.prepared.prompt_logprobs
                for row in plan.rows if row.score_targets is not None
                and (live := self._live.get(row.request_id)) is not None
                and live.request.prepared.prompt_logprobs is not None}
        for request_id, logprobs in completion.prompt_scores(plan, tops).items():
            live = self._live[request_id]
            if logprobs:
                live.events.append(PromptScores(logprobs, live.choice.index))

    def _logprobs(self, plan: StepPlan, completion: StepCompletion) -> dict[int, TokenLogprob]:
        """request id -> its row's TokenLogprob, for the sampling rows that asked (only
        those pay for reading the record)."""
        if completion.logprobs is None:
            return {}
        columns = plan.columns
        if columns is not None and columns.complete and columns.describes(plan):
            # Rows unbuilt (every row samples): the asks are the logprobs column.
            return {columns.request_ids[i]: completion.token_logprob(i, int(columns.logprobs[i]))
                    for i in np.flatnonzero(columns.logprobs >= 0).tolist()}
        return {row.request_id: completion.token_logprob(i, row.sampling.logprobs)
                for i, row in enumerate(plan.rows)
                if row.sample and row.sampling.logprobs is not None}

    def _with_masks(self, plan: StepPlan) -> StepPlan:
        """The plan as submitted: grammar masks filled for constrained sampling rows.

        The scheduler keeps the original plan object (completion is checked by
        identity); the backend gets a copy whose rows carry the masks. A constrained
        speculative lane with copied candidates also gets the grammar mask of every
        position after each candidate (CopiedCandidates.grammar_masks; the scheduler kept
        only candidates the grammar accepts). A grammar that cannot produce its masks is
        an output error of that request alone: it fails now, and its row runs
        unconstrained with the result discarded at completion.
        """
        live_of = self._live.get
        if not any((live := live_of(request_id)) is not None
                   and (live.constrained or live.ban is not None)
                   for request_id in _request_ids(plan)):
            return plan  # no row can get a mask (its rows stay unbuilt where they are)
        rows = []
        changed = False
        for row in plan.rows:
            live = self._live.get(row.request_id)
            mask = None
            candidates = row.candidates
            if row.sample and live is not None and live.constrained:
                grammar = live.choice.grammar
                assert grammar is not None
                mask = np.zeros(self.geometry.mask_words, dtype=np.int32)
                try:
                    grammar.fill_mask(mask)
                    if candidates is not None:
                        candidates = dataclasses.replace(
                            candidates, grammar_masks=grammar.candidate_masks(candidates.ids))
                except Exception as exc:
                    log.warning("grammar mask failed for a request: %s", exc)
                    self._fail_request(live, f"grammar mask failed: {exc}")
                    rows.append(row)
                    continue
            if live is not None and live.ban is not None and live.ban.applies(row):
                mask = live.ban.mask(mask)  # min_tokens: EOS and stop ids masked out
            if mask is not None:
                rows.append(dataclasses.replace(row, grammar_mask=mask, candidates=candidates))
                changed = True
            else:
                rows.append(row)
        # replace keeps packed_rows: a prefix-limit step stays one
        return dataclasses.replace(plan, rows=tuple(rows)) if changed else plan

    def _fail_request(self, live: _Live, message: str) -> None:
        """End a request (every choice) with an output error; its frames drain in the
        scheduler."""
        state = self._requests.pop(live.request.request_id, None)
        if state is None:
            return
        events: list[Event] = []
        for sched_id in state.sched_ids:
            choice = self._live.pop(sched_id, None)
            if choice is None:
                continue
            events += choice.events
            choice.events = []
            # A failed plan's requests have left the scheduler already (Scheduler.fail).
            if choice.ended is None and self.scheduler.is_live(sched_id):
                self.scheduler.finish(sched_id, FinishReason.ERROR)
        self.metrics.requests_finished.labels("error").inc()
        live.request.sink.publish(events + [Failed(message)])

    def _fail_plan(self, plan: StepPlan, message: str) -> None:
        self._flush_outputs()  # earlier steps' output reaches the readers before the error
        for summary in self.scheduler.fail(plan):
            live = self._live.get(summary.request_id)
            if live is not None:
                self._fail_request(live, message)

    def _validate(self, results: list[RowResult] | RowResults,
                  logprobs: dict[int, TokenLogprob] | None = None) -> None:
        """Per-request validation of one completed step, in submission-row order;
        `logprobs` holds the TokenLogprob of each sampled row that asked for one.

        What changes scheduling is decided here, before the next `schedule()`: EOS and
        the output limit end the request in the scheduler at once. The output work
        (`_feed`) is queued; it runs now when nothing else is in flight or a request of
        this step needs feedback (the host-stop barrier), else after the next
        submission (`_step`).
        """
        logprobs = logprobs or {}
        live_of = self._live.get
        triples = (results.columns() if isinstance(results, RowResults)
                   else ((r.request_id, r.token_id, r.output_tokens) for r in results))
        # the specification, "Token and timing observation": stamp validated completions
        # right after scheduler.complete, before grammar, stops or parsing. The clock is
        # read once per step (never per token), and that one reading is the observation
        # stamp of timed requests and the time of the latency histograms.
        now_ns = self.clock.now_ns()
        now_s = now_ns / 1e9
        feedback = False
        tokens = 0
        for request_id, token_id, output_tokens in triples:
            if token_id is None:
                continue
            live = live_of(request_id)
            if live is None or live.ended is not None:
                continue  # ended by an earlier token of its speculative run
            prepared = live.request.prepared
            token = int(token_id)
            self._observe_latency(live, now_s)
            stamp_ns = now_ns if prepared.observe_timestamps else None
            out = _Output(live, token, output_tokens, stamp_ns, now_s,
                          logprobs.get(request_id) if logprobs else None)
            self._outputs.append(out)
            tokens += 1
            if live.feedback:
                feedback = True
            else:
                stop = out.stop = check_stop(live.stop, token, output_tokens)
                out.stop_checked = True
                if stop is not None:
                    live.ended = self.scheduler.finish(live.sched_id, stop.reason,
                                                       output_tokens,
                                                       publish=stop.publish)
        self.metrics.generation_tokens.inc(tokens)
        self._itl.flush()
        if feedback or not self._inflight:
            self._flush_outputs()

    def _observe_latency(self, live: _Live, now_s: float) -> None:
        request = live.request
        if live.first_token_s is None:
            if request.enqueue_ns is not None:
                self.metrics.time_to_first_token.observe(max(0.0, now_s - request.enqueue_ns / 1e9))
            if live.scheduled_s is not None:
                self.metrics.prefill_time.observe(max(0.0, now_s - live.scheduled_s))
            live.first_token_s = now_s
        elif live.last_token_s is not None:
            self._itl.observe(max(0.0, now_s - live.last_token_s))
        live.last_token_s = now_s

    def _flush_outputs(self) -> None:
        """Run the queued output work, then deliver every response's new events at once."""
        if not self._outputs:
            return
        outputs, self._outputs = self._outputs, []
        touched: dict[int, _Live] = {}
        for out in outputs:
            live = out.live
            if self._live.get(live.sched_id) is not live:
                continue  # cancelled or failed after its completion
            try:
                self._feed(out)
            except Exception as exc:  # output pipeline failure: this request only
                log.warning("output failed for a request: %s", exc)
                self._fail_request(live, f"output failed: {exc}")
                touched.pop(id(live), None)
                continue
            live.undelivered += 1
            touched[id(live)] = live
        self._deliver(touched)

    def _deliver(self, touched: dict[int, _Live]) -> None:
        """Hand the new events of the choices fed this step (`touched`) and of the held
        ones to their readers, in one wake-up of the HTTP loop.

        With stream_interval N a choice's events wait until N tokens are held; its first
        token (TTFT), its end, and a held choice that got no token this step (a stalled
        request keeps nothing back) go at once.
        """
        batches: list[tuple[EventSink, list[Event]]] = []
        if self.stream_interval == 1 and not self._held:  # nothing is ever held back
            for live in touched.values():
                if live.events:
                    batches.append((live.request.sink, live.events))
                    live.events = []
                    live.undelivered = 0
                    live.delivered = True
            deliver(batches)
            return
        held, self._held = self._held, {}
        held.update(touched)
        for key, live in held.items():
            if not live.events:
                continue
            if (key in touched and live.delivered and live.undelivered < self.stream_interval
                    and self._live.get(live.sched_id) is live):
                self._held[key] = live
                continue
            batches.append((live.request.sink, live.events))
            live.events = []
            live.undelivered = 0
            live.delivered = True
        deliver(batches)

    def _feed(self, out: _Output) -> None:
        """One token's output work: observation, grammar, pipeline, finish."""
        live = out.live
        choice, prepared = live.choice, live.request.prepared
        token, logprob = out.token, out.logprob
        if prepared.observe_ids:
            live.events.append(TokenObserved(token, out.stamp_ns, choice.index))
        if choice.grammar is not None and not choice.grammar.advance(token):
            raise OutputError(
                f"the grammar rejected sampled token {token}: {choice.grammar.error}"
            )
        # The pipeline sees every sampled id: EOS ends generation there, token and
        # string stops are matched there, before presentation.
        pipeline = choice.pipeline
        deltas = pipeline.feed(token)
        if pipeline.finish_reason is None:  # EOS and host stops: the pipeline ended it already
            stop = (out.stop if out.stop_checked
                    else check_stop(live.stop, token, out.output_tokens))
            if stop is not None:
                deltas = deltas + pipeline.finish(stop.reason)
        # One TokenLogprob per sampled token, except the EOS id that ends the request.
        if (logprob is not None and pipeline.finish_reason is not None
                and token in self.geometry.eos_token_ids):
            logprob = None
        if deltas or logprob is not None:
            live.events.append(Output(tuple(deltas), choice.index,
                                      (logprob,) if logprob else (), out.output_tokens))
        if pipeline.finish_reason is not None:
            assert pipeline.finish_reason is not None
            # EOS and the output limit end at a publishable endpoint; a matched stop's
            # private candidate is discarded ("String stops").
            self._finish(live, pipeline.finish_reason, out.now_s, out.output_tokens,
                         publish=not pipeline.matched_stop)

    def _finish(self, live: _Live, reason: FinishReason, now_s: float,
                output_tokens: int | None = None, publish: bool = False) -> None:
        """End a choice at the token it finished on (`output_tokens`: the output up to
        and including that token; later tokens of the same speculative run are
        discarded)."""
        request = live.request
        summary: FinishedRequest = live.ended or self.scheduler.finish(
            live.sched_id, reason, output_tokens, publish=publish)
        del self._live[live.sched_id]
        if not live.choice.relayed:  # a relayed choice's reason is the frontend's
            self.metrics.requests_finished.labels(reason.value).inc()
        if live.first_token_s is not None:
            self.metrics.decode_time.observe(max(0.0, now_s - live.first_token_s))
        state = self._requests[request.request_id]
        state.sched_ids.remove(live.sched_id)
        if not state.sched_ids:
            del self._requests[request.request_id]
            if request.enqueue_ns is not None:
                self.metrics.e2e_latency.observe(max(0.0, now_s - request.enqueue_ns / 1e9))
        live.events.append(
            Finished(
                reason=reason,
                prompt_tokens=len(request.prepared.prompt_token_ids),
                completion_tokens=len(summary.output_tokens),
                reused_prompt_tokens=summary.reused_prompt_tokens,
                choice=live.choice.index,
            )
        )

    def _publish_gauges(self) -> None:
        """After every step; publishes at most every GAUGE_PERIOD_S (at once when idle)."""
        now_s = self.clock.now_ns() / 1e9
        if now_s - self._gauges_at < GAUGE_PERIOD_S:
            return
        self._gauges_at = now_s
        stats = self.scheduler.stats()
        m = self.metrics
        m.requests_running.set(stats.running)
        m.requests_waiting.set(stats.waiting)
        m.pages_used.set(stats.pages_used)
        m.kv_cache_usage.set(stats.pages_used / self.geometry.num_pages)
        m.pages_evictable.set(stats.pages_evictable)
        m.window_pages_used.set(stats.window_pages_used)
        m.snapshots_resident.set(stats.snapshots_resident)
        m.host_cache_bytes_used.set(stats.host_rows_used * self.geometry.page_bytes)
        before = self._reported
        for counter, now, then in (
            (m.prefix_cache_queries, stats.prefix_queries, before.prefix_queries),
            (m.prefix_cache_hits, stats.prefix_hit_tokens, before.prefix_hit_tokens),
            (m.pages_published, stats.pages_published, before.pages_published),
            (m.page_evictions, stats.page_evictions, before.page_evictions),
            (m.window_pages_released, stats.window_pages_released,
             before.window_pages_released),
            (m.preemptions, stats.preemptions, before.preemptions),
            (m.prefill_tokens, stats.prompt_tokens_computed, before.prompt_tokens_computed),
            (m.snapshot_publications, stats.snapshot_publications,
             before.snapshot_publications),
            (m.snapshot_evictions, stats.snapshot_evictions, before.snapshot_evictions),
            (m.snapshot_hits, stats.snapshot_hits, before.snapshot_hits),
            (m.host_cache_hits, stats.host_hits, before.host_hits),
            (m.host_cache_swap_ins, stats.host_swap_ins, before.host_swap_ins),
            (m.host_cache_swap_outs, stats.host_swap_outs, before.host_swap_outs),
            (m.host_cache_evictions, stats.host_evictions, before.host_evictions),
            (m.spec_draft_tokens.labels("learned"),
             stats.spec_draft_tokens - stats.spec_copied_draft_tokens,
             before.spec_draft_tokens - before.spec_copied_draft_tokens),
            (m.spec_accepted_tokens.labels("learned"),
             stats.spec_accepted_tokens - stats.spec_copied_accepted_tokens,
             before.spec_accepted_tokens - before.spec_copied_accepted_tokens),
            (m.spec_draft_tokens.labels("copied"), stats.spec_copied_draft_tokens,
             before.spec_copied_draft_tokens),
            (m.spec_accepted_tokens.labels("copied"), stats.spec_copied_accepted_tokens,
             before.spec_copied_accepted_tokens),
        ):
            if now > then:  # scheduler counters are cumulative; export their increments
                counter.inc(now - then)
        for counter, now_by, then_by in (
                (m.spec_draft_per_position, stats.spec_offered_by_source,
                 before.spec_offered_by_source),
                (m.spec_accepted_per_position, stats.spec_accepted_by_source,
                 before.spec_accepted_by_source)):
            for source, counts in now_by.items():
                earlier = then_by.get(source) or (0,) * len(counts)
                for position, (now, then) in enumerate(zip(counts, earlier, strict=True)):
                    if now > then:
                        counter.labels(str(position), source).inc(now - then)
        for length, (now, then) in enumerate(zip(
                stats.spec_accepted_lengths,
                before.spec_accepted_lengths or (0,) * len(stats.spec_accepted_lengths),
                strict=True)):
            for _ in range(now - then):  # one observation per speculative lane round
                m.spec_accepted_length.observe(length)
        self._reported = stats
        self._last_stats = stats
        self._live_count = len(self._live)

    # -- introspection (tests, /health) --------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Scheduler counters as of the last step (tests, /health); any thread."""
        stats, live = self._last_stats, self._live_count
        return {
            "idle": stats.idle and live == 0,
            "running": stats.running,
            "waiting": stats.waiting,
            "pages_used": stats.pages_used,
            "slots_free": stats.slots_free,
            "live": live,
        }
