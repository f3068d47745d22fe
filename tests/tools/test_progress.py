"""StepProgress: plain lines off a terminal (one per quarter and at the end), rich bars on
one; helios-tools verify and lint-core show it for large cores."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from helios_tools import cli
from helios_tools.core import load_private_key
from helios_tools.core.sample import SAMPLE_BACKENDS, SAMPLE_NAMESPACE, write_sample_core
from helios_tools.progress import StepProgress


def test_plain_lines_one_per_quarter_and_at_the_end():
    out = io.StringIO()
    with StepProgress(out, terminal=False) as progress:
        for done in range(1, 11):
            progress.update("weights read", done, 10)
        progress.update("bytes written", 3 << 20, 8 << 20, "bytes")
        progress.update("bytes written", 8 << 20, 8 << 20, "bytes")
        progress.update("bytes written", 8 << 20, 8 << 20, "bytes")  # nothing new
    assert out.getvalue().splitlines() == [
        "weights read: 3/10 (30%)",
        "weights read: 5/10 (50%)",
        "weights read: 8/10 (80%)",
        "weights read: 10/10 (100%)",
        "bytes written: 3.0/8.0 MiB (37%)",
        "bytes written: 8.0/8.0 MiB (100%)",
    ]


def test_terminal_draws_rich_bars():
    out = io.StringIO()
    with StepProgress(out, terminal=True) as progress:
        progress.update("verifying", 5 << 20, 10 << 20, "bytes")
        progress.update("verifying", 10 << 20, 10 << 20, "bytes")
    text = out.getvalue()
    assert "verifying" in text and "10.0/10.0 MiB" in text and "━" in text


@pytest.mark.parametrize("command", ["verify", "lint-core"])
def test_verify_and_lint_show_progress_on_large_cores(tmp_path, monkeypatch, command):
    runner = CliRunner()
    assert runner.invoke(cli.main, ["keygen", "--out", str(tmp_path / "k")]).exit_code == 0
    core = tmp_path / "s.core"
    write_sample_core(core, load_private_key(tmp_path / "k"))
    args = [command, str(core), "--trust", str(tmp_path / "k.pub"), "--accept", SAMPLE_NAMESPACE]
    if command == "lint-core":
        args += ["--backend", *SAMPLE_BACKENDS]
    small = runner.invoke(cli.main, args)
    assert small.exit_code == 0 and "verifying" not in small.stderr
    monkeypatch.setattr(cli, "_PROGRESS_MIN_NBYTES", 0)  # every core is "large"
    large = runner.invoke(cli.main, args)
    assert large.exit_code == 0, large.output
    lines = [line for line in large.stderr.splitlines() if line.startswith("verifying: ")]
    assert lines and lines[-1].endswith(" MiB (100%)")
