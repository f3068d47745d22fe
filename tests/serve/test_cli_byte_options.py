"""helios-serve byte-count and tier-size options on the tiny served core: a value that is
not a finite byte count, or a tier that does not fit in host memory, fails startup in one
line naming the option (exit 2); any spelling of zero is "none"."""

from __future__ import annotations

import os
import re

import pytest
from helios_serve.config import format_bytes, parse_bytes
from helios_serve.runtime.cache_sizing import (
    HOST_MEMORY,
    CacheSizingError,
    MemoryAsk,
    check_fits,
    host_available_bytes,
)
from helios_serve.runtime.tiers import TierChoice, TierRows

from tests.tiny_model import serve_fails


def _fails(core, *more) -> str:
    """helios-serve CORE ... MORE exits 2 with one error line (after startup phase lines)."""
    return serve_fails(core.path, "--trust", core.public_key, "--accept", core.namespace,
                       "--port", "0", *more)


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
    with pytest.raises(ValueError) as info:
        parse_bytes(text)
    assert str(info.value) == f"{text!r} is not a positive byte count"


@pytest.mark.parametrize(("option", "value", "rule"), [
    ("--host-cache-bytes", "-5", "a non-negative byte count (0: none)"),
    ("--host-cache-bytes", "0.5", "a non-negative byte count (0: none)"),
    ("--host-cache-bytes", "-1GiB", "a non-negative byte count (0: none)"),
    ("--kv-cache-memory", "-5", "a positive byte count"),
    ("--kv-cache-memory", "0", "a positive byte count"),
    ("--kv-cache-memory", "0.5", "a positive byte count"),
])  # fmt: skip
def test_a_byte_count_out_of_range_names_the_options_true_rule(tiny_served, option, value,
                                                              rule):
    """--host-cache-bytes accepts 0 (none), --kv-cache-memory does not: each one's
    message says its own rule, quoting the text given."""
    assert _fails(tiny_served.core, option, value) == (
        f"helios-serve: error: {option}: {value!r} is not {rule}")


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (51200, "50.0 KiB"),
    (2**20, "1.0 MiB"), (538 * 2**20, "538.0 MiB"), (2**30, "1.00 GiB"), (2**40, "1024.00 GiB"),
])  # fmt: skip
def test_byte_counts_print_in_the_largest_unit_they_reach(n, text):
    """format_bytes: one spelling for every startup line and message (a 1 KiB budget
    printed "0.0 MiB" before)."""
    assert format_bytes(n) == text


def test_a_parsed_byte_count_is_an_int_that_prints_as_typed():
    import pickle

    n = parse_bytes(" 4GiB ")
    assert n == 4 * 2**30 and type(n + 0) is int and n // 2**30 == 4
    assert (str(n), f"{n}", f"{n:d}") == ("4GiB", "4GiB", str(4 * 2**30))
    again = pickle.loads(pickle.dumps(n))  # as the engine process receives its options
    assert (again, str(again)) == (4 * 2**30, "4GiB")
    assert str(parse_bytes("0GiB", zero=True)) == "0GiB"


@pytest.mark.parametrize("engine", [(), ("--engine-process",)], ids=["thread", "engine"])
def test_a_host_tier_too_small_for_a_row_echoes_the_size_as_typed(tiny_served, engine):
    line = _fails(tiny_served.core, "--host-cache-bytes", "1KiB", *engine)
    assert re.fullmatch(r"helios-serve: error: --host-cache-bytes 1KiB holds no host-tier row "
                        r"\(one row of every host plane is [0-9.]+ KiB\)", line), line


def test_a_kv_cache_budget_holding_no_page_echoes_the_size_as_typed(tiny_served):
    line = _fails(tiny_served.core, "--kv-cache-memory", "1K")
    assert re.fullmatch(r"helios-serve: error: the KV cache budget \(--kv-cache-memory 1K: "
                        r"1\.0 KiB\) holds no page; one page of every cache plane needs "
                        r"[0-9.]+ KiB", line), line


