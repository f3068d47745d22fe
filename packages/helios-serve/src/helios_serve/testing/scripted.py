"""ScriptedModel: a test-only backend with NativeModel's interface and chosen outputs.

It executes the scheduler's real `StepPlan`s: it writes each row's tokens into an
emulated paged cache (page id, offset) exactly where the plan's page table says, reads
the row's whole sequence back through the same page table, and returns the next token
of the script chosen for that sequence's prompt. Prefix reuse, preemption and
recompute therefore work (and are checked) as on a real model; a wrong page table
yields a wrong prompt and a wrong script.

Execution frames: with `frames=2` and `device_pending=True` it behaves like a core
whose pending token is device-owned: a decode row feeds the slot's last sampled token
(the plan's token may be PENDING_PLACEHOLDER; a concrete one must agree), and `submit`
may run ahead of `wait`. Steps run inside `submit`; a fault surfaces from `wait`.

Logprobs: with `geometry.top_logprobs` set, a sampling row that asks for logprobs gets a
fixed record: the sampled id at -0.25, alternative j (0-based) the id `(sampled + j) %
vocab` at `-0.25 - j` (so the first alternative is the sampled id itself).

TRANSFER plans copy rows of token ids between the emulated tiers (pages, continuation
rows, host rows) exactly as the captured RESTORE programs copy KV rows, so a restored or
swapped-in history that is wrong reads back as a wrong prompt too.

Faults: `fail_when(predicate)` raises `ScriptedFault` from `execute` for every plan the
predicate accepts; `fail_at_step(n)` raises on the n-th execute call (0-based);
`fail_on_sequence(predicate)` raises when a sampling row's whole sequence (prompt and
output so far, read back through the page table) satisfies the predicate.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from helios_serve.engine.plan import (
    PENDING_PLACEHOLDER,
    ModelGeometry,
    Route,
    StepCompletion,
    StepKind,
    StepPlan,
    Tier,
)

Responder = Callable[[tuple[int, ...]], Sequence[int]]


class ScriptedFault(RuntimeError):
    """The injected execution failure."""


def tiny_geometry(
    vocab_size: int,
    *,
    eos_token_ids: tuple[int, ...] = (2,),
    page_tokens: int = 4,
    num_pages: int = 256,
    slots: int = 8,
    max_pages_per_request: int = 64,
    decode_capacities: tuple[int, ...] = (1, 2, 4, 8),
    prefill_token_capacities: tuple[int, ...] = (32, 64),
    prefill_row_capacity: int = 4,
    speculative_widths: tuple[int, ...] = (),
    lane_limits: tuple[int, ...] = (),
    top_logprobs: int | None = None,
    logit_bias: bool = False,
    copied_proposals: bool = False,
    prefix_programs: tuple[tuple[int, int, int], ...] = (),
    snapshot_rows: int = 0,
    host_rows: int = 0,
    transfer_rows: int = 8,
    scored_token_capacities: tuple[int, ...] = (),
) -> ModelGeometry:
    """A small geometry for scripted tests (context = 256 tokens by default;
    `speculative_widths` makes generation rows SPECULATIVE lanes, draft cursor lag 0
    (`lane_limits`: each width's lane limit, ModelGeometry.lane_limits);
    `snapshot_rows` / `host_rows` back snapshots and the host tier, every transfer route
    served; `scored_token_capacities` plans scored prefill steps, whose scores the
    scripted model does not record)."""
    return ModelGeometry(
        page_tokens=page_tokens,
        num_pages=num_pages,
        slots=slots,
        max_pages_per_request=max_pages_per_request,
        decode_capacities=decode_capacities,
        prefill_token_capacities=prefill_token_capacities,
        prefill_row_capacity=prefill_row_capacity,
        context_tokens=page_tokens * max_pages_per_request,
        vocab_size=vocab_size,
        mask_words=(vocab_size + 31) // 32,
        eos_token_ids=eos_token_ids,
        speculative_widths=speculative_widths,
        lane_limits=lane_limits,
        draft_cursor_lag=0 if speculative_widths else None,
        top_logprobs=top_logprobs,
        logit_bias=logit_bias,
        copied_proposals=copied_proposals,
        prefix_programs=prefix_programs,
        snapshot_rows=snapshot_rows,
        host_rows=host_rows,
        transfer_rows=transfer_rows,
        routes=ALL_ROUTES,
        page_bytes=page_tokens * 8,
        scored_token_capacities=scored_token_capacities,
    )


ALL_ROUTES = (
    Route(Tier.PAGES, Tier.HOST), Route(Tier.CONTINUATION, Tier.HOST),
    Route(Tier.PAGES, Tier.CONTINUATION), Route(Tier.HOST, Tier.PAGES),
    Route(Tier.CONTINUATION, Tier.PAGES),
)


@dataclass
class ScriptedTicket:
    """A submitted step: its completion record, or the fault `wait` raises."""

    completion: StepCompletion | None
    error: BaseException | None


class ScriptedModel:
    """NativeModel's interface (`manifests`, `execute`, `close`) over scripted outputs.

    Args:
        geometry: what `manifests` reports and what plans are checked against.
        responder: maps a prompt (token ids) to its scripted output ids; when the
            script runs out the model emits the first EOS id.
        step_delay_s: sleep per execute call (paces tests of concurrency and cancellation).
        frames: execution frames `submit` may fill before `wait`.
        device_pending: decode rows feed the slot's last sampled token (see module).
        accept: SPECULATIVE lanes: drafts accepted given (request_id, offers); default
            every draft (offers - 1). A lane emits the script's next accepted + 1 tokens.
    """

    def __init__(
        self, geometry: ModelGeometry, responder: Responder, *, step_delay_s: float = 0.0,
        frames: int = 1, device_pending: bool = False,
        accept: Callable[[int, int], int] | None = None,
    ) -> None:
        self._geometry = geometry
        self.frames = frames
        self.device_pending = device_pending
        self._pending = np.full(geometry.slots, -1, dtype=np.int64)  # per slot
        self._inflight: deque[ScriptedTicket] = deque()
        self.max_outstanding = 0  # most steps submitted and not yet waited for
        self.responder = responder
        self.step_delay_s = step_delay_s
        self._pages = np.full((geometry.num_pages, geometry.page_tokens), -1, dtype=np.int64)
        self._tiers = {
            Tier.PAGES: self._pages,
            Tier.CONTINUATION: np.full((geometry.snapshot_rows, geometry.page_tokens), -1,
                                       dtype=np.int64),
            Tier.HOST: np.full((geometry.host_rows, geometry.page_tokens), -1, dtype=np.int64),
        }
        self.copies: dict[Route, int] = {}  # rows copied per TRANSFER route
        self._prompt_tokens: dict[int, int] = {}  # request_id -> prompt length
        self._scripts: dict[int, list[int]] = {}  # request_id -> scripted output
        self._lock = threading.Lock()
        self._faults: list[Callable[[StepPlan], bool]] = []
        self._sequence_faults: list[Callable[[tuple[int, ...]], bool]] = []
        self._row_faults: list[Callable[[tuple[int, ...]], bool]] = []
        self.masked_rows = 0  # sampling rows that carried a grammar mask
        self.steps = 0  # execute calls so far
        self.launches: dict[StepKind, int] = dict.fromkeys(StepKind, 0)
        self.closed = False
        self.accept = accept or (lambda _request_id, offers: offers - 1)
        self.lane_lengths: list[int] = []  # every SPECULATIVE lane's length, in order
        # every SPECULATIVE lane's copied candidate ids (() for none), in order
        self.lane_candidates: list[tuple[int, ...]] = []
        self._record_faults: list[Callable[[StepPlan, np.ndarray], None]] = []

    def corrupt_records(self, edit: Callable[[StepPlan, np.ndarray], None]) -> None:
        """Let `edit(plan, record)` change every SPECULATIVE completion record in place
        (validation tests: the scheduler must reject the step)."""
        with self._lock:
            self._record_faults.append(edit)

    @property
    def manifests(self) -> ModelGeometry:
        return self._geometry

    def fail_when(self, predicate: Callable[[StepPlan], bool]) -> None:
        """Raise ScriptedFault for every plan `predicate` accepts."""
        with self._lock:
            self._faults.append(predicate)

    def fail_at_step(self, step: int) -> None:
        """Raise ScriptedFault on the `step`-th execute call (0-based)."""
        target = step
        self.fail_when(lambda _plan: self.steps == target)

    def fail_on_sequence(self, predicate: Callable[[tuple[int, ...]], bool]) -> None:
        """Raise ScriptedFault when a sampling row's sequence satisfies `predicate`."""
        with self._lock:
            self._sequence_faults.append(predicate)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._sequence_faults.clear()

    def sequence(self, page_ids: Sequence[int], length: int) -> tuple[int, ...]:
        """Tokens [0, length) read back through a page table."""
        pt = self._geometry.page_tokens
        return tuple(int(self._pages[page_ids[p // pt], p % pt]) for p in range(length))

    def execute(self, plan: StepPlan) -> np.ndarray:
        """Run one plan; returns int32 [len(plan.rows)] sampled ids (submission rows)."""
        if self.closed:
            raise RuntimeError("ScriptedModel is closed")
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        with self._lock:
            faults = list(self._faults)
            self._row_faults = list(self._sequence_faults)
        try:
            if any(f(plan) for f in faults):
                raise ScriptedFault(f"scripted execution fault at step {self.steps}")
            self._check(plan)
            if plan.kind is StepKind.TRANSFER:
                self._transfer(plan)
                self.launches[plan.kind] += 1
                return np.empty(0, dtype=np.int32)
            if plan.kind is StepKind.SPECULATIVE:
                record = np.stack([self._run_lane(row) for row in plan.rows])
                for edit in list(self._record_faults):
                    edit(plan, record)
                self.launches[plan.kind] += 1
                return record
            out = np.empty(len(plan.rows), dtype=np.int32)
            for i, row in enumerate(plan.rows):
                out[i] = self._run_row(row, plan.kind)
            self.launches[plan.kind] += 1
            return out
        finally:
            self.steps += 1

    @property
    def outstanding(self) -> int:
        return len(self._inflight)

    def submit(self, plan: StepPlan) -> ScriptedTicket:
        """Run `plan` now and hold its result for `wait` (a fault is raised there).

        Raises:
            RuntimeError: every frame is in flight.
        """
        if len(self._inflight) == self.frames:
            raise RuntimeError(f"all {self.frames} execution frames are in flight")
        try:
            ticket = ScriptedTicket(self._record(plan, self.execute(plan)), None)
        except Exception as exc:  # surfaces at wait, like a device fault
            ticket = ScriptedTicket(None, exc)
        self._inflight.append(ticket)
        self.max_outstanding = max(self.max_outstanding, len(self._inflight))
        return ticket

    def wait_step(self, ticket: ScriptedTicket) -> StepCompletion:
        """The oldest submitted step's completion record (or its fault)."""
        assert self._inflight and self._inflight[0] is ticket, "wait in submission order"
        self._inflight.popleft()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.completion is not None
        return ticket.completion

    def wait(self, ticket: ScriptedTicket) -> np.ndarray:
        """The oldest submitted step's sampled ids (or its fault)."""
        return self.wait_step(ticket).sampled

    def _record(self, plan: StepPlan, sampled: np.ndarray) -> StepCompletion:
        """The completion record of `plan` (the fixed logprobs of the module docstring)."""
        k = self._geometry.top_logprobs
        asked = [i for i, r in enumerate(plan.rows) if r.sample and r.sampling.logprobs is not None]
        if plan.kind is StepKind.SPECULATIVE or k is None or not asked:
            return StepCompletion(sampled)
        vocab = self._geometry.vocab_size
        logprobs = np.full((len(plan.rows), 1 + k), np.nan, np.float32)
        top_ids = np.full((len(plan.rows), k), -1, np.int32)
        for i in asked:
            logprobs[i, 0] = -0.25
            logprobs[i, 1:] = -0.25 - np.arange(k, dtype=np.float32)
            top_ids[i] = (int(sampled[i]) + np.arange(k)) % vocab
        return StepCompletion(sampled, logprobs, top_ids)

    def _transfer(self, plan: StepPlan) -> None:
        """Copy each row along the plan's route (every row of the source tier first, so a
        step reads what was there before it, as the captured programs do)."""
        g = self._geometry
        route = plan.route
        assert route in g.routes, f"route {route} not served"
        assert not plan.rows and 0 < len(plan.copies) <= g.transfer_rows, "transfer shape"
        src, dst = self._tiers[route.source], self._tiers[route.destination]
        for c in plan.copies:
            assert 0 <= c.source < len(src) and 0 <= c.destination < len(dst), "row range"
        values = [src[c.source].copy() for c in plan.copies]
        for c, v in zip(plan.copies, values, strict=True):
            dst[c.destination] = v
        self.copies[route] = self.copies.get(route, 0) + len(plan.copies)

    def _check(self, plan: StepPlan) -> None:
        g = self._geometry
        if plan.kind is StepKind.TRANSFER:
            return
        if plan.kind in (StepKind.DECODE, StepKind.SPECULATIVE):
            assert all(len(r.tokens) == 1 for r in plan.rows), "decode rows carry one token"
            assert len(plan.rows) <= max(g.decode_capacities), "decode batch over capacity"
            if plan.kind is StepKind.SPECULATIVE:
                assert g.speculative_widths, "speculative plan for a geometry without widths"
                assert all(1 <= r.lane_length <= max(g.lane_widths)
                           for r in plan.rows), "lane over the served lane limit"
                # As the real programs: a lane applies no logit bias, records no logprobs.
                assert not any(r.sampling.logit_bias or r.sampling.logprobs is not None
                               for r in plan.rows), "a logprobs/logit_bias request in a lane"
        elif plan.kind is StepKind.MIXED:  # one captured variant holds its rows and tokens
            assert any(b >= len(plan.rows) and t >= plan.token_count
                       for b, t in g.mixed_capacities), "mixed plan outside every variant"
            assert plan.token_count <= plan.token_budget, "mixed plan over its token budget"
        else:
            assert plan.token_count <= max(g.prefill_token_capacities), "prefill over capacity"
            assert len(plan.rows) <= g.prefill_row_capacity, "prefill rows over capacity"
        slots = [r.slot for r in plan.rows]
        assert len(set(slots)) == len(slots), "one row per slot"

    def _run_row(self, row, kind: StepKind) -> int:
        g = self._geometry
        pt = g.page_tokens
        end = row.start_position + len(row.tokens)
        assert len(row.page_ids) * pt >= end, "page table does not cover the row"
        tokens = row.tokens
        if self.device_pending and kind is StepKind.DECODE:
            fed = int(self._pending[row.slot])
            assert tokens[0] in (PENDING_PLACEHOLDER, fed), "plan token != device pending token"
            tokens = (fed,)
        assert PENDING_PLACEHOLDER not in tokens, "placeholder fed without a device pending token"
        for i, token in enumerate(tokens):
            p = row.start_position + i
            self._pages[row.page_ids[p // pt], p % pt] = token
        if not row.sample:
            return 0
        seq = self.sequence(row.page_ids, end)
        assert all(t >= 0 for t in seq), "row reads a cache position never written"
        if any(f(seq) for f in self._row_faults):
            raise ScriptedFault(f"scripted execution fault at step {self.steps}")
        if row.request_id not in self._prompt_tokens:
            self._prompt_tokens[row.request_id] = end
            self._scripts[row.request_id] = list(self.responder(seq))
        prompt_len = self._prompt_tokens[row.request_id]
        script = self._scripts[row.request_id]
        index = end - prompt_len  # output tokens already consumed
        token = int(script[index]) if index < len(script) else int(g.eos_token_ids[0])
        if row.grammar_mask is not None:
            self.masked_rows += 1
            if not (int(row.grammar_mask[token // 32]) >> (token % 32)) & 1:
                raise ScriptedFault(f"the grammar mask forbids scripted token {token}")
        self._pending[row.slot] = token
        return token

    def _run_lane(self, row) -> np.ndarray:
        """One SPECULATIVE lane: the script's next accepted + 1 tokens and its record."""
        g = self._geometry
        pt = g.page_tokens
        n = row.lane_length
        self.lane_lengths.append(n)
        self.lane_candidates.append(tuple(row.candidates.ids) if row.candidates else ())
        assert len(row.page_ids) * pt >= row.start_position + n, "lane ceiling not reserved"
        width = max(g.speculative_widths)
        accepted = min(max(int(self.accept(row.request_id, n)), 0), n - 1)
        emitted = []
        for j in range(accepted + 1):
            plain = dataclasses.replace(row, start_position=row.start_position + j,
                                        tokens=(emitted[-1],) if j else row.tokens,
                                        query_length=0)
            emitted.append(self._run_row(plain, StepKind.DECODE))
        record = np.full(6 + width, -1, np.int32)
        record[:6] = (row.generation, n, accepted, accepted + 1,
                      row.start_position + accepted + 1, -1)
        record[6:6 + len(emitted)] = emitted
        return record

    def close(self) -> None:
        self.closed = True


class ScriptBook:
    """A responder choosing a script by a trigger text found in the decoded prompt.

    `book.add("stop-letters", ids)` makes every prompt containing "stop-letters" emit
    `ids`; prompts matching nothing emit `default`.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], default: Sequence[int] = ()):
        self._decode = decode
        self._scripts: list[tuple[str, list[int]]] = []
        self.default = list(default)

    def add(self, trigger: str, ids: Sequence[int]) -> None:
        self._scripts.insert(0, (trigger, list(ids)))

    def __call__(self, prompt: tuple[int, ...]) -> list[int]:
        text = self._decode(prompt)
        for trigger, ids in self._scripts:
            if trigger in text:
                return ids
        return self.default
