"""bench/fp8_accuracy.py's command line and arithmetic (no export): the model choice and
its default formats, the one-line refusals of a bad --model / --formats, the model's own
GGUF row texts, the figures `compare` derives from two measurements, the row a refused
export becomes, and the merge that keeps the rows of formats not run."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from helios_ignition.export import ExportUsageError

from tests.bench.scripts import load_script


@pytest.fixture(scope="module")
def fa():
    return load_script("fp8_accuracy.py")


def refusal(fa, capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        fa.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_each_model_has_its_default_formats_and_smollm2_is_the_default(fa):
    args = fa.parse_args([])
    assert (args.model, args.backend, args.formats) == ("smollm2", "cpu",
                                                        ["fp8", "int4", "fp8kv"])
    assert fa.parse_args(["--model", "gemma3"]).formats == [
        "fp8", "int4", "gguf", "gguf_blocks", "fp8kv", "bf16kv"]
    assert fa.parse_args(["--model", "gemma3", "--formats", "gguf,bf16kv"]).formats == [
        "gguf", "bf16kv"]


def test_a_bad_model_or_format_is_one_line(fa, capsys):
    assert refusal(fa, capsys, ["--model", "llama"]) == (
        "fp8_accuracy.py: error: argument --model: invalid choice: 'llama' "
        "(choose from 'gemma3', 'smollm2')")
    assert refusal(fa, capsys, ["--formats", "fp8,q4"]) == (
        "fp8_accuracy.py: error: --formats: unknown format 'q4' (choose from fp8, int4, "
        "gguf, gguf_blocks, fp8kv, bf16kv)")
    assert refusal(fa, capsys, ["--backend", "cuda", "--formats", "gguf_blocks"]) == (
        "fp8_accuracy.py: error: --formats gguf_blocks: a cpu core (ggml blocks); the cuda "
        "backend does not execute it")


def test_the_gguf_rows_describe_the_models_own_blocks(fa):
    smollm2, gemma3 = fa.MODELS["smollm2"], fa.MODELS["gemma3"]
    assert fa.describe(smollm2, "gguf").startswith(
        "the GGUF's own blocks repacked exactly (never through floats): Q4_1 projections")
    assert "Q4_K attention outputs" in fa.describe(gemma3, "gguf")
    assert "Q4_K, Q6_K, Q5_0 and Q8_0" in fa.describe(gemma3, "gguf_blocks")
    assert fa.describe(gemma3, "fp8") == fa.describe(smollm2, "fp8") == fa.FORMATS["fp8"]
    for model in fa.MODELS.values():  # the files the script reads exist
        assert model.recipe.is_file() and model.goldens.is_file()


def test_compare_derives_the_figures_from_two_measurements(fa):
    text_ids = [5, 0, 1, 2]  # 3 predicted tokens over a vocabulary of 3
    ref = fa._log_softmax(np.array([[2.0, 0, 0], [0, 2.0, 0], [0, 0, 2.0]], np.float32))
    got = fa._log_softmax(np.array([[2.0, 0, 0], [0, 2.0, 0], [2.0, 0, 0]], np.float32))
    greedy_ref = [[1] * fa.STEPS, [2] * fa.STEPS]
    greedy = [[1] * fa.STEPS, [2] * 16 + [3] * (fa.STEPS - 16)]
    row = fa.compare((ref, greedy_ref), (got, greedy), text_ids)
    p_hi, p_lo = np.exp(2) / (np.exp(2) + 2), 1 / (np.exp(2) + 2)
    assert row["bf16_perplexity"] == pytest.approx(1 / p_hi)
    assert row["perplexity"] == pytest.approx((p_hi * p_hi * p_lo) ** (-1 / 3))
    kl_last = (p_hi - p_lo) * (np.log(p_hi) - np.log(p_lo))  # swapped top and a tail
    assert row["mean_kl_vs_bf16_nats"] == pytest.approx(kl_last / 3)
    assert row["max_kl_vs_bf16_nats"] == pytest.approx(kl_last)
    assert row["teacher_forced_top1_agreement"] == pytest.approx(2 / 3)
    assert row["greedy"] == [{"agreement": 1.0, "first_difference": 64},
                             {"agreement": 0.25, "first_difference": 16}]
    assert row["greedy_agreement_mean"] == 0.625


def test_a_refused_export_is_a_row_with_its_one_line(fa, monkeypatch, tmp_path, capsys):
    line = "--kv-cache-dtype fp8: recipe gemma3-270m: no plane"

    def refuse(*_args, **_kwargs):
        raise ExportUsageError(line)

    monkeypatch.setattr(fa, "export_core", refuse)
    args = argparse.Namespace(backend="cpu", target="sm_90")
    row = fa.format_row(fa.MODELS["gemma3"], "fp8kv", tmp_path, args, None, [], [])
    assert row == {"format": fa.FORMATS["fp8kv"], "commit": fa.git_commit(), "refused": line}
    assert capsys.readouterr().out == f"fp8kv: refused: {line}\n"


def test_rows_not_run_are_kept_with_their_commit(fa):
    before = {"commit": "aaa", "formats": {"fp8": {"perplexity": 1.0},
                                           "gguf": {"commit": "bbb", "perplexity": 2.0}}}
    table = {"fp8": {"commit": "ccc", "perplexity": 3.0}}
    assert fa.merged(before, table) == {"gguf": {"commit": "bbb", "perplexity": 2.0},
                                        "fp8": {"commit": "ccc", "perplexity": 3.0}}
    assert fa.merged({"commit": "aaa", "formats": {"int4": {"perplexity": 4.0}}}, table) == {
        "int4": {"commit": "aaa", "perplexity": 4.0}, "fp8": {"commit": "ccc",
                                                              "perplexity": 3.0}}
    assert fa.merged(None, table) == table
