"""The native runtime: NativeModel.load, shared packing and the execution backends."""

from .errors import MissingGraphVariant, RuntimeLoadError, UnknownBackend, UnsupportedBinding
from .native_model import BACKENDS, NativeModel

__all__ = [
    "BACKENDS",
    "MissingGraphVariant",
    "NativeModel",
    "RuntimeLoadError",
    "UnknownBackend",
    "UnsupportedBinding",
]
