"""Ahead-of-time kernel compilation (CPU, runs in CI): every kernel variant compiles for
sm_90 with no GPU, the launch metadata lands in the manifest, and ``ignition export
--target sm_90`` writes the cubins as KERNEL_BINARY resources of a lint-clean core.
"""

from __future__ import annotations

import subprocess
import tempfile
import types
from pathlib import Path

import pytest
from helios_contract.schema import core_pb2
from helios_ignition.capture.programs import capture
from helios_ignition.kernels_aot import (
    KernelCompileError,
    compile_all,
    compile_each,
    compile_targets,
    missing_targets,
    parse_target,
    resource_id,
    variant_kernel,
)
from helios_ignition.kernels_triton import TRITON_KERNELS
from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES, tiny_core

from tests.ignition.export.tiny import (
    LLAMA_RECIPE,
    NAMESPACE,
    Frontend,
    run_export,
    write_checkpoint,
)

ELF_MAGIC = b"\x7fELF"


def _check_compiled(manifest, blobs, target="sm_90"):
    assert list(manifest.targets) == [target]
    assert len(blobs) == len(manifest.kernels)
    for k in manifest.kernels:
        (b,) = k.binaries
        assert b.target == target and b.resource_id == resource_id(target, k.id)
        # the Triton function's name (swiglu_linear is the linear kernel with SWIGLU=1)
        assert b.entry_name == TRITON_KERNELS[k.reference_op].__name__
        assert b.num_warps == k.constants["WARPS"]
        assert b.global_scratch_bytes == 0 and b.profile_scratch_bytes == 0
        assert blobs[b.resource_id][:4] == ELF_MAGIC
    shared = {k.id: k.binaries[0].shared_bytes for k in manifest.kernels}
    for g in manifest.graphs:
        for launch in g.launches:
            assert launch.shared_bytes == shared[launch.kernel]
            assert launch.block[0] == 32 * manifest_kernel(manifest, launch.kernel).binaries[0].num_warps
    assert missing_targets(manifest, target) == []
    assert len(missing_targets(manifest, "sm_80")) == len(manifest.kernels)


def manifest_kernel(manifest, kid):
    return next(k for k in manifest.kernels if k.id == kid)


def test_every_variant_compiles_for_sm90_f32_and_bf16():
    f32 = tiny_core().manifest
    bf16, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16")
    ops = {k.reference_op for k in f32.kernels}
    assert ops == {"embedding", "rmsnorm", "add_rmsnorm", "linear", "rope_kv_write",
                   "attention_decode_split", "attention_decode_merge", "attention_prefill",
                   "silu_mul", "swiglu_linear", "gather_last", "slot_gather", "slot_scatter",
                   "sample_chunks_mass", "sample_merge", "sample_race_top",
                   "sample_race_mass", "sample_race_pick", "token_logprobs"}
    assert any(k.constants.get("WBF16") for k in bf16.kernels)
    for manifest in (f32, bf16):
        blobs = compile_targets(manifest, ("sm_90",), workers=2)
        _check_compiled(manifest, blobs)


def test_legacy_sample_op_compiles_for_sm90():
    """`sample` (no logit bias), the sampler op of cores exported before `sample_biased`,
    still compiles: its entry is the same row body."""
    from helios_ignition.kernels_aot import compile_variant

    compiled = compile_variant("sample", {"BLOCK_V": 2048, "WARPS": 8}, "sm_90")
    assert compiled.entry_name == "sample" and compiled.binary[:4] == ELF_MAGIC


@pytest.mark.parametrize("rule", ["v1", "v2", "v3"])
def test_linear_rules_compile_for_sm90(rule):
    """Each multi-row linear rule (``HELIOS_LINEAR_RULE``) on 8B and SmolLM2 shapes,
    and the SWAP/STACK and XSPLIT=0 variants bench/gpu_linear_sweep.py times."""
    from helios_ignition.capture.launch import linear_constants
    from helios_ignition.kernels_aot import compile_all

    variants = {}
    for T, N, K in [(8, 28672, 4096), (64, 4096, 14336), (64, 128256, 4096), (1024, 6144, 4096),
                    (5, 100, 40), (32, 28672, 4096), (32, 6144, 4096), (32, 4096, 14336),
                    (64, 6144, 4096), (64, 576, 1536), (64, 960, 576)]:
        for wbf16 in (0, 1):
            c = dict(linear_constants(T, N, K, rule), WBF16=wbf16, K16=int(K % 16 == 0))
            variants[tuple(sorted(c.items()))] = c
    if rule == "v2":
        for extra in (dict(SWAP=1, STACK=1, BLOCK_T=16, BLOCK_N=64, BLOCK_K=128),
                      dict(XSPLIT=0, BLOCK_T=64, BLOCK_N=64), dict(PREFETCH=1, BLOCK_T=32)):
            c = dict(linear_constants(64, 4096, 4096, rule), WBF16=1, K16=1, **extra)
            variants[tuple(sorted(c.items()))] = c
    kernels = [variant_kernel(f"linear{i}", "linear", c) for i, c in enumerate(variants.values())]
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0
        assert ck.shared_bytes <= 227 * 1024


