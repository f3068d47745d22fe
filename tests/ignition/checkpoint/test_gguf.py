"""The real SmolLM2 GGUF: geometry, names, Q/K un-permutation, tokenizer and template."""

from __future__ import annotations

import numpy as np
import pytest
from helios_ignition.checkpoint import (
    SMOLLM2_135M,
    CheckpointFormatError,
    MissingTensorError,
    load_gguf,
    render_chat,
    unpermute_qk,
)


def test_geometry_exact(smollm2):
    g = smollm2.geometry
    assert g.num_layers == 30
    assert g.hidden_size == 576
    assert g.intermediate_size == 1536
    assert g.num_heads == 9
    assert g.num_kv_heads == 3
    assert g.head_dim == 64
    assert g.rope_theta == 100000.0
    assert g.rms_eps == 1e-5
    assert g.vocab_size == 49152
    assert g.max_context == 8192
    assert g.tie_word_embeddings is True
    assert g.rope_scaling is None
    assert g == SMOLLM2_135M


def test_tensor_names_and_shapes(smollm2):
    names = smollm2.tensor_names
    assert len(names) == 1 + 30 * 9 + 1  # embed, layers, final norm; head tied
    assert names[0] == "model.embed_tokens.weight"
    assert "lm_head.weight" not in names
    assert smollm2.tensor("model.layers.0.self_attn.q_proj.weight").shape == (576, 576)
    assert smollm2.tensor("model.layers.29.self_attn.k_proj.weight").shape == (192, 576)
    assert smollm2.tensor("model.layers.3.mlp.down_proj.weight").shape == (576, 1536)
    norm = smollm2.tensor("model.norm.weight")
    assert norm.shape == (576,) and norm.dtype == np.float32
    assert smollm2.lm_head().shape == (49152, 576)


def test_unknown_tensor_names_file_and_tensor(smollm2):
    with pytest.raises(MissingTensorError) as info:
        smollm2.tensor("model.layers.30.mlp.up_proj.weight")
    assert info.value.tensor == "model.layers.30.mlp.up_proj.weight"
    assert smollm2.source in str(info.value)


@pytest.mark.parametrize("keep", [100, 1 << 20])
def test_a_cut_gguf_is_named_truncated_or_corrupt(smollm2, tmp_path, keep):
    """The reader's own error ("cannot reshape array of size 66784 into shape (576,360)")
    named no cause."""
    cut = tmp_path / "cut.gguf"
    with open(smollm2.source, "rb") as f:
        cut.write_bytes(f.read(keep))
    with pytest.raises(CheckpointFormatError) as info:
        load_gguf(cut)
    assert str(info.value).startswith(f"{cut}: not a readable GGUF file (truncated or "
                                      "corrupt): "), str(info.value)


def test_qk_are_unpermuted(smollm2):
    import gguf

    reader = gguf.GGUFReader(smollm2.source)
    raw = {t.name: t for t in reader.tensors}
    for gguf_name, hf_name, heads in (
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 9),
        ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", 3),
    ):
        t = raw[gguf_name]
        stored = gguf.quants.dequantize(t.data, t.tensor_type)
        ours = smollm2.tensor(hf_name)
        assert np.array_equal(ours, unpermute_qk(stored, heads))
        # HF row h*64 + i (first half) is GGUF row h*64 + 2i.
        assert np.array_equal(ours[64 + 5], stored[64 + 10])
        assert np.array_equal(ours[64 + 32 + 5], stored[64 + 11])
    t = raw["blk.0.attn_v.weight"]
    v = gguf.quants.dequantize(t.data, t.tensor_type)
    assert np.array_equal(smollm2.tensor("model.layers.0.self_attn.v_proj.weight"), v)


def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(0)
    heads, hd, d = 3, 8, 5
    hf = rng.standard_normal((heads * hd, d)).astype(np.float32)
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    permuted = hf.reshape(heads, 2, hd // 2, d).swapaxes(1, 2).reshape(hf.shape)
    assert np.array_equal(unpermute_qk(permuted, heads), hf)


def test_special_tokens(smollm2, smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.token_to_id("<|im_start|>") == 1
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.token_to_id("<|endoftext|>") == 0
    assert smollm2.bos_token_id == 1
    assert smollm2.eos_token_ids == (2,)
    assert smollm2.special_tokens["eos_token"] == "<|im_end|>"
    assert smollm2.special_tokens["bos_token"] == "<|im_start|>"
    assert tok.get_vocab_size() == 49152
    # Control tokens are atomic even inside text, and skipped when decoding.
    ids = tok.encode("a<|im_end|>b", add_special_tokens=False).ids
    assert 2 in ids
    assert tok.decode(ids) == "ab"


def test_template_is_byte_identical_to_transformers(smollm2, goldens):
    for prompt in goldens["prompts"]:
        text = render_chat(
            smollm2.chat_template, prompt["messages"], add_generation_prompt=True,
            **smollm2.special_tokens,
        )
        assert text == prompt["rendered"], prompt["name"]


def test_tokenizer_ids_equal_transformers(smollm2_tokenizer, goldens):
    for prompt in goldens["prompts"]:
        ids = smollm2_tokenizer.encode(prompt["rendered"], add_special_tokens=False).ids
        assert ids == prompt["prompt_ids"], prompt["name"]


def test_decode_matches_transformers(smollm2_tokenizer, goldens):
    for prompt in goldens["prompts"]:
        text = smollm2_tokenizer.decode(prompt["greedy_ids"], skip_special_tokens=False)
        assert text == prompt["greedy_text"], prompt["name"]


def test_digits_are_split(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("12345", add_special_tokens=False).ids
    assert len(ids) == 5


def test_blocks_are_read_as_stored_with_q_rows_unpermuted(smollm2):
    """`blocks` hands a quantized tensor's GGUF blocks over as they are, rows in
    `tensor`'s (HF) order: decoding them gives exactly `tensor`."""
    import gguf

    assert smollm2.block_type("model.embed_tokens.weight") == "Q8_0"
    name = "model.layers.0.self_attn.q_proj.weight"
    kind, raw = smollm2.blocks(name)
    assert (kind, raw.dtype, raw.shape) == ("Q4_1", np.uint8, (576, 576 // 32 * 20))
    decoded = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1)
    assert np.array_equal(decoded, smollm2.tensor(name))


def test_plain_float_tensors_have_no_blocks(smollm2):
    assert smollm2.block_type("model.norm.weight") is None
    with pytest.raises(MissingTensorError, match=r"model.norm.weight.*not stored in GGUF "
                                                 r"blocks"):
        smollm2.blocks("model.norm.weight")
    with pytest.raises(MissingTensorError):
        smollm2.block_type("model.layers.99.mlp.up_proj.weight")
