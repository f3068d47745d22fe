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


def test_a_gguf_weights_core_lints_for_the_cpu_backend(tmp_path, signing_key_pair):
    """A `--weight-dtype gguf` core keeps quantized blocks only the cpu backend executes
    (docs/qwen3.md): a default (every backend) lint fails on the cuda backend's findings
    and names `--backend cpu`, which passes."""
    from tests.ignition.export.tiny import NAMESPACE, REPO, run_export

    private, public = signing_key_pair
    out = tmp_path / "q8.core"
    result = run_export(REPO / "recipes" / "qwen3.py", "--checkpoint",
                        REPO / "tests" / "fixtures" / "qwen3_gguf" / "dense_untied.q8_0.gguf",
                        "--weight-dtype", "gguf", "--key", private, "--namespace", NAMESPACE,
                        "--out", out)
    assert result.exit_code == 0, result.output
    args = ["lint-core", str(out), "--trust", str(public), "--accept", NAMESPACE]
    every = CliRunner().invoke(tools_main, args)
    assert every.exit_code == 1
    lines = every.stdout.strip().splitlines()
    assert all("not executed by the cuda backend" in line for line in lines[:-2])
    assert lines[-2:] == [
        f"note: the cuda backend cannot execute this core ({len(lines) - 2} finding(s)): "
        "`--backend cpu` lints it for the cpu backend alone",
        f"{out}: {len(lines) - 2} finding(s)"]
    cpu = CliRunner().invoke(tools_main, [*args, "--backend", "cpu"])
    assert cpu.exit_code == 0 and cpu.stdout.strip().splitlines() == [f"{out}: 0 finding(s)"]
