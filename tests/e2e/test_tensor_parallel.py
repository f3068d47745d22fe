"""A tensor-parallel core served over real HTTP (docs/tensor-parallel.md).

`helios-serve` on the tiny model split between 2 ranks (`ignition export
--tensor-parallel 2`) runs the ranks as threads of one process (RankPeers::Threads, the
default) and answers with the greedy ids of the plain NumPy forward of the unsplit
checkpoint (bench/numpy_forward.py: an independent implementation), which the single-rank
core serves too (tests/e2e/test_logical_cores.py).
"""

from __future__ import annotations

import httpx
import pytest

from tests.tiny_model import (
    NAMESPACE,
    PROMPTS,
    ServeProcess,
    plain_greedy,
    prompt_ids,
    until_eos,
)

STEPS = 16


@pytest.fixture(scope="module")
def expected(tiny_served) -> dict[str, list[int]]:
    return {text: until_eos(plain_greedy(tiny_served.checkpoint, prompt_ids(text), STEPS))
            for text in PROMPTS}


def test_threads_serve_the_unsplit_models_greedy_ids(tiny_tp2, expected):
    with ServeProcess(tiny_tp2.path, "--trust", tiny_tp2.public_key, "--accept",
                      NAMESPACE) as served:
        got = {text: served.chat_ids(text, STEPS) for text in PROMPTS}
        health = httpx.get(served.url + "/health", timeout=10)
    assert got == expected
    assert health.status_code == 200
    assert any("2 tensor-parallel ranks (threads)" in line for line in served.stderr_lines), \
        served.stderr_lines
