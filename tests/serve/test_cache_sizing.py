"""The physical KV cache is sized after loading and replaces the prepared count everywhere:
admission, /metrics helios_cache_pages_capacity and the startup log."""

from __future__ import annotations

import re

import httpx
import pytest
from helios_serve.config import parse_bytes
from helios_serve.runtime import cache_sizing
from helios_serve.runtime.cache_sizing import (
    DEVICE_MEMORY,
    HOST_MEMORY,
    CacheSizing,
    CacheSizingError,
    MemoryAsk,
    check_fits,
)

from tests.tiny_model import NAMESPACE, SERVED_ID, ServeProcess, prompt_ids, serve_fails

# The tiny model: 2 layers x (K, V) planes x 16 tokens x 2 kv heads x head dim 8 x 4 bytes.
PAGE_BYTES = 2 * 2 * 16 * 2 * 8 * 4
PAGE_TOKENS = 16


def test_one_way_to_size_the_cache():
    for kwargs, names in (({"num_pages": 8, "memory_bytes": 10}, "--num-pages and "
                           "--kv-cache-memory"),
                          ({"memory_bytes": 10, "fraction": 0.5}, "--kv-cache-memory and "
                           "--kv-cache-fraction")):
        with pytest.raises(CacheSizingError) as info:
            CacheSizing(**kwargs)
        assert str(info.value) == f"{names} are exclusive: choose one way to size the KV cache"
    for kwargs, why in (({"num_pages": 0}, "--num-pages must be at least 1, got 0"),
                        ({"memory_bytes": 0}, "--kv-cache-memory must be positive, got 0"),
                        ({"fraction": 1.5}, "--kv-cache-fraction must be in (0, 1], got 1.5"),
                        ({"fraction": 0.0}, "--kv-cache-fraction must be in (0, 1], got 0.0")):
        with pytest.raises(CacheSizingError, match=re.escape(why)):
            CacheSizing(**kwargs)


def test_each_way_chooses_its_page_count(monkeypatch):
    def choose(sizing, backend="cpu", free=None):
        return sizing.choose(backend=backend, page_bytes=1000, prepared_pages=32,
                             free_bytes=free)

    assert choose(CacheSizing()).num_pages == 32  # cpu default: the prepared count
    assert choose(CacheSizing(num_pages=7)).num_pages == 7
    assert choose(CacheSizing(memory_bytes=10_999)).num_pages == 10
    assert choose(CacheSizing(), "cuda", free=100_000).num_pages == 90  # 0.9 of free
    assert choose(CacheSizing(fraction=0.25), "cuda", free=100_000).num_pages == 25
    monkeypatch.setattr(cache_sizing, "host_available_bytes", lambda: 40_000)
    choice = choose(CacheSizing(fraction=0.5))
    assert (choice.num_pages, choice.prepared_pages, choice.nbytes) == (20, 32, 20_000)
    assert choice.describe() == ("20 pages (prepared 32), 19.5 KiB (--kv-cache-fraction 0.5 of "
                                 "39.1 KiB of available host memory)")
    with pytest.raises(CacheSizingError) as info:
        choose(CacheSizing(memory_bytes=999))
    assert str(info.value) == ("the KV cache budget (--kv-cache-memory 999: 999 B) holds no "
                               "page; one page of every cache plane needs 1000 B")


