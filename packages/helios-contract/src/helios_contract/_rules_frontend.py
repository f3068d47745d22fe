"""Frontend rules: parser pairings, the syntax data each parser reads (image layout data:
_rules_images.py), and the concrete checks behind "frontend identifiers cannot carry runtime policy".

Pairings (the specification, "Frontend implementations"):

- XTML think reasoning requires the XTML tool parser;
- recipient-header reasoning and ATEM tools are paired, both ways;
- image preparation and image layout are NONE together or not at all;
- every reasoning terminal marker equals the declared tool syntax's opener (call_open);
- the assistant header of recipient frames starts with the frame start control.

The syntax fields each parser reads are required here, once; what needs the tokenizer
(whether a frame control is one token) is ``helios_tools.token_rules``.

Policy, made concrete: a frontend selector or syntax string can only describe text. So

- syntax data for a parser that is not selected is rejected (it would be dead data a
  runtime could key behavior on);
- no frontend marker that does not end a message may spell the EOS token text (generation
  ends only at the core's EOS IDs, a completion behavior);
- no image layout token id may be an EOS id.
"""

from __future__ import annotations

from collections.abc import Iterator

from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract._gen.helios.v1 import frontend_pb2 as fpb
from helios_contract._rules_contract import enum_name
from helios_contract._rules_images import images, layout_token_ids
from helios_contract.errors import (
    DuplicateIdentifierError,
    FrontendPairingError,
    FrontendPolicyError,
    FrontendSyntaxError,
)
from helios_contract.findings import Finding

F = Finding.of
Findings = Iterator[Finding]
FRONTEND = "model.frontend"

# Parameter tags every tagged family's parser reads (docs/frontend-syntax.md, "tag families").
_PARAMETER_TAGS = ("parameter_name_open", "parameter_name_close", "parameter_value_close")
# ToolSyntax fields each tool parser reads and cannot do without.
TOOL_SYNTAX_REQUIRED = {
    fpb.TOOL_PARSER_NONE: (),
    fpb.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS: (
        "call_open", "call_close", "function_name_open", *_PARAMETER_TAGS,
    ),
    fpb.TOOL_PARSER_GLM_ARGUMENT_TAGS: (
        "call_open", "call_close", "parameter_name_open", "parameter_name_close",
        "parameter_value_open", "parameter_value_close",
    ),
    fpb.TOOL_PARSER_DSML: (
        "call_open", "call_close", "function_name_open", "parameter_name_open",
        "parameter_name_close", "parameter_kind_open", "parameter_value_close",
    ),
    fpb.TOOL_PARSER_XTML: ("call_open", "call_close", *_PARAMETER_TAGS),
    fpb.TOOL_PARSER_ATEM_RECIPIENT_HEADERS: ("call_open", "call_close", *_PARAMETER_TAGS),
    fpb.TOOL_PARSER_JSON_IN_TAGS: ("call_open", "call_close", "json_name_key",
                                   "json_arguments_key"),
}
KIND_FIELDS = ("parameter_kind_open", "parameter_kind_close", "parameter_kind_string",
               "parameter_kind_json")
# ReasoningSyntax fields each reasoning parser needs.
REASONING_SYNTAX_REQUIRED = {
    fpb.REASONING_PARSER_NONE: (),
    fpb.REASONING_PARSER_THINK_TAGS: ("open", "close"),
    fpb.REASONING_PARSER_XTML_THINK: ("open", "close"),
    fpb.REASONING_PARSER_RECIPIENT_HEADER: (),
}
RECIPIENT_REQUIRED = ("recipient_prefix", "message_open", "internal_message_end",
                      "reasoning_recipient", "tool_recipient", "answer_recipient", "frame_start")


def _require(message, fields, path: str, why: str) -> Findings:
    for name in fields:
        if not getattr(message, name):
            yield F("frontend.syntax_required", FrontendSyntaxError, f"{path}.{name}", "", why)