def test_zero_host_cache_bytes_is_accepted(tiny_served):
    """--host-cache-bytes 0GiB gets past option parsing (the bad --num-pages fails later)."""
    assert _fails(tiny_served.core, "--host-cache-bytes", "0GiB", "--kv-cache-memory", "0.5") == (
        "helios-serve: error: --kv-cache-memory: '0.5' is not a positive byte count")


_AVAILABLE = r"(\d+) bytes \([0-9.]+ (?:MiB|GiB)\) available"


def test_snapshot_rows_beyond_host_memory_fail_startup_naming_the_size(tiny_served):
    line = _fails(tiny_served.core, "--snapshots", "99999999999999999999")
    m = re.fullmatch(r"helios-serve: error: --snapshots 99999999999999999999: snapshot storage "
                     r"\(99999999999999999999 rows\) needs (\d+) bytes \([0-9.]+ GiB\) but "
                     rf"host memory has {_AVAILABLE}", line)
    assert m, line
    asked, available = map(int, m.groups())
    assert asked % 99999999999999999999 == 0 and asked > available > 0


def test_a_host_tier_beyond_host_memory_fails_startup_naming_the_size(tiny_served):
    line = _fails(tiny_served.core, "--host-cache-bytes", "100TiB")
    m = re.fullmatch(r"helios-serve: error: --host-cache-bytes 100TiB: the host tier "
                     r"\((\d+) rows\) needs (\d+) bytes \([0-9.]+ GiB\) but host memory has "
                     rf"{_AVAILABLE} after (\d+) bytes \([0-9.]+ [KM]iB\) for snapshot storage", line)
    assert m, line
    rows, host, available, snapshots = map(int, m.groups())
    assert host % rows == 0 and 100 * 2**40 - host < host // 1000
    assert host + snapshots > available > 0 and snapshots > 0


def _choice(snapshot_rows: int, host_rows: int, snapshots: int | None = None) -> TierChoice:
    option = (f"--snapshots {snapshots}" if snapshots is not None
              else f"the core's prepared_snapshots {snapshot_rows}")
    return TierChoice(TierRows(), snapshot_rows, host_rows, host_row_bytes=1024, page_bytes=64,
                      routes={}, snapshot_row_bytes=512, snapshot_option=option,
                      host_option=f"--host-cache-bytes {host_rows * 1024}")


def test_tiers_that_fit_alone_but_not_together_name_the_host_tier():
    """100 snapshot rows (51200 B) fit in 60000 B, and so do 50 host rows (51200 B), but
    not both: the host tier is the one refused, with both sizes and what is available."""
    with pytest.raises(CacheSizingError) as info:
        check_fits(_choice(100, 50, 100).host_asks("cpu"), memory=HOST_MEMORY, available=60000)
    assert str(info.value) == ("--host-cache-bytes 51200: the host tier (50 rows) needs 51200 "
                               "bytes (50.0 KiB) but host memory has 8800 bytes (8.6 KiB) "
                               "available after 51200 bytes (50.0 KiB) for snapshot storage")
    # on cuda the continuation rows are device memory: only the (pinned) host tier counts
    assert _choice(100, 50, 100).host_asks("cuda") == [
        MemoryAsk("--host-cache-bytes 51200", "the host tier", 51200, "50 rows")]
    check_fits(_choice(100, 50, 100).host_asks("cuda"), memory=HOST_MEMORY, available=60000)


def test_the_cores_prepared_snapshot_rows_are_named_when_they_do_not_fit():
    with pytest.raises(CacheSizingError) as info:
        check_fits(_choice(100, 0).host_asks("cpu"), memory=HOST_MEMORY, available=1000)
    assert str(info.value) == ("the core's prepared_snapshots 100: snapshot storage (100 rows) "
                               "needs 51200 bytes (50.0 KiB) but host memory has 1000 bytes "
                               "(1000 B) available")


def test_the_host_tier_is_called_pinned_only_on_cuda():
    assert "(2.0 KiB host memory)" in _choice(0, 2).describe("cpu")
    assert "(2.0 KiB pinned)" in _choice(0, 2).describe("cuda")


def test_host_available_bytes_is_positive_and_at_most_physical_memory():
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < host_available_bytes() <= physical
