"""AES-GCM chunk reader (ProtectedIndex version 4): every rearrangement of chunks fails."""

from __future__ import annotations

import io

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from helios_contract.schema import core_pb2
from helios_tools.core import (
    CHUNK_NBYTES,
    LengthMismatch,
    LogicalCoreWriter,
    ProtectedChunkError,
    open_core,
)
from helios_tools.core.protected import (
    TAG_NBYTES,
    aad,
    chunk_nonce,
    encrypt_to,
    iter_decrypt,
)
from helios_tools.core.sample import sample_contract, sample_manifest

KEY = bytes(range(32))
KIND = core_pb2.RESOURCE_KIND_WEIGHTS
RECORD = CHUNK_NBYTES + TAG_NBYTES
PLAIN = np.random.default_rng(11).bytes(3 * CHUNK_NBYTES - 1000)  # 3 chunks, last one short


@pytest.fixture(scope="module")
def stream() -> tuple[bytes, bytes, int]:
    f = io.BytesIO()
    stored, decoded, prefix, count = encrypt_to(f, KEY, "w", KIND, PLAIN, None)
    assert (stored, decoded, count) == (len(PLAIN) + 3 * TAG_NBYTES, len(PLAIN), 3)
    return f.getvalue(), prefix, count


def _records(data: bytes) -> list[bytes]:
    return [data[i:i + RECORD] for i in range(0, len(data), RECORD)]


def _decrypt(data: bytes, prefix: bytes, count: int, decoded: int,
             rid: str = "w", kind: int = KIND, key: bytes = KEY) -> bytes:
    return b"".join(iter_decrypt(memoryview(data), key, rid, kind, decoded, count, prefix))


def test_round_trip(stream):
    data, prefix, count = stream
    assert _decrypt(data, prefix, count, len(PLAIN)) == PLAIN


def _lengths(records: list[bytes]) -> tuple[int, int]:
    """(decoded, count) an attacker would have to claim for these records."""
    return sum(len(r) - TAG_NBYTES for r in records), len(records)


@pytest.mark.parametrize("case, rearrange", [
    ("reorder", lambda r: [r[1], r[0], r[2]]),
    ("drop middle", lambda r: [r[0], r[2]]),
    ("drop final (truncate at a chunk boundary)", lambda r: [r[0], r[1]]),
    ("duplicate", lambda r: [r[0], r[1], r[1], r[2]]),
    ("extend past final", lambda r: [r[0], r[1], r[2], r[2]]),
    ("final chunk first", lambda r: [r[2], r[1], r[0]]),
])
def test_rearranged_chunks_fail_even_with_matching_metadata(stream, case, rearrange):
    """Even if an attacker could also rewrite the count and length, the nonce's index and
    final flag catch every rearrangement."""
    data, prefix, _ = stream
    records = rearrange(_records(data))
    decoded, count = _lengths(records)
    with pytest.raises(ProtectedChunkError):
        _decrypt(b"".join(records), prefix, count, decoded)


def test_rearranged_chunks_fail_against_the_signed_metadata(stream):
    data, prefix, count = stream
    r = _records(data)
    for records in ([r[1], r[0], r[2]], [r[0], r[1]], [r[0], r[1], r[1], r[2]], r + [r[2]]):
        with pytest.raises((ProtectedChunkError, LengthMismatch)):
            _decrypt(b"".join(records), prefix, count, len(PLAIN))


