"""Stored zstd frames: streaming compression with chunk commitments, and verified decoding.

Invariant of the read path: no stored byte reaches the zstd decoder before the SHA-256 of
its 4 MiB chunk matches the signed commitment, and the frame must be exactly one zstd frame
that fills the stored bytes. The structure is checked by walking the block headers of the
verified bytes ourselves, because python-zstandard decodes across frames, silently skips
skippable frames and returns partial output for a truncated frame (docs/architecture.md, "The core file").
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import BinaryIO

import zstandard
from helios_contract.schema import core_pb2

from helios_tools.core.errors import ChunkDigestMismatch, FrameError, LengthMismatch

__all__ = [
    "CHUNK_NBYTES",
    "MAX_WINDOW_NBYTES",
    "ZSTD_LEVEL",
    "ChunkHashingSink",
    "chunk_count",
    "compress_to",
    "iter_frame",
    "read_frame",
]

CHUNK_NBYTES = 4 << 20  # commitment chunk over stored (compressed) bytes
MAX_WINDOW_NBYTES = 8 << 20  # decoder window cap
ZSTD_LEVEL = 3
_MAX_BLOCK_NBYTES = 128 << 10  # zstd format limit on one block
_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MIN, _SKIPPABLE_MAX = 0x184D2A50, 0x184D2A5F
_PREFETCH_CHUNKS = 3  # chunks hashed ahead of the decoder on the worker thread

_hash_pool: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    # hashlib releases the GIL on large buffers, so hashing chunk i+1 overlaps decoding i.
    global _hash_pool
    if _hash_pool is None:
        _hash_pool = ThreadPoolExecutor(max_workers=max(1, min(4, (os.cpu_count() or 2) - 1)),
                                        thread_name_prefix="helios-core-sha256")
    return _hash_pool


def chunk_count(stored_nbytes: int, chunk_nbytes: int = CHUNK_NBYTES) -> int:
    """ceil(stored_nbytes / chunk_nbytes)."""
    return -(-stored_nbytes // chunk_nbytes)


# --- write ----------------------------------------------------------------------------------


class ChunkHashingSink:
    """File-like sink that writes through to ``f`` and commits SHA-256 per 4 MiB chunk.

    Attributes:
        digests: SHA-256 of each complete chunk so far (``finish`` adds the last partial one).
        nbytes: Bytes written.
    """

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._h = hashlib.sha256()
        self._in_chunk = 0
        self.digests: list[bytes] = []
        self.nbytes = 0

    def write(self, data: bytes | memoryview) -> int:
        mv = memoryview(data).cast("B")
        self._f.write(mv)
        pos = 0
        while pos < len(mv):
            take = min(len(mv) - pos, CHUNK_NBYTES - self._in_chunk)
            self._h.update(mv[pos:pos + take])
            self._in_chunk += take
            pos += take
            if self._in_chunk == CHUNK_NBYTES:
                self.digests.append(self._h.digest())
                self._h = hashlib.sha256()
                self._in_chunk = 0
        self.nbytes += len(mv)
        return len(mv)

    def flush(self) -> None:
        pass

    def finish(self) -> list[bytes]:
        if self._in_chunk:
            self.digests.append(self._h.digest())
            self._h = hashlib.sha256()
            self._in_chunk = 0
        return self.digests


def _pieces(data: bytes | bytearray | memoryview, piece: int = CHUNK_NBYTES) -> Iterator[memoryview]:
    mv = memoryview(data).cast("B")
    for start in range(0, len(mv), piece):
        yield mv[start:start + piece]


def compress_to(f: BinaryIO, data: bytes | bytearray | memoryview | Iterable[bytes],
                decoded_nbytes: int | None, *, threads: int = 0) -> tuple[int, int, list[bytes]]:
    """Write one zstd level-3 frame (content size written) of ``data`` to ``f``.

    Streams: a buffer is fed in 4 MiB slices and an iterable piece by piece, so nothing is
    held twice.

    Args:
        f: Binary file positioned where the frame goes.
        data: The decoded bytes, or an iterable of pieces.
        decoded_nbytes: Total decoded bytes; required for an iterable, checked for a buffer.
        threads: zstd worker threads (0: compress on the calling thread).

    Returns:
        (stored_nbytes, decoded_nbytes, chunk_sha256 of the stored bytes).

    Raises:
        ValueError: decoded_nbytes is missing for an iterable or disagrees with the data.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        n = memoryview(data).nbytes
        if decoded_nbytes is not None and decoded_nbytes != n:
            raise ValueError(f"decoded_nbytes={decoded_nbytes} but the buffer holds {n} bytes")
        decoded_nbytes, pieces = n, _pieces(data)
    else:
        if decoded_nbytes is None:
            raise ValueError("decoded_nbytes is required when data is an iterable")
        pieces = iter(data)
    sink = ChunkHashingSink(f)
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                    write_checksum=False, threads=threads)
    fed = 0
    # No `with`: its exit would end the frame and mask an exception from the data source.
    w = cctx.stream_writer(sink, size=decoded_nbytes, closefd=False)
    for piece in pieces:
        fed += memoryview(piece).nbytes
        if fed > decoded_nbytes:
            raise ValueError(f"data exceeds decoded_nbytes={decoded_nbytes}")
        w.write(piece)
    if fed != decoded_nbytes:
        raise ValueError(f"data holds {fed} bytes, decoded_nbytes={decoded_nbytes}")
    w.flush(zstandard.FLUSH_FRAME)
    return sink.nbytes, decoded_nbytes, sink.finish()


