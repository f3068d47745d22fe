"""The ignition CLI answers -h like --help, as helios-tools and helios-serve do."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helios_ignition.cli import main


@pytest.mark.parametrize("command", [[], ["export"]])
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(command, flag):
    result = CliRunner().invoke(main, [*command, flag])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ")
