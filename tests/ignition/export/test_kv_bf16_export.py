"""``ignition export --kv-cache-dtype bf16``: the tiny checkpoint's KV cache planes (and
their tier planes) declared D_TYPE_BF16, their launches the ``*_bf16kv`` forms, the
report line, a lint-clean core for both backends; and the refusal of a manifest whose
programs read no cache plane through ops with bf16 forms."""

from __future__ import annotations

import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.kv_cache import apply_kv_bf16
from helios_ignition.testing import tiny_core
from helios_tools.core import load_public_key, open_core
from helios_tools.kernels.kv_bf16 import KV_BF16_FORMS
from helios_tools.lint import lint_capabilities

from tests.ignition.export.tiny import (
    LLAMA_RECIPE,
    NAMESPACE,
    assert_lint_clean,
    inspect_kv_cache,
    kv_cache_line,
    run_export,
)


def test_export_stores_the_kv_cache_as_bf16(tmp_path, make_checkpoint, signing_key_pair):
    private, public = signing_key_pair
    out = tmp_path / "kv16.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--kv-cache-dtype", "bf16")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    planes = [b for b in core.manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE]
    assert planes and all(b.dtype == mpb.D_TYPE_BF16 and not b.HasField("storage")
                          for b in planes)
    assert not any(b.name.endswith(".scale") for b in core.manifest.buffers)
    ops = {k.reference_op for k in core.manifest.kernels}
    assert {"rope_kv_write_bf16kv", "attention_prefill_bf16kv"} <= ops
    assert not ops & set(KV_BF16_FORMS)  # no f32 op over a cache plane is left
    lines = [line for line in result.stdout.splitlines() if line.startswith("KV cache")]
    assert lines == [f"KV cache bf16: {len(planes)} cache planes of bfloat16 elements (2 bytes "
                     "an element, half the f32 cache's), each write rounded to nearest even"]
    line, regions = inspect_kv_cache(out)  # helios-tools inspect names the element type
    assert line == kv_cache_line("bf16")
    assert {(p["element"], p["element_bytes"]) for r in regions for p in r["planes"]} == {
        ("bf16", 2)}
    assert_lint_clean(core)
    assert lint_capabilities(core.contract, core.manifest, ["cpu", "cuda"]) == []


def test_a_manifest_without_a_plane_read_through_bf16_forms_is_refused():
    core = tiny_core(seed=1)
    for b in core.manifest.buffers:
        if b.role == mpb.BUFFER_ROLE_CACHE_PLANE:
            b.role = mpb.BUFFER_ROLE_PERSISTENT_STATE
    with pytest.raises(ValueError, match="the programs read no KV cache plane through ops "
                                         "with bf16 forms"):
        apply_kv_bf16(core.manifest, core.contract.model.graphs)
