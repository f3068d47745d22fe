"""Ahead-of-time compilation of the manifest's kernel variants to GPU binaries.

``ignition export --target sm_90`` compiles every ``Kernel`` variant of the execution
manifest with Triton for each target, on any machine (no GPU needed: Triton compiles for
``GPUTarget("cuda", 90, 32)`` without a driver), records each binary's launch metadata in
``Kernel.binaries`` and stores the cubins as KERNEL_BINARY resources. Works with Triton
3.5+ (the GPU image has 3.6, the workspace 3.9).

Parameter ABI of a compiled kernel: the declared parameters (``KERNEL_PARAMS[op]``, the
constexprs removed) followed by the scratch pointers Triton appends (global scratch, and
profile scratch since 3.6); the backend counts them with ``cuFuncGetParamInfo`` and
passes null pointers when the recorded scratch sizes are 0.
"""

from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import re
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from helios_contract.schema import core_pb2
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import kernel_params
from helios_tools.kernels.collective import COLLECTIVE_OPS

POINTER_TYPES = {"f32": "*fp32", "i32": "*i32", "u32": "*u32", "u8": "*u8", "bf16": "*bf16"}
SCALAR_TYPES = {"i32": "i32", "f32": "fp32"}
OPTION_CONSTANTS = {"WARPS": "num_warps", "STAGES": "num_stages"}
DEFAULT_STAGES = 3


class KernelCompileError(RuntimeError):
    """A kernel variant failed to compile for a target (names both)."""


@dataclass(frozen=True)
class CompiledKernel:
    """One cubin and what a launcher needs to know about it."""

    kernel_id: str
    target: str
    binary: bytes
    entry_name: str
    shared_bytes: int
    num_warps: int
    global_scratch_bytes: int
    profile_scratch_bytes: int


# The NVIDIA compute capabilities Triton's CUDA backend compiles for (Turing to
# Blackwell); anything else fails inside ptxas with pages of compiler output, so it is
# refused here as a usage error.
KNOWN_ARCHS = (75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)


def parse_target(target: str) -> int:
    """``"sm_90"`` -> 90.

    Raises:
        ValueError: not of the form ``sm_<digits>``, or not in KNOWN_ARCHS.
    """
    m = re.fullmatch(r"sm_(\d+)", target)
    if not m:
        raise ValueError(f"unknown GPU target {target!r}; expected sm_<arch>, e.g. sm_90")
    arch = int(m.group(1))
    if arch not in KNOWN_ARCHS:
        known = ", ".join(f"sm_{a}" for a in KNOWN_ARCHS)
        raise ValueError(f"GPU target {target!r} is not one Triton compiles for; known: {known}")
    return arch


def resource_id(target: str, kernel_id: str) -> str:
    return f"kernels/{target}/{kernel_id}.cubin"


def _setup_env() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ.setdefault("TRITON_CACHE_DIR",
                          os.path.join(tempfile.gettempdir(), "helios-triton-cache"))


def signature(op: str, constants: dict[str, int]):
    """Triton ``(signature, constexprs, attrs, options)`` of variant ``op``/``constants``.

    Every buffer is declared 16-byte aligned (``tt.divisibility``): capture only makes
    views at element offset 0 of allocations the backend aligns to 256 bytes, and the
    backend checks each pointer at load.
    """
    from .kernels_triton import TRITON_KERNELS, WEIGHT_PARAMS  # imports Triton (optional)

    fn = TRITON_KERNELS[op]
    params = kernel_params(op)
    sig: dict[str, str] = {}
    attrs = {}
    for i, spec in enumerate(params):
        if spec.kind == "buffer":
            ptype = POINTER_TYPES[spec.dtype]
            if WEIGHT_PARAMS.get(op) == spec.name and constants.get("WBF16"):
                ptype = "*bf16"
            sig[spec.name] = ptype
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[spec.name] = SCALAR_TYPES[spec.kind]
    constexprs = {}
    for name in fn.arg_names[len(params):]:
        if name in constants:
            value = int(constants[name])
        elif fn.params[fn.arg_names.index(name)].default is not inspect.Parameter.empty:
            value = int(fn.params[fn.arg_names.index(name)].default)
        else:
            raise KernelCompileError(f"kernel {op}: variant constants {constants} lack {name}")
        sig[name] = "constexpr"
        constexprs[name] = value
    options = {"num_warps": int(constants.get("WARPS", 4)),
               "num_stages": int(constants.get("STAGES", DEFAULT_STAGES))}
    return sig, constexprs, attrs, options


