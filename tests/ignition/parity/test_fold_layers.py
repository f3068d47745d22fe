"""Layer folding (``ignition export --fold-layers``) on the real model, CPU backend: the
folded decode graphs (RMS norms folded into the QKV and gate/up products, residual adds
into the O and down products) give the same greedy ids as the HF goldens and logits
bit-identical to the unfolded core's, and record 7 launches per layer instead of 9."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helios_serve.runtime import NativeModel
from helios_serve.runtime.driver import Driver
from helios_tools.core import authorize, load_public_key, open_core

from tests.conftest import NAMESPACE, RECIPE

GOLDENS = json.loads((Path(__file__).parents[2] / "golden" / "smollm2_goldens.json").read_text())
PROMPTS = GOLDENS["prompts"]


def _open(path, public):
    core = open_core(path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return core


@pytest.fixture(scope="module")
def folded(tmp_path_factory, signing_key_pair):
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    out = tmp_path_factory.mktemp("core-folded") / "smollm2-f32-folded.core"
    export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE, out=out,
                weight_dtype="f32", fold_layers=True)
    core = _open(out, public)
    return core, NativeModel.load(core, "cpu")


def _decode_ops(core, name="decode_b1") -> Counter:
    ops = {k.id: k.reference_op for k in core.manifest.kernels}
    graph = next(g for g in core.manifest.graphs if g.name == name)
    return Counter(ops[launch.kernel] for launch in graph.launches)


def test_folded_decode_records_seven_launches_per_layer(folded, smollm2_core_f32):
    core, _ = folded
    plain = _open(smollm2_core_f32.path, smollm2_core_f32.public_key)
    got, before = _decode_ops(core), _decode_ops(plain)
    layers = 30
    assert sum(before.values()) - sum(got.values()) == 2 * layers
    assert got["rmsnorm_linear"] == 2 * layers and got["linear_add"] == layers
    assert got["swiglu_linear_add"] == layers
    assert got["add_rmsnorm"] == 0 and got["rmsnorm"] == 1  # the final norm
    # prefill graphs are not folded
    assert _decode_ops(core, "prefill_t16") == _decode_ops(plain, "prefill_t16")


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_folded_greedy_ids_match_goldens(folded, index):
    _, model = folded
    p = PROMPTS[index]
    out = Driver(model).generate([p["prompt_ids"]], max_new_tokens=20)[0]
    assert out == p["greedy_ids"][:20]


def test_folded_logits_bit_identical_to_unfolded(folded, smollm2_core_f32):
    _, model = folded
    plain = NativeModel.load(_open(smollm2_core_f32.path, smollm2_core_f32.public_key), "cpu")
    p = PROMPTS[0]
    a = Driver(model).teacher_force(p["prompt_ids"], p["greedy_ids"][:8])
    b = Driver(plain).teacher_force(p["prompt_ids"], p["greedy_ids"][:8])
    assert np.array_equal(a, b)
