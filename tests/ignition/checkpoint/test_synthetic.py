"""Seeded random checkpoints: real shapes, lazy, deterministic, never zeros."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from helios_ignition.checkpoint import (
    LLAMA_31_8B,
    SMOLLM2_135M,
    CheckpointError,
    random_checkpoint,
)
from helios_ignition.checkpoint.synthetic import synthetic_tensor
from helios_tools.frontend_assets import load_tokenizer


def test_smollm2_geometry_all_shapes_and_real_tokenizer(smollm2):
    ck = random_checkpoint("smollm2-135m", seed=7)
    assert ck.geometry == SMOLLM2_135M
    assert ck.tensor_names == smollm2.tensor_names
    for name, array in ck.iter_tensors():
        assert array.shape == SMOLLM2_135M.tensor_shapes()[name]
        assert array.dtype == np.float32
    assert ck.tokenizer_json == smollm2.tokenizer_json
    assert ck.chat_template == smollm2.chat_template
    assert ck.eos_token_ids == (2,)


def test_llama8b_geometry_is_lazy():
    start = time.perf_counter()
    ck = random_checkpoint("llama-3.1-8b", seed=0)
    g = ck.geometry
    assert g == LLAMA_31_8B
    assert (g.vocab_size, g.hidden_size, g.intermediate_size) == (128256, 4096, 14336)
    assert (g.num_layers, g.num_heads, g.num_kv_heads, g.head_dim) == (32, 32, 8, 128)
    assert (g.rope_theta, g.rms_eps, g.tie_word_embeddings) == (500000.0, 1e-5, False)
    assert g.rope_scaling == {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    }
    assert len(ck.tensor_names) == 1 + 32 * 9 + 2
    assert ck.tensor_names[-1] == "lm_head.weight"
    assert 8.0e9 < g.parameter_count() < 8.1e9
    k = ck.tensor("model.layers.31.self_attn.k_proj.weight")
    norm = ck.tensor("model.layers.0.input_layernorm.weight")
    assert k.shape == (1024, 4096) and norm.shape == (4096,)
    assert ck.expected_shape("lm_head.weight") == (128256, 4096)
    assert ck.expected_shape("model.layers.5.mlp.down_proj.weight") == (4096, 14336)
    assert time.perf_counter() - start < 30


def test_llama8b_tokenizer_covers_vocab():
    ck = random_checkpoint("llama-3.1-8b", seed=0)
    tok = load_tokenizer(ck.tokenizer_json)
    assert tok.get_vocab_size() == 128256
    assert tok.id_to_token(128255) == "<|filler_128255|>"
    assert tok.token_to_id("<|im_end|>") == 2
    small = load_tokenizer(random_checkpoint("smollm2-135m").tokenizer_json)
    text = "<|im_start|>user\nHello, world 2024!<|im_end|>\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == small.encode(text, add_special_tokens=False).ids
    assert max(ids) < 49152


def test_deterministic_per_seed_and_nonzero():
    name = "model.layers.2.self_attn.q_proj.weight"
    a = random_checkpoint("smollm2-135m", seed=1).tensor(name)
    b = random_checkpoint("smollm2-135m", seed=1).tensor(name)
    c = random_checkpoint("smollm2-135m", seed=2).tensor(name)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # float32 ziggurat draws an exact 0.0 about once in 2**19 samples; none is all-zero.
    assert np.count_nonzero(a) >= a.size - 8
    assert 0.018 < float(a.std()) < 0.022
    other = random_checkpoint("smollm2-135m", seed=1).tensor("model.layers.2.self_attn.k_proj.weight")
    assert not np.array_equal(a[: other.shape[0]], other)


def test_norms_are_near_one_but_not_constant():
    norm = random_checkpoint("smollm2-135m", seed=3).tensor("model.layers.0.input_layernorm.weight")
    assert np.all(np.abs(norm - 1.0) < 0.2)
    assert float(norm.std()) > 0.01


def test_order_independent():
    name = "model.layers.4.mlp.up_proj.weight"
    first = random_checkpoint("smollm2-135m", seed=5)
    second = random_checkpoint("smollm2-135m", seed=5)
    second.tensor("model.embed_tokens.weight")
    assert np.array_equal(first.tensor(name), second.tensor(name))


def test_unknown_geometry_lists_known():
    with pytest.raises(CheckpointError, match="llama-3.1-8b.*smollm2-135m"):
        random_checkpoint("gpt-5", seed=0)


def test_read_ahead_returns_each_tensor_whatever_the_order():
    # The read-ahead pool draws later tensors early; a read out of canonical order (a
    # skipped-ahead tensor, one behind the cursor, one read twice) gets the same values
    # as drawing that tensor alone.
    ck = random_checkpoint("smollm2-135m", seed=3)
    names = ck.tensor_names
    geometry = ck.geometry
    order = [names[0], names[5], names[1], names[2], names[2], names[-1], names[3]]
    for name in order:
        expected = synthetic_tensor(geometry, 3, names.index(name), name)
        np.testing.assert_array_equal(ck.tensor(name), expected)


def test_the_frontend_file_stands_in_for_the_gguf(smollm2, tmp_path, monkeypatch):
    """HELIOS_SYNTHETIC_FRONTEND: the frontend JSON (its pinned sha256) gives the same
    tokenizer, template, BOS/EOS and special tokens as the GGUF; an altered file is
    refused by its digest."""
    from helios_ignition.checkpoint import ChecksumMismatchError
    from helios_ignition.checkpoint import synthetic as syn

    data = syn.frontend_json()
    assert hashlib.sha256(data).hexdigest() == syn.SMOLLM2_FRONTEND_SHA256
    path = tmp_path / "frontend.json"
    path.write_bytes(data)
    via_gguf = random_checkpoint("llama-3.1-8b", seed=0)
    monkeypatch.setenv(syn.FRONTEND_ENV, str(path))
    syn._smollm2_frontend.cache_clear()
    try:
        via_file = random_checkpoint("llama-3.1-8b", seed=0)
        assert (via_file.tokenizer_json, via_file.chat_template, via_file.bos_token_id,
                via_file.eos_token_ids, via_file.special_tokens) == (
            via_gguf.tokenizer_json, via_gguf.chat_template, via_gguf.bos_token_id,
            via_gguf.eos_token_ids, via_gguf.special_tokens)
        altered = tmp_path / "altered.json"  # (a verified path is cached per process)
        altered.write_bytes(data.replace(b"<|im_end|>", b"<|im_stop|>", 1))
        monkeypatch.setenv(syn.FRONTEND_ENV, str(altered))
        syn._smollm2_frontend.cache_clear()
        with pytest.raises(ChecksumMismatchError):
            random_checkpoint("llama-3.1-8b", seed=0)
    finally:
        syn._smollm2_frontend.cache_clear()