def test_unfused_capture_compiles_rope_and_kv_write(monkeypatch):
    """HELIOS_FUSE=0 records rope + kv_write and silu_mul + linear; they still compile."""
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "FUSE", False)
    manifest, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16")
    ops = {k.reference_op for k in manifest.kernels}
    assert {"rope", "kv_write", "silu_mul"} <= ops
    assert not ops & {"rope_kv_write", "swiglu_linear"}
    wanted = [k for k in manifest.kernels if k.reference_op in ("rope", "kv_write")]
    for ck in compile_all(wanted, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC


def test_linear_v3_picks_the_measured_winners():
    from helios_ignition.capture.launch import linear_constants

    def pick(T, N, K):
        c = linear_constants(T, N, K, "v3")
        return (c["BLOCK_T"], c["BLOCK_N"], c["BLOCK_K"], c["WARPS"], c.get("PREFETCH", 1),
                c.get("STACK", 0))

    assert pick(8, 6144, 4096) == (16, 32, 128, 4, 1, 0)  # v1
    assert pick(32, 28672, 4096) == (32, 64, 64, 4, 1, 1)
    assert pick(32, 6144, 4096) == (32, 64, 128, 8, 1, 1)
    assert pick(32, 4096, 14336) == (32, 32, 128, 8, 1, 1)
    assert pick(64, 128256, 4096) == (64, 128, 32, 4, 0, 0)
    assert pick(64, 4096, 14336) == (64, 32, 128, 8, 1, 1)
    assert pick(64, 6144, 4096) == (64, 32, 64, 4, 1, 1)
    assert pick(64, 960, 576) == (64, 16, 64, 4, 1, 0)  # v1
    assert pick(1024, 960, 576) == (64, 32, 64, 4, 1, 0)  # narrow prefill: v1
    assert pick(1024, 6144, 4096) == (128, 128, 32, 8, 0, 0)  # wide prefill tiles
    with pytest.raises(ValueError, match="unknown linear rule 'v9'; known: v1, v2, v3"):
        linear_constants(64, 64, 64, "v9")


def test_linear_fma_rows_and_spec():
    from helios_ignition.capture.launch import fuse_swiglu_linear, launch_config, linear_fma

    spec = "4,1024,4,8,1024"
    assert linear_fma(8, 960, spec) == dict(BLOCK_T=8, BLOCK_N=4, BLOCK_K=1024, WARPS=4,
                                            FMA=1)
    assert linear_fma(3, 576, spec)["BLOCK_T"] == 4
    assert linear_fma(1, 576, spec) is None and linear_fma(9, 576, spec) is None
    assert linear_fma(8, 1025, spec) is None  # wide matrices stay on the MMA tiles
    assert linear_fma(8, 576, "off") is None
    with pytest.raises(ValueError, match="HELIOS_LINEAR_FMA must be 'BLOCK_N,BLOCK_K,WARPS,"
                                         "MAX_ROWS,MAX_N' or 'off', got '4,512'"):
        linear_fma(8, 576, "4,512")
    wide = launch_config("linear", [8, 6144, 4096])
    assert "FMA" not in wide.constants and wide.constants["BLOCK_T"] == 16
    narrow = launch_config("linear", [8, 576, 1536])
    assert (narrow.grid, narrow.block, narrow.constants["FMA"]) == ((144, 1, 1), (128, 1, 1),
                                                                    1)
    assert fuse_swiglu_linear(1, 4096) and fuse_swiglu_linear(8, 576)
    # batch 1: fused up to FUSE_GEMV_MAX_K (SmolLM2's 1536), silu_mul + linear beyond (8B)
    assert fuse_swiglu_linear(1, 576, 1536) and not fuse_swiglu_linear(1, 4096, 14336)
    assert launch_config("swiglu_linear", [1, 4096, 14336]).constants["SWIGLU"] == 1
    assert not fuse_swiglu_linear(8, 4096) and not fuse_swiglu_linear(32, 576)


# The batch-1 GEMV specs tests/gpu/test_kernels.py runs (HELIOS_LINEAR_GEMV); the first
# is today's rule, the others the streamed forms bench/gpu_gemv_sweep.py times.
GEMV_SPECS = ("v1", "4,1024,2,0,0,0", "4,2048,4,2,0,0", "4,4096,8,4,1,1", "8,1024,4,8,1,0",
              "2,4096,4,0,1,0")


def test_gemv_specs_compile_for_sm90():
    """The GEMV path's code variants (plain, SwiGLU with the residual add, folded norm)
    under each spec: bf16 weights at the 8B K widths, f32 weights at an unaligned K."""
    from helios_ignition.capture.launch import gemv_constants

    variants = {}
    for spec in GEMV_SPECS[1:]:  # v1: what the tiny cores above capture
        for N, K in [(4096, 14336), (100, 40)]:
            for op, extra in (("linear", {}), ("swiglu_linear", dict(SWIGLU=1, ACC=1)),
                              ("rmsnorm_linear", {})):
                c = gemv_constants(N, K, spec)
                c.pop("PROGRAMS")
                c.update(BLOCK_T=1, WBF16=int(K % 16 == 0), K16=int(K % 16 == 0), **extra)
                variants[(op, tuple(sorted(c.items())))] = (op, c)
    kernels = [variant_kernel(f"gemv{i}", op, c) for i, (op, c) in enumerate(variants.values())]
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0


def test_gemv_constants_and_grid(monkeypatch):
    from helios_ignition.capture import launch

    assert launch.gemv_constants(6144, 4096, "v1") == dict(BLOCK_N=4, BLOCK_K=2048, WARPS=4,
                                                           PROGRAMS=1536)
    assert launch.gemv_constants(960, 576, "v1")["BLOCK_K"] == 1024
    assert launch.gemv_constants(6144, 4096, "4,4096,8,4,1,1") == dict(
        BLOCK_N=4, BLOCK_K=4096, WARPS=8, PROGRAMS=4 * launch.SMS, PERSIST=4, PRE=1, EVICT=1)
    # a persistent grid never has more programs than row tiles
    assert launch.gemv_constants(576, 576, "4,4096,8,8,0,0")["PROGRAMS"] == 144
    # v2 (the default): v1 but for long K (the 8B down projection as a plain linear)
    assert launch.gemv_constants(4096, 14336, "v2") == dict(BLOCK_N=4, BLOCK_K=1024, WARPS=2,
                                                            PROGRAMS=1024)
    assert launch.gemv_constants(4096, 4096, "v2") == launch.gemv_constants(4096, 4096, "v1")
    assert launch.gemv_constants(576, 1536, "v2") == launch.gemv_constants(576, 1536, "v1")
    assert launch.LINEAR_GEMV == "v2"
    with pytest.raises(ValueError, match="HELIOS_LINEAR_GEMV must be 'v1', 'v2' or 'BLOCK_N,"):
        launch.gemv_constants(64, 64, "4,2048")
    monkeypatch.setattr(launch, "LINEAR_GEMV", "8,1024,4,2,1,0")
    c = launch.launch_config("swiglu_linear_add", [1, 4096, 14336])
    assert c.grid == (2 * launch.SMS, 1, 1) and c.block == (128, 1, 1)
    assert c.constants == dict(BLOCK_T=1, BLOCK_N=8, BLOCK_K=1024, PERSIST=2, PRE=1, WBF16=0,
                               K16=1, SWIGLU=1, ACC=1, WARPS=4)


def test_linear_prefill_spec():
    from helios_ignition.capture.launch import _linear_prefill

    assert _linear_prefill(1024, 6144, 4096, "v1") == dict(BLOCK_T=64, BLOCK_N=32, BLOCK_K=64,
                                                           WARPS=4)
    assert _linear_prefill(1024, 6144, 4096, "128,128,64,8,3,0,1") == dict(
        BLOCK_T=128, BLOCK_N=128, BLOCK_K=64, WARPS=8, STAGES=3, PREFETCH=0, STACK=1)
    wide = dict(BLOCK_T=128, BLOCK_N=128, BLOCK_K=32, WARPS=8, STAGES=4, PREFETCH=0, STACK=0)
    assert _linear_prefill(1024, 6144, 4096, "auto") == wide
    assert _linear_prefill(256, 960, 576, "auto") == _linear_prefill(256, 960, 576, "v1")
    with pytest.raises(ValueError, match="HELIOS_LINEAR_PREFILL must be 'auto', 'v1' or"):
        _linear_prefill(1024, 6144, 4096, "128,128")


def test_compile_each_names_the_variant_that_fails():
    good = variant_kernel("ok", "slot_gather", {"BLOCK": 128, "WARPS": 4})
    bad = variant_kernel("bad", "slot_gather", {"WARPS": 4})  # BLOCK missing
    compiled, failed = compile_each([good, bad], "sm_90", workers=1)
    assert [ck.kernel_id for ck in compiled] == ["ok"]
    assert list(failed) == ["bad"] and "lack BLOCK" in failed["bad"]


def test_bad_target_is_rejected():
    with pytest.raises(ValueError, match="sm_<arch>"):
        parse_target("hopper")
    assert parse_target("sm_90") == 90
    assert issubclass(KernelCompileError, RuntimeError)


def test_export_with_target_writes_binaries(tmp_path, signing_key_pair, smollm2_checkpoint):
    from helios_tools.core import authorize, load_public_key, open_core
    from helios_tools.lint import lint_core

    ck = smollm2_checkpoint
    ckpt = write_checkpoint(tmp_path / "tiny-llama", Frontend(ck.tokenizer_json,
                                                              ck.chat_template))
    private, public = signing_key_pair
    out = tmp_path / "tiny.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", ckpt, "--key", private, "--namespace",
                        NAMESPACE, "--out", out, "--target", "sm_90")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    assert list(core.manifest.targets) == ["sm_90"]
    kinds = {rid: r.kind for rid, r in core.resources.items()}
    for k in core.manifest.kernels:
        (b,) = k.binaries
        assert kinds[b.resource_id] == core_pb2.RESOURCE_KIND_KERNEL_BINARY
        assert core.read_resource(b.resource_id)[:4] == ELF_MAGIC
    findings = lint_core(core, acceptance=NAMESPACE, require_targets=["sm_90"])
    assert [str(f) for f in findings if f.rule.startswith("kernel")] == []
    missing = lint_core(core, acceptance=NAMESPACE, require_targets=["sm_100"])
    assert any("sm_100" in str(f) for f in missing)


