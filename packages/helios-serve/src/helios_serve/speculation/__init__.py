"""Host side of speculative generation: history drafting (copied proposals) and the
width policy that chooses each step's speculative program from observations."""

from .history import HistoryIndex
from .policy import StepCosts, WidthPolicy

__all__ = ["HistoryIndex", "StepCosts", "WidthPolicy"]
