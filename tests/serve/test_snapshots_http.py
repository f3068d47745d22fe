"""Exact-endpoint snapshots, fences and the host tier through real HTTP, on the scripted
backend (helios_serve.testing.scripted: it executes the scheduler's real plans over an
emulated paged cache and tiers, so a wrong restore reads back a wrong prompt).

Pages hold 4 tokens. The scripted reply "xyzqjv" is six single-byte tokens that the tiny
tokenizer encodes back to the same ids, so a follow-up turn's prompt starts with exactly
the first turn's committed tokens: its prompt, the reply, not the final EOS.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from helios_serve.testing.harness import ScriptedServer
from prometheus_client.parser import text_string_to_metric_families

REPLY = ["x", "y", "z", "q", "j", "v"]


def _metrics(server) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for s in family.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def _chat(server, messages, **extra) -> dict:
    body = {"model": server.model_name, "messages": messages, "return_token_ids": True,
            "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _cached(response) -> int:
    return response["usage"]["prompt_tokens_details"]["cached_tokens"]


def _turn(server, history, user, **extra):
    messages = history + [{"role": "user", "content": user}]
    r = _chat(server, messages, **extra)
    reply = r["choices"][0]["message"]["content"]
    return r, messages + [{"role": "assistant", "content": reply}]


@pytest.fixture
def server(tok):
    with ScriptedServer(tok, geometry={"snapshot_rows": 8}) as s:
        s.script("hi", REPLY)
        yield s


def test_turn_two_prefills_only_its_new_tokens(server):
    first, history = _turn(server, [], "hi")
    committed = len(first["prompt_token_ids"]) + len(REPLY)  # the EOS is never fed
    assert committed % 4 and history[-1]["content"] == "".join(REPLY)
    before = _metrics(server)
    second, _ = _turn(server, history, "more")
    prompt = second["prompt_token_ids"]
    assert prompt[:committed] == first["prompt_token_ids"] + first["choices"][0]["token_ids"][:-1]
    assert _cached(second) == committed
    after = _metrics(server)
    assert after["helios_prefill_tokens_total"] - before["helios_prefill_tokens_total"] == \
        len(prompt) - committed
    assert after["helios_snapshot_hits_total"] - before["helios_snapshot_hits_total"] == 1
    assert after["helios_snapshot_publications_total"] == 2  # each turn's end
    assert server.wait_idle()["pages_used"] == 0


def test_without_snapshots_only_complete_pages_are_reused(tok):
    with ScriptedServer(tok) as server:
        server.script("hi", REPLY)
        first, history = _turn(server, [], "hi")
        committed = len(first["prompt_token_ids"]) + len(REPLY)
        second, _ = _turn(server, history, "more")
        assert _cached(second) == committed // 4 * 4
        assert _metrics(server)["helios_snapshot_publications_total"] == 0


def test_a_matched_stop_publishes_nothing_and_keeps_earlier_pages(server):
    r = _chat(server, [{"role": "user", "content": "hi"}], stop=["q"])
    assert r["choices"][0]["message"]["content"] == "xyz"
    assert r["choices"][0]["finish_reason"] == "stop"
    m = _metrics(server)
    assert m["helios_snapshot_publications_total"] == 0
    # The turn's complete pages stay cached: a follow-up of the visible text reuses them.
    committed = len(r["prompt_token_ids"]) + 3  # x, y, z; the stop token crossing is fed
    follow = _chat(server, [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "xyz"},
                            {"role": "user", "content": "go on"}])
    assert _cached(follow) == committed // 4 * 4
    assert server.wait_idle()["pages_used"] == 0


def test_a_failed_step_publishes_no_checkpoint(server):
    server.model.fail_on_sequence(lambda seq: len(seq) > 0 and seq[-1] == server.tok.ids(["z"])[0])
    body = {"model": server.model_name, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 500
    server.model.clear_faults()
    assert _metrics(server)["helios_snapshot_publications_total"] == 0
    assert server.wait_idle()["pages_used"] == 0
    ok = _chat(server, [{"role": "user", "content": "hi"}])  # the server keeps serving
    assert ok["choices"][0]["message"]["content"] == "".join(REPLY)
    assert _metrics(server)["helios_snapshot_publications_total"] == 1


def test_snapshot_capacity_is_bounded_and_evicts_lru(tok):
    with ScriptedServer(tok, geometry={"snapshot_rows": 1}) as server:
        server.script("hi", REPLY)
        server.script("yo", REPLY)
        a, history_a = _turn(server, [], "hi")
        b, _ = _turn(server, [], "yo")  # takes the one row: conversation a's snapshot goes
        m = _metrics(server)
        assert m["helios_snapshot_publications_total"] == 2
        assert m["helios_snapshot_evictions_total"] == 1
        assert m["helios_snapshot_capacity"] == 1 and m["helios_snapshots_resident"] == 1
        again, _ = _turn(server, history_a, "more")
        committed = len(a["prompt_token_ids"]) + len(REPLY)
        assert _cached(again) == committed // 4 * 4  # its tail was evicted


def test_the_host_tier_brings_pages_back(tok):
    geometry = {"snapshot_rows": 2, "host_rows": 256, "num_pages": 32}
    with ScriptedServer(tok, geometry=geometry, max_active=1) as server:
        server.script("hi", REPLY)
        first, history = _turn(server, [], "hi" + " padding" * 6, max_tokens=8)
        committed = len(first["prompt_token_ids"]) + len(REPLY)
        for i in range(6):  # other conversations push the first one's pages out
            _chat(server, [{"role": "user", "content": f"other {i} " + "filler " * 5}],
                  max_tokens=2)
        m = _metrics(server)
        assert m["helios_host_cache_swap_outs_total"] > 0
        assert m["helios_host_cache_bytes_used"] > 0
        assert m["helios_host_cache_bytes_capacity"] == 256 * 4 * 8  # rows x page_bytes
        second, _ = _turn(server, history, "more", max_tokens=8)
        assert _cached(second) == committed
        after = _metrics(server)
        assert after["helios_host_cache_hits_total"] > m["helios_host_cache_hits_total"]
        assert after["helios_host_cache_swap_ins_total"] > m["helios_host_cache_swap_ins_total"]
        assert second["choices"][0]["message"]["content"] == "".join(REPLY)


def test_a_dropped_stream_keeps_nothing(tok):
    with ScriptedServer(tok, geometry={"snapshot_rows": 8}, step_delay_s=0.02) as server:
        server.script("hi", REPLY * 4)
        body = {"model": server.model_name, "messages": [{"role": "user", "content": "hi"}],
                "stream": True}
        got = threading.Event()
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=30) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    got.set()
                    break  # drop the reader mid-stream
        assert got.is_set()
        assert server.wait_idle()["pages_used"] == 0
        assert _metrics(server)["helios_snapshot_publications_total"] == 0


def test_the_choices_of_n_restore_the_first_choices_prompt_snapshot(server):
    """n = 2: the second choice restores the snapshot of all but the prompt's last token
    that the first choice publishes, so the prompt is computed once plus one token."""
    server.script("hello", REPLY)
    before = _metrics(server)
    r = _chat(server, [{"role": "user", "content": "hello"}], n=2)
    prompt = len(r["prompt_token_ids"])
    assert prompt % 4 != 1  # a partial page to restore (endpoint prompt - 1)
    assert [c["message"]["content"] for c in r["choices"]] == ["".join(REPLY)] * 2
    after = _metrics(server)
    assert after["helios_prefill_tokens_total"] - before["helios_prefill_tokens_total"] == \
        prompt + 1
    assert after["helios_snapshot_hits_total"] - before["helios_snapshot_hits_total"] == 1
    assert server.wait_idle()["pages_used"] == 0
