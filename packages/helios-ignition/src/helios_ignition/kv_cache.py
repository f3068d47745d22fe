"""``ignition export --kv-cache-dtype fp8``: the KV cache stored as e4m3 codes.

After capture, every cache plane whose every reader and writer is an op with an e4m3
form (``helios_tools.kernels.kv_fp8.KV_FP8_FORMS``: the cache writes, every attention
over the paged cache, the TRANSFER programs' ``row_copy``) is declared
``STORAGE_TYPE_FP8_E4M3`` storage (Buffer.storage on the cache plane: one block per head
row, one f32 scale per kv head in the weight ``<plane>.scale``, ``[KVH]``), with its
continuation and host-tier planes (``capture.buffers.tier_plane``) stored the same way
(they move rows as bytes), and each launch becomes its op's e4m3 form with the planes'
scales after them. A plane one of whose readers has no form (the drafter's feature
plane) keeps f32, and so do its tier planes.

Scales (docs/kv-cache.md): a checkpoint's own per-layer KV scales where it carries them
(``checkpoint_kv_scales``); else, for plain float weights of a small model, the export
calibrates them (``calibrate_kv_scales``: per
kv head, amax x ``MARGIN`` / 448 over a fixed prompt's prefill); otherwise every scale
is ``DEFAULT_KV_SCALE`` (1.0, what vLLM uses for an uncalibrated fp8 cache). e4m3 is a
float format, so the scale only places the range: with 1.0 values up to 448 are kept
with 3 mantissa bits (the same relative error whatever their size) and values below
2**-6 lose precision as subnormals.

``bf16`` (``apply_kv_bf16``) declares the same planes ``D_TYPE_BF16`` (the planes'
element type, two bytes an element: no storage, no scales) and rewrites each launch into
its op's bf16 form (``helios_tools.kernels.kv_bf16.KV_BF16_FORMS``): every write rounds
its f32 keys and values to bfloat16 (nearest, ties to even), every reader widens them.

Names follow vLLM's ``--kv-cache-dtype`` (``auto`` keeps the recipe's f32 cache;
``fp8`` and ``fp8_e4m3`` are the same e4m3 cache; ``bf16`` the bfloat16 cache every
engine gives a bf16 model by default).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import kernel_params, reference_op
from helios_tools.kernels.fp8 import E4M3_MAX
from helios_tools.kernels.kv_bf16 import KV_BF16_FORMS
from helios_tools.kernels.kv_fp8 import KV_FP8_FORMS
from safetensors import safe_open

from .capture.buffers import (
    CONTINUATION,
    HOST,
    INPUT_NAMES,
    PAGE_TABLE,
    WINDOW_PAGE_TABLE,
    tier_plane,
    weight_resource_id,
)
from .checkpoint.errors import UnsupportedTensorError
from .quantize import keep_used_kernels, programs, relaunch

SCALE_SUFFIX = ".scale"

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "bf16")
DEFAULT_KV_SCALE = 1.0
# Parameters through which an op with an e4m3 form reads or writes a plane.
_PLANE_PARAMS = {"k_cache", "v_cache", "src", "dst"}


def is_fp8(kv_cache_dtype: str | None) -> bool:
    """Whether `kv_cache_dtype` (one of ``KV_CACHE_DTYPES`` or None) asks for e4m3."""
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


def describe_kv_fp8(scales: dict[str, np.ndarray], not_calibrated: str,
                    from_checkpoint: bool = False) -> str:
    """One line for the export's report: the planes stored as e4m3 and where their
    scales came from (`from_checkpoint`: the checkpoint's own; else `not_calibrated`: why
    calibration did not run, "" when it did)."""
    heads = sum(int(v.size) for v in scales.values())
    values = np.concatenate(list(scales.values()))
    if from_checkpoint:
        return (f"KV cache fp8 e4m3: {len(scales)} planes, {heads} per-head scales, the "
                f"checkpoint's own per-layer KV scales: {values.min():.3g}..{values.max():.3g}")
    if not not_calibrated:
        how = (f"calibrated at export on a {CALIBRATION_NAME}, amax x {MARGIN:g} / 448: "
               f"{values.min():.3g}..{values.max():.3g}")
    else:
        how = f"{DEFAULT_KV_SCALE:g}, the uncalibrated default as vLLM's ({not_calibrated})"
    return (f"KV cache fp8 e4m3: {len(scales)} planes, {heads} per-head scales, {how}; "
            "the checkpoint carries no KV scales")


_F32_PER_BF16 = 2  # bytes of an f32 element over a bf16 element's


def describe_kv_bf16(planes: list[str]) -> str:
    """One line for the export's report: the planes stored as bf16 (tier planes
    included)."""
    return (f"KV cache bf16: {len(planes)} cache planes of bfloat16 elements (2 bytes an "
            "element, half the f32 cache's), each write rounded to nearest even")


def fp8_planes(manifest: mpb.ExecutionManifest) -> list[str]:
    """Cache planes that take e4m3 storage, in manifest order: every launch naming the
    plane (or any of its continuation / host-tier planes) passes it as a plane parameter
    of an op with an e4m3 form."""
    return _form_planes(manifest, KV_FP8_FORMS)


def bf16_planes(manifest: mpb.ExecutionManifest) -> list[str]:
    """Cache planes that take bf16 elements (``fp8_planes``' rule with the bf16 forms:
    every launch naming the plane or its tier planes is an op with a bf16 form)."""
    return _form_planes(manifest, KV_BF16_FORMS)


def _form_planes(manifest: mpb.ExecutionManifest, forms: dict[str, str]) -> list[str]:
    """F32 cache planes every launch naming which (or one of its tier planes) passes it
    as a plane parameter of an op of `forms`, in manifest order."""
    ops = {k.id: k.reference_op for k in manifest.kernels}
    planes = {b.name for b in manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE}
    ok: dict[str, bool] = {}
    for program in programs(manifest):
        for launch in program.launches:
            op = ops[launch.kernel]
            for spec, arg in zip(kernel_params(op), launch.args, strict=True):
                name = arg.buffer.buffer if arg.WhichOneof("value") == "buffer" else None
                if name in planes:
                    ok[name] = ok.get(name, True) and op in forms \
                        and spec.name in _PLANE_PARAMS
    tiers = {p: [t for tier in (CONTINUATION, HOST) if (t := tier_plane(p, tier)) in planes]
             for p in planes}
    paired = {t for ts in tiers.values() for t in ts}
    return [b.name for b in manifest.buffers if b.name in planes and b.name not in paired
            and ok.get(b.name, False) and all(ok.get(t, True) for t in tiers[b.name])]


def apply_kv_fp8(manifest: mpb.ExecutionManifest,
                 calibrated: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Store the planes of ``fp8_planes`` (and their tier planes) as e4m3 codes and
    rewrite every launch over them into its e4m3 form (in place; unused kernel variants
    dropped).

    Args:
        calibrated: ``calibrate_kv_scales``' scales by scale name; None (or a plane it
            lacks): ``DEFAULT_KV_SCALE``.

    Returns:
        The scale weights declared: name -> ``[KVH]`` f32 values, to be written as the
        core's weight resources.

    Raises:
        ValueError: the programs read no cache plane through ops with e4m3 forms.
    """
    chosen = fp8_planes(manifest)
    if not chosen:
        raise ValueError("the programs read no KV cache plane through ops with e4m3 forms")
    decls = {b.name: b for b in manifest.buffers}
    scales: dict[str, np.ndarray] = {}
    stored: dict[str, str] = {}  # plane (tier planes too) -> its scales buffer
    for plane in chosen:
        decl = decls[plane]
        kvh, hd = int(decl.shape[-2]), int(decl.shape[-1])
        name = plane + SCALE_SUFFIX
        manifest.buffers.add(name=name, dtype=mpb.D_TYPE_F32, shape=[kvh],
                             role=mpb.BUFFER_ROLE_WEIGHT,
                             weight_resource_id=weight_resource_id(name))
        scales[name] = (calibrated[name] if calibrated and name in calibrated
                        else np.full(kvh, DEFAULT_KV_SCALE, np.float32))
        storage = mpb.TensorStorage(type=mpb.STORAGE_TYPE_FP8_E4M3, block_elements=hd,
                                    block_bytes=hd,
                                    scales=mpb.SideBuffer(buffer=name, dtype=mpb.D_TYPE_F32))
        for member in [plane, *(tier_plane(plane, t) for t in (CONTINUATION, HOST))]:
            if member in decls:
                decls[member].storage.CopyFrom(storage)
                stored[member] = name
    dtypes = {b.name: ("u8" if b.name in stored else "f32") for b in manifest.buffers}
    kernels = {k.id: k for k in manifest.kernels}
    for program in programs(manifest):
        for launch in program.launches:
            op = kernels[launch.kernel].reference_op
            names = [a.buffer.buffer if a.WhichOneof("value") == "buffer" else None
                     for a in launch.args]
            if op not in KV_FP8_FORMS or not any(n in stored for n in names):
                continue
            params = [p.name for p in kernel_params(op)]
            args = list(launch.args)
            if "v_cache" in params:  # the planes' own scales right after them
                at = params.index("v_cache") + 1
                for i, plane in enumerate((names[params.index("k_cache")], names[at - 1])):
                    side = stored[plane]
                    args.insert(at + i, mpb.Argument(buffer=mpb.BufferView(
                        buffer=side, shape=[int(scales[side].shape[0])])))
            relaunch(launch, KV_FP8_FORMS[op], args, kernels, dtypes, "f32")
    keep_used_kernels(manifest, kernels)
    return scales


