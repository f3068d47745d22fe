"""Two parser faults, fixed for every tagged syntax and checked over every chunking:

1. a tagged parameter whose close tag is missing before the next parameter's opener (or
   before the function or block close) ends there: the opener starts the next parameter
   and arguments never contain markup;
2. whitespace separating reasoning from a tool opener that terminates it (or from the
   next recipient frame) is syntax: it never ends `reasoning_content`.
"""

from __future__ import annotations

import json

import pytest
from helios_serve.frontend import ChatResult, ToolCall
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
from helios_serve.frontend.testing import Special as S
from helios_serve.frontend.testing import drive

THINK = ["<think>", "</think>"]
PROMPT_OPEN_THINK = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}}]


def _think(tool: ToolParser, tools) -> FrontendSyntax:
    return FrontendSyntax(tool_parser=tool, reasoning_parser=ReasoningParser.THINK_TAGS,
                          tool_syntax=tools, reasoning_syntax=think_tags_with(tools),
                          assistant_boundaries=CHATML_BOUNDARIES)


QWEN = _think(ToolParser.QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TAGS)
GLM = _think(ToolParser.GLM_ARGUMENT_TAGS, GLM_TAGS)
DSML = _think(ToolParser.DSML, DSML_TAGS)
JSONTAGS = _think(ToolParser.JSON_IN_TAGS, JSON_IN_TAGS)
XTML_SYN = FrontendSyntax(tool_parser=ToolParser.XTML, reasoning_parser=ReasoningParser.XTML_THINK,
                          tool_syntax=XTML, reasoning_syntax=XTML_THINK,
                          assistant_boundaries=CHATML_BOUNDARIES)
ATEM_SYN = FrontendSyntax(tool_parser=ToolParser.ATEM_RECIPIENT_HEADERS,
                          reasoning_parser=ReasoningParser.RECIPIENT_HEADER, tool_syntax=ATEM,
                          recipient_syntax=ATEM_RECIPIENTS, assistant_boundaries=ATEM_BOUNDARIES)
ATEM_SPECIALS = ["<|start|>", "<|message|>", "<|eom|>", "<|end|>"]
ATEM_PROMPT = "<|start|>user<|message|>Q<|end|><|start|>assistant"

# Per tagged syntax: (syntax, call opener, call close, special markers, the call body with
# parameter a = "x" left unclosed before b's opener, the same with b's close also missing
# before the function close).
UNCLOSED = {
    "qwen_coder": (QWEN, "<tool_call>", "</tool_call>", THINK + ["<tool_call>", "</tool_call>"],
                   "\n<function=f>\n<parameter=a>\nx\n<parameter=b>\n2\n</parameter>\n</function>\n",
                   "\n<function=f>\n<parameter=a>\nx\n<parameter=b>\n2\n</function>\n"),
    "glm": (GLM, "<tool_call>", "</tool_call>", THINK + ["<tool_call>", "</tool_call>"],
            "f\n<arg_key>a</arg_key>\n<arg_value>x\n<arg_key>b</arg_key>\n<arg_value>2</arg_value>\n",
            "f\n<arg_key>a</arg_key>\n<arg_value>x\n<arg_key>b</arg_key>\n<arg_value>2\n"),
    "dsml": (DSML, DSML_TAGS.call_open, DSML_TAGS.call_close,
             THINK + [DSML_TAGS.call_open, DSML_TAGS.call_close],
             '\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">x\n'
             '<｜DSML｜parameter name="b" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n',
             '\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">x\n'
             '<｜DSML｜parameter name="b" string="false">2\n</｜DSML｜invoke>\n'),
    "xtml": (XTML_SYN, XTML.call_open, XTML.call_close,
             ["<xtml:think>", "</xtml:think>", XTML.call_open, XTML.call_close],
             '\n<xtml:call name="f">\n<xtml:arg name="a">x\n<xtml:arg name="b">2</xtml:arg>\n'
             '</xtml:call>\n',
             '\n<xtml:call name="f">\n<xtml:arg name="a">x\n<xtml:arg name="b">2\n</xtml:call>\n'),
}  # fmt: skip
CALL = ToolCall("call_0", "f", '{"a":"x","b":2}')


def _no_markup(arguments: str) -> None:
    values = json.loads(arguments)
    for v in values.values():
        assert "<" not in str(v) and "DSML" not in str(v), arguments


@pytest.mark.parametrize("name", UNCLOSED)
@pytest.mark.parametrize("which", ["next_parameter", "and_function_close"])
def test_unclosed_parameter_ends_at_the_next_tag(name, which):
    syn, opener, closer, specials, body, body_unclosed_last = UNCLOSED[name]
    body = body if which == "next_parameter" else body_unclosed_last
    script = [S(opener), body, S(closer)]
    n = 0
    for chunking, _deltas, result in drive(syn, script, specials=specials, tools=TOOLS):
        assert result == ChatResult(None, None, (CALL,), "tool_calls"), (chunking, result)
        _no_markup(result.tool_calls[0].arguments)
        n += 1
    assert n > len(body)  # every split of the body, chars and bytes


@pytest.mark.parametrize("which", ["next_parameter", "and_function_close"])
def test_unclosed_parameter_in_an_atem_tool_frame(which):
    params = ('<atem:parameter name="a">x\n<atem:parameter name="b">2</atem:parameter>\n'
              if which == "next_parameter" else
              '<atem:parameter name="a">x\n<atem:parameter name="b">2\n')
    script = [" to=functions", S("<|message|>"),
              f'<atem:function_calls>\n<atem:invoke name="f">\n{params}</atem:invoke>\n'
              "</atem:function_calls>", S("<|eom|>")]  # fmt: skip
    for chunking, _deltas, result in drive(ATEM_SYN, script, specials=ATEM_SPECIALS, tools=TOOLS,
                                           prompt_text=ATEM_PROMPT):  # fmt: skip
        assert result == ChatResult(None, None, (CALL,), "tool_calls"), (chunking, result)


