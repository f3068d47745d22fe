"""Errors raised while locating, verifying and loading checkpoints.

Every class names the file it was reading, and where it applies the tensor and both
shapes, so an operator can act on the message without a debugger.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class of every checkpoint loading failure."""


class ChecksumMismatchError(CheckpointError):
    """A file's sha256 differs from the pinned digest."""

    def __init__(self, path: str, expected: str, actual: str) -> None:
        self.path, self.expected, self.actual = path, expected, actual
        super().__init__(f"{path}: sha256 mismatch: expected {expected}, actual {actual}")


class CheckpointNotFoundError(CheckpointError):
    """The checkpoint file or directory (or a required file inside it) is absent."""


class MissingTensorError(CheckpointError):
    """A tensor the geometry requires is not in the checkpoint."""

    def __init__(self, path: str, tensor: str, detail: str = "") -> None:
        self.path, self.tensor = path, tensor
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"{path}: missing tensor {tensor!r}{suffix}")


class TensorShapeError(CheckpointError):
    """A tensor's shape differs from the one the geometry implies."""

    def __init__(
        self, path: str, tensor: str, expected: tuple[int, ...], actual: tuple[int, ...]
    ) -> None:
        self.path, self.tensor = path, tensor
        self.expected, self.actual = tuple(expected), tuple(actual)
        super().__init__(
            f"{path}: tensor {tensor!r} has shape {self.actual}, expected {self.expected}"
        )


class CheckpointFormatError(CheckpointError):
    """A file of the checkpoint is malformed (bad JSON, truncated or corrupt tensor file)."""


class UnsupportedTensorError(CheckpointError):
    """A tensor has a dtype or quantization the loader cannot decode."""


class MissingTokenizerError(CheckpointError):
    """The checkpoint carries no tokenizer."""


class MissingChatTemplateError(CheckpointError):
    """The checkpoint carries no chat template."""


class GeometryError(CheckpointError):
    """The checkpoint's metadata does not describe a supported Llama geometry."""
