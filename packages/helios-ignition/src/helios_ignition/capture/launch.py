"""Launch geometry of each kernel op: grid, block, shared bytes and variant constants.

The CPU backend ignores these; the GPU backend launches with them. The Triton kernels
(issue 7) own the real tiling; until then every op launches one program per row with
four warps, which is what their record states.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaunchConfig:
    """Grid and block in (x, y, z), dynamic shared bytes, compile-time constants."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int] = (128, 1, 1)
    shared_bytes: int = 0
    constants: dict[str, int] = field(default_factory=dict)


def launch_config(op: str, scalars: list[int | float]) -> LaunchConfig:
    """The launch geometry of `op` given its scalar arguments (in parameter order)."""
    rows = int(scalars[0]) if scalars else 1
    return LaunchConfig(grid=(max(rows, 1), 1, 1))
