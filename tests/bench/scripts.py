"""Loading a bench/ script as a module, for the tests of its plans and arithmetic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_script(filename: str) -> ModuleType:
    """`bench/<filename>` executed as the module ``helios_bench_<stem>`` (registered in
    `sys.modules`, so dataclasses and pickling inside it resolve their module).

    The scripts import their neighbours (`_report`, `gpu_common`, `server`, ...) as
    top-level modules, so bench/ is on `sys.path` while the script's top level runs.
    """
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(
            f"helios_bench_{Path(filename).stem}", BENCH / filename)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module
