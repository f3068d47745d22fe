"""Safetensors directory loader on a 2-layer slice of the real SmolLM2 weights."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from helios_ignition.checkpoint import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    GeometryError,
    MissingChatTemplateError,
    MissingTensorError,
    MissingTokenizerError,
    TensorShapeError,
    UnsupportedTensorError,
    bf16_to_float32,
    load_checkpoint,
    load_safetensors_dir,
)
from safetensors.numpy import save_file

LAYERS = 2


def _config(geometry) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": geometry.vocab_size,
        "hidden_size": geometry.hidden_size,
        "intermediate_size": geometry.intermediate_size,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": geometry.num_heads,
        "num_key_value_heads": geometry.num_kv_heads,
        "head_dim": geometry.head_dim,
        "rope_theta": geometry.rope_theta,
        "rms_norm_eps": geometry.rms_eps,
        "max_position_embeddings": geometry.max_context,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_scaling": None,
    }


def write_bf16_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write float32 arrays as BF16 (truncated) safetensors by hand: NumPy has no bf16."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        bits = (np.ascontiguousarray(array, np.float32).view(np.uint32) >> 16).astype("<u2")
        blob = bits.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture(scope="module")
def reference(smollm2) -> dict[str, np.ndarray]:
    geometry = dataclasses.replace(smollm2.geometry, num_layers=LAYERS)
    return {name: smollm2.tensor(name) for name in geometry.tensor_shapes()}


def make_dir(tmp: Path, smollm2, reference, *, tokenizer=True, template="config",
             tensors=None, sharded=False) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(_config(smollm2.geometry)))
    tensors = dict(reference if tensors is None else tensors)
    if sharded:
        names = list(tensors)
        save_file({n: tensors[n] for n in names[:5]}, str(tmp / "model-00001-of-00002.safetensors"))
        save_file({n: tensors[n] for n in names[5:]}, str(tmp / "model-00002-of-00002.safetensors"))
    else:
        save_file(tensors, str(tmp / "model.safetensors"))
    if tokenizer:
        (tmp / "tokenizer.json").write_text(smollm2.tokenizer_json)
    tok_config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}}
    if template == "config":
        tok_config["chat_template"] = smollm2.chat_template
    elif template == "jinja":
        (tmp / "chat_template.jinja").write_text(smollm2.chat_template)
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return tmp


def test_round_trip_f32(tmp_path, smollm2, reference):
    ck = load_safetensors_dir(make_dir(tmp_path / "m", smollm2, reference))
    assert ck.geometry == dataclasses.replace(smollm2.geometry, num_layers=LAYERS)
    assert ck.tensor_names == tuple(reference)
    for name, array in ck.iter_tensors():
        assert array.dtype == np.float32
        assert np.array_equal(array, reference[name]), name
    assert ck.chat_template == smollm2.chat_template
    assert ck.tokenizer_json == smollm2.tokenizer_json
    assert ck.eos_token_ids == (2,) and ck.bos_token_id == 1
    assert ck.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}


def test_sharded_f16_and_jinja_template(tmp_path, smollm2, reference):
    half = {n: a.astype(np.float16) for n, a in reference.items()}
    folder = make_dir(tmp_path / "m", smollm2, reference, tensors=half, sharded=True,
                      template="jinja")
    ck = load_checkpoint(folder)
    q = ck.tensor("model.layers.1.self_attn.q_proj.weight")
    assert q.dtype == np.float32
    assert np.array_equal(q, half["model.layers.1.self_attn.q_proj.weight"].astype(np.float32))
    assert ck.chat_template == smollm2.chat_template


def test_bf16_is_widened_exactly(tmp_path, smollm2, reference):
    folder = make_dir(tmp_path / "m", smollm2, reference, tensors={})
    (folder / "model.safetensors").unlink()
    write_bf16_safetensors(folder / "model.safetensors", reference)
    ck = load_safetensors_dir(folder)
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.gate_proj.weight",
                 "model.norm.weight"):
        got = ck.tensor(name)
        want = (reference[name].view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        assert got.dtype == np.float32
        assert np.array_equal(got, want), name
        assert np.abs(got - reference[name]).max() <= np.abs(reference[name]).max() * 2**-7


def test_bf16_helper_known_values():
    bits = np.array([0x3F80, 0x4000, 0xBF80, 0x0000, 0x7F80], dtype=np.uint16)
    assert bf16_to_float32(bits).tolist() == [1.0, 2.0, -1.0, 0.0, float("inf")]


def test_missing_tokenizer(tmp_path, smollm2, reference):
    folder = make_dir(tmp_path / "m", smollm2, reference, tokenizer=False)
    with pytest.raises(MissingTokenizerError, match="tokenizer.json"):
        load_safetensors_dir(folder)


def test_missing_chat_template(tmp_path, smollm2, reference):
    folder = make_dir(tmp_path / "m", smollm2, reference, template=None)
    with pytest.raises(MissingChatTemplateError) as info:
        load_safetensors_dir(folder)
    assert str(folder) in str(info.value)


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path, smollm2, reference):
    bad = dict(reference)
    name = "model.layers.1.self_attn.k_proj.weight"
    bad[name] = np.ones((190, 576), np.float32)
    ck = load_safetensors_dir(make_dir(tmp_path / "m", smollm2, reference, tensors=bad))
    with pytest.raises(TensorShapeError) as info:
        ck.tensor(name)
    err = info.value
    assert (err.tensor, err.expected, err.actual) == (name, (192, 576), (190, 576))
    assert name in str(err) and "(192, 576)" in str(err) and "(190, 576)" in str(err)
    assert str(tmp_path / "m") in str(err)
    # Other tensors still load: the error is per tensor.
    assert ck.tensor("model.layers.1.self_attn.v_proj.weight").shape == (192, 576)


def test_missing_tensor_named(tmp_path, smollm2, reference):
    partial = {k: v for k, v in reference.items() if k != "model.layers.1.mlp.up_proj.weight"}
    folder = make_dir(tmp_path / "m", smollm2, reference, tensors=partial)
    with pytest.raises(MissingTensorError) as info:
        load_safetensors_dir(folder)
    assert info.value.tensor == "model.layers.1.mlp.up_proj.weight"
    assert str(folder) in str(info.value)


def test_integer_tensor_rejected(tmp_path, smollm2, reference):
    bad = dict(reference)
    bad["model.norm.weight"] = np.ones(576, np.int32)
    ck = load_safetensors_dir(make_dir(tmp_path / "m", smollm2, reference, tensors=bad))
    with pytest.raises(UnsupportedTensorError, match="model.norm.weight"):
        ck.tensor("model.norm.weight")


def test_bad_directories(tmp_path, smollm2, reference):
    with pytest.raises(CheckpointNotFoundError):
        load_safetensors_dir(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="config.json"):
        load_safetensors_dir(tmp_path / "empty")
    folder = make_dir(tmp_path / "m", smollm2, reference)
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(GeometryError, match="hidden_size"):
        load_safetensors_dir(folder)
    with pytest.raises(CheckpointNotFoundError):
        load_checkpoint(tmp_path / "model.bin")


@pytest.mark.parametrize(("change", "message"), [
    # a string where a list is expected once read as its characters ("architecture 'Q'")
    ({"architectures": "Qwen3ForCausalLM"},
     "architectures must be a list of strings, not 'Qwen3ForCausalLM'"),
    ({"architectures": [7]}, r"architectures must be a list of strings, not \[7\]"),
    # once int("576") and int(4.5) == 4: coerced, not refused
    ({"hidden_size": "576"}, "hidden_size must be a positive integer, not '576'"),
    ({"num_attention_heads": 4.5}, "num_attention_heads must be a positive integer, not 4.5"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be a positive integer, not True"),
    ({"vocab_size": -1}, "vocab_size must be a positive integer, not -1"),
    # once an internal error (exit 3): float("x") raised past the loader
    ({"rms_norm_eps": "x"}, "rms_norm_eps must be a positive number, not 'x'"),
    ({"rope_theta": 0}, "rope_theta must be a positive number, not 0"),
    ({"intermediate_size": None}, "a value is not a number: int.. argument must be"),
])
def test_config_values_of_the_wrong_type_are_named(tmp_path, smollm2, reference, change,
                                                    message):
    folder = make_dir(tmp_path / "m", smollm2, reference)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(GeometryError, match=message) as caught:
        load_safetensors_dir(folder)
    assert str(caught.value).startswith(f"{folder}/config.json: ")


@pytest.mark.parametrize("broken", ["config.json", "tokenizer.json", "tokenizer_config.json"])
def test_malformed_json_names_the_file(tmp_path, smollm2, reference, broken):
    folder = make_dir(tmp_path / "m", smollm2, reference)
    (folder / broken).write_text("{not json")
    with pytest.raises(CheckpointFormatError) as info:
        load_safetensors_dir(folder)
    assert str(folder / broken) in str(info.value)


def test_truncated_shard_names_file_and_tensor(tmp_path, smollm2, reference):
    folder = make_dir(tmp_path / "m", smollm2, reference)
    shard = folder / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:100_000])
    with pytest.raises(CheckpointFormatError, match="truncated") as info:
        load_safetensors_dir(folder)
    assert str(shard) in str(info.value) and "tensor" in str(info.value)
    shard.write_bytes(b"\x05")
    with pytest.raises(CheckpointFormatError, match="not a safetensors file"):
        load_safetensors_dir(folder)