def pairings(front: fpb.FrontendContract, base: str = FRONTEND) -> Findings:
    """Parser selectors the specification forbids together (or requires paired)."""
    tool, reasoning = front.tool_parser, front.reasoning_parser
    rule = "frontend.pairing"
    if reasoning == fpb.REASONING_PARSER_XTML_THINK and tool != fpb.TOOL_PARSER_XTML:
        yield F(rule, FrontendPairingError, f"{base}.tool_parser", enum_name(fpb.ToolParser, tool),
                "REASONING_PARSER_XTML_THINK requires TOOL_PARSER_XTML")
    if reasoning == fpb.REASONING_PARSER_RECIPIENT_HEADER and \
            tool != fpb.TOOL_PARSER_ATEM_RECIPIENT_HEADERS:
        yield F(rule, FrontendPairingError, f"{base}.tool_parser", enum_name(fpb.ToolParser, tool),
                "REASONING_PARSER_RECIPIENT_HEADER pairs with TOOL_PARSER_ATEM_RECIPIENT_HEADERS")
    if tool == fpb.TOOL_PARSER_ATEM_RECIPIENT_HEADERS and \
            reasoning != fpb.REASONING_PARSER_RECIPIENT_HEADER:
        yield F(rule, FrontendPairingError, f"{base}.reasoning_parser",
                enum_name(fpb.ReasoningParser, reasoning),
                "TOOL_PARSER_ATEM_RECIPIENT_HEADERS pairs with REASONING_PARSER_RECIPIENT_HEADER")
    no_prep = front.image_preparation == fpb.IMAGE_PREPARATION_NONE
    no_layout = front.image_layout == fpb.IMAGE_LAYOUT_NONE
    if no_prep != no_layout:
        yield F(rule, FrontendPairingError, f"{base}.image_layout",
                enum_name(fpb.ImageLayout, front.image_layout),
                f"image preparation is "
                f"{enum_name(fpb.ImagePreparation, front.image_preparation)}: "
                "both or neither are NONE")
    tiled_prep = front.image_preparation == fpb.IMAGE_PREPARATION_TILED_GLOBAL
    tiled_layout = front.image_layout == fpb.IMAGE_LAYOUT_TILE_GRID_SPAN
    if tiled_prep != tiled_layout:
        yield F(rule, FrontendPairingError, f"{base}.image_layout",
                enum_name(fpb.ImageLayout, front.image_layout),
                "IMAGE_PREPARATION_TILED_GLOBAL's tiles are placed by "
                "IMAGE_LAYOUT_TILE_GRID_SPAN, which reads no other windows: both or neither")


def tool_syntax(front: fpb.FrontendContract, base: str = FRONTEND) -> Findings:
    """The ToolSyntax fields the selected tool parser reads."""
    syntax, path = front.tool_syntax, f"{base}.tool_syntax"
    if front.tool_parser == fpb.TOOL_PARSER_NONE:
        if front.HasField("tool_syntax"):
            yield F("frontend.syntax_unused", FrontendSyntaxError, path, "set",
                    "TOOL_PARSER_NONE reads no tool syntax")
        return
    name = enum_name(fpb.ToolParser, front.tool_parser)
    yield from _require(syntax, TOOL_SYNTAX_REQUIRED.get(front.tool_parser, ()), path,
                        f"{name} needs it")
    if any(getattr(syntax, f) for f in KIND_FIELDS):
        yield from _require(syntax, KIND_FIELDS, path,
                            "value-kind attributes are declared completely")
        if syntax.parameter_kind_string == syntax.parameter_kind_json:
            yield F("frontend.syntax_distinct", FrontendSyntaxError,
                    f"{path}.parameter_kind_json", syntax.parameter_kind_json,
                    "string and JSON parameter kinds must differ")
    if front.tool_parser == fpb.TOOL_PARSER_JSON_IN_TAGS and \
            syntax.json_name_key == syntax.json_arguments_key:
        yield F("frontend.syntax_distinct", FrontendSyntaxError, f"{path}.json_arguments_key",
                syntax.json_arguments_key, "must differ from json_name_key")


def reasoning_syntax(front: fpb.FrontendContract, base: str = FRONTEND) -> Findings:
    """Reasoning delimiters, terminal markers and the boundaries initial state reads."""
    syntax, path = front.reasoning_syntax, f"{base}.reasoning_syntax"
    reasoning = front.reasoning_parser
    if reasoning == fpb.REASONING_PARSER_NONE and front.HasField("reasoning_syntax"):
        yield F("frontend.syntax_unused", FrontendSyntaxError, path, "set",
                "REASONING_PARSER_NONE reads no reasoning syntax")
    name = enum_name(fpb.ReasoningParser, reasoning)
    yield from _require(syntax, REASONING_SYNTAX_REQUIRED.get(reasoning, ()), path,
                        f"{name} needs it")
    opener = front.tool_syntax.call_open
    for index, marker in enumerate(syntax.terminal_markers):
        if not opener or marker != opener:
            yield F("frontend.terminal_marker", FrontendSyntaxError,
                    f"{path}.terminal_markers[{index}]", marker,
                    f"a reasoning terminal marker must be the tool syntax's opener "
                    f"(tool_syntax.call_open = {opener!r})")
    if reasoning in (fpb.REASONING_PARSER_UNSPECIFIED, fpb.REASONING_PARSER_NONE):
        return
    bounds = front.assistant_boundaries
    bpath = f"{base}.assistant_boundaries"
    if not bounds.assistant_header:
        yield F("frontend.boundaries", FrontendSyntaxError, f"{bpath}.assistant_header", "",
                "initial reasoning state needs the header")
    if not bounds.message_end_markers:
        yield F("frontend.boundaries", FrontendSyntaxError, f"{bpath}.message_end_markers", "",
                "initial reasoning state needs end markers")
    for index, marker in enumerate(bounds.message_end_markers):
        if not marker:
            yield F("frontend.boundaries", FrontendSyntaxError,
                    f"{bpath}.message_end_markers[{index}]", "", "markers are nonempty")


