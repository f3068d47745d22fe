"""Every `ignition` failure is one line, `ignition: error: ...`, with the exit status the
CLI documents (1 export failed, 2 usage, 3 internal error, 130 interrupted); `--out`
that exists is refused without `--force`. Through the installed console script (what a
user runs), and in-process where a failure must be injected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helios_ignition import cli

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
IGNITION = str(Path(sys.executable).parent / "ignition")


@pytest.fixture(scope="module")
def key(module_tmp) -> Path:
    from helios_tools.core import generate_key, write_key_pair

    private, _ = write_key_pair(generate_key(), module_tmp("k") / "p.key")
    return private


def _ignition(*args) -> subprocess.CompletedProcess:
    return subprocess.run([IGNITION, *map(str, args)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def _export(key: Path, out: Path, *more) -> list[str]:
    return ["export", RECIPE, "--checkpoint", "smollm2", "--key", key, "--namespace",
            "a.example/m", "--out", out, *more]  # fmt: skip


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""
    return lines[0]


def test_an_unknown_gpu_target_is_one_usage_line(key, tmp_path):
    """It was a 33-line traceback and exit 1, after the recipe had been read."""
    proc = _ignition(*_export(key, tmp_path / "x.core", "--target", "sm_xx"))
    assert proc.returncode == 2
    assert _one_line(proc) == ("ignition: error: Invalid value for '--target': unknown GPU "
                               "target 'sm_xx'; expected sm_<arch>, e.g. sm_90")
    assert not (tmp_path / "x.core").exists()


@pytest.mark.parametrize("target", ["sm_0", "sm_1000"])
def test_a_gpu_target_triton_cannot_compile_for_is_one_usage_line(key, tmp_path, target):
    """It passed the format check and failed in ptxas: 582 lines of PTX and exit 3."""
    proc = _ignition(*_export(key, tmp_path / "x.core", "--target", target))
    assert proc.returncode == 2
    assert _one_line(proc) == (
        f"ignition: error: Invalid value for '--target': GPU target '{target}' is not one "
        "Triton compiles for; known: sm_75, sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, "
        "sm_101, sm_103, sm_110, sm_120, sm_121")
    assert not (tmp_path / "x.core").exists()


def test_an_existing_out_is_refused_without_force(key, tmp_path):
    out = tmp_path / "earlier.core"
    out.write_bytes(b"an earlier core")
    proc = _ignition(*_export(key, out))
    assert proc.returncode == 2
    assert _one_line(proc) == (f"ignition: error: --out {out} exists; pass --force to "
                               "overwrite it")
    assert out.read_bytes() == b"an earlier core"
    # With --force the export goes ahead (here to its own failure: a missing key).
    proc = _ignition(*_export(tmp_path / "absent.key", out, "--force"))
    assert proc.returncode == 1
    assert _one_line(proc) == f"ignition: error: signing key not found: {tmp_path / 'absent.key'}"
    assert out.read_bytes() == b"an earlier core"


@pytest.mark.parametrize(("args", "status", "line"), [
    (["bogus"], 2, "ignition: error: No such command 'bogus'."),
    (["export"], 2, "ignition: error: Missing argument 'RECIPE'."),
    (["export", "recipes/absent.py", "--key", "k", "--namespace", "n", "--out", "o.core"], 1,
     "ignition: error: signing key not found: k"),
], ids=["unknown command", "no recipe", "absent key"])  # fmt: skip
def test_failures_are_one_line_with_their_status(args, status, line, tmp_path):
    proc = subprocess.run([IGNITION, *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == status
    assert _one_line(proc) == line


@pytest.mark.parametrize(("more", "line"), [
    ([], "ignition: error: no checkpoint: pass --checkpoint PATH|smollm2 or --random-weights"),
    (["--checkpoint", "smollm2", "--geometry", "smollm2-135m"],
     "ignition: error: --geometry applies only with --random-weights"),
    (["--random-weights", "7"], "ignition: error: --random-weights needs --geometry "
     "(smollm2-135m, llama-3.1-8b, qwen3-8b or qwen3-30b-a3b)"),
    (["--checkpoint", "smollm2", "--protected-version", "4"],
     "ignition: error: --protected-version applies only with --carrier logical"),
], ids=["no checkpoint", "geometry alone", "random without geometry", "carrier options"])
def test_options_that_do_not_go_together_are_usage_errors(key, tmp_path, more, line):
    """Missing or conflicting options are usage (exit 2, as the CLI documents), not a
    failed export (1): they were exit 1 before."""
    proc = _ignition("export", RECIPE, "--key", key, "--namespace", "a.example/m", "--out",
                     tmp_path / "x.core", *more)
    assert proc.returncode == 2
    assert _one_line(proc) == line
    assert not (tmp_path / "x.core").exists()


def test_an_internal_error_is_one_line_exit_3(key, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("graph")

    monkeypatch.setattr(cli, "export_core", broken)
    monkeypatch.delenv("IGNITION_TRACEBACK", raising=False)
    result = CliRunner().invoke(cli.main, [str(a) for a in _export(key, tmp_path / "x.core")])
    assert result.exit_code == 3
    assert result.stderr.strip().splitlines() == [
        "ignition: error: internal error: KeyError: 'graph'"]
    monkeypatch.setenv("IGNITION_TRACEBACK", "1")
    result = CliRunner().invoke(cli.main, [str(a) for a in _export(key, tmp_path / "x.core")])
    assert result.exit_code == 3 and "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "ignition: error: internal error: KeyError: 'graph'")


def test_an_interrupt_is_one_line_exit_130(key, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "export_core", interrupted)
    result = CliRunner().invoke(cli.main, [str(a) for a in _export(key, tmp_path / "x.core")])
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines() == ["ignition: error: interrupted"]


FAMILIES = "supported families: gemma3, llama, qwen3, qwen3_moe"  # families/registry.py


@pytest.mark.parametrize(("recipe", "checkpoint", "found"), [
    ("llama", "qwen3_gguf/dense_tied.f32.gguf", "architecture 'Qwen3ForCausalLM' is family "
     "'qwen3', not the recipe's family 'llama'"),
    ("gemma3_270m", "qwen3/moe", "architecture 'Qwen3MoeForCausalLM' is family 'qwen3_moe', "
     "not the recipe's family 'gemma3'"),
])  # fmt: skip
def test_a_checkpoint_of_another_family_is_one_line_naming_its_architecture(
        key, tmp_path, recipe, checkpoint, found):
    """A GGUF and a safetensors checkpoint. It said "recipe dense-tied.f32.gguf: the
    recipe's family 'llama' does not capture this checkpoint" (the llama recipe's name is
    the checkpoint's) and named no supported family."""
    path = REPO / "tests" / "fixtures" / checkpoint
    proc = _ignition("export", REPO / "recipes" / f"{recipe}.py", "--checkpoint", path,
                     "--key", key, "--namespace", "a.example/m", "--out", tmp_path / "x.core")
    assert proc.returncode == 1
    assert _one_line(proc) == f"ignition: error: checkpoint {path}: {found}; {FAMILIES}"
    assert not (tmp_path / "x.core").exists()


def test_a_safetensors_checkpoint_of_an_unsupported_architecture_is_one_line(key, tmp_path):
    """The GGUF case (`general.architecture`): tests/ignition/test_gemma3_family.py."""
    folder = tmp_path / "mamba"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["MambaForCausalLM"]}')
    proc = _ignition("export", REPO / "recipes" / "llama.py", "--checkpoint", folder, "--key",
                     key, "--namespace", "a.example/m", "--out", tmp_path / "x.core")
    assert proc.returncode == 1
    assert _one_line(proc) == (
        f"ignition: error: {folder}: architecture 'MambaForCausalLM' is not supported; "
        "supported: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
        "Gemma3ForCausalLM")
    assert not (tmp_path / "x.core").exists()
