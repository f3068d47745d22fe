"""Verified core read throughput against plain zstandard decompression of the same frame.

Writes a payload core holding one 256 MiB resource of realistic weights (bf16 bit patterns
of seeded normal floats; zstd level 3 stores them at about 1.3x), then, in the same run:

    plain one-shot   ZstdDecompressor().decompress(frame) on the frame bytes in memory
    plain stream     stream_reader over the frame, 4 MiB pieces
    verified stream  Core.iter_resource (chunk SHA-256 before decoding, frame-structure
                     walk, 8 MiB window cap, length checks), 4 MiB pieces
    verified whole   Core.read_resource

Throughput is decoded MB/s (1e6 bytes), best of --repeat runs. The ratio is verified stream
over plain one-shot (target >= 0.8). Peak memory is tracemalloc's peak of Python-heap
allocations during one read (the mapped file is page cache, not counted): streaming must
stay bounded by the chunk size, not the resource size. CPU seconds count every thread (the
SHA-256 of chunk i+1 runs on a worker while chunk i decodes), so on a loaded machine the
wall-clock ratio falls toward plain CPU time over verified CPU time.

Run: `cd /work/main && uv run python bench/core_read.py [--mib 256] [--repeat 3]`
-> prints a table and writes bench/out/core_read.json. Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import zstandard
from _report import write_json  # bench/ is this script's folder
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helios_contract.schema import core_pb2
from helios_tools.core import CHUNK_NBYTES, CoreWriter, open_core
from helios_tools.core.sample import sample_contract, sample_manifest

OUT = Path(__file__).resolve().parent / "out" / "core_read.json"
PIECE = 4 << 20


def bf16_weights(total: int, seed: int = 0) -> Iterator[bytes]:
    """`total` bytes of bf16 bit patterns of N(0, 0.02) floats, in 16 MiB pieces."""
    rng = np.random.default_rng(seed)
    piece = 16 << 20
    for start in range(0, total, piece):
        n = min(piece, total - start) // 2
        f32 = (rng.standard_normal(n, dtype=np.float32) * 0.02).view(np.uint32)
        yield (f32 >> 16).astype(np.uint16).tobytes()


def best(fn: Callable[[], int], repeat: int) -> tuple[float, float, int]:
    """(best wall seconds, CPU seconds of all threads in that run, decoded bytes)."""
    runs, n = [], 0
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        n = fn()
        runs.append((time.perf_counter() - t, time.process_time() - c))
    wall, cpu = min(runs)
    return wall, cpu, n


def peak_bytes(fn: Callable[[], int]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="resource size in MiB")
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    total = opts.mib << 20
    key = Ed25519PrivateKey.from_private_bytes(bytes(32))

    with tempfile.TemporaryDirectory(dir=OUT.parent.parent) as tmp:
        path = Path(tmp) / "bench.core"
        t = time.perf_counter()
        with CoreWriter(path, key, None, "bench.example") as w:
            res = w.add_resource("weights", core_pb2.RESOURCE_KIND_WEIGHTS,
                                 bf16_weights(total), decoded_nbytes=total)
            w.finish(sample_contract(), sample_manifest())
        write_s = time.perf_counter() - t

        with open_core(path, [key.public_key()]) as core:
            offset, length = core.locations["weights"]
            with open(path, "rb") as f:
                f.seek(offset)
                frame = f.read(length)

            def plain_oneshot() -> int:
                return len(zstandard.ZstdDecompressor().decompress(frame))

            def plain_stream() -> int:
                reader = zstandard.ZstdDecompressor().stream_reader(frame)
                n = 0
                while piece := reader.read(PIECE):
                    n += len(piece)
                return n

            def verified_stream() -> int:
                return sum(len(p) for p in core.iter_resource("weights", chunk=PIECE))

            def verified_whole() -> int:
                return len(core.read_resource("weights"))

            runs = {}
            for name, fn in (("plain one-shot", plain_oneshot), ("plain stream", plain_stream),
                             ("verified stream", verified_stream),
                             ("verified whole", verified_whole)):
                fn()  # warm the page cache and the code paths
                seconds, cpu_seconds, n = best(fn, opts.repeat)
                assert n == total, (name, n)
                runs[name] = {"seconds": seconds, "cpu_seconds": cpu_seconds,
                              "decoded_mb_per_s": total / seconds / 1e6,
                              "peak_heap_bytes": peak_bytes(fn)}

    base = runs["plain one-shot"]["decoded_mb_per_s"]
    for r in runs.values():
        r["ratio_to_plain_oneshot"] = r["decoded_mb_per_s"] / base
    result = {
        "resource_decoded_bytes": total,
        "resource_stored_bytes": res.stored_nbytes,
        "compression_ratio": total / res.stored_nbytes,
        "chunk_nbytes": CHUNK_NBYTES,
        "chunks": len(res.chunk_sha256),
        "write_seconds": write_s,
        "runs": runs,
        "ratio_verified_stream": runs["verified stream"]["ratio_to_plain_oneshot"],
        "ratio_verified_whole": runs["verified whole"]["ratio_to_plain_oneshot"],
        "machine": {"cpus": os.cpu_count(), "loadavg_1min_at_end": os.getloadavg()[0],
                    "python": platform.python_version(),
                    "zstandard": zstandard.__version__, "platform": platform.platform()},
    }
    print(f"resource {total >> 20} MiB decoded, {res.stored_nbytes / 2**20:.1f} MiB stored "
          f"(ratio {result['compression_ratio']:.3f}), {result['chunks']} chunks; "
          f"written in {write_s:.2f} s; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'read':<18}{'MB/s':>10}{'ratio':>8}{'CPU s':>8}{'peak heap MiB':>16}")
    for name, r in runs.items():
        print(f"{name:<18}{r['decoded_mb_per_s']:>10.0f}{r['ratio_to_plain_oneshot']:>8.2f}"
              f"{r['cpu_seconds']:>8.2f}{r['peak_heap_bytes'] / 2**20:>16.1f}")
    write_json(OUT, result, indent=2)
    print(f"wrote {OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT}")


if __name__ == "__main__":
    main()
