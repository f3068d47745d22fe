"""Philox4x32-10 against the Random123 known-answer vectors (kat_vectors)."""

import numpy as np
import pytest
from helios_tools.kernels import philox4x32_10, philox_uniform

# Random123 kat_vectors: "philox4x32 10 CTR[4] KEY[2] EXPECTED[4]"
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]


def _philox_scalar(ctr, key):
    """Independent plain-int Philox4x32-10 (Random123 philox4x32round + bumpkey)."""
    c, (k0, k1) = list(ctr), key
    m = 0xFFFFFFFF
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & m, (p0 >> 32) ^ c[3] ^ k1, p0 & m]
    return c


@pytest.mark.parametrize(("ctr", "key", "expected"), KAT)
def test_philox_known_answers(ctr, key, expected):
    assert philox4x32_10(ctr, key).tolist() == expected
    assert _philox_scalar(ctr, key) == expected


def test_philox_vectorized_matches_scalar_and_broadcasts():
    rng = np.random.default_rng(0)
    ctr = rng.integers(0, 2**32, size=(5, 4), dtype=np.uint64)
    key = rng.integers(0, 2**32, size=2, dtype=np.uint64)
    out = philox4x32_10(ctr, key)
    assert out.dtype == np.uint32 and out.shape == (5, 4)
    for i in range(5):
        assert out[i].tolist() == _philox_scalar(ctr[i].tolist(), key.tolist())


def test_uniform_is_word0_mapped_into_open_interval():
    idx = np.array([0, 1, 7, 49151])
    u = philox_uniform(0x12345678, 0x9ABCDEF0, 42, idx)
    for i, ui in zip(idx, u, strict=True):
        x0 = _philox_scalar([int(i), 42, 0, 0], [0x12345678, 0x9ABCDEF0])[0]
        assert ui == ((x0 >> 8) + 0.5) * 2.0**-24
    big = philox_uniform(1, 2, 3, np.arange(49152))
    assert big.min() > 0.0 and big.max() < 1.0
    assert abs(big.mean() - 0.5) < 0.01
    # a different position or key gives a different stream
    assert not np.array_equal(big[:16], philox_uniform(1, 2, 4, np.arange(16)))
    assert not np.array_equal(big[:16], philox_uniform(1, 3, 3, np.arange(16)))
