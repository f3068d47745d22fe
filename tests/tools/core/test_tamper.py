"""The tamper corpus: every corruption of a valid core is rejected with its exception class.

Byte flips cover every region of the file (header, body structure, signed payload,
payload type, key id, signature, LocationSet, each frame chunk); truncations and appends
cover the layout; crafted, validly signed frames cover the zstd traps (second frame,
skippable frame, 16 MiB window, huge declared content size, decoded-length mismatch).
No case may raise anything but a CoreError, hang, or allocate beyond the signed sizes.
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zstandard
from helios_contract.schema import core_pb2
from helios_tools.core import (
    ChunkDigestMismatch,
    CoreError,
    CoreFormatError,
    CoreWriter,
    FrameError,
    LengthMismatch,
    NamespaceMismatch,
    SignatureError,
    UntrustedKey,
    authorize,
    open_core,
)
from helios_tools.core.sample import SAMPLE_NAMESPACE, sample_contract, sample_manifest

pytestmark = pytest.mark.timeout(120)

WEIGHTS = core_pb2.RESOURCE_KIND_WEIGHTS
ANY = (CoreError,)


def _attempt(path: Path, key) -> type[BaseException] | None:
    """Open and read everything; the exception class raised, or None if all passed."""
    try:
        with open_core(path, [key.public_key()]) as core:
            for rid in core.resources:
                core.read_resource(rid)
                for _ in core.iter_resource(rid):
                    pass
    except CoreError as e:
        return type(e)
    return None


def _body(data: bytes) -> tuple[int, core_pb2.CoreBody]:
    n = int.from_bytes(data[8:16], "little")
    return 16 + n, core_pb2.CoreBody.FromString(data[16:16 + n])


def _span(data: bytes, needle: bytes, start: int = 0) -> range:
    at = data.index(needle, start)
    assert data.find(needle, at + 1) == -1 or len(needle) < 8, "ambiguous span"
    return range(at, at + len(needle))


def _regions(data: bytes) -> list[tuple[str, range, tuple[type, ...]]]:
    """(name, byte range, accepted exception classes) for every region of a core file."""
    frames_start, body = _body(data)
    env = body.envelope
    locations = body.locations.SerializeToString()
    regions = [
        ("magic", range(0, 8), (CoreFormatError,)),
        ("body length", range(8, 16), (CoreFormatError,)),
        ("payload", _span(data, env.payload), (SignatureError,)),
        ("signature", _span(data, env.signature), (SignatureError,)),
        ("payload type", _span(data, env.payload_type.encode()), (CoreFormatError,)),
        # A flipped key id names no trusted key, or is no longer UTF-8.
        ("key id", _span(data, env.key_id.encode()), (UntrustedKey, CoreFormatError)),
        # Unsigned: anything it points at is checked against the signed commitments.
        ("locations", _span(data, locations),
         (CoreFormatError, LengthMismatch, ChunkDigestMismatch)),
    ]
    covered = set().union(*(r for _, r, _ in regions))
    structure = [i for i in range(16, frames_start) if i not in covered]
    regions.append(("body structure", structure, ANY))
    for loc in body.locations.locations:
        regions.append((f"frame {loc.resource_id}", range(loc.offset, loc.offset + loc.length),
                        (ChunkDigestMismatch,)))
    return regions


def _flip(src: bytes, i: int, dst: Path) -> None:
    data = bytearray(src)
    data[i] ^= 0x01 if i % 2 else 0x80
    dst.write_bytes(data)


def test_flip_one_byte_in_every_region(sample_core, signing_key, tmp_path):
    src = sample_core.read_bytes()
    assert _attempt(sample_core, signing_key) is None
    regions = _regions(src)
    assert {i for _, r, _ in regions for i in r} == set(range(len(src)))  # every byte mapped
    target = tmp_path / "t.core"
    failures = []
    for name, span, expected in regions:
        offsets = list(span)
        if name.startswith("frame") and len(offsets) > 64:
            offsets = offsets[::len(offsets) // 64] + [offsets[-1]]
        for i in offsets:
            _flip(src, i, target)
            got = _attempt(target, signing_key)
            if got is None or not issubclass(got, expected):
                failures.append((name, i, got))
    assert failures == []


def test_flip_in_each_chunk_of_a_multichunk_frame(tmp_path, signing_key):
    path = tmp_path / "big.core"
    data = np.random.default_rng(5).bytes(9 << 20)  # stored as 3 chunks of 4 MiB
    with CoreWriter(path, signing_key, None, SAMPLE_NAMESPACE) as w:
        w.add_resource("w", WEIGHTS, data)
        w.finish(sample_contract(), sample_manifest())
    src = path.read_bytes()
    _, body = _body(src)
    (loc,) = body.locations.locations
    target = tmp_path / "t.core"
    for chunk in range(3):
        for i in (0, 12345, (4 << 20) - 1):
            at = loc.offset + chunk * (4 << 20) + i
            if at >= loc.offset + loc.length:
                continue
            _flip(src, at, target)
            with open_core(target, [signing_key.public_key()]) as core:
                with pytest.raises(ChunkDigestMismatch) as exc:
                    core.read_resource("w")
                assert exc.value.offset == loc.offset + chunk * (4 << 20)
                assert "'w'" in str(exc.value) and str(exc.value.offset) in str(exc.value)


def test_truncation_at_many_offsets(sample_core, signing_key, tmp_path):
    src = sample_core.read_bytes()
    frames_start, _ = _body(src)
    offsets = sorted({0, 1, 7, 8, 15, 16, 17, frames_start - 1, frames_start,
                      len(src) - 1, *range(0, len(src), 97)})
    target = tmp_path / "t.core"
    for n in offsets:
        target.write_bytes(src[:n])
        assert _attempt(target, signing_key) is CoreFormatError, n


def test_a_cut_in_the_frames_is_named_truncated(sample_core, signing_key, tmp_path):
    """A copy cut short (a partial download) once read as "location [a, b) lies outside
    the frames region" of the last resource it cut into."""
    src = sample_core.read_bytes()
    frames_start, _ = _body(src)
    target = tmp_path / "t.core"
    for n in (frames_start, (frames_start + len(src)) // 2, len(src) - 1):
        target.write_bytes(src[:n])
        with pytest.raises(CoreFormatError) as exc:
            open_core(target, [signing_key.public_key()])
        assert str(exc.value) == (f"file is {n} bytes; header, body and frames make "
                                  f"{len(src)} (truncated) (offset {n})")


@pytest.mark.parametrize("extra", [b"\x00", b"garbage", bytes(4096),
                                   zstandard.ZstdCompressor().compress(b"second frame")])
def test_appended_bytes(sample_core, signing_key, tmp_path, extra):
    target = tmp_path / "t.core"
    target.write_bytes(sample_core.read_bytes() + extra)
    assert _attempt(target, signing_key) is CoreFormatError


# --- crafted, validly signed frames -----------------------------------------------------------

DATA = bytes(range(256)) * 64  # 16 KiB


def _zstd(data: bytes, **params) -> bytes:
    if params:
        cp = zstandard.ZstdCompressionParameters.from_level(3, **params)
        return zstandard.ZstdCompressor(compression_params=cp).compress(data)
    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)