def test_cuda_backend_names_missing_target():
    """The startup error for a core without this GPU's target (no GPU needed)."""
    from helios_serve.runtime.cuda_backend import CudaBackend
    from helios_serve.runtime.errors import RuntimeLoadError

    manifest = tiny_core().manifest
    manifest.targets.append("sm_80")
    backend = object.__new__(CudaBackend)
    backend.target, backend.device_name = "sm_90", "NVIDIA H200"
    with pytest.raises(RuntimeLoadError, match=r"no kernel binaries for this GPU's target "
                                                r"sm_90 \(NVIDIA H200\); core targets: sm_80"):
        backend._check_binaries(manifest)


@pytest.mark.parametrize("rule", ["v1", "v2"])
def test_attention_rules_compile_for_sm90(rule):
    """Both split-context decode attention rules (``HELIOS_ATTN_RULE``) on the 8B, SmolLM2
    and tiny geometries at 1, 8 and 64 rows, and (v2) the GROUPED=2/0 block and warp
    variants bench/gpu_attention_sweep.py times."""
    from helios_ignition.capture.launch import (
        attention_merge_constants,
        attention_split_constants,
    )
    from helios_ignition.kernels_aot import compile_all

    variants = {}
    for H, KVH, HD in [(32, 8, 128), (9, 3, 64), (4, 2, 8)]:
        for B in (1, 8, 64):
            sc = attention_split_constants(B, H, KVH, HD, 128, 64, rule)
            variants[("attention_decode_split", tuple(sorted(sc.items())))] = sc
        mc = attention_merge_constants(HD, 32, rule)
        variants[("attention_decode_merge", tuple(sorted(mc.items())))] = mc
    if rule == "v2":
        for bn, warps in ((16, 2), (32, 4)):
            sc = dict(attention_split_constants(64, 32, 8, 128, 128, 64, rule), BLOCK_N=bn,
                      WARPS=warps)
            variants[("attention_decode_split", tuple(sorted(sc.items())))] = sc
    kernels = [variant_kernel(f"attn{i}", op, c) for i, ((op, _), c) in enumerate(variants.items())]
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0
        assert ck.shared_bytes <= 227 * 1024


