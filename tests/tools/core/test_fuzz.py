"""Property: no mutation of a core's bytes makes the reader do anything but succeed with
the original content or raise a CoreError (bounded example count for CI)."""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helios_tools.core import CoreError, open_core
from helios_tools.core.sample import SAMPLE_NAMESPACE, sample_resources, write_sample_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
EXPECTED = {rid: data for rid, _, data in sample_resources()}


@cache
def _original() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.core"
        write_sample_core(path, KEY)
        return path.read_bytes()


def _mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for op, where, value in ops:
        if not out:
            break
        i = where % len(out)
        if op == "flip":
            out[i] ^= 1 << (value % 8)
        elif op == "set":
            out[i] = value % 256
        elif op == "insert":
            out[i:i] = bytes([value % 256])
        elif op == "delete":
            del out[i]
        else:  # truncate
            del out[i:]
    return bytes(out)


ops = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                         st.integers(min_value=0, max_value=1 << 20),
                         st.integers(min_value=0, max_value=255)), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
def test_reader_rejects_or_reads_the_original(ops):
    mutated = _mutate(_original(), ops)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.core"
        path.write_bytes(mutated)
        try:
            with open_core(path, [KEY.public_key()]) as core:
                got = {rid: core.read_resource(rid) for rid in core.resources}
                streamed = {rid: b"".join(core.iter_resource(rid)) for rid in core.resources}
                namespace = core.namespace
        except CoreError:
            return
    assert mutated == _original() or (got == streamed == EXPECTED
                                      and namespace == SAMPLE_NAMESPACE)
