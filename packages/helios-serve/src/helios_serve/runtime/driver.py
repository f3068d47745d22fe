"""A small programmatic driver: prefill + decode loops over NativeModel, no scheduler.

For tests and benchmarks of the runtime alone. Pages are assigned sequentially per
slot (slot s owns pages [s * per_slot, (s + 1) * per_slot)); prompts are prefilled one
request at a time in chunks of the largest captured prefill capacity; decode runs all
requests together. The serving path uses the real scheduler instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from helios_contract import window_request_pages

from ..engine.plan import (
    CopiedCandidates,
    ModelGeometry,
    RowPlan,
    SamplingParams,
    StepCompletion,
    StepKind,
    StepPlan,
)
from .native_model import NativeModel

GREEDY = SamplingParams()


def ring_window_pages(g: ModelGeometry, slot: int, length: int) -> tuple[int, ...]:
    """A slot's sliding-window page list covering positions [0, length) without the
    scheduler (RowPlan.window_page_ids): slot s owns window pages [s n, (s + 1) n),
    n = window_pages // slots, and logical page i is page s n + i % n, a ring. Page i is
    reused for page i + n only after every query reading it ran, since n holds one
    request's window at the longest captured chunk (capture sizes the pool so).
    () without a window region.

    Raises:
        ValueError: the pool holds fewer pages per slot than a prefill chunk's window.
    """
    if not g.window_tokens:
        return ()
    n = g.window_pages // g.slots
    chunk = max(g.prefill_token_capacities)
    if n < window_request_pages(g.window_tokens, g.page_tokens, chunk):
        raise ValueError(f"the window pool's {n} pages per slot hold no {chunk}-token chunk "
                         f"of a {g.window_tokens}-token window")
    return tuple(slot * n + i % n for i in range(math.ceil(length / g.page_tokens)))


@dataclass
class _Lane:
    slot: int
    tokens: list[int]
    sampling: SamplingParams


class Driver:
    """Runs batches of prompts on a NativeModel.

    Args:
        model: a loaded NativeModel.
        collect_logits: keep each step's logits rows (float32 `[rows, vocab]`) in
            `self.logits` (reads the CPU backend's logits buffer) and each step's
            completion record (`StepCompletion`) in `self.completions`.

    Raises:
        ValueError: more prompts than slots, or a sequence longer than the pages a slot
            owns.
    """

    def __init__(self, model: NativeModel, collect_logits: bool = False):
        self.model = model
        g = model.manifests
        self.per_slot = min(g.max_pages_per_request + g.extra_pages_per_request,
                            g.num_pages // g.slots)
        self.collect_logits = collect_logits
        self.logits: list[np.ndarray] = []
        self.completions: list[StepCompletion] = []
        self._generation = 0

    def _pages(self, slot: int, length: int) -> tuple[int, ...]:
        g = self.model.manifests
        count = math.ceil(length / g.page_tokens) + g.extra_pages_per_request
        if count > self.per_slot:
            raise ValueError(f"{length} tokens need {count} pages; a slot owns {self.per_slot}")
        return tuple(range(slot * self.per_slot, slot * self.per_slot + count))

    def _run(self, plan: StepPlan) -> np.ndarray:
        done = self.model.wait_step(self.model.submit(plan))
        if self.collect_logits:
            self.logits.append(self.model.backend.buffers["scratch.logits"][:len(plan.rows)]
                               .copy())
            self.completions.append(done)
        return done.sampled

    def prefill(self, lane: _Lane) -> int:
        """Prefill a lane's tokens in chunks; returns the token sampled after the last."""
        chunk = max(self.model.manifests.prefill_token_capacities)
        total = len(lane.tokens)
        sampled = -1
        for start in range(0, total, chunk):
            piece = lane.tokens[start:start + chunk]
            last = start + len(piece) == total
            row = RowPlan(request_id=lane.slot, slot=lane.slot, generation=self._generation,
                          tokens=tuple(piece), start_position=start,
                          page_ids=self._pages(lane.slot, start + len(piece)), sample=last,
                          sampling=lane.sampling,
                          histogram_tokens=tuple(lane.tokens) if start == 0 else None,
                          window_page_ids=ring_window_pages(self.model.manifests, lane.slot,
                                                            start + len(piece)))
            sampled = int(self._run(StepPlan(StepKind.PREFILL, (row,)))[0])
        return sampled

    def decode_step(self, lanes: Sequence[_Lane], fed: Sequence[int]) -> np.ndarray:
        rows = tuple(RowPlan(request_id=lane.slot, slot=lane.slot, generation=self._generation,
                             tokens=(tok,), start_position=len(lane.tokens),
                             page_ids=self._pages(lane.slot, len(lane.tokens) + 1),
                             sample=True, sampling=lane.sampling,
                             window_page_ids=ring_window_pages(
                                 self.model.manifests, lane.slot, len(lane.tokens) + 1))
                     for lane, tok in zip(lanes, fed, strict=True))
        return self._run(StepPlan(StepKind.DECODE, rows))

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 sampling: SamplingParams | Sequence[SamplingParams] = GREEDY
                 ) -> list[list[int]]:
        """Generate `max_new_tokens` for each prompt (no early stop at EOS).

        Returns:
            The generated ids per prompt, in prompt order.
        """
        g = self.model.manifests
        if len(prompts) > min(g.slots, max(g.decode_capacities)):
            raise ValueError(f"{len(prompts)} prompts exceed the decode capacity")
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else sampling
        self._generation += 1
        lanes = [_Lane(i, list(p), params[i]) for i, p in enumerate(prompts)]
        outputs = [[self.prefill(lane)] for lane in lanes]
        for _ in range(max_new_tokens - 1):
            fed = [out[-1] for out in outputs]
            sampled = self.decode_step(lanes, fed)
            for lane, out, tok, new in zip(lanes, outputs, fed, sampled, strict=True):
                lane.tokens.append(tok)
                out.append(int(new))
        return outputs

    def generate_speculative(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                             width: int,
                             sampling: SamplingParams | Sequence[SamplingParams] = GREEDY,
                             *, propose: Callable[[list[int]], Sequence[int]] | None = None,
                             packed_rows: int = 0,
                             ) -> tuple[list[list[int]], list[np.ndarray]]:
        """Generate with SPECULATIVE rounds of lane length min(width, tokens left).

        Args:
            propose: copied candidates for a lane from the sequence so far (prompt and
                output, the pending token last), or None for learned drafts only.
            packed_rows: run prefix-limit programs with P = packed_rows (lane lengths are
                then ceilings and the program allocates the rows).

        Returns:
            The generated ids per prompt (exactly `max_new_tokens` each, no early stop)
            and each round's lane records (int32 `[lanes, 6 + W]`).
        """
        g = self.model.manifests
        if len(prompts) > min(g.slots, max(g.decode_capacities)):
            raise ValueError(f"{len(prompts)} prompts exceed the decode capacity")
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else sampling
        self._generation += 1
        lanes = [_Lane(i, list(p), params[i]) for i, p in enumerate(prompts)]
        outputs = [[self.prefill(lane)] for lane in lanes]
        records = []
        while True:
            live = [i for i in range(len(lanes)) if len(outputs[i]) < max_new_tokens]
            if not live:
                return outputs, records
            rows = []
            for i in live:
                lane = lanes[i]
                n = min(width, max_new_tokens - len(outputs[i]))
                start = len(lane.tokens)  # the pending token's position
                copied = None
                if propose is not None:
                    ids = tuple(propose(lane.tokens + [outputs[i][-1]]))
                    copied = CopiedCandidates(ids, self._generation, start + 1) if ids else None
                rows.append(RowPlan(request_id=lane.slot, slot=lane.slot,
                                    generation=self._generation, tokens=(outputs[i][-1],),
                                    start_position=start,
                                    page_ids=self._pages(lane.slot, start + n), sample=True,
                                    sampling=lane.sampling, query_length=n,
                                    candidates=copied))
            record = self._run(StepPlan(StepKind.SPECULATIVE, tuple(rows), packed_rows))
            records.append(record)
            for i, rec in zip(live, record, strict=True):
                emitted = [int(t) for t in rec[6:6 + int(rec[3])]]
                lanes[i].tokens.extend([outputs[i][-1]] + emitted[:-1])
                outputs[i].extend(emitted)

    def teacher_force(self, prompt: Sequence[int], targets: Sequence[int]) -> np.ndarray:
        """Logits predicting each of `targets` when fed the previous golden tokens.

        Returns:
            float32 `[len(targets), vocab]`: row i predicts targets[i].
        """
        saved = self.collect_logits
        self.collect_logits, self.logits = True, []
        self._generation += 1
        lane = _Lane(0, list(prompt), GREEDY)
        self.prefill(lane)
        rows = [self.logits[-1][0]]
        for tok in targets[:-1]:
            if self.model.device_pending:  # feed the golden token, not the sampled one
                self.model.write_pending_tokens([lane.slot], [tok])
            self.decode_step([lane], [tok])
            lane.tokens.append(tok)
            rows.append(self.logits[-1][0])
        self.collect_logits = saved
        return np.stack(rows)
