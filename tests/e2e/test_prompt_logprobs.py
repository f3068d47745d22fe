"""Prompt log probabilities through SCORED_PREFILL programs, on the tiny model served for
real (both worker modes): legacy completions with `echo` + `logprobs` (and max_tokens 0),
chat's `prompt_logprobs`, and their rejections.

Every value is compared with the independent plain NumPy forward
(bench/numpy_forward.py) over the same checkpoint: full logits of the prompt, log_softmax
in float64. The scored programs record float32 logprobs, hence the 1e-4 tolerance; ids
are exact.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from helios_serve.testing.harness import ScriptedServer
from helios_serve.testing.tokenizer import TinyTokenizer

from tests.tiny_model import SERVED_ID, TOKENIZER, _plain, prompt_ids

PROMPT = "Hello there, world"
LONG = "The quick brown fox jumps over the lazy dog. " * 4  # 180 ids: two scored chunks


def _encode(text: str) -> list[int]:
    return TOKENIZER.tokenizer.encode(text, add_special_tokens=False).ids


def _reference(checkpoint, ids: list[int]) -> np.ndarray:
    """float64 log_softmax of the plain forward's logits at every prompt position."""
    plain = _plain(checkpoint)
    logits = plain.forward(np.asarray([ids]), plain.new_cache(1, len(ids)),
                           last_only=False)[0].astype(np.float64)
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _top(row: np.ndarray, k: int) -> list[int]:
    return [int(i) for i in np.argsort(-row, kind="stable")[:k]]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": SERVED_ID, **body}, timeout=120)


@pytest.mark.parametrize("text", [PROMPT, LONG])
def test_echo_logprobs_equal_the_plain_forward(tiny_server, tiny_served, text):
    ids = _encode(text)
    ref = _reference(tiny_served.checkpoint, ids)
    r = _post(tiny_server, "/v1/completions", {"prompt": text, "max_tokens": 0, "echo": True,
                                               "logprobs": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    pieces = [TOKENIZER.tokenizer.decode([i]) for i in ids]
    assert lp["tokens"] == pieces
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = [ref[p, ids[p + 1]] for p in range(len(ids) - 1)]
    np.testing.assert_allclose(lp["token_logprobs"][1:], expected, atol=1e-4, rtol=0)
    for p in range(len(ids) - 1):
        best = _top(ref[p], 3)
        tops = lp["top_logprobs"][p + 1]
        # keyed by token text: texts of distinct ids may coincide, so compare values
        np.testing.assert_allclose(sorted(tops.values(), reverse=True),
                                   sorted({TOKENIZER.tokenizer.decode([i]): ref[p, i]
                                           for i in best}.values(), reverse=True),
                                   atol=1e-4, rtol=0)
    assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in pieces[:-1]]))
    assert r.json()["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0,
                                 "total_tokens": len(ids),
                                 "prompt_tokens_details": {"cached_tokens": 0}}


