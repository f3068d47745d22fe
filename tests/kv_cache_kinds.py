"""The two stored KV caches the tests run side by side (docs/kv-cache.md):
``--kv-cache-dtype fp8`` (e4m3 codes, one byte an element: ``Buffer.storage`` on an f32
plane, one scale per kv head) and ``bf16`` (the plane's own dtype, two bytes an element,
no storage). ``with_kv_cache`` applies one to a tiny core as ``ignition export`` does
(helios_ignition.kv_cache); ``Kind`` holds what the kernel, contract and runtime tests
expect of each, so a check both kinds share is written once, parametrized with
``each_kind``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.capture.buffers import weight_resource_id
from helios_ignition.kv_cache import apply_kv_bf16, apply_kv_fp8, bf16_planes, fp8_planes
from helios_ignition.testing import TINY_CAPACITIES, TinyCore
from helios_tools.kernels.kv_bf16 import KV_BF16_FORMS, Bf16Plane, decode_bf16, encode_bf16
from helios_tools.kernels.kv_fp8 import KV_FP8_FORMS, E4m3Plane, dequantize_kv, quantize_kv

# The tiny core with both tiers (continuation snapshots and the host tier), so every plane
# has its two tier planes stored as itself.
TIER_CAPS = dataclasses.replace(TINY_CAPACITIES, prepared_snapshots=8, host_tier=True,
                                transfer_rows=4)


@dataclasses.dataclass(frozen=True, eq=False)  # compared by identity: it holds dicts
class Kind:
    """One stored KV cache, as the tests see it.

    Attributes:
        name: the ``--kv-cache-dtype`` value.
        forms: f32 op -> its form over this kind's planes (helios_tools.kernels).
        element_bytes: stored bytes per cache element (f32: 4).
        held: the NumPy dtype of a plane's stored elements (e4m3 codes, bf16 bits), as
            the references take them and the cpu backend holds them.
        param_dtype: a plane parameter's dtype in the forms' ``kernel_params``.
        scaled: the forms take ``[KVH]`` f32 k and v scales right after the planes.
        encode: ``(x [..., KVH, HD] f32, scale [KVH] or None)`` -> ``held`` elements.
        decode: ``(held elements, scale)`` -> the f32 values the readers see.
        plane: ``(held [P, PT, KVH, HD], scale)`` -> the read-only view the references
            index.
        read: the dtype of ``read_buffer`` on a plane (bf16 widened, e4m3 codes as held).
        type_name: how ``runtime.storage`` names the cache a backend lacks.
        declared: a stored plane's ``(dtype, HasField("storage"))``.
        field: the plane's field that declares the kind (where a finding points).
        elements: how ``runtime.storage`` names what the kind's forms read.
        bare: the capability fields that, emptied, leave a backend without the kind.
        planes: the planes the export would store (helios_ignition.kv_cache).
    """

    name: str
    forms: Mapping[str, str]
    element_bytes: int
    held: type
    param_dtype: str
    scaled: bool
    encode: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
    decode: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
    plane: Callable[[np.ndarray, np.ndarray | None], object]
    read: type
    type_name: str
    declared: tuple[int, bool]
    field: str
    elements: str
    bare: Mapping[str, Mapping]
    planes: Callable[[mpb.ExecutionManifest], list[str]]

    def __str__(self) -> str:  # the test ids
        return self.name

    def store(self, x: np.ndarray) -> np.ndarray:
        """f32 ``[..., KVH, HD]`` elements as the kind stores them at scale 1.0 (fp8's
        scale when not calibrated): a ``held`` array of the same shape."""
        return self.encode(x, np.ones(x.shape[-2], np.float32))

    def stores(self, buffer: mpb.Buffer) -> bool:
        """Whether `buffer` is declared as one of this kind's planes."""
        return (buffer.dtype, buffer.HasField("storage")) == self.declared


FP8 = Kind(name="fp8", forms=KV_FP8_FORMS, element_bytes=1, held=np.uint8,
           param_dtype="u8", scaled=True, encode=quantize_kv, decode=dequantize_kv,
           plane=E4m3Plane, read=np.uint8, type_name="STORAGE_TYPE_FP8_E4M3",
           declared=(mpb.D_TYPE_F32, True), field="storage.type", elements="e4m3 codes",
           bare={"cache_storage_forms": {}, "cache_storage_args": {}}, planes=fp8_planes)
BF16 = Kind(name="bf16", forms=KV_BF16_FORMS, element_bytes=2, held=np.uint16,
            param_dtype="bf16", scaled=False, encode=lambda x, _: encode_bf16(x),
            decode=lambda bits, _: decode_bf16(bits), plane=lambda bits, _: Bf16Plane(bits),
            read=np.float32, type_name="D_TYPE_BF16", declared=(mpb.D_TYPE_BF16, False),
            field="dtype", elements="bf16 elements", bare={"cache_dtype_forms": {}},
            planes=bf16_planes)
KINDS = (FP8, BF16)
each_kind = pytest.mark.parametrize("kind", KINDS, ids=str)


def with_kv_cache(core: TinyCore, kind: Kind) -> TinyCore:
    """`core` (in place) with its KV cache stored as `kind`, as ``ignition export
    --kv-cache-dtype`` stores it: fp8 with every scale 1.0 (its scale weights added to
    ``core.weights``), bf16 with the RESTORE programs' state views in bf16 rows."""
    if kind is FP8:
        scales = apply_kv_fp8(core.manifest)
        core.weights.update({weight_resource_id(n): v for n, v in scales.items()})
    else:
        apply_kv_bf16(core.manifest, core.contract.model.graphs)
    return core