def recipient_syntax(front: fpb.FrontendContract, base: str = FRONTEND) -> Findings:
    """Recipient-header frame controls and recipients (docs/frontend-syntax.md, ATEM)."""
    syntax, path = front.recipient_syntax, f"{base}.recipient_syntax"
    if front.reasoning_parser != fpb.REASONING_PARSER_RECIPIENT_HEADER:
        if front.HasField("recipient_syntax"):
            yield F("frontend.syntax_unused", FrontendSyntaxError, path, "set",
                    "only REASONING_PARSER_RECIPIENT_HEADER reads recipient syntax")
        return
    yield from _require(syntax, RECIPIENT_REQUIRED, path, "recipient-header frames need it")
    rule = "frontend.recipients"
    if not syntax.content_recipients or not all(syntax.content_recipients):
        yield F(rule, FrontendSyntaxError, f"{path}.content_recipients",
                list(syntax.content_recipients),
                "visible-content recipients are declared and nonempty")
    if syntax.reasoning_recipient in syntax.content_recipients or \
            syntax.tool_recipient in (syntax.reasoning_recipient, *syntax.content_recipients):
        yield F(rule, FrontendSyntaxError, f"{path}.reasoning_recipient",
                syntax.reasoning_recipient, "reasoning, content and tool recipients are distinct")
    if syntax.answer_recipient not in syntax.content_recipients:
        yield F(rule, FrontendSyntaxError, f"{path}.answer_recipient", syntax.answer_recipient,
                "the answer recipient is one of the content recipients")
    header = front.assistant_boundaries.assistant_header
    if syntax.frame_start and not header.startswith(syntax.frame_start):
        yield F("frontend.boundaries", FrontendSyntaxError,
                f"{base}.assistant_boundaries.assistant_header", header,
                f"the assistant header opens a frame: it starts with frame_start "
                f"{syntax.frame_start!r}")


def prefix_rules(front: fpb.FrontendContract, base: str = FRONTEND) -> Findings:
    """One prefix-boundary rule per role, each after an end marker."""
    roles: set[int] = set()
    for index, rule in enumerate(front.prefix_boundary_rules):
        path = f"{base}.prefix_boundary_rules[{index}]"
        if not rule.end_marker:
            yield F("frontend.prefix_rule", FrontendSyntaxError, f"{path}.end_marker", "",
                    "boundaries follow an end marker")
        if rule.role in roles:
            yield F("frontend.prefix_rule_duplicate", DuplicateIdentifierError, f"{path}.role",
                    enum_name(fpb.FrontendMessageRole, rule.role), "one rule per role")
        roles.add(rule.role)


def syntax_findings(front: fpb.FrontendContract, base: str = FRONTEND) -> Findings:
    """The rules of a FrontendContract on its own (what an output frontend can check
    without the rest of the contract): pairings and the syntax data of the selected
    parsers. UNSPECIFIED selectors are a contract rule (``selectors``), checked with the
    whole model tree."""
    yield from pairings(front, base)
    yield from tool_syntax(front, base)
    yield from reasoning_syntax(front, base)
    yield from recipient_syntax(front, base)
    yield from prefix_rules(front, base)


def policy(serving: pb.ServingContract) -> Findings:
    """Frontend data cannot carry completion behavior (EOS text or ids)."""
    front = serving.model.frontend
    eos_text = serving.template_tokens.eos_token
    if eos_text:
        markers = [
            ("tool_syntax.call_open", front.tool_syntax.call_open),
            ("tool_syntax.call_close", front.tool_syntax.call_close),
            ("reasoning_syntax.open", front.reasoning_syntax.open),
            ("reasoning_syntax.close", front.reasoning_syntax.close),
            ("recipient_syntax.message_open", front.recipient_syntax.message_open),
            ("recipient_syntax.internal_message_end", front.recipient_syntax.internal_message_end),
        ]
        for name, marker in markers:
            if marker == eos_text:
                yield F("frontend.policy", FrontendPolicyError, f"{FRONTEND}.{name}", marker,
                        "spells the EOS token: generation ends only at the core's EOS IDs")
    if front.HasField("image_token_layout"):
        layout = front.image_token_layout
        eos = set(serving.eos_token_ids)
        for name, value in layout_token_ids(front.image_layout, layout):
            if value in eos:
                yield F("frontend.policy", FrontendPolicyError,
                        f"{FRONTEND}.image_token_layout.{name}", value,
                        "an image layout token cannot be an EOS id (completion behavior)")


def frontend_findings(serving: pb.ServingContract) -> Findings:
    """Every frontend rule except the selectors (checked with the whole model tree)."""
    yield from syntax_findings(serving.model.frontend)
    yield from policy(serving)
    yield from images(serving)
