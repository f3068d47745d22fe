"""Writing and reading cores: round trips, streaming, atomicity, keys and authorization."""

from __future__ import annotations

import os
import tracemalloc
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import zstandard
from cryptography.hazmat.primitives import serialization
from helios_contract.schema import core_pb2
from helios_tools.core import (
    CHUNK_NBYTES,
    FORMAT_LOGICAL,
    FORMAT_PAYLOAD,
    MAGIC,
    CoreWriter,
    LogicalCoreWriter,
    NamespaceMismatch,
    ProtectedKeyRequired,
    ResourceNotFound,
    UntrustedKey,
    authorize,
    key_id_for,
    load_private_key,
    load_public_key,
    open_core,
    open_core_unverified,
    write_key_pair,
)
from helios_tools.core.sample import (
    SAMPLE_NAMESPACE,
    sample_contract,
    sample_manifest,
    sample_resources,
    write_sample_core,
)

WEIGHTS = core_pb2.RESOURCE_KIND_WEIGHTS


def test_sample_core_round_trips(sample_core, open_and_read, signing_key):
    assert open_and_read(sample_core) == {rid: data for rid, _, data in sample_resources()}
    with open_core(sample_core, [signing_key.public_key()]) as core:
        assert core.format_version == FORMAT_PAYLOAD and core.protected_version is None
        assert core.namespace == SAMPLE_NAMESPACE and core.verified
        assert core.contract == sample_contract() and core.manifest == sample_manifest()
        assert core.key_id == key_id_for(signing_key.public_key())
        authorize(core, SAMPLE_NAMESPACE)
        res = core.resources["weights/embed"]
        assert res.chunk_nbytes == CHUNK_NBYTES and len(res.chunk_sha256) == 1
        assert res.decoded_nbytes == 256 * 16 * 4
        offset, length = core.locations["weights/embed"]
        frame = sample_core.read_bytes()[offset:offset + length]
        params = zstandard.get_frame_parameters(frame)
        assert params.content_size == res.decoded_nbytes  # content size written
    data = sample_core.read_bytes()
    assert data[:8] == MAGIC
    body_nbytes = int.from_bytes(data[8:16], "little")
    body = core_pb2.CoreBody.FromString(data[16:16 + body_nbytes])
    assert body.format_version == 2
    assert min(loc.offset for loc in body.locations.locations) == 16 + body_nbytes


@pytest.mark.parametrize("version", [6, 4])
def test_logical_resource_cores_round_trip(tmp_path, version, signing_key, resource_key,
                                           open_and_read):
    path = tmp_path / f"v{version}.core"
    write_sample_core(path, signing_key, protected_version=version,
                      resource_key=resource_key if version == 4 else None)
    expected = {rid: data for rid, _, data in sample_resources()}
    assert open_and_read(path, resource_key=resource_key) == expected
    with open_core(path, [signing_key.public_key()]) as core:
        assert core.format_version == FORMAT_LOGICAL and core.protected_version == version
        assert core.contract == sample_contract()
        if version == 4:
            with pytest.raises(ProtectedKeyRequired):
                core.read_resource("weights/embed")
            assert not core.resources["weights/embed"].chunk_sha256


def _pieces(data: bytes, size: int):
    for start in range(0, len(data), size):
        yield data[start:start + size]