# --- read -----------------------------------------------------------------------------------


class _FrameScanner:
    """Walks the frame header and block headers over verified bytes to find the frame end."""

    def __init__(self, view: memoryview, res: core_pb2.ExecutableResource, offset: int) -> None:
        self._view = view  # the stored bytes of the resource
        self._res = res
        self._offset = offset  # absolute file offset of view[0]
        self._pos = -1  # next block header (relative); -1 until the frame header is parsed
        self._checksum = False
        self.end: int | None = None  # frame end (relative) once the last block is seen

    def _error(self, cls: type, message: str, at: int) -> Exception:
        return cls(message, resource_id=self._res.resource_id, offset=self._offset + at)

    def _header(self, verified: int) -> None:
        head = self._view[:min(verified, 18)]  # 18 = largest frame header
        magic = int.from_bytes(head[:4], "little") if len(head) >= 4 else None
        if magic is not None and _SKIPPABLE_MIN <= magic <= _SKIPPABLE_MAX:
            raise self._error(FrameError, "skippable frame where a zstd frame must be", 0)
        if magic != _ZSTD_MAGIC:
            raise self._error(FrameError, "stored bytes do not start with the zstd magic", 0)
        if len(head) < 6:  # magic, descriptor and at least one more header byte
            raise self._error(FrameError, "truncated frame header", 0)
        try:
            header_nbytes = zstandard.frame_header_size(head)
            params = zstandard.get_frame_parameters(head)
        except zstandard.ZstdError as e:
            raise self._error(FrameError, f"truncated or invalid frame header: {e}", 0) from None
        if len(head) < header_nbytes:
            raise self._error(FrameError, "truncated frame header", 0)
        if head[4] & 0x08:
            raise self._error(FrameError, "reserved bit set in the frame header", 4)
        if params.dict_id:
            raise self._error(FrameError, f"frame needs dictionary {params.dict_id}", 0)
        if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
            raise self._error(FrameError, "frame does not declare its content size", 0)
        if params.content_size != self._res.decoded_nbytes:
            raise self._error(LengthMismatch, f"frame declares {params.content_size} decoded "
                              f"bytes, signed decoded length is {self._res.decoded_nbytes}", 0)
        if params.window_size > MAX_WINDOW_NBYTES:
            raise self._error(FrameError, f"frame window {params.window_size} bytes exceeds "
                              f"the {MAX_WINDOW_NBYTES}-byte cap", 0)
        self._checksum = bool(params.has_checksum)
        self._pos = header_nbytes

    def advance(self, verified: int) -> None:
        """Scan every block header lying within the first ``verified`` stored bytes."""
        if self._pos < 0:
            self._header(verified)
        view, stored = self._view, len(self._view)
        while self.end is None and self._pos + 3 <= verified:
            pos = self._pos
            h = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16
            last, block_type, size = h & 1, (h >> 1) & 3, h >> 3
            if block_type == 3:
                raise self._error(FrameError, "reserved zstd block type", pos)
            if size > _MAX_BLOCK_NBYTES:
                raise self._error(FrameError, f"zstd block of {size} bytes", pos)
            self._pos = pos + 3 + (1 if block_type == 1 else size)
            if last:
                self.end = self._pos + (4 if self._checksum else 0)
        if self.end is not None and self.end < stored:
            raise self._error(FrameError, f"{stored - self.end} trailing bytes after the frame "
                              "(a second frame, skippable frame or garbage)", self.end)
        if (self.end if self.end is not None else self._pos) > stored:
            raise self._error(FrameError, "truncated frame: it extends past the stored bytes",
                              stored)

    def finish(self) -> None:
        self.advance(len(self._view))
        if self.end is None:
            raise self._error(FrameError, "truncated frame: no last block", len(self._view))


