"""The width policy's decision code as it was before per-request tables (main at bc2c142,
speculation/policy.py: `choose`, `expected_tokens`, `_tokens`), kept verbatim as the
reference the faster `WidthPolicy.choose` must agree with decision for decision
(tests/serve/speculation/test_policy.py::test_choose_decides_as_before_*)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from helios_serve.speculation import WidthPolicy
from helios_serve.speculation.policy import (
    LOSER_STALE_DECISIONS,
    STALE_DECISIONS,
    STALE_MARGIN,
    Choice,
)


class PolicyBefore(WidthPolicy):
    """WidthPolicy with the decision code of before (observations unchanged)."""

    def expected_tokens(self, request_id: int, length: int, copied: int = 0) -> float:
        total, survive = 1.0, 1.0
        for alpha in self.acceptance(request_id, copied)[:max(length - 1, 0)]:
            survive *= alpha
            total += survive
        return total

    def choose(self, lanes: Sequence[tuple[int, int]],
               copied: Mapping[int, int] | None = None) -> Choice:
        if not self.widths or not lanes:
            return Choice(0, 0, "no speculation")
        costs = self.costs
        costs.decisions += 1
        rows = len(lanes)
        options = [Choice(0)] + [Choice(w) for w in self.widths]
        options += [Choice(w, p) for b, p, w in self.prefix
                    if b == self.bucket(rows) and b >= rows]
        keys = [self.program_key(rows, option) for option in options]
        for option, key in zip(options, keys, strict=True):
            if not costs.measured(key):
                return self._record(Choice(option.width, option.packed_rows, "measure"))
        rates = [self._tokens_before(lanes, option, copied) / costs.cost[key]
                 for option, key in zip(options, keys, strict=True)]
        best_rate = max(rates)
        for option, key, rate in zip(options, keys, rates, strict=True):
            age = costs.age(key)
            # (decode stale at STALE_DECISIONS whatever its rate: the rule since the
            # median cost, applied here too so the comparison stays one of the tables)
            if age > LOSER_STALE_DECISIONS or (age > STALE_DECISIONS and (
                    not option.width or rate >= STALE_MARGIN * best_rate)):
                return self._record(Choice(option.width, option.packed_rows, "measure"))
        best = options[rates.index(best_rate)]
        return self._record(Choice(best.width, best.packed_rows, "best"))

    def _tokens_before(self, lanes: Sequence[tuple[int, int]], option: Choice,
                       copied: Mapping[int, int] | None = None) -> float:
        copied = copied or {}
        if option.width == 0:
            return float(len(lanes))
        if not option.packed_rows:
            return sum(self.expected_tokens(rid, min(option.width, ceiling),
                                            copied.get(rid, 0))
                       for rid, ceiling in lanes)
        gains = []
        calibration = self.calibration
        for rid, ceiling in lanes:
            depth = max(min(option.width, ceiling) - 1, 0)
            seen = self._survival.get(rid)
            if seen:
                gains += [min(1.0, calibration * s) for s in seen[:depth]]
                continue
            survive = 1.0
            for alpha in self.acceptance(rid, copied.get(rid, 0))[:depth]:
                survive *= alpha
                gains.append(survive)
        gains.sort(reverse=True)
        return len(lanes) + sum(gains[:max(option.packed_rows - len(lanes), 0)])
