"""`helios-serve --world N --rank R --peers ... --rank-key FILE` refusals: each is one line
(`helios-serve: error: ...`, exit 2) naming the option or the peer at fault."""

from __future__ import annotations

import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helios_serve.cli import main

from tests.tiny_model import NAMESPACE, export_tiny, serve_error_line

SERVE = str(Path(sys.executable).parent / "helios-serve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def key(module_tmp) -> Path:
    path = module_tmp("rank-key") / "rank.key"
    path.write_bytes(secrets.token_bytes(32))
    return path


def _usage_error(core, *args: str) -> str:
    result = CliRunner().invoke(main, [str(core.path), "--trust", str(core.public_key),
                                       "--accept", NAMESPACE, "--port", "0", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "message"), [
    (["--rank", "1"], "--rank, --peers and --rank-key need --world N"),
    (["--world", "2", "--rank", "2", "--peers", "h:1,h:2"],
     "--rank 2 is outside [0, 2) for --world 2"),
    (["--world", "1", "--peers", "h:1"], "--world must be at least 2 for process ranks, not 1"),
    (["--world", "2", "--peers", "h:1"],
     "--peers lists 1 addresses; --world 2 needs one per rank (HOST:PORT, rank order)"),
    (["--world", "2", "--peers", "h:1,h"], "--peers entry 'h' is not HOST:PORT"),
    (["--world", "2", "--peers", "h:1,h:99999"], "--peers entry 'h:99999' is not HOST:PORT"),
    (["--world", "2", "--peers", "h:1,h:2"],
     "--rank-key FILE is required with --world (32 random bytes shared by every rank: "
     "`helios-tools keygen --aes --out FILE`)"),
    (["--world", "2", "--peers", "h:1,h:2", "--backend", "cuda"],
     "--world: process ranks run on the cpu backend; the cuda backend executes one rank"),
])
def test_process_rank_options_are_checked_before_anything_loads(tiny_tp2, args, message):
    assert _usage_error(tiny_tp2, *args) == f"helios-serve: error: {message}"


def test_a_short_or_missing_rank_key_is_refused(tiny_tp2, tmp_path):
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 16)
    peers = ["--world", "2", "--peers", "h:1,h:2", "--rank-key"]
    assert _usage_error(tiny_tp2, *peers, str(short)) == (
        f"helios-serve: error: --rank-key {short}: 16 bytes; the key needs at least 32 random "
        "bytes")
    missing = tmp_path / "nope.key"
    assert _usage_error(tiny_tp2, *peers, str(missing)) == (
        f"helios-serve: error: --rank-key {missing}: No such file or directory")


def test_a_rank_whose_own_peers_entry_is_not_local_is_refused(tiny_tp2, key):
    # Its listeners (control, MPI) bind to its own entry's interface only.
    assert _usage_error(tiny_tp2, "--world", "2", "--peers", "198.51.100.7:1,127.0.0.1:2",
                        "--rank-key", str(key)) == (
        "helios-serve: error: --peers host '198.51.100.7' (198.51.100.7) is not an address "
        "of this host's network interfaces")