class _VerifiedSource:
    """Read-only file-like source for zstd's stream_reader over one resource's stored bytes.

    Each 4 MiB chunk is released only after its SHA-256 matches the signed commitment;
    chunks ahead are hashed on the worker pool while the decoder works.
    """

    def __init__(self, view: memoryview, res: core_pb2.ExecutableResource, offset: int) -> None:
        self._view = view
        self._res = res
        self._offset = offset
        self._count = chunk_count(len(view))
        self._futures: dict[int, Future[bytes]] = {}
        self._next_chunk = 0  # chunk to verify next
        self._verified = 0  # stored bytes verified so far
        self._pos = 0  # stored bytes handed to the decoder so far
        self.scanner = _FrameScanner(view, res, offset)

    def _chunk(self, i: int) -> memoryview:
        return self._view[i * CHUNK_NBYTES:(i + 1) * CHUNK_NBYTES]

    def _verify_next(self) -> None:
        i = self._next_chunk
        if self._count > 1:
            for j in range(i + 1, min(i + 1 + _PREFETCH_CHUNKS, self._count)):
                if j not in self._futures:
                    self._futures[j] = _pool().submit(_sha256, self._chunk(j))
        fut = self._futures.pop(i, None)
        digest = fut.result() if fut is not None else _sha256(self._chunk(i))
        if digest != self._res.chunk_sha256[i]:
            self._cancel()
            raise ChunkDigestMismatch(f"chunk {i} of {self._count} does not match its signed "
                                      "SHA-256", resource_id=self._res.resource_id,
                                      offset=self._offset + i * CHUNK_NBYTES)
        self._next_chunk += 1
        self._verified = min(len(self._view), self._next_chunk * CHUNK_NBYTES)
        try:
            self.scanner.advance(self._verified)
        except Exception:
            self._cancel()
            raise

    def _cancel(self) -> None:
        """Stop hashing ahead and wait for running hashes: none may touch the map later."""
        futures = list(self._futures.values())
        self._futures.clear()
        for fut in futures:
            fut.cancel()
        wait(futures)

    def close(self) -> None:
        self._cancel()

    def prime(self) -> None:
        """Verify the first chunk and the frame header before any decoding."""
        if self._next_chunk == 0:
            self._verify_next()

    def read(self, n: int = -1) -> memoryview:
        if self._pos >= len(self._view):
            return self._view[:0]
        if self._pos >= self._verified:
            self._verify_next()
        end = self._verified if n < 0 else min(self._verified, self._pos + n)
        out = self._view[self._pos:end]
        self._pos = end
        return out

    @property
    def position(self) -> int:
        return self._pos

    def finish(self) -> None:
        """Verify the chunks the decoder never asked for and that the frame fills them."""
        while self._next_chunk < self._count:
            self._verify_next()
        self.scanner.finish()