def test_echo_logprobs_then_generated_tokens(tiny_server, tiny_served):
    """max_tokens > 0: the prompt's logprobs, then the generated tokens' (lm-eval's
    request: it drops the last entry)."""
    ids = _encode(PROMPT)
    r = _post(tiny_server, "/v1/completions", {"prompt": ids, "max_tokens": 2, "echo": True,
                                               "logprobs": 1, "temperature": 0,
                                               "ignore_eos": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 2
    assert choice["text"].startswith(PROMPT) and len(choice["text"]) > len(PROMPT)
    generated = _plain(tiny_served.checkpoint).greedy(ids, 2)[0]
    assert lp["tokens"][len(ids):] == [TOKENIZER.tokenizer.decode([i]) for i in generated]
    assert lp["text_offset"][len(ids)] == len(PROMPT)
    ref = _reference(tiny_served.checkpoint, ids + generated[:1])
    np.testing.assert_allclose(lp["token_logprobs"][len(ids)], ref[-2, generated[0]],
                               atol=1e-4, rtol=0)


def test_a_cached_prefix_is_scored_again(tiny_server, tiny_served):
    """The same prompt twice: the second request reuses nothing (every position's logits
    are needed) and reports the same values; a plain request after it does reuse."""
    text = "A cached prompt of some length to fill one page or two of the cache."
    body = {"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 0}
    first = _post(tiny_server, "/v1/completions", body).json()
    second = _post(tiny_server, "/v1/completions", body).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["choices"][0]["logprobs"] == second["choices"][0]["logprobs"]
    plain = _post(tiny_server, "/v1/completions",
                  {"prompt": text, "max_tokens": 1, "temperature": 0}).json()
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_n_choices_share_the_prompt_scores(tiny_server):
    r = _post(tiny_server, "/v1/completions", {"prompt": [PROMPT, "Hi"], "n": 2, "echo": True,
                                               "max_tokens": 1, "logprobs": 0,
                                               "temperature": 0}).json()
    assert [c["logprobs"]["token_logprobs"][:len(_encode(PROMPT))] for c in r["choices"][:2]] \
        == [r["choices"][0]["logprobs"]["token_logprobs"][:len(_encode(PROMPT))]] * 2
    assert r["choices"][2]["logprobs"]["token_logprobs"][0] is None
    assert len(r["choices"][3]["logprobs"]["token_logprobs"]) == len(_encode("Hi")) + 1


def test_streamed_echo_carries_the_prompt_logprobs(tiny_server):
    body = {"prompt": PROMPT, "max_tokens": 2, "echo": True, "logprobs": 2, "temperature": 0,
            "ignore_eos": True}
    whole = _post(tiny_server, "/v1/completions", body).json()["choices"][0]
    with httpx.stream("POST", tiny_server.url + "/v1/completions",
                      json={"model": SERVED_ID, **body, "stream": True}, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    values = [v for c in chunks if c["choices"][0]["logprobs"]
              for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert chunks[0]["choices"][0]["text"] == PROMPT
    assert text == whole["text"] and values == whole["logprobs"]["token_logprobs"]


def test_chat_prompt_logprobs(tiny_server, tiny_served):
    ids = prompt_ids("Hi")
    ref = _reference(tiny_served.checkpoint, ids)
    r = _post(tiny_server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0,
        "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    scores = r.json()["prompt_logprobs"]
    assert len(scores) == len(ids) and scores[0] is None
    for p in range(1, len(ids)):
        entry = scores[p]
        best = _top(ref[p - 1], 2)
        assert set(entry) == {str(ids[p]), *map(str, best)}
        got = entry[str(ids[p])]
        assert abs(got["logprob"] - ref[p - 1, ids[p]]) < 1e-4
        assert got["decoded_token"] == TOKENIZER.tokenizer.decode([ids[p]],
                                                                skip_special_tokens=False)
        for rank, i in enumerate(best, 1):
            assert entry[str(i)]["rank"] == rank
            assert abs(entry[str(i)]["logprob"] - ref[p - 1, i]) < 1e-4
        assert got["rank"] == (best.index(ids[p]) + 1 if ids[p] in best else None)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 21}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "prompt_logprobs": -1}, "prompt_logprobs"),
])  # fmt: skip
def test_rejections_name_the_field(tiny_server, path, body, param):
    r = _post(tiny_server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert _post(tiny_server, "/v1/completions", {"prompt": "x", "max_tokens": 1}
                 ).status_code == 200  # nothing else disturbed


def test_a_scored_record_without_scores_fails_the_request():
    """A model whose scored step reports no scores (the scripted model records none): the
    record is invalid, the request fails with a 500 and the server serves on."""
    with ScriptedServer(TinyTokenizer(), geometry={"scored_token_capacities": (16,),
                                       "top_logprobs": 2}) as s:
        s.script("hi", ["Hello"])
        r = httpx.post(s.url + "/v1/completions", json={
            "model": s.model_name, "prompt": "hi", "echo": True, "logprobs": 1}, timeout=60)
        assert r.status_code == 500, r.text
        assert r.json()["error"]["message"] == (
            "invalid completion record: a scored step's record holds no score for every "
            "packed token")
        ok = httpx.post(s.url + "/v1/completions",
                        json={"model": s.model_name, "prompt": "hi"}, timeout=60)
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "Hello"
