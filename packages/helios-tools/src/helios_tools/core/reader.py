"""Open, verify, authorize and read cores (payload cores and logical-resource cores).

``open_core`` maps the file, checks the layout, verifies the Ed25519 signature over the
exact stored payload bytes, and only then strictly decodes them. Resource bytes are checked
when read: every chunk against its signed digest (zstd frames) or its AES-GCM tag
(ProtectedIndex version 4), before any decoding.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from helios_contract.schema import contract_pb2, core_pb2, manifest_pb2

from helios_tools.core import protected
from helios_tools.core._strict import decode_strict
from helios_tools.core.errors import (
    CoreFormatError,
    LengthMismatch,
    NamespaceMismatch,
    ProtectedKeyRequired,
    ResourceNotFound,
    UntrustedKey,
)
from helios_tools.core.frames import CHUNK_NBYTES, chunk_count, iter_frame, read_frame
from helios_tools.core.layout import (
    FORMAT_LOGICAL,
    FORMAT_PAYLOAD,
    HEADER_NBYTES,
    MAGIC,
    MAX_BODY_NBYTES,
)
from helios_tools.core.signing import (
    PAYLOAD_TYPE_DEPLOYMENT,
    PAYLOAD_TYPE_LOGICAL,
    public_key_from,
    verify_payload,
)

__all__ = ["Core", "authorize", "open_core", "open_core_unverified"]

_PAYLOAD_TYPES = {FORMAT_PAYLOAD: PAYLOAD_TYPE_DEPLOYMENT, FORMAT_LOGICAL: PAYLOAD_TYPE_LOGICAL}
_ZSTD_MIN_FRAME_NBYTES = 9  # magic, descriptor, content size, one empty block header
_MAX_BLOCK_NBYTES = 128 << 10  # decoded bytes of one zstd block, at most


class Core:
    """An open core. Use ``open_core``; close it (or use ``with``) to unmap the file.

    Attributes:
        path: The core file.
        format_version: CoreBody.format_version (2 payload core, 1 logical-resource core).
        protected_version: ProtectedIndex.version (6 or 4) of a logical-resource core, else None.
        namespace: The signed publisher namespace.
        contract: The ServingContract.
        manifest: The ExecutionManifest.
        resources: resource id -> signed ExecutableResource, in signed order.
        locations: resource id -> (absolute file offset, stored length), from the unsigned
            LocationSet.
        key_id: The envelope's key id.
        verified: True when the signature was verified against a trusted key.
        payload: The exact signed payload bytes; payload_type: its signed type.
    """

    def __init__(self, path: Path, mm: mmap.mmap, *, format_version: int,
                 protected_version: int | None, namespace: str,
                 contract: contract_pb2.ServingContract,
                 manifest: manifest_pb2.ExecutionManifest,
                 resources: dict[str, core_pb2.ExecutableResource],
                 locations: dict[str, tuple[int, int]], key_id: str, verified: bool,
                 payload: bytes, payload_type: str, resource_key: bytes | None) -> None:
        self.path = path
        self._mm = mm
        self._view = memoryview(mm)
        self.format_version = format_version
        self.protected_version = protected_version
        self.namespace = namespace
        self.contract = contract
        self.manifest = manifest
        self.resources = resources
        self.locations = locations
        self.key_id = key_id
        self.verified = verified
        self.payload = payload
        self.payload_type = payload_type
        self._resource_key = resource_key

    @property
    def file_nbytes(self) -> int:
        """Size of the core file in bytes."""
        return len(self._mm)

    def _stored(self, resource_id: str) -> tuple[core_pb2.ExecutableResource, memoryview, int]:
        if self._mm.closed:
            raise ValueError(f"core {self.path} is closed")
        res = self.resources.get(resource_id)
        if res is None:
            raise ResourceNotFound(f"no resource {resource_id!r} in core {self.path}",
                                   resource_id=resource_id)
        offset, length = self.locations[resource_id]
        return res, self._view[offset:offset + length], offset

    def iter_resource(self, resource_id: str, chunk: int = CHUNK_NBYTES) -> Iterator[bytes]:
        """Stream a resource's decoded bytes in pieces of at most ``chunk`` bytes.

        Every stored chunk is verified before it is decoded; memory stays bounded by the
        piece size and one 4 MiB stored chunk. A fault raises mid-stream, after the pieces
        that preceded it.

        Raises:
            ResourceNotFound, ChunkDigestMismatch, FrameError, LengthMismatch,
            ProtectedChunkError, ProtectedKeyRequired.
        """
        res, view, offset = self._stored(resource_id)
        if self.protected_version == 4:
            yield from _rechunk(self._decrypt(res, view, offset), chunk)
        else:
            yield from iter_frame(view, res, offset, chunk)

    def read_resource(self, resource_id: str) -> bytes:
        """A resource's decoded bytes, fully verified (see ``iter_resource``).

        Raises:
            As ``iter_resource``.
        """
        res, view, offset = self._stored(resource_id)
        if self.protected_version == 4:
            return b"".join(self._decrypt(res, view, offset))
        return read_frame(view, res, offset)

    def verify_resource(self, resource_id: str) -> int:
        """Verify and decode a resource, discarding the output.

        Returns:
            The decoded length in bytes.
        """
        return sum(len(piece) for piece in self.iter_resource(resource_id))

    def _decrypt(self, res: core_pb2.ExecutableResource, view: memoryview,
                 offset: int) -> Iterator[bytes]:
        if self._resource_key is None:
            raise ProtectedKeyRequired("ProtectedIndex version 4 resources need the "
                                       "operator's AES-256 resource key",
                                       resource_id=res.resource_id, offset=offset)
        pc = res.protected_chunks
        return protected.iter_decrypt(view, self._resource_key, res.resource_id, res.kind,
                                      res.decoded_nbytes, pc.chunk_count, pc.nonce_prefix, offset)

    def close(self) -> None:
        """Unmap the file. Pieces already returned stay valid (they are copies)."""
        try:
            self._view.release()
            self._mm.close()
        except BufferError:  # a consumer still holds a view; the map closes when it is freed
            pass

    def __enter__(self) -> Core:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _rechunk(pieces: Iterator[bytes], chunk: int) -> Iterator[bytes]:
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    for piece in pieces:
        if len(piece) <= chunk:
            yield piece
        else:
            for start in range(0, len(piece), chunk):
                yield piece[start:start + chunk]


def open_core(path: str | os.PathLike[str],
              trusted_keys: Iterable[Ed25519PublicKey | bytes], *,
              resource_key: bytes | None = None) -> Core:
    """Open a core, verifying its signature before parsing the signed body.

    Args:
        path: The core file.
        trusted_keys: Ed25519 public keys (objects, 32 raw bytes or PEM bytes); the
            envelope's key id must name one of them.
        resource_key: The operator's 32-byte AES key, for ProtectedIndex version 4 cores.

    Returns:
        The open Core (memory-mapped; close it).

    Raises:
        OSError: The file cannot be read.
        CoreFormatError: Not a well-formed core (layout, body, signed body, locations).
        UntrustedKey: The key id names no trusted key.
        SignatureError: The signature does not verify.
        LengthMismatch: A location's length differs from the signed stored length.
    """
    keys = [public_key_from(k) for k in trusted_keys]
    if not keys:
        raise UntrustedKey("no trusted keys were given")
    return _open(Path(path), keys, resource_key)


def open_core_unverified(path: str | os.PathLike[str], *,
                         resource_key: bytes | None = None) -> Core:
    """Open a core WITHOUT verifying its signature, for inspection tools only.

    The result has ``verified = False`` and ``authorize`` refuses it. Layout, strict
    decoding and chunk digests are still checked.
    """
    return _open(Path(path), None, resource_key)


def authorize(core: Core, acceptance: str) -> None:
    """Succeed only when ``acceptance`` equals the signed publisher namespace byte for byte.

    No case folding or Unicode normalization: UTF-8 bytes are compared.

    Raises:
        NamespaceMismatch: The strings differ.
        UntrustedKey: The core was opened without signature verification.
        TypeError: ``acceptance`` is not a str.
    """
    if not isinstance(acceptance, str):
        raise TypeError("acceptance must be a str")
    if not core.verified:
        raise UntrustedKey("cannot authorize a core opened without signature verification")
    if acceptance.encode("utf-8") != core.namespace.encode("utf-8"):
        raise NamespaceMismatch(f"acceptance {acceptance!r} does not equal the signed "
                                f"publisher namespace {core.namespace!r}")


def _open(path: Path, keys: list[Ed25519PublicKey] | None, resource_key: bytes | None) -> Core:
    if resource_key is not None and len(resource_key) != protected.KEY_NBYTES:
        raise ValueError(f"resource_key must be {protected.KEY_NBYTES} bytes")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_NBYTES:
            raise CoreFormatError(f"{size} bytes is shorter than the core header",
                                  offset=0)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(path, mm, keys, resource_key)
    except BaseException:
        mm.close()
        raise


def _parse(path: Path, mm: mmap.mmap, keys: list[Ed25519PublicKey] | None,
           resource_key: bytes | None) -> Core:
    size = len(mm)
    if mm[:8] != MAGIC:
        raise CoreFormatError("not a Helios core (bad magic)", offset=0)
    (body_nbytes,) = struct.unpack("<Q", mm[8:16])
    if body_nbytes > MAX_BODY_NBYTES or HEADER_NBYTES + body_nbytes > size:
        raise CoreFormatError(f"header declares a {body_nbytes}-byte body in a "
                              f"{size}-byte file", offset=8)
    frames_start = HEADER_NBYTES + body_nbytes
    body = decode_strict(core_pb2.CoreBody, mm[HEADER_NBYTES:frames_start], "CoreBody",
                         HEADER_NBYTES)
    payload_type = _PAYLOAD_TYPES.get(body.format_version)
    if payload_type is None:
        raise CoreFormatError(f"unsupported core format_version {body.format_version}",
                              offset=HEADER_NBYTES)
    env = body.envelope
    if env.payload_type != payload_type:
        raise CoreFormatError(f"payload type {env.payload_type!r} is not {payload_type!r} "
                              f"(format_version {body.format_version})", offset=HEADER_NBYTES)
    if keys is not None:
        verify_payload(keys, env.key_id, env.payload_type, env.payload, env.signature)

    # Only verified bytes are parsed from here on.
    if body.format_version == FORMAT_PAYLOAD:
        deployment = decode_strict(core_pb2.DeploymentBody, env.payload, "signed payload",
                                   HEADER_NBYTES)
        namespace, contract, manifest = (deployment.publisher_namespace, deployment.contract,
                                         deployment.manifest)
        resources, protected_version = list(deployment.resources), None
    else:
        logical = decode_strict(core_pb2.LogicalResourceBody, env.payload, "signed payload",
                                HEADER_NBYTES)
        namespace, contract, manifest = (logical.index.publisher_namespace,
                                         logical.index.contract, logical.index.manifest)
        protected_version = logical.protected_index.version
        if protected_version not in (4, 6):
            raise CoreFormatError(f"unsupported ProtectedIndex version {protected_version}",
                                  offset=HEADER_NBYTES)
        resources = list(logical.protected_index.resources)
    if not namespace:
        raise CoreFormatError("the signed publisher namespace is empty", offset=HEADER_NBYTES)
    by_id = _check_resources(resources, protected_version)
    locations = _check_locations(body.locations, by_id, frames_start, size)
    return Core(path, mm, format_version=body.format_version,
                protected_version=protected_version, namespace=namespace, contract=contract,
                manifest=manifest, resources=by_id, locations=locations, key_id=env.key_id,
                verified=keys is not None, payload=env.payload, payload_type=env.payload_type,
                resource_key=resource_key)


def _check_resources(resources: list[core_pb2.ExecutableResource],
                     protected_version: int | None) -> dict[str, core_pb2.ExecutableResource]:
    """Signed commitments must be self-consistent before any byte is read through them."""
    by_id: dict[str, core_pb2.ExecutableResource] = {}
    for res in resources:
        rid = res.resource_id

        def bad(message: str, rid: str = rid) -> CoreFormatError:
            return CoreFormatError(f"signed resource: {message}", resource_id=rid)

        if not rid:
            raise bad("empty resource id")
        if rid in by_id:
            raise bad("duplicate resource id")
        if res.kind == core_pb2.RESOURCE_KIND_UNSPECIFIED:
            raise bad("kind is unspecified")
        if res.chunk_nbytes != CHUNK_NBYTES:
            raise bad(f"chunk_nbytes {res.chunk_nbytes} is not {CHUNK_NBYTES}")
        if protected_version == 4:
            pc = res.protected_chunks
            if not res.HasField("protected_chunks") or res.chunk_sha256:
                raise bad("version 4 resources carry protected_chunks and no chunk_sha256")
            if len(pc.nonce_prefix) != protected.NONCE_PREFIX_NBYTES:
                raise bad(f"nonce prefix of {len(pc.nonce_prefix)} bytes")
            if (pc.chunk_count != protected.protected_chunk_count(res.decoded_nbytes)
                    or res.stored_nbytes != protected.protected_stored_nbytes(res.decoded_nbytes)):
                raise bad(f"{pc.chunk_count} chunks / {res.stored_nbytes} stored bytes do not "
                          f"fit {res.decoded_nbytes} decoded bytes")
        else:
            if res.HasField("protected_chunks"):
                raise bad("zstd resources carry no protected_chunks")
            if res.stored_nbytes < _ZSTD_MIN_FRAME_NBYTES:
                raise bad(f"{res.stored_nbytes} stored bytes cannot hold a zstd frame")
            if len(res.chunk_sha256) != chunk_count(res.stored_nbytes):
                raise bad(f"{len(res.chunk_sha256)} chunk digests for {res.stored_nbytes} "
                          f"stored bytes (need {chunk_count(res.stored_nbytes)})")
            if any(len(d) != 32 for d in res.chunk_sha256):
                raise bad("a chunk digest is not 32 bytes")
            # Every zstd block costs at least 3 stored bytes and decodes to at most 128 KiB.
            if res.decoded_nbytes > (res.stored_nbytes // 3 + 1) * _MAX_BLOCK_NBYTES:
                raise bad(f"{res.decoded_nbytes} decoded bytes cannot come from "
                          f"{res.stored_nbytes} stored bytes")
        by_id[rid] = res
    return by_id


def _check_locations(location_set: core_pb2.LocationSet,
                     resources: dict[str, core_pb2.ExecutableResource], frames_start: int,
                     size: int) -> dict[str, tuple[int, int]]:
    """One location per resource, inside the frames region, of the signed length; the file
    holds exactly the header, the body and the frames. Where each location points is not
    trusted: the bytes found there are checked against the signed digests when read.
    The file's size is checked first: a cut copy is "truncated", not a location outside
    the frames region."""
    expected = frames_start + sum(r.stored_nbytes for r in resources.values())
    if size != expected:
        what = "trailing bytes" if size > expected else "truncated"
        raise CoreFormatError(f"file is {size} bytes; header, body and frames make "
                              f"{expected} ({what})", offset=min(size, expected))
    locations: dict[str, tuple[int, int]] = {}
    for loc in location_set.locations:
        rid = loc.resource_id
        res = resources.get(rid)
        if res is None:
            raise CoreFormatError("LocationSet names a resource that is not signed",
                                  resource_id=rid)
        if rid in locations:
            raise CoreFormatError("LocationSet holds two locations", resource_id=rid)
        if loc.length != res.stored_nbytes:
            raise LengthMismatch(f"location length {loc.length} differs from the signed "
                                 f"stored length {res.stored_nbytes}", resource_id=rid,
                                 offset=loc.offset)
        if loc.offset < frames_start or loc.offset + loc.length > size:
            raise CoreFormatError(f"location [{loc.offset}, {loc.offset + loc.length}) lies "
                                  f"outside the frames region [{frames_start}, {size})",
                                  resource_id=rid, offset=loc.offset)
        locations[rid] = (loc.offset, loc.length)
    missing = [rid for rid in resources if rid not in locations]
    if missing:
        raise CoreFormatError(f"LocationSet has no location for {missing}")
    return locations
