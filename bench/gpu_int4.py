"""GPU benchmark: Llama-3.1-8B geometry decode, bf16 weights against INT4 W4A16 weights
(``ignition export --quantize int4``: packed 4-bit codes, group 128, f32 scales and zero
points; f32 activations), seeded random weights, one process, one card. The sibling of
bench/gpu_fp8.py: its `compare` (the same measurement and JSON) over this core.

    python bench/gpu_int4.py --json OUT.json                 # batches 1 8 64 256
    python bench/gpu_int4.py --batches 1 8 --steps 20 --json OUT.json
    python bench/gpu_int4.py --variant v1 INT4_ROWS=v1 INT4_TILE=v1 --json OUT.json

Each format's core is built in memory (capture, AOT compile for the device's target,
weights), loaded on the cuda backend, timed with gpu_common.decode_bench (greedy, median
step through NativeModel, and the device time of back-to-back graph replays) at each
batch, then released before the next format loads. The INT4 core's embedding and LM head
stay bf16 (as the export keeps them), and its capture has the packed bf16 path off (as
the export does), so the bf16 core here is captured the default way (packed path on) —
the baseline a bf16 export serves with. Roofline: the weight bytes one decode step reads
over the measured device copy bandwidth (the issue's W4A16 batch-1 target: 2.8x bf16).
``--variant NAME ATTR=VALUE ...`` adds the INT4 core captured with those launch knobs
(``INT4_ROWS``, ``INT4_TILE``: the older forms, or other tiles). Writes JSON with the
commit and the card.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import MemoryCore
from gpu_fp8 import compare
from helios_contract import stored_nbytes
from helios_ignition.capture.buffers import weight_resource_id
from helios_ignition.capture.programs import capture
from helios_ignition.export import build_contract
from helios_ignition.families.llama import LlamaShapes
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.quantize import (
    SCALE_SUFFIX,
    ZERO_SUFFIX,
    apply_quantize,
    packed_path_off,
    quantized_weights,
)
from helios_ignition.recipe import Capacities

BATCHES = (1, 8, 64, 256)


def int4_core(recipe, ckpt, caps: Capacities, target: str, bf16: dict
              ) -> tuple[MemoryCore, dict]:
    """The INT4 core of `recipe` over `bf16`'s plain weights (embedding, LM head, norms)
    and seeded random packed codes with group scales and zero points for the products."""
    recipe = replace(recipe, capacities=caps)  # as gpu_common.build_core does
    shapes = LlamaShapes.from_geometry(ckpt.geometry)
    t0 = time.perf_counter()
    with packed_path_off():
        manifest, graphs = capture(shapes, caps, recipe.weight_dtype,
                                   chunked_sampling=recipe.chunked_sampling)
    names = quantized_weights(manifest, "int4")
    apply_quantize(manifest, names, "int4")
    t1 = time.perf_counter()
    blobs = compile_targets(manifest, (target,))
    t2 = time.perf_counter()
    rng = np.random.default_rng(1)
    pool_n = 1 << 26
    pool = rng.integers(0, 256, 2 * pool_n, dtype=np.uint8)  # every byte is two codes
    decls = {b.name: b for b in manifest.buffers}
    resources = dict(bf16)
    for name in names:
        n = stored_nbytes(decls[name])
        off = int(hashlib.sha256(name.encode()).hexdigest(), 16) % pool_n

        def make(n=n, off=off):
            return pool[off:off + n].tobytes() if n <= pool_n else np.resize(pool, n).tobytes()

        resources[weight_resource_id(name)] = make
        shape = tuple(int(s) for s in decls[name + SCALE_SUFFIX].shape)
        scale = (0.02 / 8 * (1 + 0.1 * rng.random(shape))).astype(np.float32)
        resources[weight_resource_id(name + SCALE_SUFFIX)] = scale.tobytes()
        zero = rng.integers(6, 10, shape).astype(np.float32)
        resources[weight_resource_id(name + ZERO_SUFFIX)] = zero.tobytes()
    contract = build_contract(recipe, ckpt, shapes, graphs, manifest)
    resources.update(blobs)
    info = {"capture_s": t1 - t0, "compile_s": t2 - t1, "kernels": len(manifest.kernels),
            "int4_matrices": len(names)}
    return MemoryCore(contract, manifest, resources), info


def main() -> None:
    compare("int4", int4_core, batches=BATCHES)


if __name__ == "__main__":
    main()
