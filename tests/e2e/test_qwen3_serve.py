"""The Qwen3-MoE fixture checkpoint (tests/fixtures/qwen3/moe: 8 experts, top-2) exported
with recipes/qwen3.py (f32 weights) and served by a real `helios-serve` process on a free
port: greedy completions of the fixture's prompts are transformers' greedy continuations
(tests/fixtures/qwen3/make_reference.py: their text and the first token's log
probability), through the CLI, HTTP and the cpu backend."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.ignition.export.tiny import NAMESPACE, REPO, run_export
from tests.tiny_model import ServeProcess

FIXTURES = REPO / "tests" / "fixtures" / "qwen3"


@pytest.fixture(scope="module")
def core(module_tmp, signing_key_pair):
    out = module_tmp("qwen3-moe") / "moe.core"
    result = run_export(REPO / "recipes" / "qwen3.py", "--checkpoint", FIXTURES / "moe",
                        "--key", signing_key_pair[0], "--namespace", NAMESPACE, "--out", out,
                        "--weight-dtype", "f32")
    assert result.exit_code == 0, result.output
    return out


def test_served_greedy_ids_are_transformers(core, signing_key_pair):
    reference = np.load(FIXTURES / "reference.npz")
    tokenizer = Tokenizer.from_file(str(FIXTURES / "tokenizer.json"))
    with ServeProcess(core, "--trust", signing_key_pair[1], "--accept", NAMESPACE) as served:
        for p in range(3):
            r = httpx.post(served.url + "/v1/completions", timeout=60, json={
                "model": "qwen3-moe", "prompt": reference[f"moe/p{p}/ids"].tolist(),
                "max_tokens": 8, "temperature": 0, "logprobs": 0})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            want = reference[f"moe/p{p}/greedy"].tolist()  # no EOS among them
            # The text is the tokenizer's decoding of transformers' ids (id 333 of prompt
            # 1 lies past the tokenizer's 320 ids, in the model's padded rows: no text).
            assert choice["text"] == tokenizer.decode(want), p
            assert len(choice["logprobs"]["tokens"]) == 8
            z = reference[f"moe/p{p}/logits"][-1].astype(np.float64)
            first = z[want[0]] - z.max() - np.log(np.exp(z - z.max()).sum())
            assert abs(choice["logprobs"]["token_logprobs"][0] - first) < 1e-4, p
