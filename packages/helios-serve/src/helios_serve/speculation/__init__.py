"""Host side of speculative generation: history drafting (copied proposals: the
latest-occurrence copy or suffix drafting) and the width policy that chooses each step's
speculative program from observations."""

from .history import HistoryIndex
from .policy import StepCosts, WidthPolicy
from .suffix import SuffixIndex

__all__ = ["PROPOSERS", "HistoryIndex", "StepCosts", "SuffixIndex", "WidthPolicy"]

# History drafting's proposers by their helios-serve --history-proposer name: "copy" the
# latest-occurrence copy with its cursor (history.py), "suffix" suffix drafting (suffix.py).
PROPOSERS = {"copy": HistoryIndex, "suffix": SuffixIndex}
