"""The core file layout.

    offset 0   magic b"HELIOSC\\0"                       8 bytes
    offset 8   u64 little-endian: n = len(CoreBody)     8 bytes
    offset 16  CoreBody (format_version, envelope, LocationSet)   n bytes
    offset 16+n  the stored frames, back to back, in signed resource order

Nothing else: the file size is exactly 16 + n + sum(stored_nbytes). The LocationSet holds
absolute file offsets, so its own size depends on where the frames start; ``place_frames``
finds that fixed point.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

__all__ = [
    "FORMAT_LOGICAL",
    "FORMAT_PAYLOAD",
    "HEADER_NBYTES",
    "MAGIC",
    "MAX_BODY_NBYTES",
    "encode_header",
    "place_frames",
]

FORMAT_PAYLOAD = 2  # CoreBody.format_version of payload cores
FORMAT_LOGICAL = 1  # CoreBody.format_version of logical-resource cores
MAGIC = b"HELIOSC\x00"
HEADER_NBYTES = 16
MAX_BODY_NBYTES = 1 << 31  # a body (contract + manifest + commitments) beyond 2 GiB is corrupt


def encode_header(body_nbytes: int) -> bytes:
    """Magic plus the little-endian u64 body length."""
    return MAGIC + struct.pack("<Q", body_nbytes)


def place_frames(encode_body: Callable[[int], bytes]) -> tuple[int, bytes]:
    """Find the frames' start offset S with ``S == 16 + len(encode_body(S))``.

    ``len(encode_body(S))`` never decreases as S grows (varints only widen), so iterating
    from S = 16 + len(encode_body(0)) climbs to the least fixed point in a few steps.

    Returns:
        (frames_start, body bytes encoded for that start).
    """
    start = HEADER_NBYTES + len(encode_body(0))
    while True:
        body = encode_body(start)
        if HEADER_NBYTES + len(body) == start:
            return start, body
        start = HEADER_NBYTES + len(body)
