"""Structured output through llguidance: the grammar built from the same FrontendSyntax
accepts exactly what the parsers read, and the parsers turn it into the expected message."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helios_serve.frontend import ChatResult, Frontend, GrammarError, ToolCall
from helios_serve.frontend.grammar import GrammarCompiler
from helios_serve.frontend.syntax import (
    ATEM,
    ATEM_BOUNDARIES,
    ATEM_RECIPIENTS,
    CHATML_BOUNDARIES,
    DSML_TAGS,
    GLM_TAGS,
    JSON_IN_TAGS,
    QWEN_CODER_TAGS,
    XTML,
    XTML_THINK,
    FrontendSyntax,
    ReasoningParser,
    ToolParser,
    think_tags_with,
)
from helios_serve.frontend.testing import ScriptTokenizer, chunkings, script_tokenizer
from helios_serve.frontend.testing import Special as S

EOS = "<|eos|>"
PROMPT_OPEN_THINK = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


def think_syntax(tool: ToolParser, tsyn) -> FrontendSyntax:
    return FrontendSyntax(
        tool_parser=tool,
        reasoning_parser=ReasoningParser.THINK_TAGS,
        tool_syntax=tsyn,
        reasoning_syntax=think_tags_with(tsyn),
        assistant_boundaries=CHATML_BOUNDARIES,
    )


def fn(name, props, required=()):
    params = {"type": "object", "properties": props, "required": list(required)}
    return {"type": "function", "function": {"name": name, "parameters": params}}


def setup(syn, scripts, specials):
    st = script_tokenizer(scripts, [*specials, EOS])
    fe = Frontend(syn, st.tokenizer, [st.special_id(EOS)])
    return st, fe, GrammarCompiler(fe)


def allowed(state, token_id: int) -> bool:
    row = np.zeros(state.mask_words, dtype=np.int32)
    state.fill_mask(row)
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)


def generate(state, ids: list[int]) -> None:
    """Every id must be allowed by the mask and accepted; the grammar then ends at EOS."""
    for i, tid in enumerate(ids):
        assert allowed(state, tid), f"token {i} ({tid}) masked out"
        assert state.advance(tid), state.error
    assert not state.is_terminated() or ids  # EOS still to come unless forced stop


def run(st, fe, gc, script, *, grammar_kw, pipeline_kw, expected: ChatResult):
    """Drive `script` through the grammar and the pipeline.

    Chunked one byte per token: the test tokenizer has no merges, so that is its canonical
    tokenization, and llguidance only admits the canonical tokenization of bytes the grammar
    forces (a required key, a tag), which is also what a real BPE model produces there.
    """
    eos = st.special_id(EOS)
    n = 0
    for name, chunks in chunkings(script):
        if name != "bytes":
            continue
        ids = st.ids(chunks)
        state = gc.for_request(**grammar_kw)
        generate(state, ids)
        assert allowed(state, eos), name
        assert state.advance(eos) and state.is_terminated(), name
        counter = iter(range(100))
        p = fe.output_pipeline(call_id=lambda c=counter: f"call_{next(c)}", **pipeline_kw)
        for tid in [*ids, eos]:
            p.feed(tid)
        assert p.result() == expected, name
        n += 1
    return n


def test_json_schema_after_reasoning_keeps_literal_think_text():
    syn = think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS)
    doc = '{"city": "Paris <think> not a tag"}'
    script = ["The capital is Paris.", S("</think>"), doc]
    st, fe, gc = setup(syn, [script], ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    expected = ChatResult("The capital is Paris.", doc, (), "stop")
    n = run(st, fe, gc, script, grammar_kw=dict(response_format=rf, prompt_text=PROMPT_OPEN_THINK),
            pipeline_kw=dict(prompt_text=PROMPT_OPEN_THINK, structured_answer=True), expected=expected)  # fmt: skip
    assert n == 1
    assert json.loads(doc)["city"] == "Paris <think> not a tag"


def test_grammar_masks_invalid_answer_tokens():
    syn = think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS)
    st = ScriptTokenizer(["<think>", "</think>", "<tool_call>", "</tool_call>", EOS], ["Hello", '{"city"'])
    fe = Frontend(syn, st.tokenizer, [st.special_id(EOS)])
    gc = GrammarCompiler(fe)
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    state = gc.for_request(response_format=rf, prompt_text=PROMPT_OPEN_THINK)
    assert allowed(state, st.piece_id("Hello"))  # reasoning is free
    assert not allowed(state, st.special_id(EOS))  # the answer is required
    assert state.advance(st.special_id("</think>"))
    assert not allowed(state, st.piece_id("Hello"))
    assert not allowed(state, st.special_id("<tool_call>"))
    assert allowed(state, st.piece_id('{"city"'))
    assert not state.advance(st.piece_id("Hello")) and state.error  # error state, not a raise
    plain = gc.for_request(response_format={"type": "json_object"})
    # No open envelope in the prompt: the model may open reasoning, or answer at once.
    assert allowed(plain, st.special_id("<think>")) and allowed(plain, ord("{"))
    assert not allowed(plain, st.special_id("<tool_call>")) and not allowed(plain, ord("x"))
    assert gc.for_request(response_format={"type": "text"}) is None
    assert gc.for_request(tools=[fn("f", {})], tool_choice="auto") is None


@pytest.mark.parametrize(
    ("rf", "field"),
    [
        ({"type": "json_schema", "json_schema": {"schema": {"type": 12}}}, "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema"),
        ("json", "response_format"),
    ],
)
def test_grammar_errors_are_request_errors(rf, field):
    syn = think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS)
    st = ScriptTokenizer(["<think>", "</think>", EOS])
    gc = GrammarCompiler(Frontend(syn, st.tokenizer, [st.special_id(EOS)]))
    with pytest.raises(GrammarError) as err:
        gc.for_request(response_format=rf)
    assert err.value.field == field


FORECAST = fn("get_forecast", {"city": {"type": "string"}, "days": {"type": "integer"}}, ["city"])
TIME = fn("get_time", {"tz": {"type": "string"}}, ["tz"])
CALL = ToolCall("call_0", "get_forecast", '{"city":"Lyon","days":3}')

TOOL_CASES = {
    "qwen": (
        think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS),
        ["<tool_call>", "</tool_call>"],
        [S("<tool_call>"), "\n<function=get_forecast>\n<parameter=city>\nLyon\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n</function>\n", S("</tool_call>")],
    ),
    "glm": (
        think_syntax(ToolParser.GLM_ARGUMENT_TAGS, GLM_TAGS),
        ["<tool_call>", "</tool_call>"],
        [S("<tool_call>"), "get_forecast\n<arg_key>city</arg_key>\n<arg_value>Lyon</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n", S("</tool_call>")],
    ),
    "dsml": (
        think_syntax(ToolParser.DSML, DSML_TAGS),
        [DSML_TAGS.call_open, DSML_TAGS.call_close],
        [S(DSML_TAGS.call_open), '\n<｜DSML｜invoke name="get_forecast">\n'
         '<｜DSML｜parameter name="city" string="true">Lyon</｜DSML｜parameter>\n'
         '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n',
         S(DSML_TAGS.call_close)],
    ),
    "json": (
        think_syntax(ToolParser.JSON_IN_TAGS, JSON_IN_TAGS),
        ["<tool_call>", "</tool_call>"],
        [S("<tool_call>"), '\n{"name": "get_forecast", "arguments": {"city": "Lyon", "days": 3}}\n',
         S("</tool_call>")],
    ),
    "xtml": (
        FrontendSyntax(tool_parser=ToolParser.XTML, reasoning_parser=ReasoningParser.XTML_THINK,
                       tool_syntax=XTML, reasoning_syntax=XTML_THINK,
                       assistant_boundaries=CHATML_BOUNDARIES),
        ["<xtml:think>", "</xtml:think>", XTML.call_open, XTML.call_close],
        [S(XTML.call_open), '\n<xtml:call name="get_forecast">\n<xtml:arg name="city">Lyon</xtml:arg>\n'
         '<xtml:arg name="days">3</xtml:arg>\n</xtml:call>\n', S(XTML.call_close)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TOOL_CASES))
@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_choice_grammar_matches_parser(case, choice):
    syn, specials, script = TOOL_CASES[case]
    opener = syn.reasoning_syntax.open
    close = syn.reasoning_syntax.close
    script = [S(opener), "Lyon, three days.", S(close), *script]
    st, fe, gc = setup(syn, [script], [opener, close, *specials])
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "get_forecast"}}
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    kw = dict(tools=[FORECAST, TIME], tool_choice=tool_choice, prompt_text=prompt)
    # a named call finishes "stop", as OpenAI's (test_parsers.py)
    expected = ChatResult("Lyon, three days.", None, (CALL,),
                          "tool_calls" if choice == "required" else "stop")
    run(st, fe, gc, script, grammar_kw=kw, pipeline_kw=kw, expected=expected)
    # A named choice masks out other functions' names where the name is generated.
    if choice == "named":
        state = gc.for_request(**kw)
        generate(state, st.ids([S(opener), S(close)]))
        assert not allowed(state, st.special_id(EOS))
    # After one complete call, a named choice allows only the end; "required" (parallel
    # calls allowed by default, two functions offered) may open another call: a new block
    # where each block holds one call (JSON_IN_TAGS); the tag families' calls share their
    # one block (test_parallel_call_limit.py).
    state = gc.for_request(**kw)
    generate(state, st.ids(dict(chunkings(script))["bytes"]))
    assert allowed(state, st.special_id(EOS))
    assert allowed(state, st.ids([script[-3]])[0]) is (
        choice == "required" and not syn.tool_syntax.function_name_open)


def test_atem_frames_grammar_constrains_user_answer_only():
    syn = FrontendSyntax(
        tool_parser=ToolParser.ATEM_RECIPIENT_HEADERS,
        reasoning_parser=ReasoningParser.RECIPIENT_HEADER,
        tool_syntax=ATEM,
        recipient_syntax=ATEM_RECIPIENTS,
        assistant_boundaries=ATEM_BOUNDARIES,
    )
    doc = '{"city": "Paris <|eom|>"}'
    script = [" to=self", S("<|message|>"), "Think.", S("<|eom|>"), S("<|start|>"),
              "assistant to=user", S("<|message|>"), doc]  # fmt: skip
    st, fe, gc = setup(syn, [script], ["<|start|>", "<|message|>", "<|eom|>", "<|end|>"])
    prompt = "<|start|>user<|message|>Capital?<|end|><|start|>assistant"
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    expected = ChatResult("Think.", doc, (), "stop")
    run(st, fe, gc, script, grammar_kw=dict(response_format=rf, prompt_text=prompt),
        pipeline_kw=dict(prompt_text=prompt, structured_answer=True), expected=expected)  # fmt: skip
    tools = [fn("get_time", {"tz": {"type": "string"}}, ["tz"])]
    call = [" to=functions", S("<|message|>"),
            '<atem:function_calls>\n<atem:invoke name="get_time">\n'
            '<atem:parameter name="tz">UTC</atem:parameter>\n</atem:invoke>\n</atem:function_calls>']  # fmt: skip
    st, fe, gc = setup(syn, [call], ["<|start|>", "<|message|>", "<|eom|>", "<|end|>"])
    kw = dict(tools=tools, tool_choice="required", prompt_text=prompt)
    expected = ChatResult(None, None, (ToolCall("call_0", "get_time", '{"tz":"UTC"}'),), "tool_calls")
    run(st, fe, gc, call, grammar_kw=kw, pipeline_kw=kw, expected=expected)


def test_mask_row_shape_is_checked():
    syn = think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS)
    st = ScriptTokenizer(["<think>", "</think>", EOS])
    gc = GrammarCompiler(Frontend(syn, st.tokenizer, [st.special_id(EOS)]), vocab_size=320)
    state = gc.for_request(response_format={"type": "json_object"})
    assert gc.mask_words == 10
    with pytest.raises(ValueError):
        state.fill_mask(np.zeros(9, dtype=np.int32))


# A pydantic-style tool schema: nested models live in local $defs, referenced by $ref.
BOOK = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object",
    "properties": {"place": {"$ref": "#/$defs/Place"}, "nights": {"type": "integer"}},
    "required": ["place"],
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": False}},
}}}  # fmt: skip


@pytest.mark.parametrize("choice", ["required", "named"])
def test_json_in_tags_tool_schema_with_local_defs(choice):
    syn = think_syntax(ToolParser.JSON_IN_TAGS, JSON_IN_TAGS)
    script = [S("<tool_call>"), '\n{"name": "book", "arguments": {"place": {"city": "Lyon"}}}\n',
              S("</tool_call>")]  # fmt: skip
    st, fe, gc = setup(syn, [script], ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "book"}}
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    kw = dict(tools=[BOOK, TIME], tool_choice=tool_choice, prompt_text=prompt)
    call = ToolCall("call_0", "book", '{"place":{"city":"Lyon"}}')
    run(st, fe, gc, script, grammar_kw=kw, pipeline_kw=kw, expected=ChatResult(
        None, None, (call,), "tool_calls" if choice == "required" else "stop"))
    # The $ref is honoured: a place that is not a Place object is masked out.
    bad = '\n{"name": "book", "arguments": {"place": "Lyon"'
    state = gc.for_request(**kw)
    ids = st.ids([S("<tool_call>"), *bad])
    with pytest.raises(AssertionError, match="masked out"):
        generate(state, ids)


TAGGED_BOOK_CASES = {
    "qwen": (
        think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS),
        ["<tool_call>", "</tool_call>"],
        [S("<tool_call>"), '\n<function=book>\n<parameter=place>\n{"city": "Lyon"}\n</parameter>\n'
         "</function>\n", S("</tool_call>")],
    ),
    "glm": (
        think_syntax(ToolParser.GLM_ARGUMENT_TAGS, GLM_TAGS),
        ["<tool_call>", "</tool_call>"],
        [S("<tool_call>"), 'book\n<arg_key>place</arg_key>\n<arg_value>{"city": "Lyon"}</arg_value>\n',
         S("</tool_call>")],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TAGGED_BOOK_CASES))
def test_tagged_tool_parameter_with_a_local_ref(case):
    # A parameter typed through "$ref": "#/$defs/Place" is a JSON object in the grammar
    # and in the arguments, not free text turned into a string.
    syn, specials, script = TAGGED_BOOK_CASES[case]
    st, fe, gc = setup(syn, [script], ["<think>", "</think>", *specials])
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    kw = dict(tools=[BOOK], tool_choice={"type": "function", "function": {"name": "book"}},
              prompt_text=prompt)  # fmt: skip
    call = ToolCall("call_0", "book", '{"place":{"city":"Lyon"}}')
    run(st, fe, gc, script, grammar_kw=kw, pipeline_kw=kw,
        expected=ChatResult(None, None, (call,), "stop"))  # a named call  # fmt: skip


def _mask(state) -> np.ndarray:
    row = np.zeros(state.mask_words, np.int32)
    state.fill_mask(row)
    return row


def test_copied_candidates_get_the_mask_of_every_position_after_them():
    """candidate_masks advances the matcher along the candidates and rolls back: row i is
    exactly the mask after consuming candidates 0..i, and the state is unchanged."""
    syn = think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS)
    st = ScriptTokenizer(["<think>", "</think>", "<tool_call>", "</tool_call>", EOS],
                         ['{"city"', ': "', "Paris", '"}', "Hello"])
    fe = Frontend(syn, st.tokenizer, [st.special_id(EOS)])
    gc = GrammarCompiler(fe)
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    state = gc.for_request(response_format=rf)
    ids = [st.piece_id(p) for p in ('{"city"', ': "', "Paris", '"}')]
    before = _mask(state)
    masks = state.candidate_masks(ids)
    assert masks.shape == (4, gc.mask_words) and masks.dtype == np.int32
    np.testing.assert_array_equal(_mask(state), before)  # rolled back
    replay = gc.for_request(response_format=rf)
    for i, t in enumerate(ids):
        assert replay.advance(t)
        np.testing.assert_array_equal(masks[i], _mask(replay), err_msg=f"position {i + 1}")
    # After the closed document only EOS may follow.
    eos = st.special_id(EOS)
    assert (masks[3][eos // 32] >> (eos % 32)) & 1
    assert not (masks[3][st.piece_id("Hello") // 32] >> (st.piece_id("Hello") % 32)) & 1
    assert state.advance_all(ids)  # the state itself never moved


def test_candidate_prefix_stops_at_the_first_rejected_candidate_and_before_eos():
    syn = think_syntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS)
    st = ScriptTokenizer(["<think>", "</think>", "<tool_call>", "</tool_call>", EOS],
                         ['{"city"', ': "', "Paris", '"}', "Hello"])
    fe = Frontend(syn, st.tokenizer, [st.special_id(EOS)])
    gc = GrammarCompiler(fe)
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    state = gc.for_request(response_format=rf)
    good = [st.piece_id(p) for p in ('{"city"', ': "', "Paris", '"}')]
    assert state.candidate_prefix(good) == 4
    assert state.candidate_prefix(good[:2] + [st.piece_id("Hello")] + good[2:]) == 5  # a string
    assert state.candidate_prefix(good[:1] + [st.piece_id("Hello")] + good[1:]) == 1  # a key
    assert state.candidate_prefix([st.piece_id("Hello")] + good) == 0  # not JSON
    assert state.candidate_prefix(good + [st.special_id(EOS)]) == 4  # EOS is never copied
    assert state.candidate_prefix(good[:1] + good[:1]) == 1
    with pytest.raises(ValueError, match="rejects copied candidate"):
        state.candidate_masks([st.piece_id("Hello")])
    np.testing.assert_array_equal(_mask(state), _mask(gc.for_request(response_format=rf)))
