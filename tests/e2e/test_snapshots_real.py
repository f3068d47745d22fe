"""Exact-endpoint snapshots with the real model (SmolLM2, CPU backend, real HTTP).

The recipe marks every ChatML message end ("<|im_end|>\\n") as a prefix boundary, backs
64 continuation rows and captures the RESTORE programs; a request's end publishes a
snapshot of its committed tokens. So a second turn reuses exactly the first turn's
committed tokens, and a conversation sharing only the system turn reuses exactly it.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from helios_serve.runtime.native_model import NativeModel
from prometheus_client.parser import text_string_to_metric_families

SYSTEM = ("You are a terse assistant for a bakery. Answer in one short sentence and never "
          "use lists.")


def _chat(server, messages, max_tokens=12) -> dict:
    body = {"model": "smollm2-135m-instruct", "messages": messages, "temperature": 0,
            "max_tokens": max_tokens, "return_token_ids": True}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _counter(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and not s.labels:
                return s.value
    raise KeyError(name)


def test_turn_two_reuses_exactly_the_first_turns_committed_tokens(real_server):
    first_messages = [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "What time do you open?"}]
    first = _chat(real_server, first_messages)
    ids = first["choices"][0]["token_ids"]
    committed = len(first["prompt_token_ids"]) + len(ids) - 1  # the last sampled id: not fed
    reply = first["choices"][0]["message"]["content"]
    second_messages = first_messages + [{"role": "assistant", "content": reply},
                                        {"role": "user", "content": "And on Sundays?"}]
    prefill_before = _counter(real_server, "helios_prefill_tokens_total")
    second = _chat(real_server, second_messages)
    prompt = second["prompt_token_ids"]
    # The precondition of exact reuse: the re-rendered history tokenizes as generated.
    assert prompt[:committed] == (first["prompt_token_ids"] + ids)[:committed]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == committed
    assert committed % 16  # a partial last page: restored from a continuation row
    prefilled = _counter(real_server, "helios_prefill_tokens_total") - prefill_before
    assert prefilled == len(prompt) - committed  # only the new tokens


def test_a_shared_system_turn_is_reused_to_its_exact_end(real_server, smollm2_core_f32):
    a = _chat(real_server, [{"role": "system", "content": SYSTEM + " Be kind."},
                            {"role": "user", "content": "Do you sell rye bread?"}], max_tokens=2)
    b = _chat(real_server, [{"role": "system", "content": SYSTEM + " Be kind."},
                            {"role": "user", "content": "Can I order a cake?"}], max_tokens=2)
    pa, pb = a["prompt_token_ids"], b["prompt_token_ids"]
    common = next(i for i, (x, y) in enumerate(zip(pa, pb, strict=False)) if x != y)
    # The system turn ends right after its "<|im_end|>\n": the boundary the recipe marks.
    tokenizer = real_server.bootstrap.tokenizer
    system_end = next(n for n in range(common, 0, -1)
                      if tokenizer.decode(pa[:n], skip_special_tokens=False).endswith(
                          "<|im_end|>\n"))
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == system_end
    assert system_end % 16


@pytest.fixture(scope="module")
def restored_and_fresh(smollm2_core_f32):
    """Turn-two logits on the CPU backend: with its snapshot restored, and on a model with
    snapshots off (computed from scratch)."""
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.testing.serial import Serial

    core = smollm2_core_f32
    prompt = list(range(300, 350))  # 50 tokens: three pages and a tail of 2
    out = {}
    with Bootstrap.load(core.path, [core.public_key], core.namespace) as bootstrap:
        for name, snapshots in (("restored", None), ("fresh", 0)):
            model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                                     snapshots=snapshots)
            try:
                run = Serial(model)
                if snapshots is None:
                    run.add(1, prompt, 4)
                    run.run()
                    first = run.out[1]
                follow = prompt + first + [500, 501, 502]
                run.add(2, follow, 3)
                run.run()
                out[name] = (run.reused[2], run.out[2], np.stack(run.logits[2]))
            finally:
                model.close()
    return out


def test_logits_after_a_restore_equal_logits_without_a_snapshot(restored_and_fresh):
    reused, tokens, logits = restored_and_fresh["restored"]
    fresh_reused, fresh_tokens, fresh_logits = restored_and_fresh["fresh"]
    assert (reused, fresh_reused) == (53, 0)  # 50 + 4 outputs - 1: three pages + tail 5
    assert tokens == fresh_tokens
    np.testing.assert_allclose(logits, fresh_logits, atol=2e-3, rtol=0)


def test_the_snapshot_core_lints_clean_for_both_backends(smollm2_core_f32):
    """Its continuation region, host planes and RESTORE programs pass every contract rule
    and both capability tables, so startup cannot fail on them (lint-core = startup)."""
    from click.testing import CliRunner
    from helios_tools.cli import main as tools_main

    core = smollm2_core_f32
    result = CliRunner().invoke(tools_main, ["lint-core", str(core.path), "--trust",
                                             str(core.public_key), "--accept", core.namespace])
    assert result.exit_code == 0, result.output
    assert result.output.endswith(" 0 finding(s)\n")
