"""A tensor-parallel core served over real HTTP (docs/tensor-parallel.md).

`helios-serve` on the tiny model split between 2 ranks (`ignition export
--tensor-parallel 2`) runs the ranks as threads of one process (RankPeers::Threads, the
default) and answers with the greedy ids of the plain NumPy forward of the unsplit
checkpoint (bench/numpy_forward.py: an independent implementation), which the single-rank
core serves too (tests/e2e/test_logical_cores.py).
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.tiny_model import (
    NAMESPACE,
    PROMPTS,
    ServeProcess,
    plain_greedy,
    prompt_ids,
    until_eos,
)

STEPS = 16
SERVE = str(Path(sys.executable).parent / "helios-serve")


@pytest.fixture(scope="module")
def expected(tiny_served) -> dict[str, list[int]]:
    return {text: until_eos(plain_greedy(tiny_served.checkpoint, prompt_ids(text), STEPS))
            for text in PROMPTS}


def test_threads_serve_the_unsplit_models_greedy_ids(tiny_tp2, expected):
    with ServeProcess(tiny_tp2.path, "--trust", tiny_tp2.public_key, "--accept",
                      NAMESPACE) as served:
        got = {text: served.chat_ids(text, STEPS) for text in PROMPTS}
        health = httpx.get(served.url + "/health", timeout=10)
    assert got == expected
    assert health.status_code == 200
    assert any("2 tensor-parallel ranks (threads)" in line for line in served.stderr_lines), \
        served.stderr_lines


# -- RankPeers::Processes ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Ranks:
    """Rank 1 as its own `helios-serve --rank 1` process (session leader: killing its
    group kills the rank under its mpiexec) and the options every rank takes."""

    rank1: subprocess.Popen
    options: tuple[str, ...]

    def stop(self) -> str:
        if self.rank1.poll() is None:
            os.killpg(self.rank1.pid, signal.SIGKILL)
        _, err = self.rank1.communicate(timeout=30)
        return err


def _start_rank1(core, tmp_path: Path) -> Ranks:
    key = tmp_path / "rank.key"
    key.write_bytes(secrets.token_bytes(32))
    peers = f"127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}"
    options = (str(core.path), "--trust", str(core.public_key), "--accept", NAMESPACE,
               "--world", "2", "--peers", peers, "--rank-key", str(key))
    rank1 = subprocess.Popen([SERVE, *options, "--rank", "1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    return Ranks(rank1, options)


def test_processes_serve_the_unsplit_models_greedy_ids(tiny_tp2, expected, tmp_path):
    ranks = _start_rank1(tiny_tp2, tmp_path)
    try:
        with ServeProcess(*ranks.options, "--rank", "0") as served:
            got = {text: served.chat_ids(text, STEPS) for text in PROMPTS}
            joined = ranks.rank1.stdout.readline()
        assert ranks.rank1.wait(timeout=60) == 0  # rank 0's shutdown closed rank 1
    finally:
        err = ranks.stop()
    assert got == expected
    assert joined.startswith("Helios rank 1 of 2 joined rank 0"), (joined, err)
    assert any("2 tensor-parallel ranks (processes" in line for line in served.stderr_lines)


def _sse_lines(response, into: queue.Queue) -> None:
    try:
        for line in response.iter_lines():
            into.put(line)
    except Exception as exc:  # the test reads what arrived before
        into.put(exc)
    into.put(None)


def test_a_killed_rank_fails_the_stream_with_a_server_error_and_the_server_stays_up(
        tiny_tp2, tmp_path):
    ranks = _start_rank1(tiny_tp2, tmp_path)
    body = {"model": "tiny-served", "max_tokens": 200, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": PROMPTS[0]}]}
    try:
        with ServeProcess(*ranks.options, "--rank", "0") as served, \
                httpx.Client(timeout=60) as client:
            with client.stream("POST", served.url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                lines: queue.Queue = queue.Queue()
                threading.Thread(target=_sse_lines, args=(r, lines), daemon=True).start()
                while "content" not in lines.get(timeout=60):  # generation is under way
                    pass
                os.killpg(ranks.rank1.pid, signal.SIGKILL)  # mid-stream
                rest = []
                while (line := lines.get(timeout=60)) is not None:
                    rest.append(line)
            events = [json.loads(x[6:]) for x in rest if x.startswith("data: {")]
            assert "data: [DONE]" not in rest, "the stream ended before the rank was killed"
            error = events[-1]["error"]
            assert error["type"] == "server_error"
            assert "rank 1 exited (its control connection closed)" in error["message"]
            after = client.post(served.url + "/v1/chat/completions",
                                json={**body, "stream": False})
            health = client.get(served.url + "/health")
            models = client.get(served.url + "/v1/models")
            alive = served.proc.poll() is None
    finally:
        ranks.stop()
    assert after.status_code == 503
    assert after.json()["error"]["message"] == "the model worker is not running"
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    assert models.status_code == 200 and alive


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            children = (task / "children").read_text().split()
            out += map(int, children)
            todo += map(int, children)
    return out


def test_a_rank_that_loses_rank_zero_exits(tiny_tp2, tmp_path):
    ranks = _start_rank1(tiny_tp2, tmp_path)
    try:
        served = ServeProcess(*ranks.options, "--rank", "0")
        try:
            assert ranks.rank1.stdout.readline().startswith("Helios rank 1 of 2 joined")
            rank0 = [p for p in _descendants(served.proc.pid)
                     if b"helios_serve.cli" in Path(f"/proc/{p}/cmdline").read_bytes()]
            assert len(rank0) == 1
            os.kill(rank0[0], signal.SIGKILL)  # rank 0's process, under its mpiexec
            assert ranks.rank1.wait(timeout=60) == 3
        finally:
            served.proc.kill()
            served.proc.communicate(timeout=30)
    finally:
        ranks.stop()