@pytest.mark.parametrize("cut", [1, TAG_NBYTES, 1000, RECORD])
def test_truncated_bytes(stream, cut):
    data, prefix, count = stream
    with pytest.raises(LengthMismatch):
        _decrypt(data[:-cut], prefix, count, len(PLAIN))
    # An attacker claiming the shorter length still fails authentication.
    short = data[:-cut]
    n = -(-len(short) // RECORD)
    decoded = len(short) - n * TAG_NBYTES
    if decoded >= 0 and max(1, -(-decoded // CHUNK_NBYTES)) == n:
        with pytest.raises(ProtectedChunkError):
            _decrypt(short, prefix, n, decoded)


def test_extended_bytes(stream):
    data, prefix, count = stream
    with pytest.raises(LengthMismatch):
        _decrypt(data + b"\x00" * 17, prefix, count, len(PLAIN))


def _encrypt_with_flags(plain: bytes, flags: list[bool]) -> tuple[bytes, bytes]:
    prefix = bytes(7)
    aes = AESGCM(KEY)
    out = b""
    for i, final in enumerate(flags):
        chunk = plain[i * CHUNK_NBYTES:(i + 1) * CHUNK_NBYTES]
        out += aes.encrypt(chunk_nonce(prefix, i, final), chunk, aad("w", KIND))
    return out, prefix


@pytest.mark.parametrize("flags", [[False, False, False], [True, False, True],
                                   [False, True, True], [True, True, True]])
def test_misplaced_final_flag(flags):
    data, prefix = _encrypt_with_flags(PLAIN, flags)
    with pytest.raises(ProtectedChunkError):
        _decrypt(data, prefix, 3, len(PLAIN))


def test_correct_flags_pass():
    data, prefix = _encrypt_with_flags(PLAIN, [False, False, True])
    assert _decrypt(data, prefix, 3, len(PLAIN)) == PLAIN


@pytest.mark.parametrize("change", ["resource id", "kind", "key", "prefix", "flip"])
def test_binding_of_id_kind_key_and_bytes(stream, change):
    data, prefix, count = stream
    kwargs = {}
    if change == "resource id":
        kwargs["rid"] = "w2"
    elif change == "kind":
        kwargs["kind"] = core_pb2.RESOURCE_KIND_TOKENIZER
    elif change == "key":
        kwargs["key"] = bytes(32)
    elif change == "prefix":
        prefix = bytes(7)
    else:
        data = data[:RECORD + 5] + bytes([data[RECORD + 5] ^ 1]) + data[RECORD + 6:]
    with pytest.raises(ProtectedChunkError):
        _decrypt(data, prefix, count, len(PLAIN), **kwargs)


def test_empty_resource_has_one_final_chunk():
    f = io.BytesIO()
    stored, decoded, prefix, count = encrypt_to(f, KEY, "e", KIND, b"", None)
    assert (stored, decoded, count) == (TAG_NBYTES, 0, 1)
    assert _decrypt(f.getvalue(), prefix, 1, 0, rid="e") == b""
    with pytest.raises(LengthMismatch):
        _decrypt(b"", prefix, 1, 0, rid="e")


def test_core_level_tampering(tmp_path, signing_key, resource_key):
    path = tmp_path / "v4.core"
    a = np.random.default_rng(1).bytes(CHUNK_NBYTES + 10)
    b = np.random.default_rng(2).bytes(CHUNK_NBYTES + 10)
    with LogicalCoreWriter(path, signing_key, None, "ns", version=4,
                           resource_key=resource_key) as w:
        w.add_resource("a", KIND, a)
        w.add_resource("b", KIND, b)
        w.finish(sample_contract(), sample_manifest())
    src = path.read_bytes()
    with open_core(path, [signing_key.public_key()], resource_key=resource_key) as core:
        assert core.read_resource("a") == a
        (oa, la), (ob, lb) = core.locations["a"], core.locations["b"]
    target = tmp_path / "t.core"
    swapped = bytearray(src)
    swapped[oa:oa + la], swapped[ob:ob + lb] = src[ob:ob + lb], src[oa:oa + la]
    flipped = bytearray(src)
    flipped[oa + RECORD + 3] ^= 0x40
    for tampered in (swapped, flipped):
        target.write_bytes(tampered)
        with open_core(target, [signing_key.public_key()], resource_key=resource_key) as core:
            with pytest.raises(ProtectedChunkError) as exc:
                core.read_resource("a")
            assert "'a'" in str(exc.value)
    with open_core(path, [signing_key.public_key()], resource_key=bytes(32)) as core:
        with pytest.raises(ProtectedChunkError):
            b"".join(core.iter_resource("b"))
