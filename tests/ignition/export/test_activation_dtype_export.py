"""``ignition export --activation-dtype bf16``: the packed products' producers round the
activations (round_bf16 / swiglu_round_bf16, ``hi | 0``) and their linear_packed kernels
run one term (XSPLIT=0); a lint-clean core for both backends; refused in one line where
no product takes the packed path (exit 1), as an unknown value (exit 2), and in a recipe.

The tiny checkpoint's matrices are below the packed path's weight bar, so the exporting
tests lower it (``launch.MMA_MIN_WEIGHTS``, rows from 1) in this process."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helios_ignition.capture import launch
from helios_tools.core import load_public_key, open_core
from helios_tools.lint import lint_capabilities

from tests.ignition.export.tiny import (
    LLAMA_RECIPE,
    NAMESPACE,
    SMOLLM2_RECIPE,
    assert_lint_clean,
    run_export,
)


@pytest.fixture
def packed_path(monkeypatch):
    monkeypatch.setattr(launch, "LINEAR_MMA", "on")
    monkeypatch.setattr(launch, "MMA_MIN_WEIGHTS", 0)
    monkeypatch.setattr(launch, "MMA_ROWS", (1, 256))


def test_bf16_rounds_every_packed_product(tmp_path, make_checkpoint, signing_key_pair,
                                          packed_path):
    private, public = signing_key_pair
    out = tmp_path / "bf16act.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--activation-dtype", "bf16")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    ops = {k.reference_op for k in core.manifest.kernels}
    assert {"round_bf16", "swiglu_round_bf16", "linear_packed"} <= ops
    assert not ops & {"split_bf16", "swiglu_split_bf16"}
    assert {k.constants["XSPLIT"] for k in core.manifest.kernels
            if k.reference_op == "linear_packed"} == {0}
    assert_lint_clean(core)
    assert lint_capabilities(core.contract, core.manifest, ["cpu", "cuda"]) == []


def test_bf16_without_a_packed_product_is_refused(tmp_path, make_checkpoint,
                                                  signing_key_pair):
    """The default rule keeps the tiny matrices on the f32 linear: nothing to round."""
    private, _ = signing_key_pair
    out = tmp_path / "none.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--activation-dtype", "bf16")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "ignition: error: --activation-dtype bf16: recipe ckpt's programs record no packed "
        "bf16 product to round (it applies to bf16 matrices of at least 16,777,216 weights "
        "at 8+ rows, without --quantize or GGUF blocks; the others keep f32 activations)"]
    assert not out.exists()


def test_f32_is_the_default_and_records_two_terms(tmp_path, make_checkpoint,
                                                  signing_key_pair, packed_path):
    private, public = signing_key_pair
    out = tmp_path / "f32act.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out)
    assert result.exit_code == 0, result.output
    ops = {k.reference_op for k in open_core(out, [load_public_key(public)]).manifest.kernels}
    assert "split_bf16" in ops and not ops & {"round_bf16", "swiglu_round_bf16"}


def test_an_unknown_activation_dtype_is_a_usage_error(tmp_path, signing_key_pair):
    private, _ = signing_key_pair
    out = tmp_path / "x.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", "smollm2", "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--activation-dtype", "fp16")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "'fp16' is not one of 'f32', 'bf16'" in result.stderr
    assert not out.exists()


def test_export_core_and_recipes_refuse_an_unknown_activation_dtype(tmp_path,
                                                                    signing_key_pair):
    """The API's own check (before anything is read) and the recipe's."""
    from helios_ignition.export import ExportUsageError, export_core
    from helios_ignition.recipe import Recipe, RecipeError, load_recipe_module, validate_recipe

    private, _ = signing_key_pair
    with pytest.raises(ExportUsageError, match=r"--activation-dtype must be one of f32, bf16, "
                                               r"not 'fp16'"):
        export_core(LLAMA_RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE,
                    out=tmp_path / "x.core", activation_dtype="fp16")
    assert not (tmp_path / "x.core").exists()
    recipe = replace(load_recipe_module(SMOLLM2_RECIPE).RECIPE, activation_dtype="int8")
    with pytest.raises(RecipeError, match=r"unsupported activation dtype 'int8'; "
                                          r"supported: f32, bf16"):
        validate_recipe(recipe)
    assert Recipe.activation_dtype == "f32"
