"""``ignition export --quantize fp8|int4``: quantized weights as manifest data.

``int4`` (W4A16): the same matrices become ``STORAGE_TYPE_INT4`` storage (two codes a
byte, groups of 128 along K, or 64/32 where 128 does not divide K: ``int4_group``) with
``<name>.scale`` and ``<name>.zero`` ([rows, K / group] f32 each: AWQ's asymmetric
scheme, helios_tools.kernels.int4) and each launch reading one
becomes its INT4 form (``INT4_FORMS``: the scales, then the zero points, after the
weight). A checkpoint's own AWQ/GPTQ codes are repacked as stored (``int4_codes``).

``--weight-dtype gguf`` with a GPU target: the GGUF block matrices become INT4 / INT4_MIN
/ INT8 storage (``repacked_weights``, ``apply_storage``; the codes come from
checkpoint/gguf_repack.py, docs/gguf-cuda.md) and their launches the forms of those types
(``STORAGE_FORMS``).

``fp8``:

After capture, every weight matrix whose every reader is a product with an FP8 form
(``helios_tools.kernels.fp8.FP8_FORMS``: ``linear``, ``linear_add``, ``rmsnorm_linear``,
``swiglu_linear``, ``swiglu_linear_add``), the LM head excepted, is declared
``STORAGE_TYPE_FP8_E4M3`` storage (Buffer.storage; one block per row, so one scale per
output channel) with its scales in the weight ``<name>.scale`` ([rows, 1] f32), and each
launch reading it becomes the FP8 form of its op with the scale buffer after the weight.
The embedding (a gather) and the LM head (its logits feed sampling directly) keep the
recipe's dtype, as published FP8 checkpoints keep them.

The capture runs with the packed bf16 decode path off (``launch.mma_plan``'s rule): its
activation terms are exact against bf16 weights only, and the FP8 forms replace those
products.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import kernel_params
from helios_tools.kernels.fp8 import FP8_FORMS, quantize_rows
from helios_tools.kernels.int4 import INT4_FORMS, int4_group, quantize_int4
from helios_tools.kernels.int8 import INT4_MIN_FORMS, INT8_FORMS

from .capture import launch as launch_rules
from .capture.buffers import weight_resource_id
from .capture.launch import launch_config
from .checkpoint.errors import UnsupportedTensorError

QUANTIZE_CHOICES = ("fp8", "int4")
# The buffer the LM head reads (families/llama.py; a tied head reads the embedding).
LM_HEAD = "lm_head"
SCALE_SUFFIX = ".scale"
ZERO_SUFFIX = ".zero"
MIN_SUFFIX = ".min"
# The parameter through which an op reads the weight its forms take as codes (the
# embedding's table; every product's weight).
WEIGHT_PARAMS = ("weight", "table")
# Each --quantize choice: the ops' forms for it and its storage type.
FORMS = {"fp8": FP8_FORMS, "int4": INT4_FORMS}
# Each element-wise code storage type: the ops' forms for it and the suffixes of its side
# buffers (in the order the forms read them).
STORAGE_FORMS = {mpb.STORAGE_TYPE_FP8_E4M3: (FP8_FORMS, (SCALE_SUFFIX,)),
                 mpb.STORAGE_TYPE_INT4: (INT4_FORMS, (SCALE_SUFFIX, ZERO_SUFFIX)),
                 mpb.STORAGE_TYPE_INT4_MIN: (INT4_MIN_FORMS, (SCALE_SUFFIX, MIN_SUFFIX)),
                 mpb.STORAGE_TYPE_INT8: (INT8_FORMS, (SCALE_SUFFIX,))}
_DTYPE_NAMES = {mpb.D_TYPE_F32: "f32", mpb.D_TYPE_BF16: "bf16", mpb.D_TYPE_I32: "i32",
                mpb.D_TYPE_U32: "u32"}
_KINDS = {"buffer": mpb.PARAM_KIND_BUFFER, "i32": mpb.PARAM_KIND_I32, "f32": mpb.PARAM_KIND_F32}


@contextmanager
def packed_path_off() -> Iterator[None]:
    """Capture inside this block records no packed bf16 products (``HELIOS_LINEAR_MMA``
    "off" for the block only)."""
    saved = launch_rules.LINEAR_MMA
    launch_rules.LINEAR_MMA = "off"
    try:
        yield
    finally:
        launch_rules.LINEAR_MMA = saved


def programs(manifest: mpb.ExecutionManifest) -> list:
    """Every program whose launches a rewrite visits: the graphs and the tuning producers."""
    return [*manifest.graphs, *manifest.tuning.producers]


def keep_used_kernels(manifest: mpb.ExecutionManifest, kernels: dict[str, mpb.Kernel]) -> None:
    """Replace `manifest`'s kernels with those of `kernels` (a rewrite's variants, old and
    new) that some launch still names: rewritten launches leave their old variants unused."""
    used = {launch.kernel for p in programs(manifest) for launch in p.launches}
    keep = [k for k in kernels.values() if k.id in used]
    del manifest.kernels[:]
    manifest.kernels.extend(keep)


def fp8_weights(manifest: mpb.ExecutionManifest) -> list[str]:
    """``quantized_weights(manifest, "fp8")``."""
    return quantized_weights(manifest, "fp8")


def quantized_weights(manifest: mpb.ExecutionManifest, quantize: str) -> list[str]:
    """Weight matrices (2-D weight buffers, the LM head excepted) that every launch reads
    as the ``weight`` parameter of an op with a form for `quantize` (``FORMS``), in
    manifest order; for int4 also K divisible by a group (``int4_group``)."""
    return [name for name in _readable(manifest, FORMS[quantize])
            if quantize != "int4" or int4_group(int(_decl(manifest, name).shape[1]))]


def _decl(manifest: mpb.ExecutionManifest, name: str) -> mpb.Buffer:
    return next(b for b in manifest.buffers if b.name == name)


def _readable(manifest: mpb.ExecutionManifest, forms: dict[str, str]) -> list[str]:
    """Weight matrices (the LM head excepted) every launch reads as the ``weight`` of an
    op with a form in `forms`, in manifest order."""
    ops = {k.id: k.reference_op for k in manifest.kernels}
    matrices = {b.name for b in manifest.buffers
                if b.role == mpb.BUFFER_ROLE_WEIGHT and len(b.shape) == 2 and b.name != LM_HEAD}
    ok: dict[str, bool] = {}
    for program in programs(manifest):
        for launch in program.launches:
            op = ops[launch.kernel]
            params = kernel_params(op)
            for spec, arg in zip(params, launch.args, strict=True):
                name = arg.buffer.buffer if arg.WhichOneof("value") == "buffer" else None
                if name in matrices:
                    ok[name] = ok.get(name, True) and op in forms and spec.name in WEIGHT_PARAMS
    return [b.name for b in manifest.buffers if ok.get(b.name)]


def repacked_weights(manifest: mpb.ExecutionManifest, storage: dict[str, tuple[int, int]]
                     ) -> dict[str, tuple[int, int]]:
    """Of the GGUF-block matrices `storage` (buffer -> (repacked storage type, group),
    ``weights.repack_storage``), those a core for a GPU target stores repacked: every
    reader an op with a form for that storage type (manifest order). The others (the
    embedding, a tied LM head) are stored as f32."""
    out = {}
    for storage_type in sorted({t for t, _ in storage.values()}):
        forms = STORAGE_FORMS[storage_type][0]
        out.update({n: storage[n] for n in _readable(manifest, forms)
                    if n in storage and storage[n][0] == storage_type})
    order = [b.name for b in manifest.buffers]
    return dict(sorted(out.items(), key=lambda item: order.index(item[0])))


class _ViewInfo:
    """What ``launch_config`` reads of a view: its shape and its buffer's dtype name."""

    def __init__(self, shape, dtype: str):
        self.shape = tuple(int(s) for s in shape)
        self.buffer = types.SimpleNamespace(dtype=dtype)