def apply_kv_bf16(manifest: mpb.ExecutionManifest, graphs: Sequence[cpb.GraphContract]
                  ) -> list[str]:
    """Declare the planes of ``bf16_planes`` (and their tier planes) D_TYPE_BF16 and
    rewrite every launch over them into its bf16 form (in place; unused kernel variants
    dropped). The arguments are the f32 op's (a bf16 plane has no side buffers); byte
    offsets into a plane, in the launches' views and in `graphs`' state views (the
    RESTORE programs' row accesses), become those of 2-byte elements.

    Args:
        manifest: the captured manifest (f32 planes).
        graphs: its graph contracts, rewritten in place.

    Returns:
        Every plane declared bf16 (tier planes included), in manifest order.

    Raises:
        ValueError: the programs read no cache plane through ops with bf16 forms.
    """
    chosen = bf16_planes(manifest)
    if not chosen:
        raise ValueError("the programs read no KV cache plane through ops with bf16 forms")
    decls = {b.name: b for b in manifest.buffers}
    stored = set()
    for plane in chosen:
        for member in [plane, *(tier_plane(plane, t) for t in (CONTINUATION, HOST))]:
            if member in decls:
                decls[member].dtype = mpb.D_TYPE_BF16
                stored.add(member)
    dtypes = {b.name: ("bf16" if b.name in stored else "f32") for b in manifest.buffers}
    kernels = {k.id: k for k in manifest.kernels}
    for program in programs(manifest):
        for launch in program.launches:
            op = kernels[launch.kernel].reference_op
            views = [a.buffer for a in launch.args if a.WhichOneof("value") == "buffer"
                     and a.buffer.buffer in stored]
            for view in views:
                view.byte_offset = view.byte_offset // _F32_PER_BF16
            if op in KV_BF16_FORMS and views:
                relaunch(launch, KV_BF16_FORMS[op], list(launch.args), kernels, dtypes, "f32")
    for graph in graphs:
        for access in graph.state_accesses:
            if access.view.buffer in stored:
                view = access.view
                view.byte_offset //= _F32_PER_BF16
                view.row_stride //= _F32_PER_BF16
                view.byte_extent //= _F32_PER_BF16
    keep_used_kernels(manifest, kernels)
    return [b.name for b in manifest.buffers if b.name in stored]


