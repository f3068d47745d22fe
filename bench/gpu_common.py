"""Shared pieces of the GPU benchmarks: in-memory cores, copy bandwidth, timed decode.

An in-memory core is what ``NativeModel.load`` reads from a verified core (contract,
manifest with compiled kernels, ``read_resource``) built without writing a file, so the
8B geometry (16 GB of bf16) fits the device machine's time limit. Run on the GPU machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import statistics
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
from helios_ignition.capture.buffers import weight_resource_id
from helios_ignition.capture.programs import capture
from helios_ignition.export import build_contract
from helios_ignition.families.llama import LlamaShapes, rope_inv_freq
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.kv_cache import apply_kv_bf16
from helios_ignition.recipe import Capacities
from helios_ignition.weights import iter_weight_buffers
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan


@dataclass
class MemoryCore:
    contract: object
    manifest: object
    resources: dict

    def read_resource(self, rid: str) -> bytes:
        value = self.resources[rid]
        return value() if callable(value) else value


def device_target() -> str:
    """``sm_XY`` of device 0 (its compute capability), for compiling kernels on the GPU
    machine.

    Raises:
        whatever ``require_driver`` raises without a GPU driver.
    """
    from helios_serve.runtime.cuda.driver import call, require_driver  # needs a GPU

    cu = require_driver()
    dev = call("dev", cu.cuDeviceGet(0))
    major, minor = (call("a", cu.cuDeviceGetAttribute(a, dev)) for a in (
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    return f"sm_{major}{minor}"


def geometry_checkpoint(geometry, name: str) -> SimpleNamespace:
    """What ``resolve_recipe`` reads of a checkpoint, for a core built in memory from a
    named `geometry` with no tokenizer (an empty one, EOS id 2)."""
    return SimpleNamespace(geometry=geometry, tokenizer_json="{}", chat_template="",
                           eos_token_ids=(2,), special_tokens={},
                           source=f"synthetic:{name}:seed=0")


def build_core(recipe, ckpt, caps: Capacities, target: str, weights,
               split_tuning=None, fold_layers: bool = False,
               chunked_sampling: bool = True,
               wide_sampling: bool = True,
               race_sampling: bool = True,
               activations: str = "f32",
               kv_cache: str = "f32") -> tuple[MemoryCore, dict]:
    """Capture (with the decode-split tuning producer when `split_tuning` is a
    recipe.SplitTuning; decode layers folded with `fold_layers`; the chunked sampler with
    `chunked_sampling`, its wide form with `wide_sampling`, its candidate race with
    `race_sampling` as well; the packed products' `activations`, "f32" or "bf16"; the KV
    cache planes f32 or, with `kv_cache` "bf16", bfloat16 as ``ignition export
    --kv-cache-dtype bf16`` declares them), compile for `target` and wrap with `weights`
    (resource id -> bytes|callable). `target` None skips the compile (cpu backend)."""
    if kv_cache not in ("f32", "bf16"):
        raise ValueError(f"kv_cache is f32 or bf16, not {kv_cache!r}")
    recipe = replace(recipe, capacities=caps, fold_layers=fold_layers,
                     chunked_sampling=chunked_sampling, activation_dtype=activations)
    shapes = LlamaShapes.from_geometry(ckpt.geometry)
    t0 = time.perf_counter()
    manifest, graphs = capture(shapes, caps, recipe.weight_dtype, split_tuning=split_tuning,
                               fold_layers=fold_layers, chunked_sampling=chunked_sampling,
                               wide_sampling=wide_sampling, race_sampling=race_sampling,
                               activations=activations)
    if kv_cache == "bf16":
        apply_kv_bf16(manifest, graphs)
    t1 = time.perf_counter()
    blobs = compile_targets(manifest, (target,)) if target else {}
    t2 = time.perf_counter()
    contract = build_contract(recipe, ckpt, shapes, graphs, manifest)
    resources = dict(weights)
    resources.update(blobs)
    info = {"capture_s": t1 - t0, "compile_s": t2 - t1, "kernels": len(manifest.kernels),
            "graphs": [g.name for g in manifest.graphs]}
    return MemoryCore(contract, manifest, resources), info


def real_weights(ckpt, shapes: LlamaShapes, dtype: str = "bf16") -> dict:
    return {weight_resource_id(n): a.tobytes() for n, a in iter_weight_buffers(ckpt, shapes,
                                                                                 dtype)}


def random_bf16_weights(shapes: LlamaShapes, seed: int, rope_scaling=None) -> dict:
    """Seeded random bf16 weights of the real shapes, generated fast: each matrix is a
    window of one seeded pool of N(0, 0.02) bf16 values starting at an offset derived
    from its name (values repeat across matrices; bandwidth does not depend on them)."""
    rng = np.random.default_rng(seed)
    pool_n = 1 << 25  # 32 Mi values = 64 MB
    pool = (rng.standard_normal(pool_n, dtype=np.float32) * 0.02)
    bits = (pool.view(np.uint32) >> 16).astype(np.uint16)  # truncation: still random bf16
    bits = np.concatenate([bits, bits])
    out = {}
    for name, shape in shapes.weight_layout().items():
        rid = weight_resource_id(name)
        if name == "rope_inv_freq":
            out[rid] = rope_inv_freq(shapes, rope_scaling).tobytes()
        elif len(shape) == 1:
            out[rid] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32).tobytes()
        else:
            n = int(np.prod(shape))
            off = int(hashlib.sha256(name.encode()).hexdigest(), 16) % pool_n

            def make(n=n, off=off):
                if n <= pool_n:
                    return bits[off:off + n].tobytes()
                return np.resize(bits[off:off + pool_n], n).tobytes()

            out[rid] = make
    return out


def copy_bandwidth(cu, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), timed with events."""
    from helios_serve.runtime.cuda.driver import call

    a = call("alloc", cu.cuMemAlloc(nbytes))
    b = call("alloc", cu.cuMemAlloc(nbytes))
    call("memset", cu.cuMemsetD8(a, 7, nbytes))
    s = call("ev", cu.cuEventCreate(0))
    e = call("ev", cu.cuEventCreate(0))
    for _ in range(3):
        call("cp", cu.cuMemcpyDtoDAsync(b, a, nbytes, 0))
    call("rec", cu.cuEventRecord(s, 0))
    for _ in range(reps):
        call("cp", cu.cuMemcpyDtoDAsync(b, a, nbytes, 0))
    call("rec", cu.cuEventRecord(e, 0))
    call("sync", cu.cuEventSynchronize(e))
    ms = call("elapsed", cu.cuEventElapsedTime(s, e))
    cu.cuMemFree(a)
    cu.cuMemFree(b)
    return 2 * nbytes * reps / (ms / 1e3)