def test_long_context_attention_compiles_for_sm90(monkeypatch):
    """Rule v3's split layouts (one tile per 64-position split: over the live splits
    (``LIVE``, about HELIOS_ATTN_LIVE programs) or, with that knob 0, several splits per
    program at 64 rows; GROUPED=3 for longer splits; the tuned kernel without SPP or
    LIVE) and the one-launch ``attention_decode_fused`` (fenced, acquire-release split
    counters) at the 8B, SmolLM2 and an odd-HD geometry."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.launch import (
        attention_fused_constants,
        attention_split_constants,
    )
    from helios_ignition.kernels_aot import compile_all

    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)  # the default, whatever the env says
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    variants = []
    for B, KVH, NS, live in [(256, 8, 32, 2), (64, 8, 128, 8), (1, 8, 32, 32),
                             (256, 3, 128, 6), (8, 3, 128, 128)]:
        c = attention_split_constants(B, KVH * 4, KVH, 128, NS, 64, "v3")
        assert c["GROUPED"] == 2 and c["LIVE"] == live and "SPP" not in c
        assert launch.launch_config("attention_decode_split", [B, 0, 16, KVH * 4, KVH, 128,
                                                               NS, 64, 0.1]).grid == (B, KVH,
                                                                                      live)
        variants.append(("attention_decode_split", c))
    for H, KVH, HD in [(32, 8, 128), (6, 2, 40)]:  # splits of 2 tiles (GROUPED=3)
        c = attention_split_constants(256, H, KVH, HD, 128, 128, "v3")
        assert c["GROUPED"] == 3 and c["LIVE"] == -(-4096 // (256 * KVH))
        variants.append(("attention_decode_split", c))
    assert "LIVE" not in attention_split_constants(64, 32, 8, 128, 128, 64, "v3", tuned=True)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 64)
    assert "LIVE" not in attention_split_constants(8, 32, 8, 128, 128, 64, "v3")
    monkeypatch.setattr(launch, "ATTN_LIVE", 0)
    for H, KVH, HD, spp in [(32, 8, 128, 2), (9, 3, 64, 4), (6, 2, 40, 4)]:
        walk = attention_split_constants(8, H, KVH, HD, 128, 128, "v3")  # splits of 2 tiles
        assert walk["GROUPED"] == 3 and walk["BLOCK_N"] == 64
        one = attention_split_constants(8, H, KVH, HD, 128, 64, "v3")
        assert one["GROUPED"] == 2 and "SPP" not in one
        wide = attention_split_constants(64, H, KVH, HD, 128, 64, "v3")
        assert wide["GROUPED"] == 2 and wide["SPP"] == spp
        few = attention_split_constants(64, H, KVH, HD, 32, 64, "v3")  # 2,048 positions
        assert few == one
        tuned = attention_split_constants(64, H, KVH, HD, 128, 64, "v3", tuned=True)
        assert tuned["GROUPED"] == 2 and "SPP" not in tuned
        variants += [("attention_decode_split", walk), ("attention_decode_split", wide),
                     ("attention_decode_fused", attention_fused_constants(H, KVH, HD, 64, 128))]
    kernels = [variant_kernel(f"long{i}", op, c) for i, (op, c) in enumerate(variants)]
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0
        assert ck.shared_bytes <= 227 * 1024


NEW_OPS = {"rmsnorm_linear", "linear_add", "swiglu_linear_add", "sample_chunks_mass",
           "sample_merge", "sample_race_top", "sample_race_mass", "sample_race_pick"}


def test_launch_choices_compile_for_sm90():
    """``capture(fold_layers=True, chunked_sampling=True)``: the folded ops (RMS prologue,
    residual epilogue) on the GEMV, FMA and MMA paths and the chunked sampler's kernels
    compile for sm_90, at the tiny model's shapes (f32 and bf16) and at SmolLM2's and
    Llama-3's (decode at 1, 8 and 64 rows; vocabularies of 49,152 and 128,256 ids)."""
    from helios_ignition.capture.launch import launch_config

    f32 = tiny_core(fold_layers=True, chunked_sampling=True).manifest
    bf16, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16", fold_layers=True,
                      chunked_sampling=True)
    kernels = [k for m in (f32, bf16) for k in m.kernels if k.reference_op in NEW_OPS]
    assert {k.reference_op for k in kernels} == NEW_OPS
    assert launch_config("linear_add", [1, 576, 576]).constants["ACC"] == 1
    variants = {}
    for T in (1, 8, 64):
        for op, N, K in (("rmsnorm_linear", 960, 576), ("rmsnorm_linear", 3072, 576),
                         ("linear_add", 576, 576), ("linear_add", 576, 1536),
                         ("swiglu_linear_add", 576, 1536)):
            if op == "swiglu_linear_add" and T == 64:
                continue  # no launch rule past the FMA path: silu_mul + linear_add
            scalars = [T, N, K, 1e-5] if op == "rmsnorm_linear" else [T, N, K]
            variants[(op, T, N, K)] = (op, dict(launch_config(op, scalars).constants, WBF16=1))
    for V in (49152, 128256):
        W, P = (V + 31) // 32, -(-V // 2048)
        for op, scalars in (("sample_chunks", [8, V, W, 2048, 64]), ("sample_merge", [8, V, P, 64]),
                            ("sample_chunks_nucleus", [8, V, W, 2048, 64]),
                            ("sample_merge_nucleus", [8, V, P, 2048, 64, 256]),
                            ("sample_chunks_wide", [8, V, W, 2048, 64]),
                            ("sample_race", [8, V, W, 2048, 128, 1]),
                            ("sample_pick", [8, V, P, 128, 1]),
                            ("sample_rest", [8, V, W]),
                            ("sample_chunks_mass", [8, V, W, 2048, 64]),
                            ("sample_race_top", [8, V, W, 2048, 4]),
                            ("sample_race_mass", [8, V, W, 2048, 4]),
                            ("sample_race_pick", [8, V, W, P, 4]),
                            ("sample_race_top", [256, V, W, 1024, 8]),
                            ("sample_race_mass", [256, V, W, 1024, 8]),
                            ("sample_race_pick", [256, V, W, 2 * P, 8])):
            variants[(op, V, tuple(scalars))] = (op, launch_config(op, scalars).constants)
    kernels += [variant_kernel(f"{op}{i}", op, c) for i, (op, c) in enumerate(variants.values())]
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0
        assert ck.shared_bytes <= 227 * 1024