# Calibration: the prompt the export runs through the captured prefill program with the
# NumPy references (f32), for cores whose weights are plain floats of at most
# CALIBRATION_MAX_BYTES; each plane's scale per kv head is amax x MARGIN / 448 (the margin
# leaves room past what the prompt showed before values saturate).
CALIBRATION_TEXT = (
    "The history of the printing press begins in the fifteenth century. Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden press. def "
    "fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    "Water boils at 100 degrees Celsius at sea level; 3 x 7 = 21. Bonjour, comment "
    "allez-vous aujourd'hui? The quick brown fox jumps over the lazy dog.")
CALIBRATION_NAME = "fixed calibration prompt through the captured prefill (NumPy)"
CALIBRATION_MAX_BYTES = 2 << 30
MARGIN = 1.25
_NUMPY = {mpb.D_TYPE_F32: np.float32, mpb.D_TYPE_BF16: np.float32, mpb.D_TYPE_I32: np.int32,
          mpb.D_TYPE_U32: np.uint32}
_ITEMSIZE = {mpb.D_TYPE_F32: 4, mpb.D_TYPE_BF16: 2, mpb.D_TYPE_I32: 4, mpb.D_TYPE_U32: 4}


def calibrate_kv_scales(manifest: mpb.ExecutionManifest, graphs: list[cpb.GraphContract],
                        weights: dict[str, np.ndarray], tokens: list[int],
                        planes: list[str]) -> dict[str, np.ndarray]:
    """Per-head scales of `planes` from one prefill of `tokens` through the captured
    program (before ``apply_kv_fp8``: f32 planes), run with the NumPy references up to its
    last cache write.

    Args:
        manifest: the captured manifest (f32 planes, no storage on them).
        graphs: its graph contracts (the PREFILL program with the most tokens runs).
        weights: every weight buffer's values by buffer name (f32, or bf16 bit patterns
            as uint16).
        tokens: the prompt ids (at most the program's token capacity are used).
        planes: the planes to calibrate (``fp8_planes``).

    Returns:
        ``<plane>.scale`` -> ``[KVH]`` f32: ``max |x| x MARGIN / 448`` over the written
        positions of each head (``DEFAULT_KV_SCALE`` for a head the prompt left all zero).

    Raises:
        ValueError: no PREFILL program, or one that writes none of `planes`.
    """
    prefill = [g for g in graphs if g.operation == cpb.OPERATION_PREFILL]
    if not prefill:
        raise ValueError("no PREFILL program to calibrate with")
    graph = max(prefill, key=lambda g: g.token_capacity)
    program = next(p for p in manifest.graphs if p.name == graph.name)
    decls = {b.name: b for b in manifest.buffers}
    buffers = {}
    for b in manifest.buffers:
        if b.role == mpb.BUFFER_ROLE_WEIGHT:
            w = weights[b.name]
            buffers[b.name] = ((w.astype(np.uint32) << 16).view(np.float32) if w.dtype == np.uint16
                               else w.astype(np.float32)).reshape([int(x) for x in b.shape])
        else:
            buffers[b.name] = np.zeros([int(x) for x in b.shape], _NUMPY[b.dtype])
    T = min(len(tokens), int(graph.token_capacity))
    pool = min(int(decls[p].shape[0]) for p in planes)  # the smallest plane's pages
    for table in (PAGE_TABLE, WINDOW_PAGE_TABLE):  # request row 0: pages 0, 1, 2, ...
        if table in buffers:
            buffers[table][0] = np.arange(buffers[table].shape[1]) % pool
    for key, value in (("tokens", tokens[:T]), ("positions", range(T)), ("token_row", [0] * T)):
        buffers[INPUT_NAMES[key]][:T] = value
    buffers[INPUT_NAMES["token_row"]][T:] = -1
    buffers[INPUT_NAMES["slot"]][:] = -1
    buffers[INPUT_NAMES["slot"]][0] = 0
    buffers[INPUT_NAMES["query_length"]][0] = T
    kernels = {k.id: k.reference_op for k in manifest.kernels}
    wanted = set(planes)
    writes = [i for i, launch in enumerate(program.launches)
              if any(a.buffer.buffer in wanted for a, p in zip(launch.args, kernel_params(
                  kernels[launch.kernel]), strict=True) if p.direction != "in")]
    if not writes:
        raise ValueError(f"program {graph.name} writes none of the planes")
    for launch in program.launches[:writes[-1] + 1]:
        args = []
        for a in launch.args:
            kind = a.WhichOneof("value")
            if kind == "buffer":
                whole = buffers[a.buffer.buffer]
                shape = [int(x) for x in a.buffer.shape]
                start = a.buffer.byte_offset // _ITEMSIZE[decls[a.buffer.buffer].dtype]
                args.append(whole if start == 0 and whole.size == np.prod(shape)
                            else whole.reshape(-1)[start:start + int(np.prod(shape))]
                            .reshape(shape))
            else:
                args.append(a.int_value if kind == "int_value" else a.float_value)
        reference_op(kernels[launch.kernel])(*args)
    scales = {}
    for plane in planes:
        x = np.abs(buffers[plane])  # [pages, page tokens, kv heads, head dim]
        amax = x.reshape(-1, x.shape[-2], x.shape[-1]).max(axis=(0, 2)).astype(np.float64)
        scales[plane + SCALE_SUFFIX] = np.where(amax > 0, amax * MARGIN / E4M3_MAX,
                                                DEFAULT_KV_SCALE).astype(np.float32)
    return scales