def _pages(model, slot, length):
    g = model.manifests
    per = min(g.max_pages_per_request, g.num_pages // g.slots)
    n = -(-length // g.page_tokens)
    assert n <= per, (length, per)
    return tuple(range(slot * per, slot * per + n))


GREEDY = SamplingParams()


def prefill(model, slot, tokens, chunk, sampling=GREEDY, generation=1) -> tuple[int, float]:
    """Prefill one row; returns (sampled token, seconds)."""
    t0 = time.perf_counter()
    tok = -1
    for start in range(0, len(tokens), chunk):
        piece = tuple(tokens[start:start + chunk])
        last = start + len(piece) == len(tokens)
        row = RowPlan(request_id=slot, slot=slot, generation=generation, tokens=piece,
                      start_position=start, page_ids=_pages(model, slot, start + len(piece)),
                      sample=last, sampling=sampling,
                      histogram_tokens=tuple(tokens) if start == 0 else None)
        tok = int(model.execute(StepPlan(StepKind.PREFILL, (row,)))[0])
    return tok, time.perf_counter() - t0


def decode_bench(model, batch: int, prompt_len: int, steps: int, chunk: int,
                 sampling=GREEDY, warmup: int = 5) -> dict:
    """Prefill `batch` prompts, then time decode through NativeModel, serial and ahead.

    serial: submit step N, wait, submit N + 1 (one frame in flight). ahead: step N + 1 is
    packed and submitted while step N runs (two frames; the pending token is read on the
    device, so the plan needs no sampled id). Host time per step = graph selection +
    packing + dirty uploads + the cuGraphLaunch call (NativeModel.submit). Device time per
    step = back-to-back graph replays with no host work in between. Returns the ahead
    figures as tokens_per_s / step_ms, the serial ones under ``serial_*``.
    """
    rng = np.random.default_rng(batch)
    vocab = model.manifests.vocab_size
    lengths = []
    for s in range(batch):
        prompt = rng.integers(3, min(vocab, 40000), prompt_len).tolist()
        prefill(model, s, prompt, chunk, sampling)
        lengths.append(prompt_len)

    def plan():
        rows = tuple(RowPlan(request_id=s, slot=s, generation=1, tokens=(-1,),
                             start_position=lengths[s],
                             page_ids=_pages(model, s, lengths[s] + 1), sample=True,
                             sampling=sampling) for s in range(batch))
        for s in range(batch):
            lengths[s] += 1
        return StepPlan(StepKind.DECODE, rows)

    def run(frames: int) -> tuple[list[float], list[float], str]:
        host, stamps, inflight, name = [], [], [], ""
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            ticket = model.submit(plan())
            host.append(time.perf_counter() - t0)
            inflight.append(ticket)
            name = ticket.graph
            if len(inflight) == frames:
                model.wait(inflight.pop(0))
                stamps.append(time.perf_counter())
        while inflight:
            model.wait(inflight.pop(0))
            stamps.append(time.perf_counter())
        step = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:], strict=False)]
        return step, host[warmup:], name

    serial_step, serial_host, name = run(1)
    ahead_step, ahead_host, _ = run(2)
    backend = model.backend
    reps = 50
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        backend.launch_only(name)
    backend.synchronize()
    device = (time.perf_counter() - t0) / reps
    step = statistics.median(ahead_step)
    serial = statistics.median(serial_step)
    return {"batch": batch, "graph": name, "tokens_per_s": batch / step,
            "step_ms": step * 1e3, "host_us": statistics.median(ahead_host) * 1e6,
            "serial_tokens_per_s": batch / serial, "serial_step_ms": serial * 1e3,
            "serial_host_us": statistics.median(serial_host) * 1e6,
            "ahead_over_serial": serial / step,
            "device_step_ms": device * 1e3, "device_tokens_per_s": batch / device,
            "steps": steps, "prompt_tokens": prompt_len}


