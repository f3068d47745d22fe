"""A core's speculative lane limits are honoured (the specification, "Complete speculative
generation": lane limits cannot exceed min(D + 1, W); SpeculativeDescriptor.lane_limit).

The tiny checkpoint exported with a seeded random drafter (widths 1, 2, 4) is re-signed
with lane_limit 2 on every W = 4 program: it lints clean, serves over real HTTP, emits
the text the unlimited core emits, and no lane verifies more than 2 positions (exact
counts from /metrics: each lane of 2 offers exactly one draft). A core whose W = 4
programs disagree on their lane limit is refused by lint and by startup with the same
rule (`speculative.lane_limit_consistency`, helios_contract's one rule for it)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from helios_contract.schema import contract_pb2 as c
from helios_serve.bootstrap import Bootstrap, StartupError
from helios_serve.cli import start
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime import NativeModel
from helios_serve.server import Server
from helios_tools.cli import main as tools_main
from helios_tools.core import CoreWriter, load_private_key, load_public_key, open_core

from tests.tiny_model import LLAMA_RECIPE, NAMESPACE

RECIPE = """
from dataclasses import replace
import importlib.util
spec = importlib.util.spec_from_file_location("base", {base!r})
base = importlib.util.module_from_spec(spec); spec.loader.exec_module(base)
from helios_ignition.recipe import DrafterDecl


def make_recipe(checkpoint):
    return replace(base.make_recipe(checkpoint),
                   drafter=DrafterDecl("random:7:128", widths=(1, 2, 4)))
"""
PROMPTS = ["Name three colours.", "What is the capital of France?"]
RULE = "speculative.lane_limit_consistency"


@pytest.fixture(scope="module")
def cores(module_tmp, tiny_served):
    """(unlimited core, lane-limited core, inconsistent core, public key)."""
    from helios_ignition.export import export_core

    core = tiny_served.core
    folder = module_tmp("tiny-lane-limit")
    recipe = folder / "tiny_spec.py"
    recipe.write_text(RECIPE.format(base=str(LLAMA_RECIPE)))
    unlimited = folder / "tiny-spec.core"
    export_core(recipe, checkpoint=str(tiny_served.checkpoint), key_path=core.private_key,
                namespace=NAMESPACE, out=unlimited, weight_dtype="f32")
    limited = _resign(unlimited, folder / "limited.core", core, lambda graphs: graphs)
    inconsistent = _resign(unlimited, folder / "inconsistent.core", core,
                           lambda graphs: graphs[:1])
    return unlimited, limited, inconsistent, core.public_key


def _resign(src: Path, out: Path, core, pick) -> Path:
    """`src` re-signed with lane_limit 2 on the W = 4 programs `pick` selects (a list of
    them, in contract order, to a sublist)."""
    with open_core(src, [load_public_key(core.public_key)]) as opened:
        contract, manifest = type(opened.contract)(), type(opened.manifest)()
        contract.CopyFrom(opened.contract)
        manifest.CopyFrom(opened.manifest)
        wide = [g for g in contract.model.graphs if g.operation == c.OPERATION_SPECULATIVE
                and g.speculative.token_capacity == 4]
        assert len(wide) >= 2 and all(g.speculative.lane_limit == 4 for g in wide)
        for graph in pick(wide):
            graph.speculative.lane_limit = 2
        with CoreWriter(out, load_private_key(core.private_key), None,
                        opened.namespace) as writer:
            for rid, res in opened.resources.items():
                writer.add_resource(rid, res.kind, opened.read_resource(rid))
            writer.finish(contract, manifest)
    return out


def _lint_rules(path: Path, public: Path) -> set[str]:
    result = CliRunner().invoke(tools_main, ["lint-core", str(path), "--trust", str(public),
                                             "--accept", NAMESPACE, "--format", "json"])
    findings = json.loads(result.output)["findings"]
    assert result.exit_code == (1 if findings else 0), result.output
    return {finding["rule"] for finding in findings}


def _serve(path: Path, public: Path, **options):
    bootstrap = Bootstrap.load(path, [public], NAMESPACE)
    settings = resolve(ServeOptions(port=0, max_active=4, queue_capacity=8, **options),
                       bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active,
                             speculative_width=options.get("speculative_width"))
    return bootstrap, Server.start(bootstrap, model, settings, ObservationClock())


def _metrics(server) -> dict[str, float]:
    out = {}
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _ask(server, prompt: str) -> list[int]:
    body = {"model": server.settings.served_name, "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": prompt}], "return_token_ids": True}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def _run(path: Path, public: Path) -> tuple[list[list[int]], dict[str, float]]:
    """Greedy answers to PROMPTS (fixed policy: every lane as long as the core lets it
    be), one request at a time, and the /metrics counters after them."""
    bootstrap, server = _serve(path, public, speculative_policy="fixed")
    try:
        answers = [_ask(server, prompt) for prompt in PROMPTS]
        return answers, _metrics(server)
    finally:
        server.stop()
        bootstrap.close()


DRAFTS = 'helios_spec_decode_draft_tokens_total{source="learned"}'
LANES = "helios_spec_decode_accepted_length_count"


def test_a_lane_limited_core_lints_clean_and_serves_lanes_within_its_limit(cores):
    unlimited, limited, _, public = cores
    assert _lint_rules(limited, public) == set()
    answers, metrics = _run(limited, public)
    reference, wide = _run(unlimited, public)
    assert answers == reference  # greedy text never depends on the lane lengths
    # Every lane of 2 or more positions offers one draft per position after its pending
    # one: drafts == lanes exactly when no lane verified more than 2.
    assert metrics[LANES] > 0
    assert metrics[DRAFTS] == metrics[LANES]
    assert metrics['helios_spec_decode_accepted_length_bucket{le="2.0"}'] == metrics[LANES]
    # one draft position only: every lane offered its draft 0, none a draft 1
    first = 'helios_spec_decode_draft_per_position_total{position="0",source="learned"}'
    assert metrics[first] == metrics[LANES]
    assert not any(name.startswith("helios_spec_decode_draft_per_position_total")
                   and 'position="1"' in name for name in metrics)
    # The unlimited core's lanes of the same requests were 4 long (3 drafts each), but
    # where fewer than 4 tokens were left.
    assert wide[DRAFTS] > 2 * wide[LANES]
    assert wide['helios_spec_decode_draft_per_position_total{position="2",source="learned"}'] > 0


def test_lane_limits_that_disagree_within_a_width_are_refused_by_lint_and_startup(cores):
    _, _, inconsistent, public = cores
    assert RULE in _lint_rules(inconsistent, public)
    with pytest.raises(StartupError) as info:
        start(inconsistent, [str(public)], NAMESPACE, ServeOptions(port=0)).stop()
    assert info.value.rule == RULE
    assert "W = 4 programs declare one lane limit" in str(info.value)


@pytest.mark.parametrize(("limits", "options", "line"), [
    ((1, 2, 4), {}, "widths up to 4, adaptive width policy"),
    ((1, 2, 2), {"history_drafting": True, "history_proposer": "suffix"},
     "widths up to 4 (lanes up to 2), adaptive width policy, history drafting (suffix)"),
])  # fmt: skip
def test_the_startup_log_names_a_lane_limit_below_the_width(limits, options, line):
    from helios_serve.loading import _speculation_line
    from helios_serve.testing.scripted import tiny_geometry

    geometry = tiny_geometry(64, speculative_widths=(1, 2, 4), lane_limits=limits)
    assert _speculation_line(geometry, ServeOptions(**options)) == line