def test_a_cpu_cache_larger_than_the_available_host_memory_fails_before_allocation(
        monkeypatch):
    monkeypatch.setattr(cache_sizing, "host_available_bytes", lambda: 50 * 2**20)

    def choose(sizing, reserved=0):
        tiers = [MemoryAsk("--snapshots / --host-cache-bytes", "the cache tiers", reserved)]
        return sizing.choose(backend="cpu", page_bytes=2**20, prepared_pages=32,
                             reserved=tiers)

    assert choose(CacheSizing(num_pages=50)).num_pages == 50  # exactly fits
    with pytest.raises(CacheSizingError) as info:
        choose(CacheSizing(num_pages=51))
    assert str(info.value) == ("--num-pages 51: the KV cache (51 pages) needs 53477376 bytes "
                               "(51.0 MiB) but host memory has 52428800 bytes (50.0 MiB) "
                               "available")
    with pytest.raises(CacheSizingError) as info:
        choose(CacheSizing(memory_bytes=2**40))
    assert str(info.value) == ("--kv-cache-memory 1099511627776: the KV cache (1048576 pages) "
                               "needs 1099511627776 bytes (1024.00 GiB) but host memory has "
                               "52428800 bytes (50.0 MiB) available")
    with pytest.raises(CacheSizingError) as info:  # the tier rows are counted first
        choose(CacheSizing(), reserved=20 * 2**20)
    assert str(info.value) == ("the core's prepared pages: the KV cache (32 pages) needs "
                               "33554432 bytes (32.0 MiB) but host memory has 31457280 bytes "
                               "(30.0 MiB) available after 20971520 bytes (20.0 MiB) for the cache tiers")
    with pytest.raises(CacheSizingError) as info:  # tier rows beyond it are named first
        choose(CacheSizing(num_pages=1), reserved=60 * 2**20)
    assert str(info.value) == ("--snapshots / --host-cache-bytes: the cache tiers needs "
                               "62914560 bytes (60.0 MiB) but host memory has 52428800 bytes "
                               "(50.0 MiB) available")
    # a fraction is of what the tier rows leave: 0.5 of 30 MiB
    assert choose(CacheSizing(fraction=0.5), reserved=20 * 2**20).num_pages == 15
    with pytest.raises(CacheSizingError) as info:  # tier rows beyond it, whatever the way
        choose(CacheSizing(fraction=1.0), reserved=60 * 2**20)
    assert str(info.value).startswith("--snapshots / --host-cache-bytes: the cache tiers needs")


def test_a_cuda_cache_is_checked_against_the_free_device_memory_after_the_scratch():
    def choose(sizing, free, scratch=0):
        return sizing.choose(backend="cuda", page_bytes=2**20, prepared_pages=32,
                             free_bytes=free,
                             reserved=[MemoryAsk("the core", "kernel scratch", scratch)])

    assert choose(CacheSizing(num_pages=51), 51 * 2**20).num_pages == 51
    with pytest.raises(CacheSizingError) as info:
        choose(CacheSizing(num_pages=51), 51 * 2**20, scratch=1)
    assert str(info.value) == ("--num-pages 51: the KV cache (51 pages) needs 53477376 bytes "
                               "(51.0 MiB) but free device memory has 53477375 bytes (51.0 MiB)"
                               " available after 1 bytes (1 B) for kernel scratch")
    # the cuda default (0.9) and a fraction are of the free memory less the scratch
    assert choose(CacheSizing(), 100 * 2**20, scratch=10 * 2**20).num_pages == 81
    assert choose(CacheSizing(fraction=0.5), 100 * 2**20, scratch=10 * 2**20).num_pages == 45
    with pytest.raises(CacheSizingError) as info:
        choose(CacheSizing(memory_bytes=2**30), 2**29)
    assert str(info.value) == ("--kv-cache-memory 1073741824: the KV cache (1024 pages) needs "
                               "1073741824 bytes (1.00 GiB) but free device memory has "
                               "536870912 bytes (512.0 MiB) available")
    with pytest.raises(ValueError, match="the cuda backend passes its free device memory"):
        CacheSizing().choose(backend="cuda", page_bytes=1, prepared_pages=1)


