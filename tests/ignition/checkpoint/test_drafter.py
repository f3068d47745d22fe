"""The drafter checkpoint format (helios_ignition/checkpoint/drafter.py) and the prompt
generator of scripts/train_drafter.py."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from helios_ignition.checkpoint import CheckpointNotFoundError, GeometryError, LlamaGeometry
from helios_ignition.checkpoint.drafter import (
    DrafterError,
    DrafterGeometry,
    random_drafter,
    read_drafter,
    write_drafter,
)

TARGET = LlamaGeometry(vocab_size=96, hidden_size=16, intermediate_size=24, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=4, rope_theta=10000.0,
                       rms_eps=1e-5, max_context=128, tie_word_embeddings=True)
REPO = Path(__file__).resolve().parents[3]


def _write(tmp_path, tensors=None, geometry=None, **kw) -> Path:
    geometry = geometry or DrafterGeometry.for_target(TARGET, 32)
    tensors = tensors if tensors is not None else random_drafter(TARGET, 32, seed=3,
                                                                 eos_token_ids=(90,))
    return write_drafter(tmp_path / "d.safetensors", geometry, tensors, **kw)


def test_round_trip_keeps_f32_exact_and_rounds_bf16(tmp_path):
    tensors = random_drafter(TARGET, 32, seed=3, eos_token_ids=(90,))
    d = read_drafter(_write(tmp_path, tensors, metadata={"seed": 3}), TARGET)
    assert d.geometry == DrafterGeometry(16, 4, 2, 4, 24, 32)
    assert d.metadata["seed"] == "3" and d.metadata["format"] == "helios-eagle-drafter-v1"
    assert d.vocab_map.dtype == np.int32 and d.vocab_map[-1] == 90
    assert list(d.vocab_map[:31]) == list(range(31))  # 31 low ids, then the EOS
    np.testing.assert_array_equal(d.tensors["final_norm"], tensors["final_norm"])  # f32
    np.testing.assert_array_equal(d.tensors["fc_feature"], np.eye(16, dtype=np.float32))
    w = d.tensors["wqkv"]
    assert w.dtype == np.float32 and not np.array_equal(w, tensors["wqkv"])
    np.testing.assert_allclose(w, tensors["wqkv"], rtol=2**-8, atol=0)  # bf16 rounding
    assert (w.view(np.uint32) & 0xFFFF).max() == 0  # exactly representable in bf16


def test_f32_matrices_round_trip_exactly(tmp_path):
    tensors = random_drafter(TARGET, 32, seed=4)
    d = read_drafter(_write(tmp_path, tensors, matrix_dtype="f32"), TARGET)
    for name in ("fc_embed", "wo", "w_down"):
        np.testing.assert_array_equal(d.tensors[name], tensors[name])


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no drafter file"):
        read_drafter(tmp_path / "absent.safetensors", TARGET)


def test_writer_rejects_a_misshapen_tensor(tmp_path):
    tensors = random_drafter(TARGET, 32, seed=3)
    tensors["wo"] = tensors["wo"][:, :8]
    with pytest.raises(DrafterError, match=r"'wo' has shape \(16, 8\), expected \(16, 16\)"):
        _write(tmp_path, tensors)


def _rewrite_header(path: Path, edit) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (n - len(blob)) if len(blob) <= n else b""
    assert len(blob) == n, "edit must not grow the header"
    path.write_bytes(raw[:8] + blob + raw[8 + n:])


def test_wrong_format_tag(tmp_path):
    path = _write(tmp_path)
    _rewrite_header(path, lambda h: h["__metadata__"].update(format="other-v9"))
    with pytest.raises(DrafterError, match="format is 'other-v9'"):
        read_drafter(path, TARGET)


def test_hidden_size_must_match_the_target(tmp_path):
    path = _write(tmp_path)
    other = LlamaGeometry(**{**TARGET.__dict__, "hidden_size": 32})
    with pytest.raises(GeometryError, match="hidden 16 / head_dim 4 differ"):
        read_drafter(path, other)


def test_vocab_map_outside_the_target_vocabulary(tmp_path):
    tensors = random_drafter(TARGET, 32, seed=3)
    tensors["vocab_map"] = np.arange(70, 102, dtype=np.int32)  # 96..101 >= vocab 96
    with pytest.raises(DrafterError, match=r"strictly ascending ids in \[0, 96\)"):
        read_drafter(_write(tmp_path, tensors), TARGET)


def test_vocab_map_must_be_strictly_ascending(tmp_path):
    tensors = random_drafter(TARGET, 32, seed=3)
    tensors["vocab_map"] = tensors["vocab_map"][::-1].copy()
    with pytest.raises(DrafterError, match="strictly ascending"):
        read_drafter(_write(tmp_path, tensors), TARGET)


def test_non_finite_weights(tmp_path):
    tensors = random_drafter(TARGET, 32, seed=3)
    tensors["w_gate_up"][3, 2] = np.nan
    with pytest.raises(DrafterError, match="'w_gate_up' holds non-finite values"):
        read_drafter(_write(tmp_path, tensors), TARGET)


def test_wrong_dtype(tmp_path):
    path = _write(tmp_path)
    _rewrite_header(path, lambda h: h["vocab_map"].update(dtype="F32"))
    with pytest.raises(DrafterError, match="'vocab_map' has dtype F32, expected one of I32"):
        read_drafter(path, TARGET)


def _prompts_module():
    spec = importlib.util.spec_from_file_location("drafter_prompts",
                                                  REPO / "scripts" / "drafter_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prompts_are_deterministic_varied_and_split_by_topic():
    m = _prompts_module()
    a = m.chat_prompts("train", 400, seed=7)
    assert a == m.chat_prompts("train", 400, seed=7)
    assert a != m.chat_prompts("train", 400, seed=8)
    texts = [p[-1]["content"] for p in a]
    assert len(set(texts)) > 300  # templates x topics x fillers: few repeats
    assert sum(len(p) > 1 for p in a) > 40  # system prompts and earlier turns occur
    assert set(m.TRAIN_TOPICS).isdisjoint(m.EVAL_TOPICS)
    assert len(m.EVAL_TOPICS) >= 10 and set(m.TOPICS) == set(m.TRAIN_TOPICS) | set(m.EVAL_TOPICS)
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        m.chat_prompts("test", 1)