@pytest.mark.parametrize("coupled", [True, False], ids=["coupled", "standard"])
def test_speculative_kernels_compile_for_sm90(coupled):
    """The draft, copied-candidate, candidate-mask, verify, confidence, allocation and
    row-packing kernels of a drafter core's speculative and prefix-limit programs, with
    the constants capture chose: coupled verification (new cores) and standard
    speculative sampling (the ops of cores exported before it, which must keep
    loading)."""
    from helios_ignition.kernels_aot import compile_variant

    manifest = tiny_core(0, speculative_widths=(1, 2, 4),
                         coupled_verification=coupled).manifest
    new = (("draft_sample_coupled", "spec_copy_drafts", "spec_verify_coupled") if coupled
           else ("draft_sample", "spec_copy_candidates", "spec_verify"))
    new += ("spec_confidence", "spec_allocate", "spec_pack_rows", "spec_candidate_masks")
    variants = [k for k in manifest.kernels if k.reference_op in new]
    assert {k.reference_op for k in variants} == set(new)
    ops = {k.reference_op for k in manifest.kernels}
    assert not ops & {"draft_sample", "spec_verify", "spec_copy_candidates",
                      "draft_sample_coupled", "spec_verify_coupled", "spec_copy_drafts"} - set(new)
    for k in variants:
        compiled = compile_variant(k.reference_op, dict(k.constants), "sm_90")
        assert compiled.entry_name == k.reference_op and compiled.binary[:4] == ELF_MAGIC