def test_a_fixed_cache_size_is_known_before_loading():
    """What the cuda backend checks with every other allocation before making any."""
    def ask(sizing, backend="cuda"):
        return sizing.fixed_ask(backend=backend, page_bytes=1000, prepared_pages=32)

    assert ask(CacheSizing(num_pages=7)) == MemoryAsk("--num-pages 7", "the KV cache", 7000,
                                                      "7 pages")
    assert ask(CacheSizing(memory_bytes=10_999)) == MemoryAsk(
        "--kv-cache-memory 10999", "the KV cache", 10_000, "10 pages")
    assert ask(CacheSizing(), "cpu") == MemoryAsk("the core's prepared pages", "the KV cache",
                                                  32_000, "32 pages")
    assert ask(CacheSizing()) is None  # the cuda default: 0.9 of what is left once loaded
    assert ask(CacheSizing(fraction=0.5)) is None
    with pytest.raises(CacheSizingError, match=re.escape(
            "the KV cache budget (--kv-cache-memory 999: 999 B) holds no page")):
        ask(CacheSizing(memory_bytes=999))


def test_check_fits_names_the_first_ask_that_does_not_fit_and_what_took_the_rest():
    model = MemoryAsk("the core", "the model", 600, "weights and other buffers")
    scratch = MemoryAsk("the core", "kernel scratch", 0)
    snapshots = MemoryAsk("--snapshots 100", "snapshot storage", 300, "100 rows")
    pages = MemoryAsk("--num-pages 10", "the KV cache", 200, "10 pages")
    check_fits([model, scratch, snapshots, pages], memory=DEVICE_MEMORY, available=1100)
    check_fits([], memory=HOST_MEMORY, available=0)
    cases = [
        ([model, scratch, snapshots, pages], 1099,
         "--num-pages 10: the KV cache (10 pages) needs 200 bytes (200 B) but free device "
         "memory has 199 bytes (199 B) available after 600 bytes (600 B) for the model and 300 "
         "bytes (300 B) for snapshot storage"),
        ([model, scratch, snapshots, pages], 899,
         "--snapshots 100: snapshot storage (100 rows) needs 300 bytes (300 B) but free "
         "device memory has 299 bytes (299 B) available after 600 bytes (600 B) for the model"),
        ([model, snapshots], 10,
         "the core: the model (weights and other buffers) needs 600 bytes (600 B) but free "
         "device memory has 10 bytes (10 B) available"),
        ([MemoryAsk("the core", "kernel scratch", 3 * 2**30)], 2**31,
         "the core: kernel scratch needs 3221225472 bytes (3.00 GiB) but free device memory "
         "has 2147483648 bytes (2.00 GiB) available"),
    ]
    for asks, available, line in cases:
        with pytest.raises(CacheSizingError) as info:
            check_fits(asks, memory=DEVICE_MEMORY, available=available)
        assert str(info.value) == line
    with pytest.raises(CacheSizingError) as info:
        check_fits([pages], memory=HOST_MEMORY, available=0)
    assert str(info.value) == ("--num-pages 10: the KV cache (10 pages) needs 200 bytes "
                               "(200 B) but host memory has 0 bytes (0 B) available")


def test_byte_counts():
    assert parse_bytes("20480") == 20480
    assert parse_bytes("20KiB") == parse_bytes("20k") == 20 * 1024
    assert parse_bytes("1.5GiB") == 3 * 2**29 and parse_bytes("2GB") == 2 * 10**9
    # what the startup lines print (config.format_bytes) is accepted back
    assert parse_bytes("1B") == parse_bytes("1 b") == 1 and parse_bytes("100 B") == 100
    assert parse_bytes("720.0 KiB") == 720 * 1024 and parse_bytes("1.00 GiB") == 2**30
    for bad in ("", "abc", "12XB", "-5", "0", "B", "1BB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def _serve(core, *options) -> ServeProcess:
    return ServeProcess(core.path, "--trust", core.public_key, "--accept", NAMESPACE, *options)


def _chat(url: str, max_tokens: int) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": SERVED_ID, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": "Hello"}]})


@pytest.mark.parametrize(("option", "pages"), [(("--num-pages", "8"), 8),
                                               (("--kv-cache-memory", "20KiB"), 5)])