def _skippable(payload: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A50, len(payload)) + payload


def _huge_content_frame() -> bytes:
    # Frame header: single segment, 8-byte content size 2**40; one raw last block "hello".
    block = struct.pack("<I", (5 << 3) | 1)[:3] + b"hello"
    return struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", 1 << 40) + block


NINE_MIB_ZEROS_WIDE_WINDOW = _zstd(bytes(9 << 20), window_log=24, write_content_size=1)

CRAFTED: dict[str, tuple[Callable[[], tuple[bytes, int]], type]] = {
    "second frame": (lambda: (_zstd(DATA) + _zstd(b"x"), len(DATA)), FrameError),
    "second empty frame": (lambda: (_zstd(DATA) + _zstd(b""), len(DATA)), FrameError),
    "trailing skippable frame": (lambda: (_zstd(DATA) + _skippable(b"hi"), len(DATA)),
                                 FrameError),
    "leading skippable frame": (lambda: (_skippable(b"hi") + _zstd(DATA), len(DATA)),
                                FrameError),
    "trailing garbage": (lambda: (_zstd(DATA) + b"\x00\x01\x02", len(DATA)), FrameError),
    "truncated frame": (lambda: (_zstd(DATA)[:-7], len(DATA)), FrameError),
    "not zstd": (lambda: (b"PK\x03\x04" + DATA[:100], len(DATA)), FrameError),
    "window needs 16 MiB": (lambda: (NINE_MIB_ZEROS_WIDE_WINDOW, 9 << 20), FrameError),
    "huge declared content size": (lambda: (_huge_content_frame(), 5), LengthMismatch),
    "decoded length one more than frame": (lambda: (_zstd(DATA), len(DATA) + 1), LengthMismatch),
    "decoded length one less than frame": (lambda: (_zstd(DATA), len(DATA) - 1), LengthMismatch),
    "no content size": (lambda: (zstandard.ZstdCompressor(write_content_size=False)
                                 .compress(DATA), len(DATA)), FrameError),
    "reserved block type": (lambda: (_one_block_frame(3, b"hello", 5), 5), FrameError),
    "garbage compressed block": (lambda: (_one_block_frame(2, b"\xff" * 9, 5), 5), FrameError),
}


