"""Startup phases with their durations, logged as each one ends.

helios-serve loads a core in phases (Bootstrap.load: verify, contract; NativeModel.load:
weights, kernels, cache sizing, graphs, tuning; then listen). Each phase is one line on
stderr when it ends, so an operator sees where startup time goes while it happens:

    helios-serve: verify          0.21 s  signature, namespace helios.test/models, 280 resources
    helios-serve: weights         3.08 s  272 tensors, 538.0 MiB
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Phase", "StartupLog"]


@dataclass
class Phase:
    """One finished phase: its name, wall seconds and what it did (one line)."""

    name: str
    seconds: float = 0.0
    detail: str = ""


@dataclass
class StartupLog:
    """The phases of one startup.

    Args:
        emit: called with each phase's line as it ends (None: record only).
    """

    emit: Callable[[str], None] | None = None
    phases: list[Phase] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[Phase]:
        """Time the block as phase `name`; set `.detail` on the yielded Phase to describe
        it. A phase that raises is not recorded (the error says what failed)."""
        current = Phase(name)
        started = time.perf_counter()
        yield current
        self.record(name, time.perf_counter() - started, current.detail)

    def record(self, name: str, seconds: float, detail: str = "") -> None:
        """Record (and emit) a phase timed by the caller."""
        self.phases.append(Phase(name, seconds, detail))
        if self.emit is not None:
            self.emit(f"{name:<13} {seconds:6.2f} s  {detail}".rstrip())

    def seconds(self, name: str) -> float:
        """Total seconds of the phases named `name`."""
        return sum(p.seconds for p in self.phases if p.name == name)
