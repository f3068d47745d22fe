"""Qwen3 dense and Qwen3-MoE from GGUF (architectures `qwen3`, `qwen3moe`) against
llama.cpp, and against the same checkpoints exported from HF safetensors.

The GGUFs are tests/fixtures/qwen3/'s tiny checkpoints converted by llama.cpp's own
`convert_hf_to_gguf.py` (f32; the untied dense one and the MoE one also in Q8_0);
tests/fixtures/qwen3_gguf/make_reference.py wrote them and llama.cpp's logits at every
prompt position and its 8 greedy ids (f32 KV cache, no flash attention).

Tolerances (measured when the fixtures were written, cpu backend, 2 threads):
- f32: Helios and llama.cpp differ by at most 9.6e-6 on these logits (llama.cpp and
  transformers by at most 1.4e-5); held to 2e-5, and to llama.cpp's greedy ids
  (the smallest top-two gap on their paths is 0.045).
- Q8_0, dense (`--weight-dtype gguf`: the core keeps the Q8_0 blocks and its products
  run through ggml as llama.cpp's do, activations quantized to Q8 blocks as there): the
  logits measured equal to llama.cpp's bit for bit (norms, QK-norm, RoPE and attention
  are f32 on both sides); held to 1e-4, and the greedy ids equal (smallest top-two gap
  0.013).
- Q8_0, MoE: attention and head keep their blocks, but the stacked experts are stored
  as f32 (the expert operations have no block form) and multiply f32 activations, where
  llama.cpp quantizes the activations; measured differences 0.08 to 0.22, held to 0.4.
  At one position (ROUTING_FLIPS) llama.cpp's Q8_0 run differs from its own f32 run by
  2.24 while Helios' Q8_0 core stays within 0.17 of llama.cpp's f32 run: the quantized
  activations route that token to other experts in llama.cpp. There the core is held to
  llama.cpp's f32 logits instead (the test checks both facts); the greedy ids equal
  llama.cpp's.
- GGUF against safetensors (f32): the readers return the same tensors bit for bit, so
  the two cores' logits are held to 1e-6.

One core is also served through HTTP: a text prompt completes with llama.cpp's greedy ids.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.checkpoint import GeometryError, load_checkpoint
from helios_ignition.checkpoint.errors import MissingTokenizerError
from helios_ignition.checkpoint.gguf_read import gpt2_tokenizer_json
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.frontend_assets import load_tokenizer
from helios_tools.lint import lint_core

from tests.ignition.export.tiny import NAMESPACE, REPO, assert_lint_clean, run_export

FIXTURES = REPO / "tests" / "fixtures" / "qwen3_gguf"
HF_FIXTURES = REPO / "tests" / "fixtures" / "qwen3"
QWEN3_RECIPE = REPO / "recipes" / "qwen3.py"
LLAMA_CPP = np.load(FIXTURES / "reference.npz")
# GGUF fixture -> (the --weight-dtype it is exported with, the logits' tolerance)
GGUFS = {"dense_tied.f32": ("f32", 2e-5), "dense_untied.f32": ("f32", 2e-5),
         "moe.f32": ("f32", 2e-5), "dense_untied.q8_0": ("gguf", 1e-4),
         "moe.q8_0": ("gguf", 0.4)}
# Prompt positions (prompt, position) where llama.cpp's own runs of a Q8_0 GGUF and of its
# f32 original differ by more than ROUTING_FLIP while Helios' Q8_0 core stays by the f32
# run: llama.cpp's quantized activations change a token's experts there. There the core
# is held to llama.cpp's f32 logits instead.
ROUTING_FLIPS = {"moe.q8_0": [(0, 14)]}
ROUTING_FLIP = 1.0
PROMPTS = 3
GREEDY = 8
PROMPT_TEXTS = [  # tests/fixtures/qwen3/make_reference.py's PROMPTS
    "Hello there, what is the weather in Paris?",
    "def add(a, b):",
    "<|im_start|>user\nCall get_weather.<|im_end|>\n<|im_start|>assistant\n<think>\n",
]


def export(tmp: Path, keys, checkpoint: Path, weight_dtype: str) -> Path:
    out = tmp / f"{checkpoint.name}.core"
    result = run_export(QWEN3_RECIPE, "--checkpoint", checkpoint, "--key", keys[0],
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype",
                        weight_dtype)
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(keys[1])])
    authorize(core, NAMESPACE)
    return core


def teacher_forced(core) -> list[np.ndarray]:
    """Per prompt, the core's float32 logits `[len(ids), vocab]` at every prompt position."""
    driver = Driver(load_native(core, "cpu"))
    out = []
    for p in range(PROMPTS):
        ids = LLAMA_CPP[f"moe.f32/p{p}/ids"].tolist()
        out.append(driver.teacher_force(ids[:1], ids[1:] + [0]))
    driver.model.close()
    return out