def _one_block_frame(block_type: int, payload: bytes, content: int) -> bytes:
    # Single-segment header with a 1-byte content size, then one last block.
    header = struct.pack("<IBB", 0xFD2FB528, 0x20, content)
    return header + struct.pack("<I", (len(payload) << 3) | (block_type << 1) | 1)[:3] + payload


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_frames_are_rejected(case, tmp_path, signing_key):
    make, expected = CRAFTED[case]
    stored, decoded = make()
    path = tmp_path / "c.core"
    with CoreWriter(path, signing_key, None, SAMPLE_NAMESPACE) as w:
        w._add_stored("r", WEIGHTS, stored, decoded)
        w.finish(sample_contract(), sample_manifest())
    with open_core(path, [signing_key.public_key()]) as core:
        for read in (core.read_resource, lambda rid: b"".join(core.iter_resource(rid))):
            tracemalloc.start()
            try:
                with pytest.raises(expected) as exc:
                    read("r")
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert "'r'" in str(exc.value) and exc.value.offset is not None
            assert peak <= max(decoded, 1 << 20) + (1 << 20), peak


def test_empty_frame_trailing_bytes_are_found_even_without_output(tmp_path, signing_key):
    path = tmp_path / "c.core"
    with CoreWriter(path, signing_key, None, SAMPLE_NAMESPACE) as w:
        w._add_stored("r", WEIGHTS, _zstd(b"") + _skippable(b""), 0)
        w.finish(sample_contract(), sample_manifest())
    with open_core(path, [signing_key.public_key()]) as core:
        with pytest.raises(FrameError, match="trailing"):
            core.read_resource("r")


# --- signed-body and envelope tampering ---------------------------------------------------------


def _with_payload(tmp_path: Path, key, payload: bytes) -> Path:
    path = tmp_path / "p.core"
    with CoreWriter(path, key, None, SAMPLE_NAMESPACE) as w:
        w.add_resource("r", WEIGHTS, DATA)
        w.finish(sample_contract(), sample_manifest(), payload=payload)
    return path


def _deployment(resource: core_pb2.ExecutableResource) -> core_pb2.DeploymentBody:
    return core_pb2.DeploymentBody(publisher_namespace=SAMPLE_NAMESPACE,
                                   contract=sample_contract(), manifest=sample_manifest(),
                                   resources=[resource])


def _real_resource(tmp_path: Path, key) -> core_pb2.ExecutableResource:
    path = _with_payload(tmp_path, key, None)
    with open_core(path, [key.public_key()]) as core:
        res = core_pb2.ExecutableResource()
        res.CopyFrom(core.resources["r"])
    return res


def test_unknown_field_in_signed_body(tmp_path, signing_key):
    res = _real_resource(tmp_path, signing_key)
    payload = _deployment(res).SerializeToString() + b"\xf8\x07\x01"  # field 127, varint 1
    assert _attempt(_with_payload(tmp_path, signing_key, payload), signing_key) is CoreFormatError


def test_unknown_enum_number_in_signed_body(tmp_path, signing_key):
    res = _real_resource(tmp_path, signing_key)
    body = _deployment(res)
    body.resources[0].kind = 99
    path = _with_payload(tmp_path, signing_key, body.SerializeToString())
    assert _attempt(path, signing_key) is CoreFormatError
    body = _deployment(res)
    body.contract.model.graphs[0].operation = 42
    path = _with_payload(tmp_path, signing_key, body.SerializeToString())
    assert _attempt(path, signing_key) is CoreFormatError


