"""scripts/check_imports.py on a synthetic workspace: each kind of finding, exactly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_imports.py"
_spec = importlib.util.spec_from_file_location("helios_check_imports", SCRIPT)
check_imports = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = check_imports  # dataclasses resolve string annotations through it
_spec.loader.exec_module(check_imports)

SERVE = "packages/helios-serve/src/helios_serve"
TOOLS = "packages/helios-tools/src/helios_tools"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_clean_tree_has_no_findings(tmp_path):
    root = _tree(tmp_path, {
        f"{SERVE}/__init__.py": "",
        f"{SERVE}/clock.py": "import time\n",
        f"{SERVE}/server.py": "from helios_serve.http.app import build\n",
        f"{SERVE}/http/__init__.py": "",
        f"{SERVE}/http/app.py": "from . import errors\nfrom ..clock import now\n",
        f"{SERVE}/http/errors.py": "",
        f"{SERVE}/cli.py": (
            "def main():\n"
            "    # start-up time: HTTP loads only when serving\n"
            "    from helios_serve.server import Server\n"
            "    from helios_serve.http import app\n"
        ),
        f"{TOOLS}/__init__.py": "",
        f"{TOOLS}/lint.py": "import helios_tools\n",
    })
    assert check_imports.check(root) == []
    assert check_imports.main([str(root)]) == 0


def test_cycles_upward_imports_unexplained_and_unplaced_modules(tmp_path, capsys):
    root = _tree(tmp_path, {
        f"{SERVE}/__init__.py": "",
        f"{SERVE}/clock.py": "from helios_serve import cli\n",  # base -> cli: upward
        f"{SERVE}/cli.py": "import helios_serve.clock\n",  # and back: a cycle
        f"{SERVE}/server.py": "from helios_serve.http.app import build\n",
        f"{SERVE}/http/__init__.py": "",
        f"{SERVE}/http/app.py": (
            "def build():\n"
            "    from helios_serve.server import Server\n"  # upward, hidden, unexplained
            "    import json\n"
        ),
        f"{SERVE}/mystery.py": "",
        f"{TOOLS}/__init__.py": "",
        f"{TOOLS}/lint.py": "from helios_serve.clock import now\n",  # tools -> serve
    })
    assert check_imports.check(root) == [
        f"upward: helios_serve.clock imports helios_serve.cli (floor base below floor cli) "
        f"at {SERVE}/clock.py:1",
        f"unexplained: {SERVE}/http/app.py:2 imports helios_serve.server inside a function",
        f"upward: helios_serve.http.app imports helios_serve.server (floor http below floor "
        f"server) at {SERVE}/http/app.py:2",
        f"unexplained: {SERVE}/http/app.py:3 imports json inside a function",
        f"upward: helios_tools.lint imports helios_serve.clock (helios_tools may not import "
        f"helios_serve) at {TOOLS}/lint.py:1",
        "no floor: helios_serve.mystery",
        "cycle: helios_serve.cli -> helios_serve.clock -> helios_serve.cli",
        "cycle: helios_serve.http.app -> helios_serve.server -> helios_serve.http.app",
    ]
    assert check_imports.main([str(root)]) == 1
    assert capsys.readouterr().err == "check_imports: 8 findings\n"


def test_the_workspace_passes():
    assert check_imports.check(SCRIPT.parents[1]) == []
