"""`helios-serve-ray` rejections: one line on stderr, exit 2, before Ray starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RAY_CLI = Path(sys.executable).parent / "helios-serve-ray"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(RAY_CLI), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_a_missing_core_is_one_line(tiny_served, tmp_path):
    core = tiny_served.core
    r = _run(tmp_path / "nope.core", "--trust", core.public_key, "--accept", core.namespace)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"helios-serve-ray: error: bad core: {tmp_path / 'nope.core'}: no such file"]


def test_an_unreadable_key_is_one_line(tmp_path):
    r = _run(tmp_path / "nope.core", "--trust", tmp_path / "k.pub", "--accept", "x")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"helios-serve-ray: error: cannot read trusted key {tmp_path / 'k.pub'}: "
        f"[Errno 2] No such file or directory: '{tmp_path / 'k.pub'}'"]


def test_a_wrong_namespace_is_one_line(tiny_served):
    core = tiny_served.core
    r = _run(core.path, "--trust", core.public_key, "--accept", "someone.else/models")
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert line.startswith("helios-serve-ray: error: wrong namespace: "), line


@pytest.mark.parametrize(("options", "message"), [
    (("--min-replicas", "1"), "--min-replicas needs --max-replicas (autoscaling bounds)"),
    (("--replicas", "5", "--max-replicas", "3"),
     "--replicas 5 must lie within the autoscaling bounds [1, 3]"),
])
def test_inconsistent_scaling_options_are_one_line(tmp_path, options, message):
    r = _run(tmp_path / "x.core", "--trust", tmp_path / "k.pub", "--accept", "x", *options)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"helios-serve-ray: error: {message}"]
