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


def test_processes_serve_the_unsplit_models_greedy_ids_on_the_declared_addresses(
        tiny_tp2, expected, tmp_path):
    """One pair of rank processes (each pair costs two helios-serve starts): their greedy
    ids, then every listener they hold while serving, then their shared memory."""
    ranks = _start_rank1(tiny_tp2, tmp_path)
    control = int(ranks.options[ranks.options.index("--peers") + 1].split(",")[1]
                  .rsplit(":", 1)[1])
    try:
        with ServeProcess(*ranks.options, "--rank", "0") as served:
            got = {text: served.chat_ids(text, STEPS) for text in PROMPTS}
            joined = ranks.rank1.stdout.readline()
            http_port = int(served.url.rsplit(":", 1)[1])
            # every listener of a serving step is open (the requests above were served)
            rank0 = {a for p in _tree(served.proc.pid) for a in _listening(p)}
            rank1 = {a for p in _tree(ranks.rank1.pid) for a in _listening(p)}
            mappings = [m for p in [*_tree(served.proc.pid), *_tree(ranks.rank1.pid)]
                        for m in _shm_mappings(p)]
        assert ranks.rank1.wait(timeout=60) == 0  # rank 0's shutdown closed rank 1
    finally:
        err = ranks.stop()
    assert got == expected
    assert joined.startswith("Helios rank 1 of 2 joined rank 0"), (joined, err)
    assert any("2 tensor-parallel ranks (processes" in line for line in served.stderr_lines)
    # --host, every --peers entry and MPI's listeners: 127.0.0.1 only (none on 0.0.0.0,
    # ::, or the host's external address).
    assert {address for address, _ in rank0 | rank1} == {"127.0.0.1"}, (rank0, rank1)
    assert (("127.0.0.1", http_port) in rank0 and ("127.0.0.1", control) not in rank0)
    # rank 1's control listener closed once rank 0 called; what is left is MPI's
    assert ("127.0.0.1", control) not in rank1 and len(rank1) == 1, rank1
    # MPICH's segment is unlinked while mapped: nothing of it outlives the processes
    assert mappings and all(m.endswith("(deleted)") for m in mappings), mappings


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
    # One line for the lost rank; the shutdown after it (rank 0's MPI thread abandoned in
    # a collective) exits 0 without a traceback or MPICH's finalize assertion.
    err = "\n".join(served.stderr_lines)
    assert served.proc.returncode == 0, err
    assert [line.split(" ERROR ", 1)[1] for line in served.stderr_lines
            if " ERROR " in line] == [
        "helios_serve.worker: model worker stopped: rank 1 exited (its control connection "
        "closed)"], err
    assert "Traceback" not in err and "Assertion" not in err, err


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


# -- faults at the edges (docs/tensor-parallel.md, "What operators see") ---------------


