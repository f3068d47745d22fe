"""The process-local monotonic origin that token timestamps are relative to.

the specification, "Token and timing observation": nanoseconds are relative to a
process-local monotonic origin initialized at native runtime startup; ingress and
enqueue timestamps use the same origin. One `ObservationClock` is made right before
the runtime loads and shared by the HTTP layer and the model worker.
"""

from __future__ import annotations

import time


class ObservationClock:
    """Monotonic nanoseconds since runtime startup."""

    def __init__(self) -> None:
        self.origin_ns = time.monotonic_ns()

    def now_ns(self) -> int:
        """Nanoseconds since the origin (monotonic, never negative)."""
        return time.monotonic_ns() - self.origin_ns
