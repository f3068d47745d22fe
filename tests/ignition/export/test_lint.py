"""`helios-tools lint-core` passes on the real model's export (the issue's done-when)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helios_tools.cli import main as tools_main

pytestmark = pytest.mark.slow


def test_lint_core_passes_on_smollm2_bf16(smollm2_core_bf16):
    core = smollm2_core_bf16
    args = ["lint-core", str(core.path), "--trust", str(core.public_key),
            "--accept", core.namespace]
    result = CliRunner().invoke(tools_main, [*args, "--format", "json"])
    assert json.loads(result.stdout)["findings"] == []
    assert result.exit_code == 0
    text = CliRunner().invoke(tools_main, args)
    assert text.exit_code == 0 and text.stdout.strip().endswith(": 0 finding(s)")
