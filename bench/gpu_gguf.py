"""GPU benchmark: Llama-3.1-8B geometry decode, bf16 weights against the repacked GGUF
forms a ``--weight-dtype gguf`` core for a GPU target stores (docs/gguf-cuda.md), seeded
random codes, one process, one card: the sibling of bench/gpu_int4.py (gpu_fp8's
`compare`, the same measurement and JSON).

Formats (each the storage of a GGUF block type, every product matrix in it):

- ``q4_1``: INT4_MIN, 4-bit codes in groups of 32 with f32 scale and minimum (GGUF Q4_1,
  and Q4_K, whose repacked form is the same);
- ``q4_0``: INT4, groups of 32 with f32 scale and zero point (GGUF Q4_0);
- ``q8_0``: INT8, int8 codes in groups of 32 with f32 scales (GGUF Q8_0 and Q5_0);
- ``q6_k``: INT8 in groups of 16 (GGUF Q6_K).

    python bench/gpu_gguf.py --json OUT.json                   # bf16 q4_1 q8_0, b 1 8 64
    python bench/gpu_gguf.py --formats bf16 q4_0 q6_k --json OUT.json

The embedding of an INT8 format is INT8 too (``embedding_int8``, as a Q8_0 embedding
repacks); the LM head stays bf16 (the export never repacks the ``lm_head`` buffer, though
a published Q4_K_M file stores it as Q6_K). The capture has the packed bf16 path off (as
the export does for a repacked core); the bf16 core is captured the default way.
Writes JSON with the commit and the card.
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
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.capture.buffers import weight_resource_id
from helios_ignition.capture.programs import capture
from helios_ignition.export import build_contract
from helios_ignition.families.llama import LlamaShapes
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.quantize import (
    STORAGE_FORMS,
    apply_storage,
    packed_path_off,
    repacked_weights,
)
from helios_ignition.recipe import Capacities

BATCHES = (1, 8, 64)
# Format -> (storage type, group elements).
FORMATS = {"q4_1": (mpb.STORAGE_TYPE_INT4_MIN, 32), "q4_0": (mpb.STORAGE_TYPE_INT4, 32),
           "q8_0": (mpb.STORAGE_TYPE_INT8, 32), "q6_k": (mpb.STORAGE_TYPE_INT8, 16)}


def repacked_core(fmt: str):
    storage_type, group = FORMATS[fmt]

    def build(recipe, ckpt, caps: Capacities, target: str, bf16: dict
              ) -> tuple[MemoryCore, dict]:
        """The `fmt` core of `recipe` over `bf16`'s plain weights (LM head, norms) and
        seeded random codes with group scales (and zero points / minimums)."""
        recipe = replace(recipe, capacities=caps)  # as gpu_common.build_core does
        shapes = LlamaShapes.from_geometry(ckpt.geometry)
        t0 = time.perf_counter()
        with packed_path_off():
            manifest, graphs = capture(shapes, caps, recipe.weight_dtype,
                                       chunked_sampling=recipe.chunked_sampling)
        matrices = {b.name: (storage_type, group) for b in manifest.buffers
                    if b.role == mpb.BUFFER_ROLE_WEIGHT and len(b.shape) == 2
                    and int(b.shape[1]) % group == 0}
        chosen = repacked_weights(manifest, matrices)
        apply_storage(manifest, chosen)
        t1 = time.perf_counter()
        blobs = compile_targets(manifest, (target,))
        t2 = time.perf_counter()
        rng = np.random.default_rng(1)
        pool_n = 1 << 26
        pool = rng.integers(0, 256, 2 * pool_n, dtype=np.uint8)
        decls = {b.name: b for b in manifest.buffers}
        resources = dict(bf16)
        suffixes = STORAGE_FORMS[storage_type][1]
        for name in chosen:
            n = stored_nbytes(decls[name])
            off = int(hashlib.sha256(name.encode()).hexdigest(), 16) % pool_n

            def make(n=n, off=off):
                return (pool[off:off + n].tobytes() if n <= pool_n
                        else np.resize(pool, n).tobytes())

            resources[weight_resource_id(name)] = make
            shape = tuple(int(s) for s in decls[name + suffixes[0]].shape)
            bits_scale = 8 if storage_type != mpb.STORAGE_TYPE_INT8 else 64
            scale = (0.02 / bits_scale * (1 + 0.1 * rng.random(shape))).astype(np.float32)
            resources[weight_resource_id(name + suffixes[0])] = scale.tobytes()
            if len(suffixes) > 1:  # zero points (6..9) or minimums (about -8 scales)
                third = (rng.integers(6, 10, shape).astype(np.float32)
                         if storage_type == mpb.STORAGE_TYPE_INT4 else -8 * scale)
                resources[weight_resource_id(name + suffixes[1])] = third.tobytes()
        contract = build_contract(recipe, ckpt, shapes, graphs, manifest)
        resources.update(blobs)
        info = {"capture_s": t1 - t0, "compile_s": t2 - t1, "kernels": len(manifest.kernels),
                "storage": mpb.StorageType.Name(storage_type), "group": group,
                "repacked_matrices": len(chosen)}
        return MemoryCore(contract, manifest, resources), info

    return build


def main() -> None:
    compare("gguf", {fmt: repacked_core(fmt) for fmt in FORMATS}, batches=BATCHES,
            defaults=("bf16", "q4_1", "q8_0"))


if __name__ == "__main__":
    main()
