"""Checkpoint loading: GGUF, safetensors directories and seeded synthetic models.

Every loader returns a `Checkpoint`: geometry, HF-named float32 tensors read lazily one at a
time, `tokenizer.json` text, the chat template verbatim, and BOS/EOS/special tokens.
"""

from pathlib import Path

from .checkpoint import Checkpoint
from .errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    GeometryError,
    MissingChatTemplateError,
    MissingTensorError,
    MissingTokenizerError,
    TensorShapeError,
    UnsupportedTensorError,
)
from .geometry import LLAMA_31_8B, NAMED_GEOMETRIES, SMOLLM2_135M, LlamaGeometry
from .gguf_loader import load_gguf, unpermute_qk
from .locate import (
    GEMMA3_270M_GGUF_SHA256,
    SMOLLM2_GGUF_SHA256,
    gemma3_270m_gguf_path,
    smollm2_gguf_path,
    verify_sha256,
)
from .safetensors_loader import bf16_to_float32, load_safetensors_dir
from .synthetic import random_checkpoint
from .template import render_chat


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Open a `.gguf` file or a safetensors directory by its shape on disk.

    Raises:
        CheckpointNotFoundError: the path is neither.
    """
    path = Path(path)
    if path.is_dir():
        return load_safetensors_dir(path)
    if path.suffix == ".gguf":
        return load_gguf(path)
    raise CheckpointNotFoundError(f"{path}: neither a .gguf file nor a safetensors directory")


__all__ = [
    "GEMMA3_270M_GGUF_SHA256",
    "LLAMA_31_8B",
    "NAMED_GEOMETRIES",
    "SMOLLM2_135M",
    "SMOLLM2_GGUF_SHA256",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointNotFoundError",
    "ChecksumMismatchError",
    "GeometryError",
    "LlamaGeometry",
    "MissingChatTemplateError",
    "MissingTensorError",
    "MissingTokenizerError",
    "TensorShapeError",
    "UnsupportedTensorError",
    "bf16_to_float32",
    "gemma3_270m_gguf_path",
    "load_checkpoint",
    "load_gguf",
    "load_safetensors_dir",
    "random_checkpoint",
    "render_chat",
    "smollm2_gguf_path",
    "unpermute_qk",
    "verify_sha256",
]
