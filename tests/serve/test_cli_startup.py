"""helios-serve startup failures on the tiny served core: one line, exit 2, and what can be
checked without loading the model (core path, port) is checked before loading it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helios_tools.core import load_public_key, open_core

from tests.tiny_model import serve_error_line

SERVE = str(Path(sys.executable).parent / "helios-serve")


def _fails(*args) -> str:
    """helios-serve ARGS exits 2 with one error line (after any startup phase lines)."""
    proc = subprocess.run([SERVE, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    return serve_error_line(proc.stderr)


@pytest.fixture(scope="module")
def corrupt_weights(tiny_served, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the tiny core with one byte of a weight's stored frame flipped (the
    signed envelope and the tokenizer are intact: only loading the weights fails)."""
    core = tiny_served.core
    with open_core(core.path, [load_public_key(core.public_key)]) as opened:
        rid = "weights/L1.w_down"
        offset, length = opened.locations[rid]
    data = bytearray(core.path.read_bytes())
    data[offset + length // 2] ^= 0x40
    out = tmp_path_factory.mktemp("corrupt") / "corrupt.core"
    out.write_bytes(bytes(data))
    return out, rid


def _args(core, path: Path, *more: str) -> list[str]:
    return [str(path), "--trust", str(core.public_key), "--accept", core.namespace, *more]


def test_weight_chunk_failing_its_digest_is_a_bad_core(tiny_served, corrupt_weights):
    path, rid = corrupt_weights
    line = _fails(*_args(tiny_served.core, path, "--port", "0"))
    assert line.startswith(f"helios-serve: error: bad core: {path}: chunk 0 of 1 does not "
                           f"match its signed SHA-256 (resource {rid!r}, offset ")


def test_busy_port_is_reported_before_the_model_loads(tiny_served, corrupt_weights):
    path, _ = corrupt_weights
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        # The corrupt weights would fail loading: the port error shows nothing was loaded.
        line = _fails(*_args(tiny_served.core, path, "--port", str(port)))
    assert line == (f"helios-serve: error: cannot listen on 127.0.0.1:{port}: "
                    "Address already in use")


def test_missing_core_is_reported_before_the_port_is_bound(tiny_served, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        missing = tmp_path / "absent.core"
        line = _fails(*_args(tiny_served.core, missing, "--port", str(port)))
        assert line == f"helios-serve: error: bad core: {missing}: no such file"
        line = _fails(*_args(tiny_served.core, tmp_path, "--port", str(port)))
        assert line == f"helios-serve: error: bad core: {tmp_path}: is a directory"


def test_unknown_backend_is_a_usage_error_before_anything_loads(tmp_path):
    """--backend is a click.Choice of the backends with a capability table: an unknown one
    fails at once (the core path is not even read), one line, exit 2."""
    line = _fails(str(tmp_path / "absent.core"), "--trust", "k.pub", "--accept", "ns",
                  "--backend", "tpu")
    assert line == ("helios-serve: error: Invalid value for '--backend': 'tpu' is not one of "
                    "'cpu', 'cuda'.")


def test_history_drafting_without_learned_speculation_fails_startup(tiny_served):
    core = tiny_served.core
    line = _fails(*_args(core, core.path, "--port", "0", "--history-drafting"))
    assert line == ("helios-serve: error: --history-drafting needs learned speculation: the "
                    "core has no speculative programs or --speculative-width is 0")
