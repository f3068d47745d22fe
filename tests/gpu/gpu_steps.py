"""A minimal step driver over NativeModel for GPU tests and benchmarks (no scheduler).

Slot ``s`` owns pages ``[s * per_slot, (s + 1) * per_slot)``; prompts prefill one row at a
time in chunks of the largest prefill capacity; decode runs all rows together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.runtime.driver import ring_window_pages


class Steps:
    def __init__(self, model, logits=None):
        self.model = model
        g = model.manifests
        self.per_slot = min(g.max_pages_per_request, g.num_pages // g.slots)
        self.generation = 0
        self.read_logits = logits  # callable(rows) -> [rows, V] logits, or None

    def pages(self, slot: int, length: int) -> tuple[int, ...]:
        n = math.ceil(length / self.model.manifests.page_tokens)
        assert n <= self.per_slot, (length, self.per_slot)
        return tuple(range(slot * self.per_slot, slot * self.per_slot + n))

    def prefill(self, slot: int, tokens: Sequence[int], sampling: SamplingParams,
                chunk: int | None = None) -> int:
        chunk = chunk or max(self.model.manifests.prefill_token_capacities)
        self.generation += 1
        sampled = -1
        for start in range(0, len(tokens), chunk):
            piece = tuple(tokens[start:start + chunk])
            last = start + len(piece) == len(tokens)
            row = RowPlan(request_id=slot, slot=slot, generation=self.generation, tokens=piece,
                          start_position=start, page_ids=self.pages(slot, start + len(piece)),
                          sample=last, sampling=sampling,
                          histogram_tokens=tuple(tokens) if start == 0 else None,
                          window_page_ids=ring_window_pages(self.model.manifests, slot,
                                                            start + len(piece)))
            sampled = int(self.model.execute(StepPlan(StepKind.PREFILL, (row,)))[0])
        return sampled

    def decode(self, slots: Sequence[int], lengths: Sequence[int], fed: Sequence[int],
               sampling: Sequence[SamplingParams]) -> np.ndarray:
        rows = tuple(RowPlan(request_id=s, slot=s, generation=self.generation, tokens=(int(t),),
                             start_position=n, page_ids=self.pages(s, n + 1), sample=True,
                             sampling=p,
                             window_page_ids=ring_window_pages(self.model.manifests, s, n + 1))
                     for s, n, t, p in zip(slots, lengths, fed, sampling, strict=True))
        return self.model.execute(StepPlan(StepKind.DECODE, rows))

    def generate(self, prompts: Sequence[Sequence[int]], new_tokens: int,
                 sampling: Sequence[SamplingParams] | None = None) -> list[list[int]]:
        sampling = sampling or [SamplingParams()] * len(prompts)
        out = [[self.prefill(i, p, sampling[i])] for i, p in enumerate(prompts)]
        lengths = [len(p) for p in prompts]
        for _ in range(new_tokens - 1):
            fed = [o[-1] for o in out]
            new = self.decode(range(len(prompts)), lengths, fed, sampling)
            for i, t in enumerate(new):
                out[i].append(int(t))
                lengths[i] += 1
        return out

    def teacher_force(self, prompt: Sequence[int], targets: Sequence[int]) -> np.ndarray:
        """Logits rows predicting each target when fed the previous targets."""
        greedy = SamplingParams()
        self.prefill(0, prompt, greedy)
        rows = [self.read_logits(1)[0]]
        n = len(prompt)
        for tok in targets[:-1]:
            if self.model.device_pending:  # feed the golden token, not the sampled one
                self.model.write_pending_tokens([0], [tok])
            self.decode([0], [n], [tok], [greedy])
            rows.append(self.read_logits(1)[0])
            n += 1
        return np.stack(rows)
