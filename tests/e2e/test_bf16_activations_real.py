"""The real SmolLM2 exported with ``--activation-dtype bf16`` (every layer product on the
packed path: its matrices are below the default weight bar, so the export lowers it as
tests/gpu/test_mma_model.py does), linted clean for both backends and served on the cpu
backend through HTTP: the served greedy answers are the direct NativeModel run's, token
for token and in text. (That the cpu backend executes the rounding, and that a backend
without the ops refuses the core: tests/ignition/test_mma_capture.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helios_ignition.capture import launch
from helios_ignition.export import export_core
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.lint import lint_capabilities, lint_core

from tests.conftest import NAMESPACE, RECIPE
from tests.e2e.conftest import served_on_cpu

REPO = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((REPO / "tests" / "golden" / "smollm2_goldens.json").read_text())
STEPS = 12
PROMPTS = ("france", "system_haiku")


@pytest.fixture(scope="module")
def bf16_core(module_tmp, signing_key_pair, smollm2_checkpoint):
    private, public = signing_key_pair
    out = module_tmp("bf16act") / "smollm2-bf16act.core"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "LINEAR_MMA", "on")
        mp.setattr(launch, "MMA_MIN_WEIGHTS", 0)
        mp.setattr(launch, "MMA_ROWS", (1, 256))
        export_core(RECIPE, checkpoint=smollm2_checkpoint, key_path=private, namespace=NAMESPACE,
                    out=out, activation_dtype="bf16")
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return out, public, core


def test_rounded_products_and_lint_clean(bf16_core):
    _, _, core = bf16_core
    ops = [k.reference_op for k in core.manifest.kernels]
    assert {"round_bf16", "swiglu_round_bf16"} <= set(ops)
    assert not {"split_bf16", "swiglu_split_bf16"} & set(ops)
    assert lint_core(core, acceptance=NAMESPACE) == []
    assert lint_capabilities(core.contract, core.manifest, ["cpu", "cuda"]) == []


def test_http_greedy_equals_the_native_model_run(bf16_core):

    path, public, core = bf16_core
    goldens = [p for p in GOLDENS["prompts"] if p["name"] in PROMPTS]
    assert len(goldens) == len(PROMPTS)
    model = load_native(core, "cpu")
    try:
        direct = Driver(model).generate([p["prompt_ids"] for p in goldens], STEPS)
    finally:
        model.close()
    with served_on_cpu(path, public, NAMESPACE) as (bootstrap, settings, client):
        served = [client.chat.completions.create(
            model=settings.served_name, messages=p["messages"], temperature=0,
            max_tokens=STEPS, extra_body={"return_token_ids": True}) for p in goldens]
        tokenizer = bootstrap.tokenizer
    for r, ids, p in zip(served, direct, goldens, strict=True):
        got = r.choices[0].token_ids
        assert got == ids[:len(got)] and (len(got) == STEPS or r.choices[0].finish_reason
                                          == "stop"), p["name"]
        assert r.choices[0].message.content == tokenizer.decode(got, skip_special_tokens=True)