def test_inconsistent_signed_commitments(tmp_path, signing_key):
    res = _real_resource(tmp_path, signing_key)
    for mutate in (lambda r: r.chunk_sha256.append(b"\x00" * 32),
                   lambda r: setattr(r, "chunk_nbytes", 1 << 20),
                   lambda r: r.chunk_sha256.__setitem__(0, b"short"),
                   lambda r: setattr(r, "decoded_nbytes", r.stored_nbytes * 50_000)):
        body = _deployment(res)
        mutate(body.resources[0])
        path = _with_payload(tmp_path, signing_key, body.SerializeToString())
        assert _attempt(path, signing_key) in (CoreFormatError, LengthMismatch)


def _rewrite_body(src: Path, dst: Path, mutate: Callable[[core_pb2.CoreBody], None]) -> None:
    data = src.read_bytes()
    frames_start, body = _body(data)
    mutate(body)
    new = body.SerializeToString()
    assert len(new) == frames_start - 16, "mutation must keep the body length"
    dst.write_bytes(data[:16] + new + data[frames_start:])


def test_replaced_signature(sample_core, signing_key, other_key, tmp_path):
    target = tmp_path / "t.core"

    def other_signature(body: core_pb2.CoreBody) -> None:
        from helios_tools.core.signing import sign_payload

        env = body.envelope
        env.signature = sign_payload(other_key, env.payload_type, env.payload)

    _rewrite_body(sample_core, target, other_signature)
    assert _attempt(target, signing_key) is SignatureError

    def other_signer(body: core_pb2.CoreBody) -> None:
        from helios_tools.core import key_id_for

        other_signature(body)
        body.envelope.key_id = key_id_for(other_key.public_key())

    _rewrite_body(sample_core, target, other_signer)
    assert _attempt(target, signing_key) is UntrustedKey


def test_locations_pointing_at_wrong_bytes_fail_on_digests(tmp_path, signing_key):
    path = tmp_path / "two.core"
    a, b = np.random.default_rng(7).bytes(5000), np.random.default_rng(8).bytes(5000)
    with CoreWriter(path, signing_key, None, SAMPLE_NAMESPACE) as w:
        w.add_resource("a", WEIGHTS, a)
        w.add_resource("b", WEIGHTS, b)
        w.finish(sample_contract(), sample_manifest())

    def swap(body: core_pb2.CoreBody) -> None:
        la, lb = body.locations.locations
        la.offset, lb.offset = lb.offset, la.offset

    target = tmp_path / "t.core"
    _rewrite_body(path, target, swap)
    assert _attempt(target, signing_key) is ChunkDigestMismatch


def test_resource_swapped_in_from_another_core(tmp_path, signing_key):
    paths = []
    for seed in (1, 2):
        path = tmp_path / f"{seed}.core"
        with CoreWriter(path, signing_key, None, SAMPLE_NAMESPACE) as w:
            w.add_resource("r", WEIGHTS, np.random.default_rng(seed).bytes(7000))
            w.finish(sample_contract(), sample_manifest())
        paths.append(path)
    one, two = (p.read_bytes() for p in paths)
    loc1 = _body(one)[1].locations.locations[0]
    loc2 = _body(two)[1].locations.locations[0]
    assert loc1.length == loc2.length
    swapped = one[:loc1.offset] + two[loc2.offset:loc2.offset + loc2.length]
    target = tmp_path / "t.core"
    target.write_bytes(swapped + one[loc1.offset + loc1.length:])
    assert _attempt(target, signing_key) is ChunkDigestMismatch


@pytest.mark.parametrize("namespace", ["Helios.example/tiny-llama",
                                       "helios.example/tiny-llama2", "other.example/x"])
def test_changed_namespace_fails_authorization(tmp_path, signing_key, namespace):
    from helios_tools.core.sample import write_sample_core

    path = tmp_path / "n.core"
    write_sample_core(path, signing_key, namespace=namespace)
    with open_core(path, [signing_key.public_key()]) as core:
        with pytest.raises(NamespaceMismatch):
            authorize(core, SAMPLE_NAMESPACE)


def test_namespace_edit_in_place_breaks_the_signature(sample_core, signing_key, tmp_path):
    data = sample_core.read_bytes()
    edited = data.replace(b"helios.example/tiny-llama", b"Helios.example/tiny-llama")
    assert edited != data
    target = tmp_path / "t.core"
    target.write_bytes(edited)
    assert _attempt(target, signing_key) is SignatureError
