"""`helios-serve-ray` rejections: one line on stderr, exit 2, before Ray starts."""

from __future__ import annotations

import os
import signal
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
        "No such file or directory"]


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


@pytest.mark.slow
def test_two_replicas_serve_on_a_joined_cluster_and_stop_on_sigint(tiny_served, ray_cluster):
    """The command end to end: it joins the session's Ray cluster (`--ray-address`), serves
    2 replicas, answers, and stops on SIGINT; the banner is stdout's only line."""
    import httpx

    core = tiny_served.core
    proc = subprocess.Popen(
        [str(RAY_CLI), str(core.path), "--trust", str(core.public_key), "--accept",
         core.namespace, "--replicas", "2", "--replica-cpus", "0.5", "--port", "0",
         "--ray-address", ray_cluster, "--", "--max-active", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"})  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"Helios is serving 2 replicas of {core.path} at http://"), line
        url = line.split(" at ")[1].split()[0]
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny-served", "max_tokens": 3, "min_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
        assert httpx.get(url + "/health", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    assert code == 0
    assert proc.stdout.read() == ""  # Ray's own lines went to stderr