# Per-layer KV scales of FP8 checkpoints (compressed-tensors' kv_cache_scheme and the
# older `k_proj.k_scale` layout): one f32 per layer and plane, what the cache was
# quantized with (`x / k_scale`, as ``quantize_kv``).
_CHECKPOINT_SCALE = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(?:[kv]_proj\.)?([kv])_scale$")


def checkpoint_kv_scales(source: str, planes: list[str], kv_heads: dict[str, int]
                         ) -> dict[str, np.ndarray] | None:
    """The checkpoint's own KV scales for `planes` (``L{i}.k_cache`` / ``L{i}.v_cache``),
    each broadcast to its ``kv_heads[plane]`` heads; None when `source` is no safetensors
    folder or carries none.

    Raises:
        UnsupportedTensorError: the checkpoint carries KV scales, but not for every plane,
            or one is not a single positive finite value.
    """
    folder = Path(source)
    if not folder.is_dir():
        return None
    found: dict[str, float] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:
            for name in f.keys():
                m = _CHECKPOINT_SCALE.match(name)
                if m is None:
                    continue
                value = np.asarray(f.get_tensor(name), np.float32).reshape(-1)
                if value.size != 1 or not np.isfinite(value[0]) or value[0] <= 0:
                    raise UnsupportedTensorError(
                        f"{name}: a KV scale is one positive finite value per layer, not "
                        f"{value.tolist()[:4]}")
                found[f"L{m.group(1)}.{m.group(2)}_cache"] = float(value[0])
    if not found:
        return None
    missing = [p for p in planes if p not in found]
    if missing:
        raise UnsupportedTensorError(
            f"{folder}: the checkpoint carries KV scales but none for {missing[0]} "
            f"({len(missing)} of {len(planes)} planes)")
    return {p + SCALE_SUFFIX: np.full(kv_heads[p], found[p], np.float32) for p in planes}
