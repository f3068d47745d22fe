"""Frontend rules: parser pairings, required syntax data, terminal markers, image layout
data and the runtime-policy checks. One passing and one failing case per rule."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helios_contract import (
    BindingError,
    DuplicateIdentifierError,
    ExtentError,
    FrontendPairingError,
    FrontendPolicyError,
    FrontendSyntaxError,
    MissingFieldError,
    UnspecifiedSelectorError,
    VocabularyRangeError,
)
from helios_contract.schema import contract_pb2 as c
from helios_contract.schema import frontend_pb2 as f

from tests.contract.checks import accepts, rejects
from tests.contract.example import add_images, add_tiled_images

Mutation = Callable[[c.ServingContract], None]
F = "model.frontend"


def front(serving) -> f.FrontendContract:
    return serving.model.frontend


def xtml(serving):
    """XTML tools with XTML think reasoning (docs/frontend-syntax.md)."""
    fr = front(serving)
    fr.tool_parser = f.TOOL_PARSER_XTML
    fr.reasoning_parser = f.REASONING_PARSER_XTML_THINK
    fr.tool_syntax.CopyFrom(f.ToolSyntax(
        call_open="<xtml:calls>", call_close="</xtml:calls>",
        function_name_open='<xtml:call name="', function_name_close='">',
        function_close="</xtml:call>", parameter_name_open='<xtml:arg name="',
        parameter_name_close='">', parameter_value_close="</xtml:arg>"))
    fr.reasoning_syntax.CopyFrom(f.ReasoningSyntax(open="<xtml:think>", close="</xtml:think>",
                                                   terminal_markers=["<xtml:calls>"]))


def recipient(serving):
    """ATEM tools inside recipient-header frames."""
    fr = front(serving)
    fr.tool_parser = f.TOOL_PARSER_ATEM_RECIPIENT_HEADERS
    fr.reasoning_parser = f.REASONING_PARSER_RECIPIENT_HEADER
    fr.tool_syntax.CopyFrom(f.ToolSyntax(
        call_open="<atem:function_calls>", call_close="</atem:function_calls>",
        function_name_open='<atem:invoke name="', function_name_close='">',
        function_close="</atem:invoke>", parameter_name_open='<atem:parameter name="',
        parameter_name_close='">', parameter_value_close="</atem:parameter>"))
    fr.ClearField("reasoning_syntax")
    fr.recipient_syntax.CopyFrom(f.RecipientSyntax(
        recipient_prefix=" to=", message_open="<|message|>", internal_message_end="<|eom|>",
        reasoning_recipient="self", content_recipients=["commentary", "user"],
        tool_recipient="functions", named_tool_separator=".", answer_recipient="user",
        frame_start="<|start|>"))
    fr.assistant_boundaries.assistant_header = "<|start|>assistant"


def qwen_coder(serving):
    fr = front(serving)
    fr.tool_parser = f.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS
    fr.tool_syntax.CopyFrom(f.ToolSyntax(
        call_open="<tool_call>", call_close="</tool_call>", function_name_open="<function=",
        function_name_close=">", function_close="</function>", parameter_name_open="<parameter=",
        parameter_name_close=">", parameter_value_close="</parameter>", wrapping_newline="\n"))


def glm(serving):
    fr = front(serving)
    fr.tool_parser = f.TOOL_PARSER_GLM_ARGUMENT_TAGS
    fr.tool_syntax.CopyFrom(f.ToolSyntax(
        call_open="<tool_call>", call_close="</tool_call>", parameter_name_open="<arg_key>",
        parameter_name_close="</arg_key>", parameter_value_open="<arg_value>",
        parameter_value_close="</arg_value>"))


def dsml(serving):
    fr = front(serving)
    fr.tool_parser = f.TOOL_PARSER_DSML
    fr.tool_syntax.CopyFrom(f.ToolSyntax(
        call_open="<｜DSML｜function_calls>", call_close="</｜DSML｜function_calls>",
        function_name_open='<｜DSML｜invoke name="', function_name_close='">',
        function_close="</｜DSML｜invoke>", parameter_name_open='<｜DSML｜parameter name="',
        parameter_name_close='"', parameter_kind_open=' string="', parameter_kind_close='"',
        parameter_kind_string="true", parameter_kind_json="false", parameter_value_open=">",
        parameter_value_close="</｜DSML｜parameter>"))
    fr.reasoning_syntax.terminal_markers[:] = ["<｜DSML｜function_calls>"]


def no_tools_no_reasoning(serving):
    fr = front(serving)
    fr.tool_parser = f.TOOL_PARSER_NONE
    fr.reasoning_parser = f.REASONING_PARSER_NONE
    fr.ClearField("tool_syntax")
    fr.ClearField("reasoning_syntax")


def then(*steps: Mutation) -> Mutation:
    def apply(serving):
        for step in steps:
            step(serving)
    return apply


def tiling(s):
    return front(s).image_token_layout


def geometry(s):
    return front(s).image_tiling


def set_attr(getter, name, value) -> Mutation:
    return lambda s: setattr(getter(s), name, value)


PASSING: list[tuple[str, Mutation]] = [
    ("json-in-tags-think-tags", lambda s: None),
    ("xtml-think-with-xtml-tools", xtml),
    ("recipient-header-with-atem", recipient),
    ("qwen-coder-with-think-tags", qwen_coder),
    ("glm-with-think-tags", glm),
    ("dsml-with-think-tags", dsml),
    ("xtml-tools-with-think-tags",
     then(xtml, set_attr(front, "reasoning_parser", f.REASONING_PARSER_THINK_TAGS))),
    ("no-tools-no-reasoning", no_tools_no_reasoning),
    ("no-terminal-markers", lambda s: front(s).reasoning_syntax.ClearField("terminal_markers")),
    ("images-single-span", add_images),
    ("images-row-separated",
     then(add_images, set_attr(front, "image_layout", f.IMAGE_LAYOUT_ROW_SEPARATED_SPAN))),
    ("images-tiled", add_tiled_images),
    ("images-tiled-larger-grid", then(add_tiled_images, lambda s: setattr(
        s.model.input_vocabulary, "input_tokens", 400), lambda s: tiling(s).tile_token_ids
        .extend(range(330, 335)), set_attr(tiling, "tile_grid_columns", 3))),
    ("eos-as-message-end-marker", lambda s: None),  # "<|im_end|>" ends messages and is EOS
]

FAILING: list[tuple[str, Mutation, type, str]] = [
    # pairings
    ("xtml-think-without-xtml-tools",
     set_attr(front, "reasoning_parser", f.REASONING_PARSER_XTML_THINK), FrontendPairingError,
     f"{F}.tool_parser"),
    ("recipient-header-without-atem",
     then(recipient, set_attr(front, "tool_parser", f.TOOL_PARSER_JSON_IN_TAGS)),
     FrontendPairingError, f"{F}.tool_parser"),
    ("atem-without-recipient-header",
     then(recipient, set_attr(front, "reasoning_parser", f.REASONING_PARSER_THINK_TAGS)),
     FrontendPairingError, f"{F}.reasoning_parser"),
    ("image-preparation-without-layout",
     set_attr(front, "image_preparation", f.IMAGE_PREPARATION_PATCH_GRID), FrontendPairingError,
     f"{F}.image_layout"),
    # terminal marker is the tool syntax's opener
    ("terminal-marker-not-opener",
     lambda s: front(s).reasoning_syntax.terminal_markers.__setitem__(0, "<function="),
     FrontendSyntaxError, f"{F}.reasoning_syntax.terminal_markers[0]"),
    ("terminal-marker-without-tools",
     then(no_tools_no_reasoning, set_attr(front, "reasoning_parser",
                                          f.REASONING_PARSER_THINK_TAGS),
          lambda s: front(s).reasoning_syntax.MergeFrom(f.ReasoningSyntax(
              open="<think>", close="</think>", terminal_markers=["<tool_call>"]))),
     FrontendSyntaxError, f"{F}.reasoning_syntax.terminal_markers[0]"),
    # syntax data the selected parsers need
    ("json-in-tags-without-name-key", set_attr(lambda s: front(s).tool_syntax, "json_name_key",
                                               ""),
     FrontendSyntaxError, f"{F}.tool_syntax.json_name_key"),
    ("json-keys-equal", set_attr(lambda s: front(s).tool_syntax, "json_arguments_key", "name"),
     FrontendSyntaxError, f"{F}.tool_syntax.json_arguments_key"),
    ("qwen-without-value-close",
     then(qwen_coder, set_attr(lambda s: front(s).tool_syntax, "parameter_value_close", "")),
     FrontendSyntaxError, f"{F}.tool_syntax.parameter_value_close"),
    ("glm-without-value-open",
     then(glm, set_attr(lambda s: front(s).tool_syntax, "parameter_value_open", "")),
     FrontendSyntaxError, f"{F}.tool_syntax.parameter_value_open"),
    ("dsml-kinds-incomplete",
     then(dsml, set_attr(lambda s: front(s).tool_syntax, "parameter_kind_json", "")),
     FrontendSyntaxError, f"{F}.tool_syntax.parameter_kind_json"),
    ("dsml-kinds-equal",
     then(dsml, set_attr(lambda s: front(s).tool_syntax, "parameter_kind_json", "true")),
     FrontendSyntaxError, f"{F}.tool_syntax.parameter_kind_json"),
    ("xtml-without-close",
     then(xtml, set_attr(lambda s: front(s).tool_syntax, "call_close", "")),
     FrontendSyntaxError, f"{F}.tool_syntax.call_close"),
    ("think-tags-without-close", set_attr(lambda s: front(s).reasoning_syntax, "close", ""),
     FrontendSyntaxError, f"{F}.reasoning_syntax.close"),
    ("tool-syntax-for-no-parser",
     then(no_tools_no_reasoning, lambda s: front(s).tool_syntax.MergeFrom(
         f.ToolSyntax(call_open="<tool_call>"))),
     FrontendSyntaxError, f"{F}.tool_syntax"),
    ("reasoning-syntax-for-no-parser",
     then(no_tools_no_reasoning, lambda s: front(s).reasoning_syntax.MergeFrom(
         f.ReasoningSyntax(open="<think>"))),
     FrontendSyntaxError, f"{F}.reasoning_syntax"),
    ("recipient-syntax-without-recipient-parser",
     lambda s: front(s).recipient_syntax.MergeFrom(f.RecipientSyntax(message_open="<|m|>")),
     FrontendSyntaxError, f"{F}.recipient_syntax"),
    ("recipient-without-message-open",
     then(recipient, set_attr(lambda s: front(s).recipient_syntax, "message_open", "")),
     FrontendSyntaxError, f"{F}.recipient_syntax.message_open"),
    ("recipient-without-frame-start",
     then(recipient, set_attr(lambda s: front(s).recipient_syntax, "frame_start", "")),
     FrontendSyntaxError, f"{F}.recipient_syntax.frame_start"),
    ("recipient-header-not-a-frame",
     then(recipient, set_attr(lambda s: front(s).assistant_boundaries, "assistant_header",
                              "assistant")),
     FrontendSyntaxError, f"{F}.assistant_boundaries.assistant_header"),
    ("qwen-without-name-close",
     then(qwen_coder, set_attr(lambda s: front(s).tool_syntax, "parameter_name_close", "")),
     FrontendSyntaxError, f"{F}.tool_syntax.parameter_name_close"),
    ("xtml-without-parameter-tags",
     then(xtml, set_attr(lambda s: front(s).tool_syntax, "parameter_name_open", "")),
     FrontendSyntaxError, f"{F}.tool_syntax.parameter_name_open"),
    ("recipient-without-content",
     then(recipient, lambda s: front(s).recipient_syntax.ClearField("content_recipients")),
     FrontendSyntaxError, f"{F}.recipient_syntax.content_recipients"),
    ("recipient-reasoning-is-content",
     then(recipient, set_attr(lambda s: front(s).recipient_syntax, "reasoning_recipient",
                              "commentary")),
     FrontendSyntaxError, f"{F}.recipient_syntax.reasoning_recipient"),
    ("answer-recipient-not-content",
     then(recipient, set_attr(lambda s: front(s).recipient_syntax, "answer_recipient",
                              "functions")),
     FrontendSyntaxError, f"{F}.recipient_syntax.answer_recipient"),
    ("reasoning-without-assistant-header",
     set_attr(lambda s: front(s).assistant_boundaries, "assistant_header", ""),
     FrontendSyntaxError, f"{F}.assistant_boundaries.assistant_header"),
    ("reasoning-without-end-markers",
     lambda s: front(s).assistant_boundaries.ClearField("message_end_markers"),
     FrontendSyntaxError, f"{F}.assistant_boundaries.message_end_markers"),
    ("prefix-rule-without-marker",
     set_attr(lambda s: front(s).prefix_boundary_rules[1], "end_marker", ""),
     FrontendSyntaxError, f"{F}.prefix_boundary_rules[1].end_marker"),
    ("prefix-rule-role-twice",
     set_attr(lambda s: front(s).prefix_boundary_rules[1], "role",
              f.FRONTEND_MESSAGE_ROLE_SYSTEM),
     DuplicateIdentifierError, f"{F}.prefix_boundary_rules[1].role"),
    # image layout data
    ("image-feature-not-sentinel",
     then(add_images, set_attr(lambda s: front(s).image_token_layout, "feature_token_id", 321)),
     VocabularyRangeError, f"{F}.image_token_layout.feature_token_id"),
    ("image-span-outside-inputs",
     then(add_images, set_attr(lambda s: front(s).image_token_layout, "span_end_token_id", 324)),
     VocabularyRangeError, f"{F}.image_token_layout.span_end_token_id"),
    ("image-patches-disagree",
     then(add_images, set_attr(lambda s: front(s).image_token_layout, "patches_per_feature", 2)),
     FrontendSyntaxError, f"{F}.image_token_layout.patches_per_feature"),
    ("image-layout-without-data",
     then(add_images, lambda s: front(s).ClearField("image_token_layout")),
     MissingFieldError, f"{F}.image_token_layout"),
    ("image-layout-without-vision",
     then(add_images, set_attr(lambda s: s.model.vision, "feature_slots", 0)),
     ExtentError, "model.vision.feature_slots"),
    ("image-data-without-layout",
     lambda s: front(s).image_token_layout.MergeFrom(f.ImageTokenLayout(feature_token_id=5)),
     FrontendSyntaxError, f"{F}.image_token_layout"),
    ("image-binding-without-layout",
     then(add_images, set_attr(front, "image_layout", f.IMAGE_LAYOUT_NONE),
          set_attr(front, "image_preparation", f.IMAGE_PREPARATION_NONE),
          lambda s: front(s).ClearField("image_token_layout"),
          lambda s: s.model.input_vocabulary.ClearField("image_sentinel_ids")),
     BindingError, "model.graphs[0].bindings[15].source"),
    ("sentinels-without-layout",
     then(lambda s: setattr(s.model.input_vocabulary, "input_tokens", 321),
          lambda s: s.model.input_vocabulary.image_sentinel_ids.append(320)),
     VocabularyRangeError, "model.input_vocabulary.image_sentinel_ids"),
    # tiled images (IMAGE_PREPARATION_TILED_GLOBAL, IMAGE_LAYOUT_TILE_GRID_SPAN)
    ("tiled-preparation-without-grid-layout",
     then(add_tiled_images, set_attr(front, "image_layout", f.IMAGE_LAYOUT_SINGLE_SPAN)),
     FrontendPairingError, f"{F}.image_layout"),
    ("tiling-without-tiled-preparation",
     then(add_images, lambda s: front(s).image_tiling.MergeFrom(f.ImageTiling(
         tile_pixels=8, resample=f.IMAGE_RESAMPLE_BICUBIC))),
     FrontendSyntaxError, f"{F}.image_tiling"),
    ("tiled-without-tiling",
     then(add_tiled_images, lambda s: front(s).ClearField("image_tiling")),
     MissingFieldError, f"{F}.image_tiling"),
    ("tiling-patch-not-dividing",
     then(add_tiled_images, set_attr(geometry, "patch_pixels", 24)),
     ExtentError, f"{F}.image_tiling.patch_pixels"),
    ("tiling-no-resample",
     then(add_tiled_images, set_attr(geometry, "resample", f.IMAGE_RESAMPLE_UNSPECIFIED)),
     UnspecifiedSelectorError, f"{F}.image_tiling.resample"),
    ("tiling-zero-rescale", then(add_tiled_images, set_attr(geometry, "rescale", 0.0)),
     ExtentError, f"{F}.image_tiling.rescale"),
    ("tiling-two-means", then(add_tiled_images, lambda s: geometry(s).mean.pop()),
     ExtentError, f"{F}.image_tiling.mean"),
    ("tiling-zero-std", then(add_tiled_images, lambda s: geometry(s).std.__setitem__(1, 0.0)),
     ExtentError, f"{F}.image_tiling.std"),
    ("tile-token-outside-inputs",
     then(add_tiled_images, lambda s: tiling(s).tile_token_ids.__setitem__(3, 400)),
     VocabularyRangeError, f"{F}.image_token_layout.tile_token_ids[3]"),
    ("global-token-outside-inputs",
     then(add_tiled_images, set_attr(tiling, "global_token_id", -1)),
     VocabularyRangeError, f"{F}.image_token_layout.global_token_id"),
    ("tile-token-twice",
     then(add_tiled_images, lambda s: tiling(s).tile_token_ids.__setitem__(3, 324)),
     DuplicateIdentifierError, f"{F}.image_token_layout.tile_token_ids[3]"),
    ("tile-grid-without-end",
     then(add_tiled_images, lambda s: tiling(s).ClearField("grid_end_token_ids")),
     MissingFieldError, f"{F}.image_token_layout.grid_end_token_ids"),
    ("tile-grid-without-placeholder",
     then(add_tiled_images, set_attr(tiling, "template_placeholder", "")),
     MissingFieldError, f"{F}.image_token_layout.template_placeholder"),
    ("grid-end-outside-inputs",
     then(add_tiled_images, lambda s: tiling(s).grid_end_token_ids.__setitem__(1, 999)),
     VocabularyRangeError, f"{F}.image_token_layout.grid_end_token_ids[1]"),
    ("tile-grid-ragged",
     then(add_tiled_images, set_attr(tiling, "tile_grid_columns", 3)),
     ExtentError, f"{F}.image_token_layout.tile_grid_columns"),
    ("tile-grid-too-small",
     then(add_tiled_images, set_attr(geometry, "resize_longest_edge", 192)),
     ExtentError, f"{F}.image_token_layout.tile_token_ids"),
    ("window-features-disagree",
     then(add_tiled_images, set_attr(lambda s: s.model.vision, "features_per_window", 8)),
     ExtentError, "model.vision.features_per_window"),
    ("shuffle-not-square",
     then(add_tiled_images, set_attr(lambda s: s.model.vision, "patches_per_feature", 2),
          set_attr(lambda s: s.model.vision, "features_per_window", 8),
          set_attr(tiling, "patches_per_feature", 2)),
     ExtentError, "model.vision.patches_per_feature"),
    ("feature-slots-below-largest-image",
     then(add_tiled_images, set_attr(lambda s: s.model.vision, "feature_slots", 19)),
     ExtentError, "model.vision.feature_slots"),
    ("patch-capacity-partial-window",
     then(add_tiled_images, lambda s: s.model.vision.patch_capacities.__setitem__(0, 20)),
     ExtentError, "model.vision.patch_capacities[0]"),
    ("patch-capacity-below-largest-image",
     then(add_tiled_images, lambda s: s.model.vision.patch_capacities.__setitem__(1, 64)),
     ExtentError, "model.vision.patch_capacities"),
    ("tile-token-is-eos",
     then(add_tiled_images, lambda s: s.eos_token_ids.append(319),
          lambda s: tiling(s).tile_token_ids.__setitem__(2, 319)),
     FrontendPolicyError, f"{F}.image_token_layout.tile_token_ids[2]"),
    # frontend data cannot carry completion behavior
    ("reasoning-close-is-eos-text",
     set_attr(lambda s: front(s).reasoning_syntax, "close", "<|im_end|>"), FrontendPolicyError,
     f"{F}.reasoning_syntax.close"),
    ("tool-close-is-eos-text",
     set_attr(lambda s: front(s).tool_syntax, "call_close", "<|im_end|>"), FrontendPolicyError,
     f"{F}.tool_syntax.call_close"),
    ("internal-message-end-is-eos-text",
     then(recipient, lambda s: setattr(s.template_tokens, "eos_token", "<|eom|>")),
     FrontendPolicyError, f"{F}.recipient_syntax.internal_message_end"),
    ("image-token-is-eos",
     then(add_images, lambda s: s.eos_token_ids.append(319),
          set_attr(lambda s: front(s).image_token_layout, "span_start_token_id", 319)),
     FrontendPolicyError, f"{F}.image_token_layout.span_start_token_id"),
]


@pytest.mark.parametrize("mutate", [case[1] for case in PASSING], ids=[c[0] for c in PASSING])
def test_frontend_accepts(serving, mutate):
    mutate(serving)
    accepts(serving)


@pytest.mark.parametrize(("mutate", "cls", "path"), [case[1:] for case in FAILING],
                         ids=[case[0] for case in FAILING])
def test_frontend_rejects(serving, mutate, cls, path):
    mutate(serving)
    rejects(cls, path, serving)


def test_images_accepted_with_manifest(serving, manifest):
    add_images(serving, manifest)
    prepared = accepts(serving, manifest)
    assert prepared.image_sentinel_ids == frozenset({320})
    assert prepared.vision.patches_per_feature == 4


def test_frontend_views(serving):
    recipient(serving)
    prepared = accepts(serving)
    assert prepared.tool_parser == f.TOOL_PARSER_ATEM_RECIPIENT_HEADERS
    assert prepared.reasoning_parser == f.REASONING_PARSER_RECIPIENT_HEADER
    assert prepared.recipient_syntax.reasoning_recipient == "self"
    assert prepared.assistant_boundaries.assistant_header == "<|start|>assistant"
