"""String stops, token stops, their validation, and partial UTF-8, through the OutputPipeline."""

from __future__ import annotations

import pytest
from helios_serve.frontend import (
    ChatResult,
    ContentDelta,
    Frontend,
    StopSpec,
    StopValidationError,
    accumulate,
    parse_stops,
)
from helios_serve.frontend.detokenizer import IncrementalDetokenizer
from helios_serve.frontend.syntax import FrontendSyntax, ReasoningParser, ToolParser
from helios_serve.frontend.testing import ScriptTokenizer, drive

PLAIN = FrontendSyntax(tool_parser=ToolParser.NONE, reasoning_parser=ReasoningParser.NONE)


def stops(*strings: str) -> StopSpec:
    return parse_stops(list(strings))


def test_stop_across_three_tokens():
    script = ["Letters: HIJ", "KL", "MN", "OP", "QRS"]
    n = 0
    for name, deltas, result in drive(PLAIN, script, specials=[], stops=stops("KLMNOP")):
        assert result == ChatResult(None, "Letters: HIJ", (), "stop"), name
        assert accumulate(deltas, "stop") == result
        for d in deltas:
            assert not set(d.text) & set("KMNOPQRS"), (name, d)
        n += 1
    assert n == 19


def test_earliest_completed_match_wins_within_one_token():
    script = ["Look", " there", " now"]
    for name, _, result in drive(PLAIN, script, specials=[], stops=stops("re", "he")):
        assert result == ChatResult(None, "Look t", (), "stop"), name


@pytest.mark.parametrize(("stop_list", "content"), [(["ab", "b"], "x"), (["b", "ab"], "xa")])
def test_ties_by_list_order(stop_list, content):
    for name, _, result in drive(PLAIN, ["xab", "cd"], specials=[], stops=parse_stops(stop_list)):
        assert result.content == content, name


@pytest.mark.parametrize("end", ["eos", "length"])
def test_eos_and_length_flush_held_prefix(end):
    expected = ChatResult(None, "abc KL", (), "stop" if end == "eos" else "length")
    for name, deltas, result in drive(PLAIN, ["abc KL"], specials=[], stops=stops("KLM"), end=end):
        assert result == expected, name
        assert accumulate(deltas, result.finish_reason) == result


def test_held_prefix_is_not_streamed_until_resolved():
    st = ScriptTokenizer(["<|eos|>"], ["Hello K", "L", "X"])
    fe = Frontend(PLAIN, st.tokenizer, [st.special_id("<|eos|>")])
    p = fe.output_pipeline(stops=stops("KLM"))
    assert p.feed(st.piece_id("Hello K")) == []  # the whole token waits: "K" may begin the stop
    assert p.feed(st.piece_id("L")) == []
    assert p.feed(st.piece_id("X")) == [ContentDelta("Hello KLX")]


def test_stop_matches_reasoning_and_envelopes_before_presentation():
    from helios_serve.frontend.syntax import CHATML_BOUNDARIES, THINK_TAGS_DEFAULT
    from helios_serve.frontend.testing import Special as S

    syn = FrontendSyntax(
        tool_parser=ToolParser.NONE,
        reasoning_parser=ReasoningParser.THINK_TAGS,
        reasoning_syntax=THINK_TAGS_DEFAULT,
        assistant_boundaries=CHATML_BOUNDARIES,
    )
    script = [S("<think>"), "Plan: STOP here", S("</think>"), "never"]
    for name, _, result in drive(syn, script, specials=["<think>", "</think>"], stops=stops("STOP")):
        assert result == ChatResult("Plan: ", None, (), "stop"), name


def test_emoji_split_over_tokens():
    st = ScriptTokenizer(["<|eos|>"])
    detok = IncrementalDetokenizer(st.tokenizer)
    pieces = [detok.push(b) for b in "Hi 👋!".encode()]
    assert pieces == ["H", "i", " ", "", "", "", "👋", "!"]
    for name, deltas, result in drive(PLAIN, ["Hi 👋 there"], specials=[], stops=stops("👋")):
        assert result == ChatResult(None, "Hi ", (), "stop"), name
        assert all("\ufffd" not in d.text for d in deltas)


