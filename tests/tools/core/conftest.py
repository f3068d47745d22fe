"""Fixtures for core-format tests: keys, sample cores and helpers that read everything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helios_tools.core import Core, open_core
from helios_tools.core.sample import write_sample_core


@pytest.fixture(scope="session")
def signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


@pytest.fixture(scope="session")
def other_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


@pytest.fixture(scope="session")
def resource_key() -> bytes:
    return bytes(range(100, 132))


@pytest.fixture(scope="session")
def sample_core(tmp_path_factory: pytest.TempPathFactory, signing_key: Ed25519PrivateKey) -> Path:
    path = tmp_path_factory.mktemp("sample") / "sample.core"
    write_sample_core(path, signing_key)
    return path


def read_everything(core: Core) -> dict[str, bytes]:
    """Read every resource both ways and check that the two agree."""
    out = {}
    for rid in core.resources:
        whole = core.read_resource(rid)
        assert b"".join(core.iter_resource(rid, chunk=1 << 20)) == whole
        out[rid] = whole
    return out


@pytest.fixture
def open_and_read(signing_key: Ed25519PrivateKey) -> Callable[..., dict[str, bytes]]:
    """Open with the signing key trusted, read every resource, return their bytes."""

    def run(path: Path, **kwargs: object) -> dict[str, bytes]:
        with open_core(path, [signing_key.public_key()], **kwargs) as core:
            return read_everything(core)

    return run
