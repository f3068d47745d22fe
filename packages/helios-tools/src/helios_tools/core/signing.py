"""Ed25519 signing of core envelopes (DSSE pre-authentication encoding) and key files.

The signature covers ``PAE(payload_type, payload)`` over the exact stored payload bytes,
never a re-serialization (Protobuf output is not canonical). The key id is a hint that
selects which trusted key verifies; it is derived from the public key, so a core whose key
id names no trusted key is rejected as ``UntrustedKey`` rather than tried against every key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from helios_tools.core.errors import SignatureError, UntrustedKey

__all__ = [
    "PAYLOAD_TYPE_DEPLOYMENT",
    "PAYLOAD_TYPE_LOGICAL",
    "generate_key",
    "key_id_for",
    "load_private_key",
    "load_public_key",
    "pae",
    "public_key_from",
    "sign_payload",
    "verify_payload",
    "write_key_pair",
]

# Versioned payload types bound into every signature.
PAYLOAD_TYPE_DEPLOYMENT = "application/vnd.helios.deployment-body.v2+protobuf"
PAYLOAD_TYPE_LOGICAL = "application/vnd.helios.logical-resource-body.v1+protobuf"


def pae(payload_type: str, payload: bytes | memoryview) -> bytes:
    """DSSE v1 pre-authentication encoding.

    Returns:
        ``b"DSSEv1 " + len(type) + b" " + type + b" " + len(body) + b" " + body`` with
        lengths as ASCII decimal byte counts.
    """
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), bytes(payload))


def key_id_for(public_key: Ed25519PublicKey) -> str:
    """The key id of a public key: ``"ed25519:"`` + first 16 bytes of SHA-256(raw), hex."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]


def public_key_from(key: Ed25519PublicKey | bytes) -> Ed25519PublicKey:
    """Accept a key object, 32 raw bytes, or PEM bytes of an Ed25519 public key.

    Raises:
        ValueError: The bytes are not an Ed25519 public key.
    """
    if isinstance(key, Ed25519PublicKey):
        return key
    data = bytes(key)
    if len(data) == 32:
        return Ed25519PublicKey.from_public_bytes(data)
    loaded = serialization.load_pem_public_key(data)
    if not isinstance(loaded, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return loaded


def sign_payload(key: Ed25519PrivateKey, payload_type: str, payload: bytes) -> bytes:
    """Ed25519 signature (64 bytes) over ``pae(payload_type, payload)``."""
    return key.sign(pae(payload_type, payload))


def verify_payload(trusted: Iterable[Ed25519PublicKey], key_id: str, payload_type: str,
                   payload: bytes, signature: bytes) -> Ed25519PublicKey:
    """Verify a signature with the trusted key that the key id names.

    Returns:
        The trusted key that verified.

    Raises:
        UntrustedKey: No trusted key has this key id.
        SignatureError: The named key does not verify the signature.
    """
    by_id = {key_id_for(k): k for k in trusted}
    key = by_id.get(key_id)
    if key is None:
        raise UntrustedKey(f"core signed by key id {key_id!r}, which is not among the "
                           f"trusted keys {sorted(by_id)}")
    try:
        key.verify(signature, pae(payload_type, payload))
    except InvalidSignature:
        raise SignatureError(f"signature by {key_id!r} does not verify over the payload "
                             f"({len(payload)} bytes, type {payload_type!r})") from None
    return key


def generate_key() -> Ed25519PrivateKey:
    """A new Ed25519 private key."""
    return Ed25519PrivateKey.generate()


def write_key_pair(key: Ed25519PrivateKey, path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``path`` (PKCS#8 PEM, mode 0600, created exclusively) and ``path.pub`` (PEM).

    Raises:
        FileExistsError: Either file exists already (keys are never overwritten).
    """
    path = Path(path)
    pub_path = path.with_name(path.name + ".pub")
    if pub_path.exists():
        raise FileExistsError(pub_path)
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    os.chmod(path, 0o600)  # umask cannot widen it, but an inherited ACL could
    pub_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path, pub_path


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load an unencrypted PEM Ed25519 private key.

    Raises:
        ValueError: The file is not an Ed25519 private key.
    """
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Load a PEM (or 32 raw bytes) Ed25519 public key.

    Raises:
        ValueError: The file is not an Ed25519 public key.
    """
    try:
        return public_key_from(Path(path).read_bytes())
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
