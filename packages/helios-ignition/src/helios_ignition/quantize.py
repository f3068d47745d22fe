"""``ignition export --quantize fp8``: FP8 (e4m3) W8A8 weights as manifest data.

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

from .capture import launch as launch_rules
from .capture.buffers import weight_resource_id
from .capture.launch import launch_config

QUANTIZE_CHOICES = ("fp8",)
# The buffer the LM head reads (families/llama.py; a tied head reads the embedding).
LM_HEAD = "lm_head"
SCALE_SUFFIX = ".scale"
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


def _programs(manifest: mpb.ExecutionManifest):
    return [*manifest.graphs, *manifest.tuning.producers]


def fp8_weights(manifest: mpb.ExecutionManifest) -> list[str]:
    """Weight matrices (2-D weight buffers, the LM head excepted) that every launch reads
    as the ``weight`` parameter of an op with an FP8 form, in manifest order."""
    ops = {k.id: k.reference_op for k in manifest.kernels}
    matrices = {b.name for b in manifest.buffers
                if b.role == mpb.BUFFER_ROLE_WEIGHT and len(b.shape) == 2 and b.name != LM_HEAD}
    ok: dict[str, bool] = {}
    for program in _programs(manifest):
        for launch in program.launches:
            op = ops[launch.kernel]
            params = kernel_params(op)
            for spec, arg in zip(params, launch.args, strict=True):
                name = arg.buffer.buffer if arg.WhichOneof("value") == "buffer" else None
                if name in matrices:
                    ok[name] = ok.get(name, True) and op in FP8_FORMS and spec.name == "weight"
    return [b.name for b in manifest.buffers if ok.get(b.name)]


class _ViewInfo:
    """What ``launch_config`` reads of a view: its shape and its buffer's dtype name."""

    def __init__(self, shape, dtype: str):
        self.shape = tuple(int(s) for s in shape)
        self.buffer = types.SimpleNamespace(dtype=dtype)


def apply_fp8(manifest: mpb.ExecutionManifest, names: list[str]) -> None:
    """Declare `names` FP8 e4m3 storage with per-row scale buffers and rewrite every launch
    reading one into the FP8 form of its op (in place; unused kernel variants dropped).

    Raises:
        ValueError: a name is not a 2-D weight of `manifest`.
    """
    quantized = set(names)
    decls = {b.name: b for b in manifest.buffers}
    for name in names:
        decl = decls.get(name)
        if decl is None or decl.role != mpb.BUFFER_ROLE_WEIGHT or len(decl.shape) != 2:
            raise ValueError(f"{name!r} is not a weight matrix of the manifest")
        rows, k = (int(s) for s in decl.shape)
        scale = name + SCALE_SUFFIX
        decl.dtype = mpb.D_TYPE_F32
        decl.storage.CopyFrom(mpb.TensorStorage(
            type=mpb.STORAGE_TYPE_FP8_E4M3, block_elements=k, block_bytes=k,
            scales=mpb.SideBuffer(buffer=scale, dtype=mpb.D_TYPE_F32)))
        manifest.buffers.add(name=scale, dtype=mpb.D_TYPE_F32, shape=[rows, 1],
                             role=mpb.BUFFER_ROLE_WEIGHT,
                             weight_resource_id=weight_resource_id(scale))
    dtypes = {b.name: ("u8" if b.name in quantized else _DTYPE_NAMES.get(b.dtype, "f32"))
              for b in manifest.buffers}
    kernels = {k.id: k for k in manifest.kernels}
    for program in _programs(manifest):
        for launch in program.launches:
            op = kernels[launch.kernel].reference_op
            if op not in FP8_FORMS:
                continue
            names_ = [a.buffer.buffer if a.WhichOneof("value") == "buffer" else None
                      for a in launch.args]
            at = [spec.name for spec in kernel_params(op)].index("weight")
            if names_[at] not in quantized:
                continue
            _rewrite(launch, FP8_FORMS[op], at, names_[at], kernels, dtypes)
    used = {launch.kernel for p in _programs(manifest) for launch in p.launches}
    keep = [k for k in kernels.values() if k.id in used]
    del manifest.kernels[:]
    manifest.kernels.extend(keep)


def _rewrite(launch: mpb.Launch, op: str, at: int, weight: str,
             kernels: dict[str, mpb.Kernel], dtypes: dict[str, str]) -> None:
    rows = launch.args[at].buffer.shape[0]
    args = list(launch.args)
    scale = mpb.Argument(buffer=mpb.BufferView(buffer=weight + SCALE_SUFFIX, shape=[rows, 1]))
    args.insert(at + 1, scale)
    views = [_ViewInfo(a.buffer.shape, dtypes[a.buffer.buffer]) for a in args
             if a.WhichOneof("value") == "buffer"]
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
