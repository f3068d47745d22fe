"""GGUF loader on tiny files written with `gguf.GGUFWriter`: permutation, geometry, errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from helios_ignition.checkpoint import (
    CheckpointFormatError,
    GeometryError,
    LlamaGeometry,
    MissingChatTemplateError,
    MissingTensorError,
    MissingTokenizerError,
    TensorShapeError,
    load_checkpoint,
    load_gguf,
)
from helios_tools.frontend_assets import load_tokenizer

GEOMETRY = LlamaGeometry(
    vocab_size=261, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
    num_kv_heads=1, head_dim=8, rope_theta=10000.0, rms_eps=1e-6, max_context=64,
    tie_word_embeddings=False,
    rope_scaling={"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 32},
)
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"

_HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, suffix = hf.split(".", 3)
    return f"blk.{i}.{_HF_TO_GGUF[suffix]}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF half-split -> interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def _byte_tokens() -> list[str]:
    # GPT-2 bytes_to_unicode alphabet, so every byte string is encodable.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_gguf(path: Path, *, arch="llama", template=TEMPLATE, tokenizer=True,
                    skip=(), override=None, pre=None) -> dict[str, np.ndarray]:
    """Write a tiny llama GGUF (F32); returns the HF-layout tensors it encodes."""
    rng = np.random.default_rng(0)
    hf = {n: rng.standard_normal(s).astype(np.float32) for n, s in
          GEOMETRY.tensor_shapes().items()}
    hf.update(override or {})
    w = gguf.GGUFWriter(str(path), arch)
    g = GEOMETRY
    w.add_block_count(g.num_layers)
    w.add_context_length(g.max_context)
    w.add_embedding_length(g.hidden_size)
    w.add_feed_forward_length(g.intermediate_size)
    w.add_head_count(g.num_heads)
    w.add_head_count_kv(g.num_kv_heads)
    w.add_rope_freq_base(g.rope_theta)
    w.add_layer_norm_rms_eps(g.rms_eps)
    w.add_rope_dimension_count(g.head_dim)
    w.add_vocab_size(g.vocab_size)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_rope_scaling_orig_ctx_len(32)
    if tokenizer:
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_tokens()
        tokens += ["he", "hel"][: g.vocab_size - len(tokens)]
        w.add_tokenizer_model("gpt2")
        if pre is not None:
            w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
        w.add_token_merges(["h e", "he l"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    if template is not None:
        w.add_chat_template(template)
    for name, array in hf.items():
        if name in skip:
            continue
        if name.endswith("q_proj.weight"):
            array = _permute(array, g.num_heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, g.num_kv_heads)
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def test_round_trip_undoes_permutation(tmp_path):
    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path)
    ck = load_checkpoint(path)
    assert ck.geometry == dataclasses.replace(
        GEOMETRY, rope_scaling={"rope_type": "linear", "factor": 2.0,
                                "original_max_position_embeddings": 32})
    assert ck.tensor_names[-1] == "lm_head.weight"
    for name, array in ck.iter_tensors():
        assert np.array_equal(array, hf[name]), name
    tok = load_tokenizer(ck.tokenizer_json)
    assert tok.encode("<|im_start|>hel<|im_end|>", add_special_tokens=False).ids == [1, 260, 2]
    assert ck.chat_template == TEMPLATE
    assert ck.eos_token_ids == (2,) and ck.bos_token_id == 1


def test_missing_tensor_names_file_and_tensor(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, skip={"model.layers.1.mlp.gate_proj.weight"})
    with pytest.raises(MissingTensorError) as info:
        load_gguf(path)
    assert info.value.tensor == "model.layers.1.mlp.gate_proj.weight"
    assert str(path) in str(info.value)


def test_shape_mismatch_names_both_shapes(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, override={"model.layers.0.mlp.up_proj.weight": np.ones((30, 16),
                                                                                np.float32)})
    ck = load_gguf(path)
    with pytest.raises(TensorShapeError) as info:
        ck.tensor("model.layers.0.mlp.up_proj.weight")
    assert (info.value.expected, info.value.actual) == ((32, 16), (30, 16))
    assert "(32, 16)" in str(info.value) and "(30, 16)" in str(info.value)


def test_missing_template_and_tokenizer(tmp_path):
    write_tiny_gguf(tmp_path / "a.gguf", template=None)
    with pytest.raises(MissingChatTemplateError, match="a.gguf"):
        load_gguf(tmp_path / "a.gguf")
    write_tiny_gguf(tmp_path / "b.gguf", tokenizer=False)
    with pytest.raises(MissingTokenizerError, match="b.gguf"):
        load_gguf(tmp_path / "b.gguf")


def test_wrong_architecture(tmp_path):
    write_tiny_gguf(tmp_path / "c.gguf", arch="qwen2")
    with pytest.raises(GeometryError, match="qwen2"):
        load_gguf(tmp_path / "c.gguf")


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    write_tiny_gguf(tmp_path / "d.gguf", pre="qwen2")
    with pytest.raises(MissingTokenizerError, match="qwen2.*known"):
        load_gguf(tmp_path / "d.gguf")


@pytest.mark.parametrize(("pre", "digit_pieces"), [("smollm", 5), ("llama-bpe", 2),
                                                    ("gpt2", 1)])
def test_pre_tokenizer_table(tmp_path, pre, digit_pieces):
    write_tiny_gguf(tmp_path / "e.gguf", pre=pre)
    tok = load_tokenizer(load_gguf(tmp_path / "e.gguf").tokenizer_json)
    pieces = tok.pre_tokenizer.pre_tokenize_str("12345")
    assert len(pieces) == digit_pieces


def test_tensors_mapping_view(tmp_path):
    path = tmp_path / "f.gguf"
    hf = write_tiny_gguf(path)
    ck = load_gguf(path)
    assert len(ck.tensors) == len(hf)
    assert "model.norm.weight" in ck.tensors and "nope" not in ck.tensors
    assert np.array_equal(ck.tensors["model.layers.1.self_attn.k_proj.weight"],
                          hf["model.layers.1.self_attn.k_proj.weight"])
    with pytest.raises(KeyError):
        ck.tensors["nope"]


def test_truncated_gguf_is_a_format_error(tmp_path):
    path = tmp_path / "g.gguf"
    write_tiny_gguf(path)
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(CheckpointFormatError, match="g.gguf"):
        load_gguf(path)
