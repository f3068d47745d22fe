"""helios-serve byte-count and tier-size options on the tiny served core: a value that is
not a finite byte count, or a tier that does not fit in host memory, fails startup in one
line naming the option (exit 2); any spelling of zero is "none"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helios_serve.config import parse_bytes
from helios_serve.runtime.cache_sizing import host_available_bytes
from helios_serve.runtime.errors import RuntimeLoadError
from helios_serve.runtime.tiers import TierChoice, TierRows, check_host_memory

from tests.tiny_model import serve_error_line

SERVE = str(Path(sys.executable).parent / "helios-serve")


def _fails(core, *more) -> str:
    """helios-serve CORE ... MORE exits 2 with one error line (after startup phase lines)."""
    proc = subprocess.run([SERVE, str(core.path), "--trust", str(core.public_key), "--accept",
                           core.namespace, "--port", "0", *map(str, more)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    return serve_error_line(proc.stderr)


@pytest.mark.parametrize(("option", "value"), [
    ("--host-cache-bytes", "inf"), ("--host-cache-bytes", "1e400"),
    ("--host-cache-bytes", "nan"), ("--kv-cache-memory", "inf"), ("--kv-cache-memory", "-inf"),
    ("--kv-cache-memory", "nan"),
])
def test_a_byte_count_that_is_not_finite_is_one_line_naming_the_option(tiny_served, option,
                                                                       value):
    assert _fails(tiny_served.core, option, value) == (
        f"helios-serve: error: {option}: {value!r} is not a finite byte count")


@pytest.mark.parametrize("text", ["0", "0.0", "0GiB", "0e3", " 0 "])
def test_any_spelling_of_zero_is_none_where_zero_is_allowed(text):
    assert parse_bytes(text, zero=True) == 0
    with pytest.raises(ValueError, match=re.escape(f"{text!r} is not a positive byte count")):
        parse_bytes(text)


def test_zero_host_cache_bytes_is_accepted(tiny_served):
    """--host-cache-bytes 0GiB gets past option parsing (the bad --num-pages fails later)."""
    assert _fails(tiny_served.core, "--host-cache-bytes", "0GiB", "--kv-cache-memory", "0.5") == (
        "helios-serve: error: --kv-cache-memory: '0.5' is not a positive byte count")


_AVAILABLE = r"\((\d+) bytes available\)"


def test_snapshot_rows_beyond_host_memory_fail_startup_naming_the_size(tiny_served):
    line = _fails(tiny_served.core, "--snapshots", "99999999999999999999")
    m = re.fullmatch(r"helios-serve: error: --snapshots 99999999999999999999: (\d+) bytes of "
                     rf"continuation rows do not fit in host memory {_AVAILABLE}", line)
    assert m, line
    asked, available = map(int, m.groups())
    assert asked % 99999999999999999999 == 0 and asked > available > 0


def test_a_host_tier_beyond_host_memory_fails_startup_naming_the_size(tiny_served):
    line = _fails(tiny_served.core, "--host-cache-bytes", "100TiB")
    m = re.fullmatch(rf"helios-serve: error: --host-cache-bytes {100 * 2**40}: (\d+) bytes of "
                     rf"host tier plus (\d+) bytes of snapshot rows do not fit in host memory "
                     rf"{_AVAILABLE}", line)
    assert m, line
    host, snapshots, available = map(int, m.groups())
    assert 100 * 2**40 - host < host // 1000 and host + snapshots > available > 0


def _choice(snapshot_rows: int, host_rows: int) -> TierChoice:
    return TierChoice(TierRows(), snapshot_rows, host_rows, host_row_bytes=1024, page_bytes=64,
                      routes={}, snapshot_row_bytes=512)


def test_tiers_that_fit_alone_but_not_together_name_the_host_tier():
    """100 snapshot rows (51200 B) fit in 60000 B, and so do 50 host rows (51200 B), but
    not both: the host tier is the one refused, with both sizes and what is available."""
    with pytest.raises(RuntimeLoadError, match=re.escape(
            "--host-cache-bytes 51200: 51200 bytes of host tier plus 51200 bytes of snapshot "
            "rows do not fit in host memory (60000 bytes available)")):
        check_host_memory(_choice(100, 50), snapshots_on_host=True, available=60000,
                          snapshots=100, host_cache_bytes=51200)
    # on cuda the continuation rows are device memory: only the host tier counts
    check_host_memory(_choice(100, 50), snapshots_on_host=False, available=60000,
                      snapshots=100, host_cache_bytes=51200)


def test_the_cores_prepared_snapshot_rows_are_named_when_they_do_not_fit():
    with pytest.raises(RuntimeLoadError, match=re.escape(
            "the core's prepared_snapshots 100: 51200 bytes of continuation rows do not fit "
            "in host memory (1000 bytes available)")):
        check_host_memory(_choice(100, 0), snapshots_on_host=True, available=1000,
                          snapshots=None, host_cache_bytes=0)


def test_the_host_tier_is_called_pinned_only_on_cuda():
    assert "(0.0 MiB host memory)" in _choice(0, 2).describe("cpu")
    assert "(0.0 MiB pinned)" in _choice(0, 2).describe("cuda")


def test_host_available_bytes_is_positive_and_at_most_physical_memory():
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < host_available_bytes() <= physical
