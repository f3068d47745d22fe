"""`helios-serve --backend cuda` checks every allocation an operator sizes before it
allocates anything (issue 15's gap): --snapshots, --num-pages against the free device
memory, --host-cache-bytes (pinned) against the host's; one that does not fit exits 2
with one line naming the option, the bytes asked and the bytes available, and no weight
is uploaded first. A fitting --snapshots starts and serves.

Run: `python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_startup_memory.py` on the
GPU machine (bench/gpu_device.sh startup-memory).
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.gpu
MIB = r"\([0-9.]+ (?:B|KiB|MiB|GiB)\)"  # config.format_bytes


def _manifest(core_path):
    from helios_tools.core import load_public_key, open_core

    path, key = core_path
    return open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])


def _sizes(core_path) -> dict[str, int]:
    """Bytes, computed from the manifest: the model's buffers (everything but the cache
    planes), one continuation row, one page of the paged planes, one host-tier row."""
    from helios_contract.schema import manifest_pb2 as mpb
    from helios_contract.tiers import storage_tiers

    itemsize = {mpb.D_TYPE_F32: 4, mpb.D_TYPE_BF16: 2, mpb.D_TYPE_I32: 4, mpb.D_TYPE_U32: 4}
    core = _manifest(core_path)
    buffers = {b.name: b for b in core.manifest.buffers}
    tiers = storage_tiers(core.contract.model.cache)

    def row(names):
        return sum(math.prod(int(s) for s in buffers[n].shape[1:]) * itemsize[buffers[n].dtype]
                   for n in names)

    model = sum(math.prod(int(s) for s in b.shape) * itemsize[b.dtype]
                for b in buffers.values() if b.role != mpb.BUFFER_ROLE_CACHE_PLANE)
    return {"model": model, "snapshot_row": row(tiers.continuation), "page": row(tiers.pages),
            "host_row": row(tiers.host), "prepared": core.contract.prepared_snapshots}


def _command(core_path, port: int, *options) -> list[str]:
    path, key = core_path
    return [sys.executable, "-c", "from helios_serve.cli import main; main()", str(path),
            "--trust", str(key) + ".pub", "--accept", "gpu.test", "--backend", "cuda",
            "--port", str(port), *map(str, options)]


def _fails(core_path, *options) -> str:
    """helios-serve exits 2; its one error line (the lines before it are phase lines of
    verify/contract/cache tiers only: nothing was uploaded)."""
    proc = subprocess.run(_command(core_path, 0, *options), capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    print(proc.stderr)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    *before, last = proc.stderr.strip().splitlines()
    assert not any(line.startswith(("helios-serve: weights", "helios-serve: kernels"))
                   for line in before), proc.stderr
    return last


def test_oversized_snapshots_fail_before_allocation_naming_the_size(core_path):
    sizes = _sizes(core_path)
    rows = 1_000_000
    asked = rows * sizes["snapshot_row"]
    line = _fails(core_path, "--snapshots", rows)
    m = re.fullmatch(
        re.escape(f"helios-serve: error: --snapshots {rows}: snapshot storage ({rows} rows) "
                  f"needs {asked} bytes ") + MIB + r" but free device memory has (\d+) bytes "
        + MIB + rf" available after {sizes['model']} bytes " + MIB + " for the model"
        r"( and (\d+) bytes " + MIB + " for kernel scratch)?", line)
    assert m, line
    assert 0 < int(m.group(1)) < asked


def test_oversized_num_pages_fail_after_counting_the_snapshot_rows(core_path):
    sizes = _sizes(core_path)
    pages = 100_000_000
    snapshot = sizes["prepared"] * sizes["snapshot_row"]
    line = _fails(core_path, "--num-pages", pages)
    m = re.fullmatch(
        re.escape(f"helios-serve: error: --num-pages {pages}: the KV cache ({pages} pages) "
                  f"needs {pages * sizes['page']} bytes ") + MIB
        + r" but free device memory has (\d+) bytes " + MIB
        + rf" available after {sizes['model']} bytes " + MIB + " for the model"
        + r"( and \d+ bytes " + MIB + " for kernel scratch)?"
        + re.escape(f" and {snapshot} bytes ") + MIB + " for snapshot storage", line)
    assert m, line


def test_an_oversized_pinned_host_tier_fails_against_the_host_memory(core_path):
    sizes = _sizes(core_path)
    asked = 100 * 2**40
    rows = asked // sizes["host_row"]
    line = _fails(core_path, "--host-cache-bytes", "100TiB")
    m = re.fullmatch(
        re.escape(f"helios-serve: error: --host-cache-bytes 100TiB: the host tier ({rows} "
                  f"rows) needs {rows * sizes['host_row']} bytes ") + MIB
        + r" but host memory has (\d+) bytes " + MIB + " available", line)
    assert m, line  # on cuda the snapshot rows are device memory: not counted here
    assert 0 < int(m.group(1)) < asked


def test_a_fitting_snapshot_capacity_starts_and_serves(core_path, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(_command(core_path, port, "--snapshots", 1024), stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.time() + 240
        while True:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    pytest.fail("server did not start:\n" + log.read()[-4000:])
                time.sleep(1)
        assert models.status_code == 200
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": models.json()["data"][0]["id"], "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hello"}]})
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.seek(0)
    text = log.read()
    print(text)
    assert re.search(r"^helios-serve: cache tiers +\d+\.\d\d s  1024 snapshot rows, ", text,
                     re.M), text
