"""Host side of speculative generation: history drafting (copied proposals: the
latest-occurrence copy or suffix drafting) and the width policy that chooses each step's
speculative program from observations."""

from .history import HistoryIndex
from .policy import StepCosts, WidthPolicy
from .suffix import SuffixIndex

__all__ = ["HistoryIndex", "StepCosts", "SuffixIndex", "WidthPolicy"]