def apply_fp8(manifest: mpb.ExecutionManifest, names: list[str]) -> None:
    """``apply_quantize(manifest, names, "fp8")``."""
    apply_quantize(manifest, names, "fp8")


def _declare(manifest: mpb.ExecutionManifest, decl: mpb.Buffer, storage_type: int,
             group: int) -> list[str]:
    """Give `decl` element-wise code storage of `storage_type` in groups of `group` and add
    its side buffers; returns their names in the order the forms read them."""
    rows, k = (int(s) for s in decl.shape)
    name = decl.name
    sides = [name + suffix for suffix in STORAGE_FORMS[storage_type][1]]
    side = [mpb.SideBuffer(buffer=b, dtype=mpb.D_TYPE_F32) for b in sides]
    bits = 4 if storage_type in (mpb.STORAGE_TYPE_INT4, mpb.STORAGE_TYPE_INT4_MIN) else 8
    storage = mpb.TensorStorage(type=storage_type, block_elements=group,
                                block_bytes=group * bits // 8, scales=side[0])
    if storage_type == mpb.STORAGE_TYPE_INT4:
        storage.zero_points.CopyFrom(side[1])
    elif storage_type == mpb.STORAGE_TYPE_INT4_MIN:
        storage.mins.CopyFrom(side[1])
    decl.dtype = mpb.D_TYPE_F32
    decl.storage.CopyFrom(storage)
    for b in sides:
        manifest.buffers.add(name=b, dtype=mpb.D_TYPE_F32, shape=[rows, k // group],
                             role=mpb.BUFFER_ROLE_WEIGHT, weight_resource_id=weight_resource_id(b))
    return sides


_QUANTIZE_TYPES = {"fp8": mpb.STORAGE_TYPE_FP8_E4M3, "int4": mpb.STORAGE_TYPE_INT4}


def apply_quantize(manifest: mpb.ExecutionManifest, names: list[str], quantize: str) -> None:
    """Declare `names` quantized storage of `quantize` (``fp8``: e4m3 codes with per-row
    scales; ``int4``: packed codes with group-128 scales and zero points) and rewrite every
    launch reading one into its op's form (in place; unused kernel variants dropped).

    Raises:
        ValueError: a name is not a 2-D weight of `manifest`.
    """
    storage_type = _QUANTIZE_TYPES[quantize]
    decls = {b.name: b for b in manifest.buffers}
    apply_storage(manifest, {n: (storage_type, _group(quantize, decls.get(n))) for n in names})


def _group(quantize: str, decl: mpb.Buffer | None) -> int:
    if decl is None or len(decl.shape) != 2:
        return 0  # apply_storage names it
    k = int(decl.shape[1])
    return k if quantize == "fp8" else int4_group(k)


def apply_storage(manifest: mpb.ExecutionManifest, storage: dict[str, tuple[int, int]]
                  ) -> None:
    """Declare each weight of `storage` (name -> (element-wise code storage type, group
    elements)) that storage with its side buffers, and rewrite every launch reading one
    into its op's form for the type (``STORAGE_FORMS``; the side buffers after the
    weight), in place; unused kernel variants dropped.

    Raises:
        ValueError: a name is not a 2-D weight of `manifest`.
    """
    sides: dict[str, list[str]] = {}
    decls = {b.name: b for b in manifest.buffers}
    for name, (storage_type, group) in storage.items():
        decl = decls.get(name)
        if decl is None or decl.role != mpb.BUFFER_ROLE_WEIGHT or len(decl.shape) != 2:
            raise ValueError(f"{name!r} is not a weight matrix of the manifest")
        sides[name] = _declare(manifest, decl, storage_type, group)
    dtypes = {b.name: ("u8" if b.name in storage else _DTYPE_NAMES.get(b.dtype, "f32"))
              for b in manifest.buffers}
    kernels = {k.id: k for k in manifest.kernels}
    for program in programs(manifest):
        for launch in program.launches:
            op = kernels[launch.kernel].reference_op
            names_ = [a.buffer.buffer if a.WhichOneof("value") == "buffer" else None
                      for a in launch.args]
            params = [spec.name for spec in kernel_params(op)]
            at = next((i for i, p in enumerate(params) if p in WEIGHT_PARAMS), None)
            if at is None:
                continue
            weight = names_[at]
            if weight not in storage:
                continue
            storage_type, group = storage[weight]
            forms = STORAGE_FORMS[storage_type][0]
            if op not in forms:
                continue
            _rewrite(launch, forms[op], at, sides[weight], group, kernels, dtypes)
    keep_used_kernels(manifest, kernels)


def _rewrite(launch: mpb.Launch, op: str, at: int, sides: list[str], group: int,
             kernels: dict[str, mpb.Kernel], dtypes: dict[str, str]) -> None:
    rows, k = (int(s) for s in launch.args[at].buffer.shape)
    cols = k // group
    args = list(launch.args)
    for i, side in enumerate(sides):
        args.insert(at + 1 + i, mpb.Argument(buffer=mpb.BufferView(buffer=side,
                                                                   shape=[rows, cols])))
    relaunch(launch, op, args, kernels, dtypes)


def fp8_codes(checkpoint, sources: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The e4m3 codes ([rows, K] uint8) and per-row scales ([rows, 1] f32) of the weight
    whose rows are `sources`' rows in order: the checkpoint's own FP8 codes and scales
    where every source is stored in FP8 (kept exactly), else ``quantize_rows`` of the
    sources' values."""
    stored = [checkpoint.fp8(src) for src in sources]
    if all(s is not None for s in stored):
        codes = np.concatenate([s[0] for s in stored], axis=0)
        scales = np.concatenate([s[1] for s in stored], axis=0)
        return np.ascontiguousarray(codes), np.ascontiguousarray(scales, dtype=np.float32)
    return quantize_rows(np.concatenate([checkpoint.tensor(src) for src in sources], axis=0))


def int4_codes(checkpoint, sources: list[str]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed INT4 codes ([rows, K / 2] uint8), group scales and zero points
    ([rows, K / group] f32 each, group ``int4_group(K)``) of the weight whose rows are `sources`' rows in order: the
    checkpoint's own AWQ/GPTQ codes repacked where every source is stored in 4 bits
    (``Checkpoint.int4``; never through floats), else ``quantize_int4`` of the sources'
    values.

    Raises:
        UnsupportedTensorError: a stored source's group is not ``int4_group(K)``.
    """
    stored = [checkpoint.int4(src) for src in sources] if hasattr(checkpoint, "int4") else []
    if stored and all(s is not None for s in stored):
        for src, (codes, scales, _) in zip(sources, stored, strict=True):
            k = codes.shape[1] * 2
            if k != scales.shape[1] * int4_group(k):
                raise UnsupportedTensorError(f"{src}: INT4 groups of {k // scales.shape[1]} elements; "
                                 f"the export declares groups of {int4_group(k)} at K = {k}")
        return tuple(np.ascontiguousarray(np.concatenate([s[i] for s in stored], axis=0))
                     for i in range(3))
    w = np.concatenate([checkpoint.tensor(src) for src in sources], axis=0)
    return quantize_int4(w, int4_group(w.shape[1]))


def relaunch(launch: mpb.Launch, op: str, args: list[mpb.Argument],
             kernels: dict[str, mpb.Kernel], dtypes: dict[str, str],
             default_dtype: str | None = None) -> None:
    """Make `launch` a launch of `op` over `args`: its kernel variant (geometry and
    constants from ``launch_config``) added to `kernels` where new, grid, block and shared
    bytes replaced. `dtypes` names each argument buffer's dtype; a buffer missing from it
    takes `default_dtype`, or raises KeyError where that is None."""
    views = [_ViewInfo(a.buffer.shape, dtypes[a.buffer.buffer] if default_dtype is None
                       else dtypes.get(a.buffer.buffer, default_dtype))
             for a in args if a.WhichOneof("value") == "buffer"]
    scalars = [a.int_value if a.WhichOneof("value") == "int_value" else a.float_value
               for a in args if a.WhichOneof("value") != "buffer"]
    config = launch_config(op, scalars, views)
    suffix = "_".join(f"{k}{v}" for k, v in sorted(config.constants.items()))
    kernel_id = f"{op}__{suffix}" if suffix else op
    if kernel_id not in kernels:
        kernel = mpb.Kernel(id=kernel_id, reference_op=op)
        for spec in kernel_params(op):
            kernel.params.add(name=spec.name, kind=_KINDS[spec.kind])
        for key, value in config.constants.items():
            kernel.constants[key] = value
        kernels[kernel_id] = kernel
    launch.kernel = kernel_id
    del launch.grid[:], launch.block[:], launch.args[:]
    launch.grid.extend(config.grid)
    launch.block.extend(config.block)
    launch.shared_bytes = config.shared_bytes
    launch.args.extend(args)