def _serve(core, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([SERVE, str(core.path), "--trust", str(core.public_key), "--accept",
                           NAMESPACE, "--port", "0", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def test_rank_zero_gives_up_on_a_rank_that_never_answers(tiny_tp2, key):
    port = _free_port()
    proc = _serve(tiny_tp2, "--world", 2, "--rank", 0, "--peers",
                  f"127.0.0.1:{_free_port()},127.0.0.1:{port}", "--rank-key", key,
                  "--rank-timeout", 1)
    assert proc.returncode == 2, proc.stderr
    assert serve_error_line(proc.stderr) == (
        f"helios-serve: error: rank 1 at 127.0.0.1:{port} did not answer within the "
        "bootstrap timeout (Connection refused)")


def test_a_world_that_is_not_the_cores_rank_count_is_refused(tiny_tp2, key):
    peers = ",".join(f"127.0.0.1:{_free_port()}" for _ in range(3))
    proc = _serve(tiny_tp2, "--world", 3, "--rank", 0, "--peers", peers, "--rank-key", key,
                  "--rank-timeout", 1)
    assert proc.returncode == 2, proc.stderr
    assert serve_error_line(proc.stderr) == (
        "helios-serve: error: --world 3, but the core is split between 2 ranks")


@pytest.mark.parametrize("option", [("--host-cache-bytes", "1MiB"), ("--snapshots", 257)])
def test_a_host_tier_or_more_snapshot_rows_across_rank_processes_is_refused(tiny_tp2, key,
                                                                             option):
    """The other rank processes back the manifest's tier planes (256 snapshot rows, one
    host row), so rank 0 refuses what they could not hold, before any rank is called."""
    peers = ",".join(f"127.0.0.1:{_free_port()}" for _ in range(2))
    proc = _serve(tiny_tp2, "--world", 2, "--rank", 0, "--peers", peers, "--rank-key", key,
                  "--rank-timeout", 1, *option)
    assert proc.returncode == 2, proc.stderr
    assert serve_error_line(proc.stderr) == (
        "helios-serve: error: --host-cache-bytes and --snapshots above the core's 256 are not "
        "served across rank processes (--world) yet; run the ranks as threads")


def _pair(rank0_core, rank1_core, key0: Path, key1: Path):
    peers = f"127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}"
    common = ("--world", 2, "--peers", peers, "--rank-timeout", 20)
    rank1 = subprocess.Popen(
        [SERVE, str(rank1_core.path), "--trust", str(rank1_core.public_key), "--accept",
         NAMESPACE, *map(str, common), "--rank", "1", "--rank-key", str(key1)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank0 = _serve(rank0_core, *common, "--rank", 0, "--rank-key", key0)
    _, err1 = rank1.communicate(timeout=60)
    return rank0, rank1.returncode, err1


# Rank 1's --rank-timeout in the different-keys test: after it drops rank 0's call it
# waits out this timeout, so the test costs at least this long. Rank 1 starts only once
# rank 0 is calling (below), so these seconds cover a loopback call from a process that
# retries every 0.2 s (rank_control.dial), not rank 0's start-up.
RANK1_TIMEOUT_S = 8


def _calling_rank0(core, peers: str, key: Path, err: Path) -> subprocess.Popen:
    """Rank 0 started with its stderr in `err`, returned once it dials rank 1: its last
    phase line before the ranks phase ("cache tiers") is written."""
    with err.open("w") as sink:
        rank0 = subprocess.Popen(
            [SERVE, str(core.path), "--trust", str(core.public_key), "--accept", NAMESPACE,
             "--port", "0", "--world", "2", "--peers", peers, "--rank-timeout", "120",
             "--rank", "0", "--rank-key", str(key)],
            stdout=subprocess.DEVNULL, stderr=sink, text=True)
    deadline = time.monotonic() + 120
    while "helios-serve: cache tiers" not in err.read_text():
        assert rank0.poll() is None, err.read_text()
        assert time.monotonic() < deadline, err.read_text()
        time.sleep(0.05)
    return rank0


def test_ranks_with_different_keys_refuse_each_other(tiny_tp2, key, tmp_path):
    other = tmp_path / "other.key"
    other.write_bytes(secrets.token_bytes(32))
    peers = f"127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}"
    rank0 = _calling_rank0(tiny_tp2, peers, key, tmp_path / "rank0.err")
    rank1 = subprocess.run(
        [SERVE, str(tiny_tp2.path), "--trust", str(tiny_tp2.public_key), "--accept",
         NAMESPACE, "--world", "2", "--peers", peers, "--rank-timeout",
         str(RANK1_TIMEOUT_S), "--rank", "1", "--rank-key", str(other)],
        capture_output=True, text=True, timeout=120)
    assert rank0.wait(timeout=60) == 2 and rank1.returncode == 2
    err0 = (tmp_path / "rank0.err").read_text()
    assert serve_error_line(err0).startswith("helios-serve: error: rank 1 at 127.0.0.1:")
    assert serve_error_line(err0).endswith(" failed authentication (another --rank-key)")
    # Rank 1 drops the caller (one warning line) and waits on for the real rank 0 until
    # its timeout.
    err1 = rank1.stderr
    *_, dropped, line = err1.strip().splitlines()
    assert re.fullmatch(r"control port 127\.0\.0\.1:\d+ dropped 127\.0\.0\.1:\d+: failed "
                        r"authentication \(another --rank-key, or not a rank\)", dropped), err1
    assert "Traceback" not in err1, err1
    assert re.fullmatch(rf"helios-serve: error: rank 0 did not call 127\.0\.0\.1:\d+ within "
                        rf"{RANK1_TIMEOUT_S} s; dropped 127\.0\.0\.1:\d+: failed "
                        r"authentication \(another --rank-key, or not a rank\)", line), line


def test_a_rank_serving_another_core_is_refused(tiny_tp2, tiny_served, key, tmp_path):
    from dataclasses import replace

    from helios_ignition.recipe import SplitTuning

    other = export_tiny(tiny_served.checkpoint, tiny_tp2.private_key, tmp_path / "tuned.core",
                        tensor_parallel=2, split_tuning=SplitTuning())  # another manifest
    rank0, code1, err1 = _pair(tiny_tp2, replace(tiny_tp2, path=other), key, key)
    assert rank0.returncode == 2 and code1 == 2
    assert serve_error_line(err1) == (
        "helios-serve: error: rank 0 serves another core (execution manifests differ)")
    assert serve_error_line(rank0.stderr).endswith(
        "refused: rank 0 serves another core (execution manifests differ)")


def test_a_rank_gives_up_when_rank_zero_never_calls(tiny_tp2, key):
    port = _free_port()
    proc = _serve(tiny_tp2, "--world", 2, "--rank", 1, "--peers",
                  f"127.0.0.1:{_free_port()},127.0.0.1:{port}", "--rank-key", key,
                  "--rank-timeout", 1)
    assert proc.returncode == 2, proc.stderr
    assert serve_error_line(proc.stderr) == (
        f"helios-serve: error: rank 0 did not call 127.0.0.1:{port} within 1 s")