def _sha256(mv: memoryview) -> bytes:
    return hashlib.sha256(mv).digest()


def _decoder(source: _VerifiedSource) -> zstandard.ZstdDecompressionReader:
    dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_NBYTES)
    return dctx.stream_reader(source, read_size=CHUNK_NBYTES, read_across_frames=False,
                              closefd=False)


def _zstd_error(res: core_pb2.ExecutableResource, offset: int, src: _VerifiedSource,
                e: zstandard.ZstdError) -> FrameError:
    return FrameError(f"zstd decoder rejected the frame: {e}", resource_id=res.resource_id,
                      offset=offset + src.position)


def iter_frame(view: memoryview, res: core_pb2.ExecutableResource, offset: int,
               piece_nbytes: int = CHUNK_NBYTES) -> Iterator[bytes]:
    """Decode a stored frame in pieces of at most ``piece_nbytes`` decoded bytes.

    Memory stays bounded by the piece size and one stored chunk, whatever the resource size.

    Raises:
        ChunkDigestMismatch, FrameError, LengthMismatch: As described in the module.
    """
    if piece_nbytes <= 0:
        raise ValueError("piece_nbytes must be positive")
    src = _VerifiedSource(view, res, offset)
    try:
        yield from _iter_decoded(src, view, res, offset, piece_nbytes)
    finally:
        src.close()  # also when the consumer abandons the stream


def _iter_decoded(src: _VerifiedSource, view: memoryview, res: core_pb2.ExecutableResource,
                  offset: int, piece_nbytes: int) -> Iterator[bytes]:
    src.prime()
    reader = _decoder(src)
    remaining = res.decoded_nbytes
    try:
        while remaining:
            out = reader.read(min(piece_nbytes, remaining))
            if not out:
                src.finish()  # names the precise structural fault if there is one
                raise FrameError(f"frame ended {remaining} bytes short of the signed decoded "
                                 "length", resource_id=res.resource_id, offset=offset + len(view))
            remaining -= len(out)
            yield out
        if reader.read(1):
            raise LengthMismatch("frame decodes past the signed decoded length",
                                 resource_id=res.resource_id, offset=offset + src.position)
    except zstandard.ZstdError as e:
        raise _zstd_error(res, offset, src, e) from None
    src.finish()


def read_frame(view: memoryview, res: core_pb2.ExecutableResource, offset: int) -> bytes:
    """Decode a whole stored frame into one ``bytes`` of the signed decoded length.

    The single output buffer is allocated at the signed length only after the first chunk
    and the frame header are verified.
    """
    src = _VerifiedSource(view, res, offset)
    try:
        return _read_decoded(src, view, res, offset)
    finally:
        src.close()


def _read_decoded(src: _VerifiedSource, view: memoryview, res: core_pb2.ExecutableResource,
                  offset: int) -> bytes:
    src.prime()
    reader = _decoder(src)
    try:
        out = reader.read(res.decoded_nbytes) if res.decoded_nbytes else b""
        if len(out) < res.decoded_nbytes:
            src.finish()
            raise FrameError(f"frame ended {res.decoded_nbytes - len(out)} bytes short of the "
                             "signed decoded length", resource_id=res.resource_id,
                             offset=offset + len(view))
        if reader.read(1):
            raise LengthMismatch("frame decodes past the signed decoded length",
                                 resource_id=res.resource_id, offset=offset + src.position)
    except zstandard.ZstdError as e:
        raise _zstd_error(res, offset, src, e) from None
    src.finish()
    return out