def test_admission_the_gauge_and_the_log_follow_the_chosen_count(tiny_served, option, pages):
    prompt = len(prompt_ids("Hello"))
    fits = pages * PAGE_TOKENS - prompt  # the largest output limit the cache holds
    with _serve(tiny_served.core, *option) as served:
        metrics = httpx.get(served.url + "/metrics", timeout=30).text
        assert f"\nhelios_cache_pages_capacity {float(pages)}\n" in metrics
        assert _chat(served.url, fits).status_code == 200
        over = _chat(served.url, fits + 1)
        assert over.status_code == 503, over.text
        assert over.json()["error"]["message"] == (
            f"prompt is too long: {prompt + fits + 1} tokens need {pages + 1} pages; the "
            f"cache has {pages}")
    how = "--num-pages" if option[0] == "--num-pages" else "--kv-cache-memory 20KiB"
    line = next(x for x in served.stderr_lines if x.startswith("helios-serve: cache sizing"))
    size = {8: "32.0 KiB", 5: "20.0 KiB"}[pages]  # PAGE_BYTES = 4 KiB
    assert line.endswith(f" s  {pages} pages (prepared 2048), {size} ({how})"), line


def _fails(*args) -> str:
    return serve_fails("--port", "0", *args)


def test_conflicting_or_impossible_sizes_are_one_line(tiny_served, tmp_path):
    core = tiny_served.core
    trust = ("--trust", core.public_key, "--accept", NAMESPACE, "--port", "0")
    assert _fails(tmp_path / "absent.core", *trust, "--num-pages", "8", "--kv-cache-fraction",
                  "0.5") == ("helios-serve: error: --num-pages and --kv-cache-fraction are "
                             "exclusive: choose one way to size the KV cache")
    assert _fails(core.path, *trust, "--kv-cache-memory", "lots") == (
        "helios-serve: error: --kv-cache-memory: 'lots' is not a byte count (an integer, "
        "optionally with B, K, M, G, T, KiB..TiB or KB..TB)")
    assert _fails(core.path, *trust, "--kv-cache-memory", "4000") == (
        "helios-serve: error: the KV cache budget (--kv-cache-memory 4000: 3.9 KiB) holds no "
        "page; one page of every cache plane needs 4.0 KiB")
    # A budget beyond the host's memory fails at startup, not by the OOM killer later.
    pages = 2**46 // PAGE_BYTES
    line = _fails(core.path, *trust, "--kv-cache-memory", "64TiB")
    m = re.fullmatch(
        re.escape(f"helios-serve: error: --kv-cache-memory 64TiB: the KV cache ({pages} "
                  f"pages) needs {pages * PAGE_BYTES} bytes (65536.00 GiB) but host memory "
                  "has ") + r"(\d+) bytes \([0-9.]+ (MiB|GiB)\) available( after \d+ bytes "
        r"\([0-9.]+ [KMG]?i?B\) for the cache tiers)?", line)
    assert m and 0 < int(m.group(1)) < pages * PAGE_BYTES, line


@pytest.mark.parametrize(("sizing", "message"), [
    (CacheSizing(memory_bytes=1000), "the KV cache budget (--kv-cache-memory 1000: 1000 B) "
     "holds no page; one page of every cache plane needs"),
    (CacheSizing(num_pages=2**40), "--num-pages 1099511627776: the KV cache (1099511627776 "
     "pages) needs"),
])  # fmt: skip
def test_a_cache_the_options_size_fails_on_cpu_before_any_weight_is_read(sizing, message):
    """An operator's wrong --kv-cache-memory or --num-pages fails in a second: the cpu
    backend checks the cache it fixes before it reads the weights (tester2, 2026-12-02:
    the message came after the load)."""
    from helios_ignition.testing import tiny_core
    from helios_serve.runtime.cpu_backend import CpuBackend

    core = tiny_core()
    read = []
    with pytest.raises(CacheSizingError) as info:
        CpuBackend(core.manifest, lambda rid: read.append(rid) or core.read_resource(rid),
                   sizing)
    assert str(info.value).startswith(message), info.value
    assert read == []
    backend = CpuBackend(core.manifest, lambda rid: read.append(rid) or core.read_resource(rid),
                         CacheSizing(num_pages=3))
    assert backend.cache.num_pages == 3 and read  # the same core loads with a cache that fits