@pytest.mark.parametrize("version", [None, 6, 4])
def test_streamed_multichunk_resource(tmp_path, signing_key, resource_key, version, open_and_read):
    """A 9 MiB incompressible resource spans 3 commitment chunks; streamed in odd pieces."""
    data = np.random.default_rng(1).bytes(9 << 20)
    path = tmp_path / "big.core"
    if version is None:
        writer = CoreWriter(path, signing_key, None, "ns")
    else:
        writer = LogicalCoreWriter(path, signing_key, None, "ns", version=version,
                                   resource_key=resource_key if version == 4 else None)
    with writer as w:
        res = w.add_resource("w", WEIGHTS, _pieces(data, 1_000_003), decoded_nbytes=len(data))
        w.add_resource("empty", WEIGHTS, b"")
        w.finish(sample_contract(), sample_manifest())
    if version != 4:
        assert len(res.chunk_sha256) == -(-res.stored_nbytes // CHUNK_NBYTES) == 3
    else:
        assert res.protected_chunks.chunk_count == 3
    assert open_and_read(path, resource_key=resource_key) == {"w": data, "empty": b""}


def test_iter_resource_memory_is_bounded_by_the_chunk(tmp_path, signing_key):
    """64 MiB of zeros compress to a few KiB; streaming never materializes it."""
    path = tmp_path / "zeros.core"
    total = 64 << 20
    with CoreWriter(path, signing_key, None, "ns") as w:
        w.add_resource("z", WEIGHTS, (bytes(1 << 20) for _ in range(64)), decoded_nbytes=total)
        w.finish(sample_contract(), sample_manifest())
    with open_core(path, [signing_key.public_key()]) as core:
        tracemalloc.start()
        try:
            seen = 0
            for piece in core.iter_resource("z", chunk=1 << 20):
                assert len(piece) <= 1 << 20
                seen += len(piece)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert seen == total
    assert peak < 4 << 20


def test_exception_inside_with_leaves_no_partial_core(tmp_path, signing_key):
    path = tmp_path / "x.core"

    def failing():
        yield b"abc"
        raise RuntimeError("checkpoint read failed")

    with pytest.raises(RuntimeError, match="checkpoint read failed"):
        with CoreWriter(path, signing_key, None, "ns") as w:
            w.add_resource("a", WEIGHTS, b"fine")
            w.add_resource("b", WEIGHTS, failing(), decoded_nbytes=6)
    assert os.listdir(tmp_path) == []


def test_missing_finish_is_misuse_and_writes_nothing(tmp_path, signing_key):
    with pytest.raises(RuntimeError, match="finish"):
        with CoreWriter(tmp_path / "x.core", signing_key, None, "ns") as w:
            w.add_resource("a", WEIGHTS, b"x")
    assert os.listdir(tmp_path) == []


def test_finish_replaces_atomically(tmp_path, signing_key):
    path = tmp_path / "x.core"
    path.write_bytes(b"old")
    write_sample_core(path, signing_key)
    assert path.read_bytes()[:8] == MAGIC
    assert sorted(os.listdir(tmp_path)) == ["x.core"]


@pytest.mark.parametrize("call, match", [
    (lambda w: w.add_resource("a", WEIGHTS, b"x") and w.add_resource("a", WEIGHTS, b"y"),
     "duplicate"),
    (lambda w: w.add_resource("", WEIGHTS, b"x"), "non-empty"),
    (lambda w: w.add_resource("a", 0, b"x"), "ResourceKind"),
    (lambda w: w.add_resource("a", 99, b"x"), "ResourceKind"),
    (lambda w: w.add_resource("a", WEIGHTS, iter([b"x"])), "decoded_nbytes is required"),
    (lambda w: w.add_resource("a", WEIGHTS, iter([b"xy"]), decoded_nbytes=1), "exceeds"),
    (lambda w: w.add_resource("a", WEIGHTS, iter([b"x"]), decoded_nbytes=2), "holds 1"),
    (lambda w: w.add_resource("a", WEIGHTS, b"x", decoded_nbytes=2), "holds 1"),
])
def test_writer_misuse_raises_value_error(tmp_path, signing_key, call, match):
    with pytest.raises(ValueError, match=match):
        with CoreWriter(tmp_path / "x.core", signing_key, None, "ns") as w:
            call(w)
    assert os.listdir(tmp_path) == []


def test_writer_rejects_foreign_key_id_and_empty_namespace(tmp_path, signing_key, other_key):
    with pytest.raises(ValueError, match="key_id"):
        CoreWriter(tmp_path / "x", signing_key, key_id_for(other_key.public_key()), "ns")
    with pytest.raises(ValueError, match="namespace"):
        CoreWriter(tmp_path / "x", signing_key, None, "")
    with pytest.raises(ValueError, match="resource_key"):
        LogicalCoreWriter(tmp_path / "x", signing_key, None, "ns", version=4)
    assert os.listdir(tmp_path) == []


def test_trusted_keys_as_objects_raw_or_pem(sample_core, signing_key, other_key):
    pub = signing_key.public_key()
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pem = pub.public_bytes(serialization.Encoding.PEM,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    for trusted in ([pub], [raw], [pem], [other_key.public_key(), raw]):
        open_core(sample_core, trusted).close()
    with pytest.raises(UntrustedKey):
        open_core(sample_core, [other_key.public_key()])
    with pytest.raises(UntrustedKey):
        open_core(sample_core, [])


def test_key_files(tmp_path):
    from helios_tools.core import generate_key

    key = generate_key()
    priv, pub = write_key_pair(key, tmp_path / "k")
    assert pub == tmp_path / "k.pub"
    assert priv.stat().st_mode & 0o777 == 0o600
    assert key_id_for(load_private_key(priv).public_key()) == key_id_for(load_public_key(pub))
    with pytest.raises(FileExistsError):
        write_key_pair(key, tmp_path / "k")
    with pytest.raises(ValueError):
        load_public_key(priv)


@pytest.mark.parametrize("acceptance", [
    "Helios.example/tiny-llama",  # case only
    "helios.example/tiny-llama ",
    "helios.example/tiny-llam",
    "",
])
def test_authorize_is_byte_for_byte(sample_core, signing_key, acceptance):
    with open_core(sample_core, [signing_key.public_key()]) as core:
        with pytest.raises(NamespaceMismatch):
            authorize(core, acceptance)


def test_authorize_does_not_normalize_unicode(tmp_path, signing_key):
    nfc = unicodedata.normalize("NFC", "café.example")
    nfd = unicodedata.normalize("NFD", nfc)
    path = tmp_path / "u.core"
    write_sample_core(path, signing_key, namespace=nfc)
    with open_core(path, [signing_key.public_key()]) as core:
        authorize(core, nfc)
        with pytest.raises(NamespaceMismatch):
            authorize(core, nfd)


def test_unverified_cores_cannot_be_authorized(sample_core):
    with open_core_unverified(sample_core) as core:
        assert not core.verified
        with pytest.raises(UntrustedKey):
            authorize(core, SAMPLE_NAMESPACE)


def test_resource_not_found_and_closed(sample_core, signing_key):
    core = open_core(sample_core, [signing_key.public_key()])
    with pytest.raises(ResourceNotFound, match="nope"):
        core.read_resource("nope")
    with pytest.raises(KeyError):  # ResourceNotFound is also a KeyError
        core.read_resource("nope")
    core.close()
    with pytest.raises(ValueError, match="closed"):
        core.read_resource("weights/embed")


def test_multithreaded_compression_reads_back(tmp_path, signing_key, open_and_read):
    data = np.random.default_rng(2).standard_normal(3 << 20, dtype=np.float32).tobytes()
    path = tmp_path / "mt.core"
    with CoreWriter(path, signing_key, None, "ns", threads=2) as w:
        w.add_resource("w", WEIGHTS, data)
        w.finish(sample_contract(), sample_manifest())
    assert open_and_read(path) == {"w": data}


def test_payload_bytes_are_exactly_what_was_signed(sample_core, signing_key):
    from helios_tools.core import pae

    with open_core(sample_core, [signing_key.public_key()]) as core:
        env_sig = core_pb2.CoreBody.FromString(
            Path(sample_core).read_bytes()[16:16 + int.from_bytes(
                Path(sample_core).read_bytes()[8:16], "little")]).envelope.signature
        signing_key.public_key().verify(env_sig, pae(core.payload_type, core.payload))
