"""`ignition export --random-weights SEED --geometry smollm2-135m`: real shapes, seeded.

One export of the full 135M-parameter geometry through the CLI (bf16, the generic
recipe's dtype). Determinism is checked resource by resource: a few weight resources'
decoded bytes equal what a second, independent draw of the same seed produces for those
buffers (fused and rounded the way export stores them), and differ for another seed.
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_ignition.checkpoint import SMOLLM2_135M, random_checkpoint
from helios_ignition.weights import to_bf16_bits
from helios_tools.core import authorize, load_public_key, open_core

from tests.ignition.export.tiny import LLAMA_RECIPE, NAMESPACE, assert_lint_clean, run_export

pytestmark = pytest.mark.slow

SEED = 7
# Physical buffer -> the HF tensors concatenated (row-wise) into it.
SOURCES = {
    "L0.wqkv": [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"],
    "L29.w_down": ["model.layers.29.mlp.down_proj.weight"],
    "embed": ["model.embed_tokens.weight"],
}


def drawn_bf16(seed: int, buffer: str) -> bytes:
    ck = random_checkpoint("smollm2-135m", seed)
    fused = np.concatenate([ck.tensor(name) for name in SOURCES[buffer]])
    return to_bf16_bits(fused).tobytes()


@pytest.fixture(scope="module")
def exported(module_tmp, signing_key_pair):
    private, public = signing_key_pair
    out = module_tmp("random") / "random-7.core"
    result = run_export(LLAMA_RECIPE, "--random-weights", SEED, "--geometry", "smollm2-135m",
                        "--key", private, "--namespace", NAMESPACE, "--out", out)
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return result, core


def test_export_summary(exported):
    result, core = exported
    assert "served id synthetic:smollm2-135m:seed=7" in result.stdout
    weights = [b for b in core.manifest.buffers if b.weight_resource_id]
    assert len(weights) == 3 + 6 * SMOLLM2_135M.num_layers  # embed, final norm, rope table
    assert core.contract.context_tokens == 4096  # the generic recipe's; the geometry has 8192


@pytest.mark.parametrize("buffer", sorted(SOURCES))
def test_weights_are_the_seeded_draw(exported, buffer):
    _, core = exported
    stored = core.read_resource(f"weights/{buffer}")
    assert stored == drawn_bf16(SEED, buffer)
    bits = np.frombuffer(stored, "<u2")
    assert np.count_nonzero(bits) > 0.99 * bits.size  # real values, never zeros


def test_another_seed_differs(exported):
    _, core = exported
    assert core.read_resource("weights/L0.wqkv") != drawn_bf16(SEED + 1, "L0.wqkv")


def test_lint_core(exported):
    assert_lint_clean(exported[1])