def test_restore_programs_compile_for_sm90():
    """The RESTORE programs' row_copy kernels (snapshots and the host tier) compile for the
    GPU: the tiny core above declares no tiers, so they are compiled on their own here."""
    from dataclasses import replace

    from helios_contract.schema import manifest_pb2 as mpb

    caps = replace(TINY_CAPACITIES, prepared_snapshots=4, host_tier=True, transfer_rows=4)
    manifest = tiny_core(caps=caps).manifest
    kernels = [k for k in manifest.kernels if k.reference_op == "row_copy"]
    assert kernels
    only = mpb.ExecutionManifest(kernels=kernels)
    blobs = compile_targets(only, ("sm_90",), workers=1)
    assert len(blobs) == len(kernels)
    assert all(blob[:4] == ELF_MAGIC for blob in blobs.values())


MMA_MATS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


def test_mma_rule_compiles_for_sm90():
    """The batched-decode GEMM path under the launch rule: linear_packed with every
    measured tile of the 8B matrices at 8-256 rows (bf16), the default tile with f32
    weights and as linear_partial, and split_bf16 / swiglu_split_bf16 / splitk_reduce
    [_add]."""
    from helios_ignition.capture.launch import launch_config, mma_plan

    class View:
        def __init__(self, dtype):
            self.shape, self.buffer = (), type("D", (), {"dtype": dtype})()

    variants = {}

    def add(op, scalars, views=(), rounded=False):
        c = launch_config(op, scalars, views, rounded=rounded)
        variants[(op, tuple(sorted(c.constants.items())))] = c.constants
        return c

    for T in (8, 16, 32, 64, 128, 256):
        for N, K in MMA_MATS:
            S = mma_plan(T, N, K)
            assert S is not None  # the default rule takes the packed path on every cell
            c = add("linear_packed", [T, N, K, S], [None, View("bf16")])
            assert c.grid[2] == S and c.constants["PACKED"] == 1 and c.constants["EVEN_K"] == 1
            add("splitk_reduce", [T, N, S])
        add("split_bf16", [T, 4096])
        # bf16 activations: the K split over round_bf16's hi | 0, one term (XSPLIT=0)
        c = add("linear_packed", [T, 4096, 14336, mma_plan(T, 4096, 14336)],
                [None, View("bf16")], rounded=True)
        assert c.constants["XSPLIT"] == 0
    add("swiglu_split_bf16", [8, 14336])
    assert add("round_bf16", [8, 4096]).constants["LO"] == 0
    assert add("swiglu_round_bf16", [8, 14336]).constants["SWIGLU"] == 1
    add("splitk_reduce_add", [8, 4096, 4])
    for op, dtype in (("linear_packed", "f32"), ("linear_partial", "bf16"),
                      ("linear_partial", "f32")):  # unmeasured shape: the default tile
        c = add(op, [24, 1000, 1000, 2], [None, View(dtype)])
        assert c.constants["EVEN_K"] == 0 and c.constants["K16"] == 0
    kernels = [variant_kernel(f"mma{i}", op, c) for i, ((op, _), c) in enumerate(variants.items())]
    assert len([k for k in kernels if k.reference_op == "linear_packed"]) == 12 + 4 + 1
    compiled, failed = compile_each(kernels, "sm_90")
    assert failed == {} and len(compiled) == len(kernels)


