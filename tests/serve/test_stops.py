"""String and token stops through the real worker, scheduler, output pipeline and HTTP,
driven by the scripted token source (the specification, "String stops")."""

from __future__ import annotations

import pytest
from helios_serve.testing.harness import content_of, sse_post


def _chat(server, prompt: str, **extra):
    return {"model": server.model_name, "messages": [{"role": "user", "content": prompt}], **extra}


LETTERS = ["Letters", ":", " H", "IJ", "K", "LM", "NOP", " Hello", "!"]


def test_stop_across_three_tokens_never_leaks(scripted):
    scripted.script("letters please", LETTERS)
    status, events = sse_post(scripted.url, _chat(scripted, "letters please", stream=True,
                                                  stop=["KLMNOP"]))
    assert status == 200
    deltas = [e["choices"][0]["delta"].get("content") for e in events
              if isinstance(e, dict) and e["choices"]]
    pieces = [d for d in deltas if d]
    assert "".join(pieces) == "Letters: HIJ"
    for piece in pieces:  # no delta ever carries a piece of the stop
        assert not any(s in piece for s in ("K", "LM", "NOP"))
    finish = [e["choices"][0]["finish_reason"] for e in events
              if isinstance(e, dict) and e["choices"]]
    assert finish[-1] == "stop" and all(f is None for f in finish[:-1])
    assert events[-1] == "[DONE]"


def test_stop_json_counts_the_crossing_token(scripted):
    scripted.script("letters please", LETTERS)
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "letters please"}],
        stop=["KLMNOP"], extra_body={"return_token_ids": True},
    )
    assert r.choices[0].message.content == "Letters: HIJ"
    assert r.choices[0].finish_reason == "stop"
    # Usage and raw-token observation count every sampled token through the one that
    # completed the stop ("NOP"), nothing after it.
    assert r.usage.completion_tokens == 7
    assert r.choices[0].token_ids == scripted.tok.ids(LETTERS[:7])


def test_earliest_completed_match_wins(scripted):
    scripted.script("look", ["Look", " there", "!"])
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "look"}],
        stop=["re", "he"],
    )
    # " there" completes "he" (at " the") before "re" (at " there").
    assert r.choices[0].message.content == "Look t"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize(("stops", "content"), [(["here", "ere"], "Look t"),
                                                (["ere", "here"], "Look th")])
def test_ties_resolve_by_list_order(scripted, stops, content):
    scripted.script("look", ["Look", " there", "!"])
    status, events = sse_post(scripted.url, _chat(scripted, "look", stream=True, stop=stops))
    assert status == 200
    assert content_of(events) == content


def test_stop_removes_suffix_inside_the_same_token(scripted):
    scripted.script("greet", ["Hello", ",", " world", "!"])
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "greet"}], stop="wor",
    )
    assert r.choices[0].message.content == "Hello, "
    assert r.usage.completion_tokens == 3


def test_partial_utf8_is_buffered_until_resolved(scripted, tok):
    # " caf" then the two bytes of "é" as separate tokens, then "!".
    ids = tok.ids([" caf"]) + tok.byte_ids("é".encode()) + tok.ids(["!"])
    scripted.book.add("cafe", ids)
    status, events = sse_post(scripted.url, _chat(scripted, "cafe", stream=True))
    pieces = [e["choices"][0]["delta"].get("content") for e in events
              if isinstance(e, dict) and e["choices"]]
    assert content_of(events) == " café!"
    assert all("\ufffd" not in p for p in pieces if p)
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "cafe"}], stop=["é!"],
    )
    assert r.choices[0].message.content == " caf"


def test_eos_flushes_an_unmatched_stop_prefix(scripted):
    scripted.script("greet", ["Hello", ",", " world"])  # then EOS
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "greet"}],
        stop=[" world!"],
    )
    assert r.choices[0].message.content == "Hello, world"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 4  # three tokens and EOS


def test_output_limit_flushes_an_unmatched_stop_prefix(scripted):
    scripted.script("greet", ["Hello", ",", " world", "!"])
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "greet"}],
        stop=[" world!"], max_tokens=3,
    )
    assert r.choices[0].message.content == "Hello, world"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_stop_token_ids_are_omitted_from_presentation(scripted, tok):
    scripted.script("greet", ["Hello", ",", " world", "!", " The"])
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "greet"}],
        extra_body={"stop_token_ids": tok.ids(["!"]), "return_token_ids": True},
    )
    assert r.choices[0].message.content == "Hello, world"
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].token_ids == tok.ids(["Hello", ",", " world", "!"])
    assert r.usage.completion_tokens == 4


def test_stop_token_sequences(scripted, tok):
    scripted.script("greet", ["Hello", ",", " world", "!", " The"])
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "greet"}],
        extra_body={"stop_token_sequences": [tok.ids([",", " world"])]},
    )
    assert r.choices[0].message.content == "Hello"
    assert r.choices[0].finish_reason == "stop"
    # A held prefix that does not complete is released in order.
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "greet"}],
        extra_body={"stop_token_sequences": [tok.ids([",", " The"])]},
    )
    assert r.choices[0].message.content == "Hello, world! The"


def test_empty_stop_array_disables_string_stops(scripted):
    scripted.script("greet", ["Hello", ",", " world", "!"])
    client = scripted.openai()
    r = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "greet"}], stop=[],
    )
    assert r.choices[0].message.content == "Hello, world!"


def test_include_usage_chunk_shapes(scripted):
    scripted.script("letters please", LETTERS)
    status, events = sse_post(scripted.url, _chat(
        scripted, "letters please", stream=True, stop=["KLMNOP"],
        stream_options={"include_usage": True}))
    assert status == 200
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    with_choices = [c for c in chunks if c["choices"]]
    usage_only = [c for c in chunks if not c["choices"]]
    assert all("usage" in c and c["usage"] is None for c in with_choices)
    assert len(usage_only) == 1 and chunks[-1] is usage_only[0]
    assert usage_only[0]["usage"]["completion_tokens"] == 7
    assert usage_only[0]["usage"]["total_tokens"] == (
        usage_only[0]["usage"]["prompt_tokens"] + 7)


def test_include_usage_with_the_openai_client(scripted):
    client = scripted.openai()
    stream = client.chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Hello, world!")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])