def profile_ops(backend, graph: str, reps: int = 20) -> dict[str, float]:
    """Device ms per step spent in each op of `graph`: for each op, a throwaway CUDA graph
    of just that op's launches (same arguments) is captured and replayed. Profiling only:
    it captures graphs after serving measurements are taken."""
    from helios_serve.runtime.cuda import driver as drv

    cu = backend._cu
    g = next(p for p in backend._manifest_graphs if p.name == graph)
    _, _, args = backend._graphs[graph]  # (graphs per frame, execs per frame, args)
    by_op: dict[str, list] = {}
    for launch, a in zip(g.launches, args, strict=True):
        op = backend._kernels[launch.kernel].reference_op
        by_op.setdefault(op, []).append((launch, a))
    result = {}
    s = backend._stream
    for op, items in by_op.items():
        drv.call("begin", cu.cuStreamBeginCapture(
            s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for launch, a in items:
            fn, binary, _ = backend._functions[launch.kernel]
            grid = list(launch.grid) + [1] * (3 - len(launch.grid))
            drv.call("launch", cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2],
                                                 32 * binary.num_warps, 1, 1,
                                                 binary.shared_bytes, s, a.address, 0))
        graph_ = drv.call("end", cu.cuStreamEndCapture(s))
        exe = drv.call("inst", cu.cuGraphInstantiate(graph_, 0))
        for _ in range(3):
            drv.call("launch", cu.cuGraphLaunch(exe, s))
        drv.call("sync", cu.cuStreamSynchronize(s))
        t0 = time.perf_counter()
        for _ in range(reps):
            drv.call("launch", cu.cuGraphLaunch(exe, s))
        drv.call("sync", cu.cuStreamSynchronize(s))
        result[op] = {"ms": (time.perf_counter() - t0) / reps * 1e3, "launches": len(items)}
        cu.cuGraphExecDestroy(exe)
        cu.cuGraphDestroy(graph_)
    return result


_ = ctypes