def test_incomplete_character_at_length_flushes_replacement():
    st = ScriptTokenizer(["<|eos|>"])
    fe = Frontend(PLAIN, st.tokenizer, [st.special_id("<|eos|>")])
    p = fe.output_pipeline()
    assert p.feed(ord("a")) == [ContentDelta("a")]
    assert p.feed("👋".encode()[0]) == []
    assert p.finish("length") == [ContentDelta("\ufffd")]
    assert p.result() == ChatResult(None, "a\ufffd", (), "length")


def _token_pipeline(spec: StopSpec):
    st = ScriptTokenizer(["<|eos|>"], ["Hello", " world", "END", "ING", "!"])
    fe = Frontend(PLAIN, st.tokenizer, [st.special_id("<|eos|>")])
    return st, fe.output_pipeline(stops=spec)


def test_token_stop_sequence_omits_match_and_buffers_prefix():
    st, _ = _token_pipeline(StopSpec())
    end, ing, world = st.piece_id("END"), st.piece_id("ING"), st.piece_id(" world")
    _, p = _token_pipeline(parse_stops(None, None, [[end, ing]]))
    assert p.feed(st.piece_id("Hello")) == [ContentDelta("Hello")]
    assert p.feed(end) == []  # pending prefix
    assert p.feed(world) == [ContentDelta("END world")]  # resolved: not a stop
    assert p.feed(end) == []
    assert p.feed(ing) == []
    assert p.finished and p.result() == ChatResult(None, "HelloEND world", (), "stop")


def test_stop_token_ids_and_flush_of_pending_prefix_at_eos():
    st, _ = _token_pipeline(StopSpec())
    end, ing = st.piece_id("END"), st.piece_id("ING")
    _, p = _token_pipeline(parse_stops(None, [st.piece_id("!")], [[end, ing, ing]]))
    p.feed(st.piece_id("Hello"))
    p.feed(end)
    p.feed(ing)
    assert p.feed(st.special_id("<|eos|>")) == [ContentDelta("ENDING")]
    assert p.result() == ChatResult(None, "HelloENDING", (), "stop")
    _, p = _token_pipeline(parse_stops(None, [st.piece_id("!")], None))
    p.feed(st.piece_id("Hello"))
    assert p.feed(st.piece_id("!")) == [] and p.finished
    assert p.result().content == "Hello"


def test_validation_limits():
    assert parse_stops(None) == StopSpec()
    assert parse_stops([]) == StopSpec()
    assert parse_stops("x").strings == ("x",)
    assert parse_stops(["a" * 1024] * 4).strings == ("a" * 1024,) * 4  # exactly 4096 bytes
    assert parse_stops("x").needs_host_stop_barrier
    assert not parse_stops(None, [1]).needs_host_stop_barrier and parse_stops(None, [1]).has_host_stops
    cases = [
        (dict(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
        (dict(stop=""), "stop", "nonempty"),
        (dict(stop=["a", ""]), "stop", "nonempty"),
        (dict(stop=["é" * 1025, "a" * 2047]), "stop", "4096"),
        (dict(stop=3), "stop", "string"),
        (dict(stop=["a", 3]), "stop", "strings"),
        (dict(stop="a", stop_token_ids=[1]), "stop", "combined"),
        (dict(stop="a", stop_token_sequences=[[1]]), "stop", "combined"),
        (dict(stop="a", structured_output=True), "stop", "structured"),
        (dict(stop_token_ids=[True]), "stop_token_ids", "integers"),
        (dict(stop_token_ids=[-1]), "stop_token_ids", "vocabulary"),
        (dict(stop_token_ids=[50], vocab_size=50), "stop_token_ids", "vocabulary"),
        (dict(stop_token_sequences=[[1]] * 17), "stop_token_sequences", "at most 16"),
        (dict(stop_token_sequences=[[1] * 65]), "stop_token_sequences", "at most 64"),
        (dict(stop_token_sequences=[[]]), "stop_token_sequences", "nonempty"),
        (dict(stop_token_sequences=[1]), "stop_token_sequences", "nonempty"),
    ]
    for kwargs, field, words in cases:
        with pytest.raises(StopValidationError) as err:
            parse_stops(**kwargs)
        assert err.value.field == field and words in err.value.message, kwargs
    assert len(parse_stops(None, None, [[1] * 64] * 16).token_sequences) == 16