def test_a_new_block_token_ends_an_unclosed_parameter_and_its_block():
    script = [S("<tool_call>"), "\n<function=f>\n<parameter=a>\nx\n", S("<tool_call>"),
              "\n<function=f>\n<parameter=b>\n2\n</parameter>\n</function>\n", S("</tool_call>")]
    calls = (ToolCall("call_0", "f", '{"a":"x"}'), ToolCall("call_1", "f", '{"b":2}'))
    for chunking, _deltas, result in drive(QWEN, script, specials=THINK + ["<tool_call>", "</tool_call>"],
                                           tools=TOOLS):  # fmt: skip
        assert result == ChatResult(None, None, calls, "tool_calls"), (chunking, result)


# ---- the separator before a tool opener that ends reasoning ----

SEPARATED = {  # syntax, specials, opener, call body, closer
    "qwen_coder": (QWEN, THINK + ["<tool_call>", "</tool_call>"], "<tool_call>",
                   "\n<function=f>\n<parameter=b>\n2\n</parameter>\n</function>\n", "</tool_call>"),
    "glm": (GLM, THINK + ["<tool_call>", "</tool_call>"], "<tool_call>",
            "f\n<arg_key>b</arg_key>\n<arg_value>2</arg_value>\n", "</tool_call>"),
    "dsml": (DSML, THINK + [DSML_TAGS.call_open, DSML_TAGS.call_close], DSML_TAGS.call_open,
             '\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="b" string="false">2'
             '</｜DSML｜parameter>\n</｜DSML｜invoke>\n', DSML_TAGS.call_close),
    "json_in_tags": (JSONTAGS, THINK + ["<tool_call>", "</tool_call>"], "<tool_call>",
                     '\n{"name": "f", "arguments": {"b": 2}}\n', "</tool_call>"),
    "xtml": (XTML_SYN, ["<xtml:think>", "</xtml:think>", XTML.call_open, XTML.call_close],
             XTML.call_open, '\n<xtml:call name="f">\n<xtml:arg name="b">2</xtml:arg>\n</xtml:call>\n',
             XTML.call_close),
}  # fmt: skip


@pytest.mark.parametrize("name", SEPARATED)
@pytest.mark.parametrize("separator", ["\n", "\n\n", " \n "])
@pytest.mark.parametrize("opener_as", ["token", "text"])
def test_separator_before_a_terminal_tool_opener_is_not_reasoning(name, separator, opener_as):
    syn, specials, opener, body, closer = SEPARATED[name]
    if opener_as == "text":  # the tokenizer spells the opener as text (several tokens)
        specials = [m for m in specials if m != opener]
    prompt = PROMPT_OPEN_THINK.replace("<think>", syn.reasoning_syntax.open)
    script = ["I need f.", separator, S(opener) if opener_as == "token" else opener, body,
              S(closer)]
    expected = ChatResult("I need f.", None, (ToolCall("call_0", "f", '{"b":2}'),), "tool_calls")
    for chunking, _deltas, result in drive(syn, script, specials=specials, tools=TOOLS,
                                           prompt_text=prompt):  # fmt: skip
        assert result == expected, (chunking, result)


def test_whitespace_inside_reasoning_and_before_its_close_stays_reasoning():
    script = ["a \n", "b\n", S("</think>"), "\n\nAnswer."]
    for chunking, _deltas, result in drive(QWEN, script, specials=THINK + ["<tool_call>"],
                                           prompt_text=PROMPT_OPEN_THINK):  # fmt: skip
        assert result == ChatResult("a \nb\n", "Answer.", (), "stop"), (chunking, result)
    # cut by the output limit inside reasoning: the held whitespace is flushed
    for chunking, _deltas, result in drive(QWEN, ["a \n"], specials=THINK, end="length",
                                           prompt_text=PROMPT_OPEN_THINK):  # fmt: skip
        assert result == ChatResult("a \n", None, (), "length"), (chunking, result)


def test_separator_before_the_next_recipient_frame_is_not_reasoning():
    script = [" to=self", S("<|message|>"), "Look it up.\n\n", S("<|start|>"),
              "assistant to=functions", S("<|message|>"),
              '<atem:function_calls>\n<atem:invoke name="f">\n'
              '<atem:parameter name="b">2</atem:parameter>\n</atem:invoke>\n'
              "</atem:function_calls>", S("<|eom|>")]  # fmt: skip
    expected = ChatResult("Look it up.", None, (ToolCall("call_0", "f", '{"b":2}'),), "tool_calls")
    for chunking, _deltas, result in drive(ATEM_SYN, script, specials=ATEM_SPECIALS, tools=TOOLS,
                                           prompt_text=ATEM_PROMPT):  # fmt: skip
        assert result == expected, (chunking, result)
    # ended by its own end marker, a reasoning body keeps its text
    script = [" to=self", S("<|message|>"), "Done.\n", S("<|eom|>")]
    for chunking, _deltas, result in drive(ATEM_SYN, script, specials=ATEM_SPECIALS,
                                           prompt_text=ATEM_PROMPT):  # fmt: skip
        assert result.reasoning_content == "Done.\n", (chunking, result)