@pytest.fixture(scope="module", params=list(GGUFS))
def gguf_core(request, module_tmp, signing_key_pair):
    key = request.param
    core = export(module_tmp("qwen3_gguf"), signing_key_pair,
                  FIXTURES / f"{key}.gguf", GGUFS[key][0])
    return key, core


def test_logits_and_greedy_ids_match_llama_cpp(gguf_core):
    key, core = gguf_core
    weight_dtype, tolerance = GGUFS[key]
    quantized = weight_dtype == "gguf"
    if quantized:  # GGUF blocks are a cpu-backend storage: lint for the cpu backend
        assert lint_core(core, acceptance=NAMESPACE, backends=["cpu"]) == []
    else:
        assert_lint_clean(core)
    driver = Driver(load_native(core, "cpu"))
    for p in range(PROMPTS):
        ids = LLAMA_CPP[f"{key}/p{p}/ids"].tolist()
        want = LLAMA_CPP[f"{key}/p{p}/logits"]
        got = driver.teacher_force(ids[:1], ids[1:] + [0])
        keep = np.ones(len(ids), bool)
        for flip in (i for q, i in ROUTING_FLIPS.get(key, []) if q == p):
            f32 = LLAMA_CPP[f"{key.split('.')[0]}.f32/p{p}/logits"][flip]
            assert np.abs(want[flip] - f32).max() > ROUTING_FLIP  # llama.cpp moves alone
            np.testing.assert_allclose(got[flip], f32, rtol=0, atol=tolerance)
            keep[flip] = False
        np.testing.assert_allclose(got[keep], want[keep], rtol=0, atol=tolerance,
                                   err_msg=f"{key} p{p}")
        greedy = driver.generate([ids], max_new_tokens=GREEDY)[0]
        assert greedy == LLAMA_CPP[f"{key}/p{p}/greedy"].tolist(), (key, p)
    driver.model.close()


