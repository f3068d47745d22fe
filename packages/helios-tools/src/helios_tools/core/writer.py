"""Streaming, atomic core writers: payload cores and logical-resource cores.

Resources are streamed into a hidden frames file beside the target as they are added;
``finish`` signs the body, writes header and body to a second hidden file, appends the
frames with an in-kernel copy and renames it into place. No resource is ever held in memory
whole, and an exception (or a missing ``finish``) removes both hidden files: a failed export
leaves no partial core.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helios_contract.schema import contract_pb2, core_pb2, manifest_pb2

from helios_tools.core import protected
from helios_tools.core.frames import CHUNK_NBYTES, ChunkHashingSink, compress_to
from helios_tools.core.layout import FORMAT_LOGICAL, FORMAT_PAYLOAD, encode_header, place_frames
from helios_tools.core.signing import (
    PAYLOAD_TYPE_DEPLOYMENT,
    PAYLOAD_TYPE_LOGICAL,
    key_id_for,
    sign_payload,
)

__all__ = ["FORMAT_LOGICAL", "FORMAT_PAYLOAD", "CoreWriter", "LogicalCoreWriter"]

ResourceData = bytes | bytearray | memoryview | Iterable[bytes]


class CoreWriter:
    """Write a payload core (CoreBody.format_version 2).

    Example:
        with CoreWriter(out, key, None, "acme.example/models") as w:
            w.add_resource("weights/embed", ResourceKind.RESOURCE_KIND_WEIGHTS, array_bytes)
            w.add_resource("weights/big", WEIGHTS, pieces, decoded_nbytes=total)
            w.finish(contract, manifest)

    Args:
        path: Final core path; written atomically by ``finish``.
        signing_key: Ed25519 private key.
        key_id: The key's id, or None to derive it (``key_id_for``); a given id must equal
            the derived one, since readers select trusted keys by it.
        namespace: Publisher namespace, signed; ``authorize`` compares it byte for byte.
        threads: zstd compression worker threads (0: the calling thread).

    Raises:
        ValueError: Empty namespace or a key id that is not the signing key's.
    """

    _format_version = FORMAT_PAYLOAD

    def __init__(self, path: str | os.PathLike[str], signing_key: Ed25519PrivateKey,
                 key_id: str | None, namespace: str, *, threads: int = 0) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise ValueError("namespace must be a non-empty string")
        derived = key_id_for(signing_key.public_key())
        if key_id is not None and key_id != derived:
            raise ValueError(f"key_id {key_id!r} is not the signing key's id {derived!r}")
        self.path = Path(path)
        self._key = signing_key
        self._key_id = derived
        self._namespace = namespace
        self._threads = threads
        self._resources: list[core_pb2.ExecutableResource] = []
        self._rel_offsets: list[int] = []  # offset of each frame within the frames file
        self._state = "open"
        fd, frames = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                      suffix=".frames")
        self._frames_path = Path(frames)
        self._frames = os.fdopen(fd, "w+b")
        self._final_tmp: Path | None = None

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> CoreWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._state == "done":
            return
        self.abort()
        if exc_type is None:
            raise RuntimeError(f"CoreWriter for {self.path} exited without finish(); "
                               "nothing was written")

    def abort(self) -> None:
        """Remove every temporary file; the target path is left untouched."""
        self._state = "aborted"
        with contextlib.suppress(Exception):
            self._frames.close()
        for p in (self._frames_path, self._final_tmp):
            if p is not None:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()

    # -- resources ---------------------------------------------------------------------------

    def _check_new(self, resource_id: str, kind: int) -> None:
        if self._state != "open":
            raise RuntimeError(f"CoreWriter is {self._state}")
        if not isinstance(resource_id, str) or not resource_id:
            raise ValueError("resource_id must be a non-empty string")
        if any(r.resource_id == resource_id for r in self._resources):
            raise ValueError(f"duplicate resource id {resource_id!r}")
        if kind not in core_pb2.ResourceKind.values() or kind == 0:
            raise ValueError(f"kind {kind!r} is not a specified ResourceKind")

    def add_resource(self, resource_id: str, kind: int, data: ResourceData,
                     decoded_nbytes: int | None = None) -> core_pb2.ExecutableResource:
        """Stream one resource into the core as one zstd level-3 frame.

        Args:
            resource_id: Unique, non-empty id.
            kind: A ``ResourceKind`` value other than UNSPECIFIED.
            data: The decoded bytes, or an iterable of byte pieces (streamed).
            decoded_nbytes: Total decoded bytes; required when ``data`` is an iterable.

        Returns:
            The ExecutableResource that will be signed.

        Raises:
            ValueError: Bad id or kind, duplicate id, or a decoded length disagreeing with
                the data.
        """
        self._check_new(resource_id, kind)
        return self._add(resource_id, kind, data, decoded_nbytes)

    def _add(self, resource_id: str, kind: int, data: ResourceData,
             decoded_nbytes: int | None) -> core_pb2.ExecutableResource:
        start = self._frames.tell()
        try:
            stored, decoded, digests = compress_to(self._frames, data, decoded_nbytes,
                                                   threads=self._threads)
        except BaseException:
            self._frames.seek(start)
            self._frames.truncate()
            raise
        res = core_pb2.ExecutableResource(resource_id=resource_id, kind=kind,
                                          stored_nbytes=stored, decoded_nbytes=decoded,
                                          chunk_nbytes=CHUNK_NBYTES, chunk_sha256=digests)
        return self._record(res, start)

    def _record(self, res: core_pb2.ExecutableResource, start: int) -> core_pb2.ExecutableResource:
        self._resources.append(res)
        self._rel_offsets.append(start)
        return res

    def _add_stored(self, resource_id: str, kind: int, stored: bytes,
                    decoded_nbytes: int) -> core_pb2.ExecutableResource:
        """Store ``stored`` verbatim as a resource's frame, committing its chunk digests.

        For tests and tools that craft frames (the tamper corpus); it validates nothing.
        """
        if self._state != "open":
            raise RuntimeError(f"CoreWriter is {self._state}")
        start = self._frames.tell()
        sink = ChunkHashingSink(self._frames)
        sink.write(stored)
        res = core_pb2.ExecutableResource(resource_id=resource_id, kind=kind,
                                          stored_nbytes=len(stored),
                                          decoded_nbytes=decoded_nbytes,
                                          chunk_nbytes=CHUNK_NBYTES, chunk_sha256=sink.finish())
        return self._record(res, start)

    @property
    def resources(self) -> list[core_pb2.ExecutableResource]:
        """The resources added so far (copies)."""
        return [core_pb2.ExecutableResource.FromString(r.SerializeToString())
                for r in self._resources]

    # -- finish ------------------------------------------------------------------------------

    def _payload(self, contract: contract_pb2.ServingContract,
                 manifest: manifest_pb2.ExecutionManifest) -> tuple[str, bytes]:
        body = core_pb2.DeploymentBody(publisher_namespace=self._namespace, contract=contract,
                                       manifest=manifest, resources=self._resources)
        return PAYLOAD_TYPE_DEPLOYMENT, body.SerializeToString(deterministic=True)

    def finish(self, contract: contract_pb2.ServingContract,
               manifest: manifest_pb2.ExecutionManifest, *,
               payload: bytes | None = None) -> Path:
        """Sign the body, assemble the core and rename it into place.

        Args:
            contract: The ServingContract.
            manifest: The ExecutionManifest.
            payload: Tests only: sign these payload bytes instead of the serialized body.

        Returns:
            The final path.
        """
        if self._state != "open":
            raise RuntimeError(f"CoreWriter is {self._state}")
        try:
            payload_type, body_bytes = self._payload(contract, manifest)
            if payload is not None:
                body_bytes = payload
            envelope = core_pb2.PayloadEnvelope(
                payload=body_bytes, payload_type=payload_type, key_id=self._key_id,
                signature=sign_payload(self._key, payload_type, body_bytes))

            def encode(frames_start: int) -> bytes:
                locations = core_pb2.LocationSet(locations=[
                    core_pb2.Location(resource_id=r.resource_id, offset=frames_start + rel,
                                      length=r.stored_nbytes)
                    for r, rel in zip(self._resources, self._rel_offsets, strict=True)])
                return core_pb2.CoreBody(format_version=self._format_version,
                                         envelope=envelope, locations=locations,
                                         ).SerializeToString(deterministic=True)

            _, core_body = place_frames(encode)
            self._assemble(encode_header(len(core_body)) + core_body)
        except BaseException:
            self.abort()
            raise
        self._state = "done"
        return self.path

    def _assemble(self, head: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                   suffix=".tmp")
        self._final_tmp = Path(tmp)
        self._frames.flush()
        frames_nbytes = self._frames.seek(0, os.SEEK_END)
        with os.fdopen(fd, "wb") as out:
            out.write(head)
            out.flush()
            _copy_file(self._frames.fileno(), out.fileno(), frames_nbytes)
            os.fchmod(out.fileno(), 0o644)
            out.flush()
            os.fsync(out.fileno())
        self._frames.close()
        os.replace(self._final_tmp, self.path)
        self._final_tmp = None
        self._frames_path.unlink()
        with contextlib.suppress(OSError):  # persist the rename where the platform allows
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


class LogicalCoreWriter(CoreWriter):
    """Write a logical-resource core: a signed ModelIndex plus ProtectedIndex.

    Args:
        path, signing_key, key_id, namespace, threads: As for ``CoreWriter``.
        version: ProtectedIndex version: 6 (zstd frames, as payload cores) or 4
            (authenticated AES-GCM chunks).
        resource_key: Version 4 only: the operator's 32-byte AES-256 key.

    Raises:
        ValueError: Unknown version, or a key missing for version 4 / given for version 6.
    """

    _format_version = FORMAT_LOGICAL

    def __init__(self, path: str | os.PathLike[str], signing_key: Ed25519PrivateKey,
                 key_id: str | None, namespace: str, *, version: int = 6,
                 resource_key: bytes | None = None, threads: int = 0) -> None:
        if version not in (4, 6):
            raise ValueError(f"ProtectedIndex version must be 4 or 6, not {version}")
        if (version == 4) != (resource_key is not None):
            raise ValueError("version 4 needs resource_key; version 6 takes none")
        if resource_key is not None and len(resource_key) != protected.KEY_NBYTES:
            raise ValueError(f"resource_key must be {protected.KEY_NBYTES} bytes")
        super().__init__(path, signing_key, key_id, namespace, threads=threads)
        self._version = version
        self._resource_key = resource_key

    def _add(self, resource_id: str, kind: int, data: ResourceData,
             decoded_nbytes: int | None) -> core_pb2.ExecutableResource:
        if self._version == 6:
            return super()._add(resource_id, kind, data, decoded_nbytes)
        assert self._resource_key is not None
        start = self._frames.tell()
        try:
            stored, decoded, prefix, count = protected.encrypt_to(
                self._frames, self._resource_key, resource_id, kind, data, decoded_nbytes)
        except BaseException:
            self._frames.seek(start)
            self._frames.truncate()
            raise
        res = core_pb2.ExecutableResource(
            resource_id=resource_id, kind=kind, stored_nbytes=stored, decoded_nbytes=decoded,
            chunk_nbytes=CHUNK_NBYTES,
            protected_chunks=core_pb2.ProtectedChunks(nonce_prefix=prefix, chunk_count=count))
        return self._record(res, start)

    def _payload(self, contract: contract_pb2.ServingContract,
                 manifest: manifest_pb2.ExecutionManifest) -> tuple[str, bytes]:
        body = core_pb2.LogicalResourceBody(
            index=core_pb2.ModelIndex(contract=contract, manifest=manifest,
                                      publisher_namespace=self._namespace),
            protected_index=core_pb2.ProtectedIndex(version=self._version,
                                                    resources=self._resources))
        return PAYLOAD_TYPE_LOGICAL, body.SerializeToString(deterministic=True)


def _copy_file(src_fd: int, dst_fd: int, nbytes: int) -> None:
    """Append ``nbytes`` from the start of src to dst, in the kernel where possible."""
    offset = 0
    try:
        while offset < nbytes:
            n = os.copy_file_range(src_fd, dst_fd, nbytes - offset, offset)
            if n == 0:
                raise OSError("copy_file_range made no progress")
            offset += n
        return
    except (AttributeError, OSError):
        pass
    with os.fdopen(os.dup(src_fd), "rb") as src, os.fdopen(os.dup(dst_fd), "ab") as dst:
        src.seek(offset)
        shutil.copyfileobj(src, dst, 16 << 20)