def _tree(pid: int) -> list[int]:
    return [pid, *_descendants(pid)]


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` holds in the LISTEN state."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for family, table in ((socket.AF_INET, "tcp"), (socket.AF_INET6, "tcp6")):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            # /proc writes each 32-bit word of the address in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.add((socket.inet_ntop(family, raw), int(port, 16)))
    return out


def _shm_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("mpich_shm_*")}


def _left_behind(before: set[str]) -> set[str]:
    """MPICH segments created since `before` that still exist and no live process maps:
    what an exit left behind. Ranks that another test starts meanwhile (the other xdist
    worker's, say) map their segment from its creation until they unlink it, so theirs
    do not count."""
    new = _shm_segments() - before
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process exited meanwhile, or is not ours to read
            continue
        mapped.update(name for name in new if f"/dev/shm/{name}" in text)
    return {name for name in new - mapped if (Path("/dev/shm") / name).exists()}


def _shm_mappings(pid: int) -> list[str]:
    """The MPICH shared-memory segments process `pid` maps (`(deleted)`: unlinked)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [line.split(None, 5)[-1] for line in lines if "/dev/shm/mpich_shm_" in line]


def _stranger(kind: str, address: tuple[str, int], key: bytes) -> socket.socket:
    """Connect to a waiting rank's control port as a stranger; returns the socket (kept
    open by the caller so a silent one stays silent)."""
    from multiprocessing.connection import Connection, answer_challenge

    sock = socket.create_connection(address, timeout=30)
    sock.settimeout(None)  # (a timeout makes the descriptor non-blocking)
    if kind == "garbage":
        sock.sendall(b"\x7f" * 64)  # a frame of 2 GiB announced
    elif kind == "replay":
        # A valid rank-0 answer recorded from one connection's challenge, replayed on a
        # second connection (the challenge there differs).
        first = Connection(os.dup(sock.fileno()))
        challenge = first.recv_bytes(256)
        mine, theirs = socket.socketpair()
        recorder = Connection(theirs.detach())
        recorder.send_bytes(challenge)
        recorder.send_bytes(b"#WELCOME#")  # so answer_challenge returns
        answer_challenge(Connection(mine.detach()), key)
        answer = recorder.recv_bytes()
        first.close()
        sock.close()
        sock = socket.create_connection(address, timeout=30)
        sock.settimeout(None)
        replay = Connection(os.dup(sock.fileno()))
        replay.recv_bytes(256)  # this connection's challenge, ignored
        replay.send_bytes(answer)
        replay.close()
    return sock  # "silent": nothing sent


@pytest.mark.parametrize("kind", ["garbage", "replay", "silent"])
def test_a_stranger_on_the_control_port_does_not_stop_the_real_rank_zero(
        kind, tiny_tp2, tmp_path):
    ranks = _start_rank1(tiny_tp2, tmp_path)
    host, port = ranks.options[ranks.options.index("--peers") + 1].split(",")[1].split(":")
    key = Path(ranks.options[ranks.options.index("--rank-key") + 1]).read_bytes()
    stranger = None
    try:
        for _ in range(600):  # until rank 1 listens (it verifies the core first)
            try:
                stranger = _stranger(kind, (host, int(port)), key)
                break
            except ConnectionRefusedError:
                threading.Event().wait(0.1)
        assert stranger is not None
        with ServeProcess(*ranks.options, "--rank", "0") as served:
            got = served.chat_ids(PROMPTS[0], 4)
        assert ranks.rank1.wait(timeout=60) == 0
    finally:
        if stranger is not None:
            stranger.close()
        err = ranks.stop()
    assert len(got) == 4 or got[-1] == 2, got
    assert "Traceback" not in err, err
    dropped = [line.split(" dropped ", 1)[1].split(": ", 1)[1] for line in err.splitlines()
               if " dropped " in line]
    assert sorted(dropped) == {"garbage": ["sent garbage (bad message length)"],
                       "replay": ["failed authentication (another --rank-key, or not a rank)",
                                  "hung up before authenticating"],  # (the recording)
                       "silent": []}[kind], err


def test_a_silent_stranger_does_not_extend_the_rank_timeout(tiny_tp2, tmp_path):
    ranks = _start_rank1(tiny_tp2, tmp_path)
    command = [*ranks.rank1.args[:-2], "--rank-timeout", "2", "--rank", "1"]
    ranks.stop()  # the same options, with a short timeout
    host, port = command[command.index("--peers") + 1].split(",")[1].split(":")
    rank1 = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    stranger = None
    try:
        for _ in range(600):
            try:
                stranger = _stranger("silent", (host, int(port)), b"")
                break
            except ConnectionRefusedError:
                threading.Event().wait(0.1)
        # The stranger stays connected and silent; the rank still gives up on time.
        _, err = rank1.communicate(timeout=60)
    finally:
        if stranger is not None:
            stranger.close()
        if rank1.poll() is None:
            os.killpg(rank1.pid, signal.SIGKILL)
            rank1.communicate(timeout=30)
    assert rank1.returncode == 2
    assert err.strip().splitlines()[-1] == (
        f"helios-serve: error: rank 0 did not call {host}:{port} within 2 s"), err


def test_sigterm_to_rank_zero_stops_every_rank_cleanly(tiny_tp2, tmp_path):
    before = _shm_segments()
    ranks = _start_rank1(tiny_tp2, tmp_path)
    try:
        served = ServeProcess(*ranks.options, "--rank", "0")
        assert ranks.rank1.stdout.readline().startswith("Helios rank 1 of 2 joined")
        served.chat_ids(PROMPTS[0], 2)
        served.proc.send_signal(signal.SIGTERM)
        _, err0 = served.proc.communicate(timeout=60)
        rc1 = ranks.rank1.wait(timeout=60)
    finally:
        err1 = ranks.stop()
    assert served.proc.returncode == 0, err0
    assert rc1 == 0, err0 + err1
    for err in (err0, err1):
        assert "BAD TERMINATION" not in err and "Traceback" not in err, err
    assert not _left_behind(before)


def test_a_failed_shutdown_leaves_no_shared_memory(tiny_tp2, tmp_path):
    before = _shm_segments()
    ranks = _start_rank1(tiny_tp2, tmp_path)
    try:
        served = ServeProcess(*ranks.options, "--rank", "0")
        try:
            assert ranks.rank1.stdout.readline().startswith("Helios rank 1 of 2 joined")
            os.killpg(ranks.rank1.pid, signal.SIGKILL)  # rank 1 gone without finalizing
            ranks.rank1.wait(timeout=60)
            r = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={
                "model": "tiny-served", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPTS[0]}]})
        finally:
            served.proc.send_signal(signal.SIGTERM)
            _, err0 = served.proc.communicate(timeout=60)
    finally:
        ranks.stop()
    assert r.status_code == 500, r.text
    lost = [line for line in err0.splitlines() if "rank 1 exited" in line]
    assert len(lost) == 1 and "Traceback" not in err0, err0
    assert lost[0].endswith("model worker stopped: rank 1 exited (its control connection "
                            "closed)"), lost
    assert not _left_behind(before)


def test_sigterm_to_another_rank_stops_it_with_status_zero(tiny_tp2, tmp_path):
    ranks = _start_rank1(tiny_tp2, tmp_path)
    try:
        with ServeProcess(*ranks.options, "--rank", "0") as served:
            assert ranks.rank1.stdout.readline().startswith("Helios rank 1 of 2 joined")
            ranks.rank1.send_signal(signal.SIGTERM)  # its launcher forwards it to the rank
            rc1 = ranks.rank1.wait(timeout=60)
            r = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={
                "model": "tiny-served", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPTS[0]}]})
    finally:
        err1 = ranks.stop()
    assert rc1 == 0, err1
    assert "signaled" not in err1 and "Traceback" not in err1, err1  # (gforker's banner)
    assert r.status_code == 500
    assert r.json()["error"]["message"].endswith(
        "rank 1 exited (its control connection closed)"), r.text
