"""Engine liveness: the one rule that calls a model worker stalled.

docs/api.md, "Engine liveness". Both engine handles (`worker_host.WorkerHost`, the
worker thread here; `engine_client.EngineClient`, the engine process) feed a
`StallWatch` with the worker's step counter (`ModelWorker.steps`: one per turn of its
loop) and whether it has work; the watch answers whether the engine is stalled:

    stalled  <=>  it has work  and  the counter has not moved for `timeout_s`

The clock restarts whenever the counter moves and whenever work arrives at an idle
engine, so an idle engine never stalls and a request handed to an engine that slept for
an hour gets the full bound. A stalled engine makes /health 503 and admission refuse; it
is healthy again as soon as the counter moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_STALL_TIMEOUT_S = 30.0  # helios-serve --engine-stall-timeout


class StallWatch:
    """The liveness rule over observations of (step counter, has work).

    Args:
        timeout_s: seconds without progress, while having work, that make a stall (> 0).
        clock: monotonic seconds (tests pass a fake).

    Raises:
        ValueError: `timeout_s` is not positive.
    """

    def __init__(self, timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if not timeout_s > 0:
            raise ValueError(f"the stall timeout must be positive, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._steps: int | None = None
        self._busy = False
        self._since = clock()  # the last progress (or the arrival of work), clock seconds

    def observe(self, steps: int, busy: bool) -> None:
        """Record the worker's step counter and whether it has work now."""
        if steps != self._steps or (busy and not self._busy):
            self._since = self._clock()
        self._steps = steps
        self._busy = busy

    def stalled_for(self) -> float:
        """Seconds the engine has had work without progress as of the last observation
        (0.0 while idle)."""
        return max(0.0, self._clock() - self._since) if self._busy else 0.0

    @property
    def stalled(self) -> bool:
        """It has work and made no progress for `timeout_s` or more."""
        return self._busy and self.stalled_for() >= self.timeout_s

    def reason(self) -> str | None:
        """/health's detail while stalled (one line), else None."""
        if not self.stalled:
            return None
        return (f"the model engine has work and made no progress for "
                f"{self.stalled_for():.0f} s (--engine-stall-timeout {self.timeout_s:g} s)")


__all__ = ["DEFAULT_STALL_TIMEOUT_S", "StallWatch"]