@pytest.mark.parametrize("model", ["dense_tied", "dense_untied", "moe"])
def test_gguf_and_safetensors_exports_agree(tmp_path, signing_key_pair, model):
    from_gguf = export(tmp_path, signing_key_pair, FIXTURES / f"{model}.f32.gguf", "f32")
    from_hf = export(tmp_path, signing_key_pair, HF_FIXTURES / model, "f32")
    assert [b.name for b in from_gguf.manifest.buffers] == \
        [b.name for b in from_hf.manifest.buffers]
    for got, want in zip(teacher_forced(from_gguf), teacher_forced(from_hf), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("model", ["dense_tied", "dense_untied", "moe"])
def test_reader_returns_the_safetensors_checkpoint(model):
    """Geometry, tensors (bit for bit; the experts sliced from llama.cpp's stacked
    tensors), tokenizer and chat template equal the HF checkpoint's."""
    ck = load_checkpoint(FIXTURES / f"{model}.f32.gguf")
    hf = load_checkpoint(HF_FIXTURES / model)
    assert ck.geometry == hf.geometry
    assert ck.geometry.family == ("qwen3_moe" if model == "moe" else "qwen3")
    assert ck.tensor_names == hf.tensor_names
    for name in hf.tensor_names:
        np.testing.assert_array_equal(ck.tensor(name), hf.tensor(name), err_msg=name)
    assert ck.chat_template == hf.chat_template
    assert ck.eos_token_ids == (2,) and ck.bos_token_id is None
    assert ck.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    tokenizer = load_tokenizer(ck.tokenizer_json)
    for p, text in enumerate(PROMPT_TEXTS):
        want = LLAMA_CPP[f"{model}.f32/p{p}/llama_ids"].tolist()
        assert want == LLAMA_CPP[f"{model}.f32/p{p}/ids"].tolist()  # = transformers'
        assert tokenizer.encode(text, add_special_tokens=False).ids == want
    assert tokenizer.encode("<think><tool_call>").ids == [314, 316]  # whole, not BPE


def test_moe_geometry_comes_from_the_metadata():
    geometry = load_checkpoint(FIXTURES / "moe.f32.gguf").geometry
    assert (geometry.architecture, geometry.experts, geometry.experts_per_token,
            geometry.expert_ffn, geometry.norm_topk) == ("Qwen3MoeForCausalLM", 8, 2, 32,
                                                         True)
    assert (geometry.rope_theta, geometry.rms_eps, geometry.head_dim) == (1e6, 1e-6, 32)
    assert not geometry.tie_word_embeddings
    assert load_checkpoint(FIXTURES / "dense_tied.f32.gguf").geometry.tie_word_embeddings


def test_q8_0_blocks_are_kept_but_experts_are_f32(tmp_path, signing_key_pair):
    """`--weight-dtype gguf` keeps the Q8_0 blocks of every 2-D matrix stored in them; the
    stacked experts (no block form of the expert operations) are stored as f32."""
    ck = load_checkpoint(FIXTURES / "moe.q8_0.gguf")
    kind, blocks = ck.blocks("model.layers.0.mlp.experts.3.down_proj.weight")
    assert (kind, blocks.shape) == ("Q8_0", (64, 34))  # one block of 34 bytes a row
    assert ck.block_type("model.layers.0.self_attn.q_norm.weight") is None  # f32
    core = export(tmp_path, signing_key_pair, FIXTURES / "moe.q8_0.gguf", "gguf")
    storage = {b.name: mpb.StorageType.Name(b.storage.type)
               for b in core.manifest.buffers if b.weight_resource_id}
    # The converter keeps the router (ffn_gate_inp) and the norms in f32.
    assert sorted(name for name, kind in storage.items()
                  if kind == "STORAGE_TYPE_GGUF_Q8_0") == \
        ["L0.wo", "L0.wqkv", "L1.wo", "L1.wqkv", "embed", "lm_head"]
    assert storage["L0.experts_gate_up"] == storage["L1.experts_down"] == \
        "STORAGE_TYPE_UNSPECIFIED"  # f32


def _write(path: Path, arch: str, kv: dict, tensors: tuple[str, ...] = ()) -> Path:
    """A GGUF of `arch` holding `kv` (key without the architecture prefix -> int, float
    or str) and zero f32 tensors named `tensors`."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        add = {int: writer.add_uint32, float: writer.add_float32, str: writer.add_string}
        add[type(value)](f"{arch}.{key}", value)
    for name in tensors or ("token_embd.weight",):
        writer.add_tensor(name, np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


BASE = {"block_count": 1, "context_length": 64, "embedding_length": 8,
        "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-6}
MOE = {**BASE, "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 8}


@pytest.mark.parametrize(("arch", "kv", "tensors", "message"), [
    ("qwen3", {k: v for k, v in BASE.items() if k != "block_count"}, (),
     "missing metadata key 'qwen3.block_count'"),
    ("qwen3", BASE, ("token_embd.weight", "blk.0.attn_q.bias"),
     "tensor 'blk.0.attn_q.bias': attention biases are not supported for Qwen3"),
    ("qwen3moe", MOE, ("token_embd.weight", "blk.0.ffn_gate_shexp.weight"),
     "tensor 'blk.0.ffn_gate_shexp.weight': shared experts are not supported for Qwen3"),
    ("qwen3", {**BASE, "rope.scaling.type": "yarn"}, (),
     "qwen3.rope.scaling.type 'yarn' is not supported for Qwen3 (only the default RoPE)"),
    ("qwen3", {**BASE, "attention.sliding_window": 16}, (),
     "qwen3.attention.sliding_window is not supported for Qwen3"),
    ("qwen3", {**BASE, "attention.key_length": 4, "attention.value_length": 8}, (),
     "qwen3.attention.value_length 8 differs from the key length 4"),
    ("qwen3moe", {**MOE, "expert_used_count": 5}, (),
     "qwen3moe.expert_used_count 5 must lie in 1..4 (the experts)"),
    ("qwen3moe", {k: v for k, v in MOE.items() if k != "expert_count"}, (),
     "missing metadata key 'qwen3moe.expert_count'"),
])
def test_gguf_refusals(tmp_path, arch, kv, tensors, message):
    path = _write(tmp_path / "x.gguf", arch, kv, tensors)
    with pytest.raises(GeometryError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == f"{path}: {message}"


def test_a_missing_tensor_is_named(tmp_path):
    from helios_ignition.checkpoint.errors import MissingTensorError

    path = _write(tmp_path / "x.gguf", "qwen3", BASE, ("token_embd.weight",))
    with pytest.raises(MissingTensorError, match="model.layers.0.input_layernorm.weight"):
        load_checkpoint(path)


def test_a_gguf_without_a_gpt2_tokenizer_is_refused():
    fields = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(MissingTokenizerError) as caught:
        gpt2_tokenizer_json(fields.get, "x.gguf")
    assert str(caught.value) == "x.gguf: no GPT-2 style BPE tokenizer (tokenizer.ggml.*)"
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"],
              "tokenizer.ggml.pre": "qwen35"}
    with pytest.raises(MissingTokenizerError) as caught:
        gpt2_tokenizer_json(fields.get, "x.gguf")
    assert str(caught.value) == ("x.gguf: unsupported tokenizer.ggml.pre 'qwen35'; known: "
                                 "default, gpt-2, gpt2, llama-bpe, smollm")


def test_a_gguf_core_serves_llama_cpps_greedy_text_over_http(tmp_path, signing_key_pair):
    """The dense GGUF core through helios-serve's HTTP API (official openai client, cpu
    backend): a text prompt with Qwen3's special and added tokens, tokenized by the
    core's tokenizer, completes greedily with llama.cpp's ids."""
    from helios_serve.bootstrap import Bootstrap

    from tests.ignition.families.test_qwen3_http import Served

    out = tmp_path / "dense.core"
    result = run_export(QWEN3_RECIPE, "--checkpoint", FIXTURES / "dense_untied.f32.gguf",
                        "--key", signing_key_pair[0], "--namespace", NAMESPACE, "--out", out,
                        "--weight-dtype", "f32")
    assert result.exit_code == 0, result.output
    bootstrap = Bootstrap.load(out, [signing_key_pair[1]], NAMESPACE)
    served = Served(bootstrap, load_native(bootstrap.core, "cpu"))
    try:
        r = served.openai().completions.create(
            model=served.model_name, prompt=PROMPT_TEXTS[2], max_tokens=GREEDY,
            temperature=0.0)
    finally:
        served.server.stop()
    want = LLAMA_CPP["dense_untied.f32/p2/greedy"].tolist()
    assert 2 not in want  # <|im_end|> would stop the completion early
    assert served.model_name == "qwen3-dense-untied.f32"
    assert r.usage.prompt_tokens == len(LLAMA_CPP["dense_untied.f32/p2/ids"])
    assert r.choices[0].text == bootstrap.tokenizer.decode(want, skip_special_tokens=True)


def test_a_control_token_is_no_text_in_served_output(tmp_path, signing_key_pair):
    """The Q8_0 dense core's greedy continuation of prompt 0 (llama.cpp's ids) holds
    `<|endoftext|>` (id 0, a CONTROL token, exported special) twice: it used to appear in
    the text; the text is now the ids decoded skipping special tokens (HF's
    `skip_special_tokens=True`, vLLM's default), and every id is still counted."""
    from helios_serve.bootstrap import Bootstrap

    from tests.ignition.families.test_qwen3_http import Served

    out = tmp_path / "q8.core"
    result = run_export(QWEN3_RECIPE, "--checkpoint", FIXTURES / "dense_untied.q8_0.gguf",
                        "--key", signing_key_pair[0], "--namespace", NAMESPACE, "--out", out,
                        "--weight-dtype", "gguf")
    assert result.exit_code == 0, result.output
    bootstrap = Bootstrap.load(out, [signing_key_pair[1]], NAMESPACE)
    served = Served(bootstrap, load_native(bootstrap.core, "cpu"))
    try:
        r = served.openai().completions.create(
            model=served.model_name, prompt=LLAMA_CPP["dense_untied.q8_0/p0/ids"].tolist(),
            max_tokens=GREEDY, temperature=0.0, logprobs=0)
    finally:
        served.server.stop()
    want = LLAMA_CPP["dense_untied.q8_0/p0/greedy"].tolist()
    assert want.count(0) == 2 and 2 not in want
    choice = r.choices[0]
    assert choice.logprobs.tokens[3] == "<|endoftext|>"  # the sampled ids: llama.cpp's
    assert r.usage.completion_tokens == GREEDY
    assert choice.text == bootstrap.tokenizer.decode(want, skip_special_tokens=True)
    assert "<|endoftext|>" not in choice.text
