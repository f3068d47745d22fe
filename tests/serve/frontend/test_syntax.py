"""FrontendSyntax mirrors the generated FrontendContract; selectors fail startup when unknown."""

from __future__ import annotations

import pytest
from helios_contract._gen.helios.v1 import frontend_pb2
from helios_serve.frontend import Frontend, FrontendConfigError, FrontendRequestError
from helios_serve.frontend.syntax import (
    ATEM,
    ATEM_BOUNDARIES,
    ATEM_RECIPIENTS,
    CHATML_BOUNDARIES,
    GLM_TAGS,
    QWEN_CODER_TAGS,
    THINK_TAGS_DEFAULT,
    XTML,
    XTML_THINK,
    FrontendMessageRole,
    FrontendSyntax,
    ImageLayout,
    ImagePreparation,
    ImageTokenLayout,
    PrefixBoundaryRule,
    ReasoningParser,
    ToolParser,
    think_tags_with,
)
from helios_serve.frontend.testing import ScriptTokenizer

FULL = FrontendSyntax(
    tool_parser=ToolParser.QWEN_CODER_FUNCTION_TAGS,
    reasoning_parser=ReasoningParser.THINK_TAGS,
    image_preparation=ImagePreparation.PATCH_GRID,
    image_layout=ImageLayout.SINGLE_SPAN,
    tool_syntax=QWEN_CODER_TAGS,
    reasoning_syntax=think_tags_with(QWEN_CODER_TAGS),
    assistant_boundaries=CHATML_BOUNDARIES,
    prefix_boundary_rules=(
        PrefixBoundaryRule(FrontendMessageRole.USER, "<|im_end|>\n", False),
        PrefixBoundaryRule(FrontendMessageRole.ASSISTANT, "<|im_end|>\n", True),
    ),
    image_token_layout=ImageTokenLayout(900, 901, 902, 0, 4, True),
)


@pytest.mark.parametrize(
    "syntax",
    [
        FULL,
        FrontendSyntax(ToolParser.ATEM_RECIPIENT_HEADERS, ReasoningParser.RECIPIENT_HEADER,
                       ImagePreparation.NONE, ImageLayout.NONE, tool_syntax=ATEM,
                       recipient_syntax=ATEM_RECIPIENTS, assistant_boundaries=ATEM_BOUNDARIES),
    ],  # fmt: skip
)
def test_round_trip_through_generated_message(syntax):
    msg = syntax.to_contract()
    assert isinstance(msg, frontend_pb2.FrontendContract)
    wire = frontend_pb2.FrontendContract.FromString(msg.SerializeToString())
    assert FrontendSyntax.from_contract(wire) == syntax


def test_from_contract_reads_field_names_and_enum_numbers():
    msg = frontend_pb2.FrontendContract(
        tool_parser=frontend_pb2.TOOL_PARSER_GLM_ARGUMENT_TAGS,
        reasoning_parser=frontend_pb2.REASONING_PARSER_THINK_TAGS,
        image_preparation=frontend_pb2.IMAGE_PREPARATION_NONE,
        image_layout=frontend_pb2.IMAGE_LAYOUT_NONE,
    )
    msg.tool_syntax.call_open = "<tool_call>"
    msg.reasoning_syntax.terminal_markers.append("<tool_call>")
    msg.assistant_boundaries.message_end_markers.extend(["<|im_end|>"])
    syn = FrontendSyntax.from_contract(msg)
    assert syn.tool_parser is ToolParser.GLM_ARGUMENT_TAGS
    assert syn.reasoning_parser is ReasoningParser.THINK_TAGS
    assert syn.tool_syntax.call_open == "<tool_call>"
    assert syn.reasoning_syntax.terminal_markers == ("<tool_call>",)
    assert syn.assistant_boundaries.message_end_markers == ("<|im_end|>",)
    # The Python enums mirror the generated numbers exactly.
    for py, pb in [(ToolParser, frontend_pb2.ToolParser), (ReasoningParser, frontend_pb2.ReasoningParser),
                   (ImagePreparation, frontend_pb2.ImagePreparation), (ImageLayout, frontend_pb2.ImageLayout),
                   (FrontendMessageRole, frontend_pb2.FrontendMessageRole)]:  # fmt: skip
        prefix = pb.Name(0).removesuffix("UNSPECIFIED")
        assert {m.name: m.value for m in py} == {k.removeprefix(prefix): v for k, v in pb.items()}


def _frontend(syntax):
    st = ScriptTokenizer(["<think>", "</think>", "<tool_call>", "</tool_call>", "<|eos|>"])
    return Frontend(syntax, st.tokenizer, [st.special_id("<|eos|>")])