def compile_variant(op: str, constants: dict[str, int], target: str,
                    kernel_id: str = "") -> CompiledKernel:
    """Compile one kernel variant for `target` (no GPU needed).

    Raises:
        KernelCompileError: Triton rejected the kernel (message names op and target).
    """
    _setup_env()
    # Triton is optional (a Linux x86-64 dependency) and needed only with --target; it
    # must see the environment _setup_env sets before it is imported.
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .kernels_triton import TRITON_KERNELS

    arch = parse_target(target)
    sig, constexprs, attrs, options = signature(op, constants)
    src = ASTSource(TRITON_KERNELS[op], sig, constexprs, attrs)
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as exc:  # Triton raises many types; keep the cause
        raise KernelCompileError(f"compiling {kernel_id or op} for {target} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    md = compiled.metadata
    return CompiledKernel(
        kernel_id=kernel_id or op, target=target, binary=bytes(compiled.asm["cubin"]),
        entry_name=md.name, shared_bytes=int(md.shared), num_warps=int(md.num_warps),
        global_scratch_bytes=int(getattr(md, "global_scratch_size", 0) or 0),
        profile_scratch_bytes=int(getattr(md, "profile_scratch_size", 0) or 0))


def _compile_job(job: tuple[str, dict[str, int], str, str]) -> CompiledKernel:
    op, constants, target, kernel_id = job
    return compile_variant(op, constants, target, kernel_id)


def compile_all(kernels: list[mpb.Kernel], targets: tuple[str, ...],
                workers: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[CompiledKernel]:
    """Compile every kernel variant for every target, in parallel processes.

    `progress(done, total)` is called as each variant finishes (in submission order).
    """
    for t in targets:
        parse_target(t)
    jobs = [(k.reference_op, dict(k.constants), t, k.id) for t in targets for k in kernels]
    workers = workers or min(len(jobs), os.cpu_count() or 1, 16)
    if workers <= 1 or len(jobs) <= 1:
        results = map(_compile_job, jobs)
        return _counted(results, len(jobs), progress)

    ctx = mp.get_context("spawn")  # no fork of a process that may hold threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return _counted(pool.map(_compile_job, jobs), len(jobs), progress)


def _counted(results, total: int, progress: Callable[[int, int], None] | None
             ) -> list[CompiledKernel]:
    out = []
    for compiled in results:
        out.append(compiled)
        if progress:
            progress(len(out), total)
    return out


def variant_kernel(kernel_id: str, op: str, constants: dict[str, int]) -> mpb.Kernel:
    """A manifest Kernel for variant `constants` of `op` (sweeps and compile checks)."""
    kernel = mpb.Kernel(id=kernel_id, reference_op=op)
    for name, value in constants.items():
        kernel.constants[name] = int(value)
    return kernel


def compile_each(kernels: list[mpb.Kernel], target: str, workers: int | None = None
                 ) -> tuple[list[CompiledKernel], dict[str, str]]:
    """Compile `kernels` for `target` in parallel; if any fails, compile them one at a
    time so every failure is named.

    Returns:
        The compiled kernels, and kernel id -> error (first 200 characters) of those that
        failed (sweeps time what compiled and report the rest).
    """
    try:
        return compile_all(kernels, (target,), workers=workers), {}
    except Exception:  # noqa: BLE001 - any compiler error: retry one by one to name it
        compiled, failed = [], {}
        for kernel in kernels:
            try:
                compiled += compile_all([kernel], (target,), workers=1)
            except Exception as exc:  # noqa: BLE001 - reported per kernel
                failed[kernel.id] = str(exc)[:200]
        return compiled, failed


# Cubins compiled for a manifest and not yet written: id(manifest) -> {resource id: bytes}.
_PENDING: dict[int, dict[str, bytes]] = {}


def compile_targets(manifest: mpb.ExecutionManifest, targets: tuple[str, ...],
                    workers: int | None = None,
                    progress: Callable[[int, int], None] | None = None) -> dict[str, bytes]:
    """Compile every kernel of `manifest` for `targets`; fill ``Kernel.binaries``,
    ``manifest.targets`` and each launch's shared bytes (`progress` as for compile_all).

    Returns:
        resource id -> cubin bytes (also kept for ``add_binaries``).
    """
    targets = tuple(dict.fromkeys(targets))
    by_id = {k.id: k for k in manifest.kernels}
    blobs: dict[str, bytes] = {}
    shared: dict[str, int] = {}
    compiled = [k for k in manifest.kernels if k.reference_op not in COLLECTIVE_OPS]
    for ck in compile_all(compiled, targets, workers, progress):
        rid = resource_id(ck.target, ck.kernel_id)
        kernel = by_id[ck.kernel_id]
        del_existing = [b for b in kernel.binaries if b.target == ck.target]
        for b in del_existing:
            kernel.binaries.remove(b)
        kernel.binaries.add(target=ck.target, resource_id=rid, entry_name=ck.entry_name,
                            shared_bytes=ck.shared_bytes, num_warps=ck.num_warps,
                            global_scratch_bytes=ck.global_scratch_bytes,
                            profile_scratch_bytes=ck.profile_scratch_bytes)
        blobs[rid] = ck.binary
        if ck.target == targets[0]:
            shared[ck.kernel_id] = ck.shared_bytes
    for t in targets:
        if t not in manifest.targets:
            manifest.targets.append(t)
    for g in manifest.graphs:
        for launch in g.launches:
            launch.shared_bytes = shared.get(launch.kernel, launch.shared_bytes)
    _PENDING[id(manifest)] = blobs
    return blobs


def add_binaries(writer, manifest: mpb.ExecutionManifest) -> int:
    """Store the cubins compiled by ``compile_targets`` as KERNEL_BINARY resources.

    Returns:
        Decoded bytes written.
    """
    blobs = _PENDING.pop(id(manifest), {})
    total = 0
    for rid, blob in blobs.items():
        writer.add_resource(rid, core_pb2.RESOURCE_KIND_KERNEL_BINARY, blob)
        total += len(blob)
    return total


def missing_targets(manifest: mpb.ExecutionManifest, target: str) -> list[str]:
    """Kernel ids of `manifest` without a binary for `target` (collectives have none: rank
    peers run them)."""
    return [k.id for k in manifest.kernels if k.reference_op not in COLLECTIVE_OPS
            and not any(b.target == target for b in k.binaries)]