def test_prefill_tc_rule_and_compile_for_sm90(monkeypatch):
    """Prefill tile paths (issue 27): which products take them, and every TC=1 variant the
    rule or bench/gpu_prefill_gemm.py can record compiles for sm_90 with its TMA
    descriptors in global scratch."""
    from helios_ignition.capture import launch

    class _W:  # a bf16 weight view
        shape, buffer = (6144, 4096), type("D", (), {"dtype": "bf16"})()

    def cfg(op, s):
        views = [None, None, _W, None] if op == "rmsnorm_linear" else [None, _W, None]
        return launch.launch_config(op, s, views)

    assert not launch.prefill_tc(256, 6144, 4096)  # the batched-decode rows keep their path
    assert launch.prefill_tc(257, 6144, 4096) and not launch.prefill_tc(1024, 3072, 576)
    assert not launch.prefill_tc(1024, 4096, 4100)  # K not a multiple of 64
    lin = cfg("linear", [1024, 6144, 4096])
    assert lin.grid == (16 * 24, 1, 1) and lin.block == (128, 1, 1)
    assert {k: lin.constants[k] for k in ("TC", "TMA", "XSPLIT", "BLOCK_T", "BLOCK_N")} == dict(
        TC=1, TMA=1, XSPLIT=1, BLOCK_T=64, BLOCK_N=256)
    assert "TC" not in cfg("linear", [256, 6144, 4096]).constants
    assert "TC" not in cfg("rmsnorm_linear", [1024, 6144, 4096, 1e-5]).constants
    assert "TC" not in cfg("linear_add", [1024, 6144, 4096]).constants
    monkeypatch.setattr(launch, "PREFILL_PACKED", False)  # HELIOS_LINEAR_PREFILL_PACKED=0
    assert launch.mma_plan(1024, 6144, 4096) is None
    monkeypatch.setattr(launch, "PREFILL_PACKED", True)  # the default
    assert launch.mma_plan(1024, 6144, 4096) == 1 and launch.mma_plan(1024, 3072, 576) is None
    packed = cfg("linear_packed", [1024, 6144, 4096, 1])
    assert packed.constants["TC"] == 1 and packed.constants["PACKED"] == 1
    assert packed.grid == (8 * 6144 // packed.constants["BLOCK_N"], 1, 1)
    rounded = launch.launch_config("linear_packed", [1024, 6144, 4096, 1], [None, _W],
                                   rounded=True)
    assert rounded.constants == {**packed.constants, "XSPLIT": 0}

    base = dict(WBF16=1, K16=1, GROUP_T=8, EVEN_K=1, TC=1)
    variants = [("linear", dict(lin.constants, XSPLIT=x)) for x in (0, 1)]
    variants += [("rmsnorm_linear", dict(lin.constants, XSPLIT=1)),
                 ("linear_add", dict(lin.constants, XSPLIT=1, ACC=1))]
    for bt, bn, bk, warps, stages in launch.PREFILL_TILES:
        for xsplit in (0, 1):
            variants.append(("linear_packed", dict(base, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk,
                                                   WARPS=warps, STAGES=stages, XSPLIT=xsplit,
                                                   PACKED=1)))
    kernels = [variant_kernel(f"tc{i}", op, c) for i, (op, c) in enumerate(variants)]
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC
        assert ck.global_scratch_bytes > 0  # device-side tensor descriptors
        assert ck.shared_bytes <= 227 * 1024


def test_int4_forms_compile_for_sm90():
    """Each INT4 kernel and prologue (none, RMS norm, SwiGLU with the residual add) on
    each of its forms (one row: the word form; a few rows: the rows form; tl.dot tiles
    from INT4_MMA_ROWS) at SmolLM2 (group 64 and 128) and 8B shapes."""
    from helios_ignition.capture.launch import launch_config
    from helios_ignition.kernels_aot import compile_all
    from helios_tools.kernels.int4 import int4_group

    kernels = []
    for op in ("linear_int4", "rmsnorm_linear_int4", "swiglu_linear_add_int4"):
        for T, N, K in [(1, 960, 576), (1, 4096, 14336), (8, 4096, 4096), (20, 6144, 4096),
                        (64, 576, 1536), (256, 6144, 4096), (64, 4096, 14336)]:
            at = 3 if op.startswith("rmsnorm") else 2
            views = [types.SimpleNamespace(shape=(N, K // int4_group(K)),
                                           buffer=types.SimpleNamespace(dtype="f32"))] * 6
            scalars = [T, N, K, 1e-5] if op.startswith("rmsnorm") else [T, N, K]
            c = launch_config(op, scalars, views[:at + 1]).constants
            kernels.append(variant_kernel(f"{op}{len(kernels)}", op, c))
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0
        assert ck.shared_bytes <= 227 * 1024


@pytest.mark.parametrize("suffix", ["fp8kv", "bf16kv"])
def test_kv_cache_forms_compile_for_sm90(suffix):
    """Every e4m3 KV cache form (kernels_triton/kv_fp8.py: uint8 planes decoded through
    ``tl.float8e4nv``, the write's ``cvt.rn.satfinite``) and every bf16 form (the f32
    entry points over ``*bf16`` planes: widened loads, ``cvt.rn.bf16.f32`` stores) at its
    f32 op's launch constants: each split layout (GROUPED 0-3, the live-split layout, several splits per program), the
    fused and tuned decode, prefill and the windowed forms, at the 8B and SmolLM2
    geometries."""
    from helios_ignition.capture.launch import (
        attention_fused_constants,
        attention_split_constants,
        launch_config,
    )
    from helios_tools.kernels.kv_bf16 import KV_BF16_FORMS
    from helios_tools.kernels.kv_fp8 import KV_FP8_FORMS

    forms = {"fp8kv": KV_FP8_FORMS, "bf16kv": KV_BF16_FORMS}[suffix]
    variants = []
    for H, KVH, HD in [(32, 8, 128), (9, 3, 64)]:
        for B, NS, split, rule in [(1, 128, 64, "v3"), (64, 128, 64, "v3"), (8, 128, 128, "v3"),
                                   (8, 128, 64, "v1"), (64, 128, 64, "v1")]:
            variants.append(("attention_decode_split_" + suffix,
                             attention_split_constants(B, H, KVH, HD, NS, split, rule)))
        # rule v3 without the live-split layout (HELIOS_ATTN_LIVE=0): several splits a program
        live = attention_split_constants(64, H, KVH, HD, 128, 64, "v3")
        assert live.get("LIVE")
        variants.append(("attention_decode_split_" + suffix,
                         {**{k: v for k, v in live.items() if k != "LIVE"}, "SPP": 4}))
        variants.append(("attention_decode_split_tuned_" + suffix,
                         attention_split_constants(64, H, KVH, HD, 128, 64, "v3", tuned=True)))
        variants.append(("attention_decode_fused_" + suffix,
                         attention_fused_constants(H, KVH, HD, 128, 64)))
        for op, scalars in [("kv_write_" + suffix, [8, 2, 64, 16, H, KVH, HD]),
                            ("rope_kv_write_" + suffix, [8, 2, 64, 16, H, KVH, HD]),
                            ("attention_prefill_" + suffix, [64, 2, 64, 16, H, KVH, HD, 0.1]),
                            ("attention_prefill_window_" + suffix,
                             [64, 2, 64, 16, H, KVH, HD, 512, 0.1]),
                            ("attention_decode_window_" + suffix,
                             [8, 64, 16, H, KVH, HD, 512, 0.1]),
                            ("row_copy_" + suffix, [64, 16 * KVH * HD])]:
            variants.append((op, launch_config(op, scalars).constants))
    assert {op for op, _ in variants} == set(forms.values())
    kernels = [variant_kernel(f"{suffix}_{i}", op, c) for i, (op, c) in enumerate(variants)]
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0
        assert ck.shared_bytes <= 227 * 1024


def test_repacked_gguf_forms_compile_for_sm90():
    """Each INT4_MIN and INT8 kernel and prologue (none, RMS norm, SwiGLU with the residual
    add) on both paths (row GEMV, tl.dot tiles) at SmolLM2 and 8B shapes, groups of 32 and
    (INT8, Q6_K's) 16; and the INT8 embedding gather."""
    from helios_ignition.capture.launch import launch_config
    from helios_ignition.kernels_aot import compile_all

    kernels = []
    for op in ("linear_int4_min", "rmsnorm_linear_int4_min", "swiglu_linear_add_int4_min",
               "linear_int8", "rmsnorm_linear_int8", "swiglu_linear_add_int8"):
        for T, N, K in [(1, 960, 576), (64, 576, 1536), (256, 6144, 4096)]:
            group = 16 if op.endswith("int8") and K == 4096 else 32
            at = 3 if op.startswith("rmsnorm") else 2
            views = [types.SimpleNamespace(shape=(N, K // group),
                                           buffer=types.SimpleNamespace(dtype="f32"))] * 6
            scalars = [T, N, K, 1e-5] if op.startswith("rmsnorm") else [T, N, K]
            c = launch_config(op, scalars, views[:at + 1]).constants
            assert c["GROUP"] == group
            kernels.append(variant_kernel(f"{op}{len(kernels)}", op, c))
    table = [types.SimpleNamespace(shape=s, buffer=types.SimpleNamespace(dtype="f32"))
             for s in ((4,), (49152, 576), (49152, 18))]
    c = launch_config("embedding_int8", [4, 576], table).constants
    kernels.append(variant_kernel("embedding_int8", "embedding_int8", c))
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC and ck.global_scratch_bytes == 0
        assert ck.shared_bytes <= 227 * 1024


def test_fp8_gemv_forms_compile_for_sm90_without_spills():
    """The FP8 GEMV at a few rows (BLOCK_T token rows a program) and with EARLY (the first
    codes before the prologue pass) for each prologue at the 8B shapes: cubins for sm_90
    without a stack frame (register spills would cost the decode its bandwidth)."""
    from helios_ignition.capture import launch
    from helios_ignition.kernels_aot import compile_all

    kernels = []
    for op, N, K in [("linear_add_fp8", 4096, 4096), ("rmsnorm_linear_fp8", 6144, 4096),
                     ("swiglu_linear_add_fp8", 4096, 14336)]:
        for T in (8, 16):
            scalars = [T, N, K, 1e-5] if op.startswith("rmsnorm") else [T, N, K]
            c = launch.launch_config(op, scalars).constants
            kernels.append(variant_kernel(f"{op}{len(kernels)}", op, {**c, "EARLY": 1}))
    for ck in compile_all(kernels, ("sm_90",), workers=2):
        assert ck.binary[:4] == ELF_MAGIC
        assert _stack_bytes(ck.binary) == 0, ck.kernel_id


def _stack_bytes(cubin: bytes) -> int:
    """The STACK of a cubin by Triton's bundled cuobjdump (the frame spills go to)."""
    import triton  # optional (Linux x86-64), as in kernels_aot

    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    return max(int(w[6:]) for w in text.split() if w.startswith("STACK:"))
