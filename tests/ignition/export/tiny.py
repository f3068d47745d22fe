"""Helpers for `ignition export` tests: tiny synthetic safetensors checkpoints, the CLI.

A tiny checkpoint is a real HF-layout directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with the chat template) carrying SmolLM2's tokenizer
and template and seeded random float32 weights of a 2-layer, width-64 geometry, so an
export takes about a second and every failure path runs against real files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from helios_ignition.checkpoint import LlamaGeometry

REPO = Path(__file__).resolve().parents[3]
LLAMA_RECIPE = REPO / "recipes" / "llama.py"
SMOLLM2_RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
NAMESPACE = "helios.test/export"

# max_position_embeddings 520 is deliberately not a whole number of 16-token pages and
# shorter than the generic recipe's largest prefill chunk (1024): export must fit both.
TINY = LlamaGeometry(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                     rms_eps=1e-5, max_context=520, tie_word_embeddings=True)


@dataclass(frozen=True)
class Frontend:
    """SmolLM2's tokenizer.json text and chat template (verbatim)."""

    tokenizer_json: str
    chat_template: str


def tiny_tensors(geometry: LlamaGeometry, seed: int) -> dict[str, np.ndarray]:
    """Seeded float32 tensors by HF name: matrices N(0, 0.05), norms 1 + N(0, 0.02)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in geometry.tensor_shapes().items():
        noise = rng.standard_normal(shape).astype(np.float32)
        out[name] = 1 + 0.02 * noise if len(shape) == 1 else 0.05 * noise
    return out


def write_checkpoint(folder: Path, frontend: Frontend, *, geometry: LlamaGeometry = TINY,
                     seed: int = 0, tokenizer: bool = True, template: bool = True,
                     shapes: dict[str, tuple[int, ...]] | None = None,
                     arrays: dict[str, np.ndarray] | None = None,
                     drop: tuple[str, ...] = ()) -> Path:
    """Write a tiny HF safetensors checkpoint directory.

    Args:
        folder: directory to create.
        frontend: tokenizer and template to store.
        geometry: config.json geometry.
        seed: weight seed.
        tokenizer: write tokenizer.json.
        template: put the chat template in tokenizer_config.json.
        shapes: HF tensor name -> shape to store instead of the geometry's (random data).
        arrays: HF tensor name -> array to store instead.
        drop: HF tensor names to leave out.
    """
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": geometry.vocab_size, "hidden_size": geometry.hidden_size,
        "intermediate_size": geometry.intermediate_size,
        "num_hidden_layers": geometry.num_layers,
        "num_attention_heads": geometry.num_heads,
        "num_key_value_heads": geometry.num_kv_heads, "head_dim": geometry.head_dim,
        "rope_theta": geometry.rope_theta, "rms_norm_eps": geometry.rms_eps,
        "max_position_embeddings": geometry.max_context,
        "tie_word_embeddings": geometry.tie_word_embeddings,
        "bos_token_id": 1, "eos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(config))
    tensors = tiny_tensors(geometry, seed)
    rng = np.random.default_rng(seed + 1)
    for name, shape in (shapes or {}).items():
        tensors[name] = (0.05 * rng.standard_normal(shape)).astype(np.float32)
    tensors.update(arrays or {})
    for name in drop:
        del tensors[name]
    save_file(tensors, str(folder / "model.safetensors"))
    if tokenizer:
        (folder / "tokenizer.json").write_text(frontend.tokenizer_json, encoding="utf-8")
    tok_config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                  "pad_token": "<|im_end|>"}
    if template:
        tok_config["chat_template"] = frontend.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    return folder


def run_export(*args: str | Path) -> Result:
    """`ignition export ARGS...` in-process; stdout and stderr are kept apart."""
    from helios_ignition.cli import main

    return CliRunner().invoke(main, ["export", *map(str, args)])


def export_error(result: Result) -> str:
    """The one ``ignition: error`` line of a failed `run_export`, asserting the export
    failed (nonzero exit) with exactly one such line and no traceback."""
    errors = [x for x in result.stderr.splitlines() if x.startswith("ignition: error")]
    assert result.exit_code != 0 and "Traceback" not in result.stderr, result.stderr
    assert len(errors) == 1, errors
    return errors[0]


def refused_export(checkpoint: str | Path, key: Path, out: Path, *options: str | Path) -> str:
    """The one error line of `ignition export` of LLAMA_RECIPE with `checkpoint`, signed
    by `key`, into `out`, with `options`; asserts `export_error`'s checks and that no core
    was left at `out`."""
    result = run_export(LLAMA_RECIPE, "--checkpoint", checkpoint, "--key", key,
                        "--namespace", NAMESPACE, "--out", out, *options)
    line = export_error(result)
    assert not out.exists()
    return line


def refused_on_load_and_export(folder: Path, key: Path, out: Path, quantize: str,
                               message: str) -> None:
    """The safetensors loader refuses `folder` with exactly `message`, and `ignition export
    --quantize QUANTIZE` refuses it with the same words ending its one error line, leaving
    no core at `out` (one rule: the loader's, reported by both)."""
    from helios_ignition.checkpoint import load_safetensors_dir
    from helios_ignition.checkpoint.errors import UnsupportedTensorError

    with pytest.raises(UnsupportedTensorError) as info:
        load_safetensors_dir(folder)
    assert str(info.value) == message
    assert refused_export(folder, key, out, "--quantize", quantize).endswith(message)


def assert_lint_clean(core, acceptance: str = NAMESPACE) -> None:
    """`lint_core` (verify + contract validation + manifest consistency) finds nothing."""
    from helios_tools.lint import lint_core

    findings = lint_core(core, acceptance=acceptance)
    assert findings == [], [str(f) for f in findings]


def inspect_kv_cache(core_path: Path) -> tuple[str, list[dict]]:
    """`helios-tools inspect CORE`'s ``kv cache`` line and ``--json``'s ``kv_cache``."""
    from helios_tools.cli import main

    text = CliRunner().invoke(main, ["inspect", str(core_path)])
    data = CliRunner().invoke(main, ["inspect", str(core_path), "--json"])
    assert text.exit_code == 0 and data.exit_code == 0, (text.output, data.output)
    line = [x for x in text.output.splitlines() if x.startswith("kv cache")]
    assert len(line) == 1, text.output
    return line[0], json.loads(data.output)["kv_cache"]


def kv_cache_line(element: str) -> str:
    """The inspect line of the tiny recipe's core whose 4 planes a region hold `element`."""
    return (f"kv cache     kv (paged_kv, 4 planes: {element}); "
            f"continuation (continuation, 4 planes: {element})")
