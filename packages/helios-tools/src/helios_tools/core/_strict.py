"""Strict Protobuf decoding for the core format (unknown fields and enum numbers rejected).

Uses ``helios_contract.strict``; every failure becomes ``CoreFormatError``.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import Message
from helios_contract.errors import StrictDecodeError
from helios_contract.strict import decode_message

from helios_tools.core.errors import CoreFormatError

M = TypeVar("M", bound=Message)


def decode_strict(cls: type[M], data: bytes | memoryview, what: str, offset: int) -> M:
    """Decode ``data`` as ``cls`` strictly.

    Raises:
        CoreFormatError: Malformed bytes, an unknown field or an unknown enum number.
    """
    try:
        return decode_message(cls, bytes(data))
    except StrictDecodeError as e:
        raise CoreFormatError(f"{what} is not a strict {cls.DESCRIPTOR.full_name}: {e}",
                              offset=offset) from None
