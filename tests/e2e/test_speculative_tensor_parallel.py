"""Speculation with tensor-parallel ranks served over real HTTP (docs/tensor-parallel.md,
docs/speculative.md): the tiny model with a seeded random drafter (widths 1, 2, 4)
split between 2 ranks, as threads (in-process server) and as processes (`helios-serve
--rank R`), answers with the greedy ids of the plain NumPy forward of the unsplit
checkpoint (bench/numpy_forward.py) while its lanes speculate; a rank whose record of one
speculative step disagrees fails exactly that request and the server serves on."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime import NativeModel
from helios_serve.server import Server

from tests.e2e.test_tensor_parallel import _start_rank1
from tests.tiny_model import (
    LLAMA_RECIPE,
    NAMESPACE,
    PROMPTS,
    SERVED_ID,
    ServeProcess,
    plain_greedy,
    prompt_ids,
    until_eos,
)

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
STEPS = 16


class _Core:
    def __init__(self, path: Path, public_key: Path):
        self.path, self.public_key = path, public_key


@pytest.fixture(scope="module")
def spec_tp2(module_tmp, tiny_served) -> _Core:
    from helios_ignition.export import export_core

    core = tiny_served.core
    folder = module_tmp("tiny-spec-tp2")
    recipe = folder / "tiny_spec.py"
    recipe.write_text(RECIPE.format(base=str(LLAMA_RECIPE)))
    out = folder / "tiny-spec-tp2.core"
    export_core(recipe, checkpoint=str(tiny_served.checkpoint), key_path=core.private_key,
                namespace=NAMESPACE, out=out, weight_dtype="f32", tensor_parallel=2)
    return _Core(out, core.public_key)


@pytest.fixture(scope="module")
def expected(tiny_served) -> dict[str, list[int]]:
    return {text: until_eos(plain_greedy(tiny_served.checkpoint, prompt_ids(text), STEPS))
            for text in PROMPTS}


def _ask(url: str, text: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": SERVED_ID, "max_tokens": STEPS, "temperature": 0, "return_token_ids": True,
        "messages": [{"role": "user", "content": text}]})


def _launches(url: str) -> float:
    line = next(x for x in httpx.get(url + "/metrics").text.splitlines()
                if x.startswith('helios_graph_launches_total{operation="speculative"}'))
    return float(line.split()[-1])


def test_thread_ranks_speculate_the_unsplit_greedy_ids_and_survive_a_rejected_step(
        spec_tp2, expected):
    bootstrap = Bootstrap.load(spec_tp2.path, [spec_tp2.public_key], NAMESPACE)
    settings = resolve(ServeOptions(port=0, max_active=4, queue_capacity=8,
                                    speculative_policy="fixed"), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    try:
        assert model.backend.peers.ranks == 2
        got = {}
        for text in PROMPTS:
            r = _ask(server.url, text)
            assert r.status_code == 200, r.text
            got[text] = r.json()["choices"][0]["token_ids"]
        assert got == expected
        assert _launches(server.url) > 0
        # rank 1 disagrees on the next speculative step only
        rank1 = model.backend.peers._ranks[1]
        honest = rank1.run
        lied = []

        def lying(step):
            record = honest(step)
            if step.graph.startswith("spec_") and not lied:
                record["out.record"][0, 2] += 1
                lied.append(step.graph)
            return record

        rank1.run = lying
        r = _ask(server.url, PROMPTS[0])
        assert r.status_code == 500
        assert "speculative step is rejected on every rank" in r.text
        assert lied
        assert httpx.get(server.url + "/health").status_code == 200
        again = _ask(server.url, PROMPTS[0])
        assert again.status_code == 200
        assert again.json()["choices"][0]["token_ids"] == expected[PROMPTS[0]]
    finally:
        server.stop()
        bootstrap.close()


def test_process_ranks_speculate_the_unsplit_greedy_ids(spec_tp2, expected, tmp_path):
    ranks = _start_rank1(spec_tp2, tmp_path)
    try:
        with ServeProcess(*ranks.options, "--rank", "0", "--speculative-policy",
                          "fixed") as served:
            got = {text: served.chat_ids(text, STEPS) for text in PROMPTS}
            speculative = _launches(served.url)
        assert ranks.rank1.wait(timeout=60) == 0
    finally:
        err = ranks.stop()
    assert got == expected, err
    assert speculative > 0
    assert any("2 tensor-parallel ranks (processes" in line for line in served.stderr_lines)
