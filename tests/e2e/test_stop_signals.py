"""Ctrl-C on helios-serve started as scripts/demo.sh starts it: `uv run`, in a process group
of its own (a terminal's foreground job), the SIGINT sent to the whole group. One Ctrl-C
drains: an open stream keeps getting tokens and ends with [DONE]. A second, deliberate
Ctrl-C ends the drain, dropping the stream. Neither prints a traceback (docs/api.md,
shutdown paragraph)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SERVE = str(Path(sys.executable).parent / "helios-serve")
UV = shutil.which("uv")
TOKENS = 200  # the tiny model's context is 256


def _start(launcher: list[str], core) -> tuple[subprocess.Popen, str, str]:
    """helios-serve CORE on a free port, leading a process group of its own, as a
    terminal's job; (process, url, served model)."""
    proc = subprocess.Popen(
        [*launcher, str(core.path), "--trust", str(core.public_key), "--accept",
         core.namespace, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        start_new_session=True)  # fmt: skip
    first = proc.stdout.readline()
    if not first.startswith("Helios is serving"):
        proc.kill()
        raise AssertionError(first + proc.communicate()[1])
    return proc, first.split(" at ")[1].split()[0], first.split()[3]


def _chat(model: str, max_tokens: int) -> dict:
    return {"model": model, "stream": True, "temperature": 0, "ignore_eos": True,
            "max_tokens": max_tokens, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Tell me a story about a dragon."}]}


def _exit_stderr(proc: subprocess.Popen) -> str:
    """Its stderr once it exits; killed (and the test failed) if it does not in 60 s."""
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def _ctrl_c(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: its whole foreground group


@pytest.mark.skipif(UV is None, reason="scripts/demo.sh's launcher, uv, is not on PATH")
def test_one_ctrl_c_under_uv_run_drains_the_open_stream(tiny_served):
    """`uv run` forwards the SIGINT that the group already got: helios-serve saw two and
    force-quit at once (the stream dropped, a CancelledError traceback); the repeat is
    now ignored and the stream finishes within the drain. The tiny model: its 200 tokens
    take a fraction of the drain."""
    proc, url, model = _start([UV, "run", "--locked", "helios-serve"], tiny_served.core)
    lines: list[str] = []
    failed: httpx.HTTPError | None = None
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=_chat(model, TOKENS),
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    if not lines:
                        _ctrl_c(proc)  # after the first event: the stream is open
                    lines.append(line)
    except httpx.HTTPError as exc:
        failed = exc
    finally:
        err = _exit_stderr(proc)
    assert failed is None and lines[-1] == "data: [DONE]", (failed, len(lines), err)
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == TOKENS  # all made after the Ctrl-C
    # The status is uv's: 0 when helios-serve exits first, 130 when uv reports the SIGINT
    # it got itself (both seen in CI). helios-serve's own 0 is asserted without uv below.
    assert proc.returncode in (0, 130), proc.returncode
    assert "Traceback" not in err and "dropped" not in err, err


def test_a_second_ctrl_c_later_ends_the_drain_without_a_traceback(smollm2_core_f32):
    """A SIGINT repeated at once is the duplicate (ignored); one a second and a half
    later is a person's second Ctrl-C: the stream still open (the real model's 4000
    tokens take minutes on the CPU) is dropped, the process exits 0 without a
    traceback."""
    proc, url, model = _start([SERVE], smollm2_core_f32)
    lines: list[str] = []
    try:
        with pytest.raises(httpx.RemoteProtocolError), \
                httpx.stream("POST", url + "/v1/chat/completions", json=_chat(model, 4000),
                             timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    if len(lines) == 1:
                        _ctrl_c(proc)
                        os.kill(proc.pid, signal.SIGINT)  # as uv forwards it
                        time.sleep(1.5)
                        _ctrl_c(proc)
    finally:
        err = _exit_stderr(proc)
    assert "data: [DONE]" not in lines
    assert proc.returncode == 0
    assert "Traceback" not in err, err
    assert "dropped an open POST /v1/chat/completions at shutdown" in err