@pytest.mark.parametrize(
    ("syntax", "words"),
    [
        (FrontendSyntax(ToolParser.UNSPECIFIED, ReasoningParser.NONE),
         "known tool parsers: NONE, QWEN_CODER_FUNCTION_TAGS, GLM_ARGUMENT_TAGS, DSML, XTML, "
         "ATEM_RECIPIENT_HEADERS, JSON_IN_TAGS"),
        (FrontendSyntax(ToolParser.NONE, ReasoningParser.UNSPECIFIED),
         "known reasoning parsers: NONE, THINK_TAGS, XTML_THINK, RECIPIENT_HEADER"),
        (FrontendSyntax(ToolParser.GLM_ARGUMENT_TAGS, ReasoningParser.XTML_THINK, tool_syntax=GLM_TAGS,
                        reasoning_syntax=XTML_THINK),
         "model.frontend.tool_parser = 'TOOL_PARSER_GLM_ARGUMENT_TAGS': "
         "REASONING_PARSER_XTML_THINK requires TOOL_PARSER_XTML"),
        (FrontendSyntax(ToolParser.XTML, ReasoningParser.RECIPIENT_HEADER, tool_syntax=XTML),
         "REASONING_PARSER_RECIPIENT_HEADER pairs with TOOL_PARSER_ATEM_RECIPIENT_HEADERS"),
        (FrontendSyntax(ToolParser.ATEM_RECIPIENT_HEADERS, ReasoningParser.THINK_TAGS, tool_syntax=ATEM,
                        reasoning_syntax=THINK_TAGS_DEFAULT),
         "TOOL_PARSER_ATEM_RECIPIENT_HEADERS pairs with REASONING_PARSER_RECIPIENT_HEADER"),
        (FrontendSyntax(ToolParser.GLM_ARGUMENT_TAGS, ReasoningParser.THINK_TAGS, tool_syntax=GLM_TAGS,
                        reasoning_syntax=think_tags_with(XTML)),
         "model.frontend.reasoning_syntax.terminal_markers[0] = '<xtml:calls>': a reasoning "
         "terminal marker must be the tool syntax's opener"),
        (FrontendSyntax(ToolParser.QWEN_CODER_FUNCTION_TAGS, ReasoningParser.NONE),
         "model.frontend.tool_syntax.call_open = '': TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS needs it"),
    ],  # fmt: skip
)
def test_startup_errors(syntax, words):
    with pytest.raises(FrontendConfigError) as err:
        _frontend(syntax)
    assert words in str(err.value)


def test_request_errors():
    fe = _frontend(FrontendSyntax(ToolParser.NONE, ReasoningParser.NONE))
    with pytest.raises(FrontendRequestError) as err:
        fe.output_pipeline(tools=[{"type": "function", "function": {"name": "f"}}])
    assert err.value.field == "tools"
    fe = _frontend(FULL)
    with pytest.raises(FrontendRequestError) as err:
        fe.output_pipeline(tools=[{"type": "function", "function": {"name": "f"}}],
                           tool_choice={"type": "function", "function": {"name": "g"}})  # fmt: skip
    assert err.value.field == "tool_choice"
    with pytest.raises(FrontendRequestError) as err:
        fe.output_pipeline(tools=[{"type": "function"}])
    assert err.value.field == "tools[0]"


def test_delimiters_resolve_to_tokens_only_when_single_tokens():
    fe = _frontend(FULL)
    assert set(fe.marks.by_text) == {"<think>", "</think>", "<tool_call>", "</tool_call>"}
    # ">" is one ordinary token, but as a tag it stays text (it also occurs inside tokens).
    assert not fe.marks.token_bound(">")


def test_recipient_frame_controls_must_be_single_tokens():
    """Frame controls delimit only as their token: a tokenizer that splits one can never
    parse a frame, so the frontend (and lint-core, tests/tools/core) refuses it."""
    atem = FrontendSyntax(ToolParser.ATEM_RECIPIENT_HEADERS, ReasoningParser.RECIPIENT_HEADER,
                          ImagePreparation.NONE, ImageLayout.NONE, tool_syntax=ATEM,
                          recipient_syntax=ATEM_RECIPIENTS, assistant_boundaries=ATEM_BOUNDARIES)
    controls = ["<|start|>", "<|message|>", "<|eom|>", "<|end|>"]
    Frontend(atem, ScriptTokenizer(controls).tokenizer, [0])  # every control is one token
    split = ScriptTokenizer([c for c in controls if c != "<|message|>"])
    with pytest.raises(FrontendConfigError) as err:
        Frontend(atem, split.tokenizer, [0])
    assert str(err.value) == (
        "model.frontend.recipient_syntax.message_open = '<|message|>': recipient frame controls "
        "delimit only as their token; the tokenizer encodes it as 11 tokens")
