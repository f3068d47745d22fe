"""The native runtime: NativeModel.load, shared packing and the execution backends."""

from .errors import RuntimeLoadError, SpeculativeWidthError, UnknownBackend, UnsupportedContract
from .native_model import BACKENDS, NativeModel

__all__ = [
    "BACKENDS",
    "NativeModel",
    "RuntimeLoadError",
    "SpeculativeWidthError",
    "UnknownBackend",
    "UnsupportedContract",
]
