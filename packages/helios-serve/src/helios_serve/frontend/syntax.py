"""Frontend syntax: the plain-data mirror of `helios.v1.FrontendContract`.

Every class here mirrors one message or enum of proto/helios/v1/frontend.proto field for
field, so parsers and grammars read plain frozen data and never the generated code. The
meaning of each string, and the XTML and ATEM details the specification leaves open, are
defined once in docs/frontend-syntax.md. The presets at the bottom are the canonical syntax
families that recipes copy into cores with `FrontendSyntax.to_contract()`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any

from helios_contract._gen.helios.v1 import frontend_pb2


class ToolParser(enum.IntEnum):
    """Mirrors `helios.v1.ToolParser` (same numbers; names without the enum prefix)."""

    UNSPECIFIED = 0
    NONE = 1
    QWEN_CODER_FUNCTION_TAGS = 2
    GLM_ARGUMENT_TAGS = 3
    DSML = 4
    XTML = 5
    ATEM_RECIPIENT_HEADERS = 6
    JSON_IN_TAGS = 7


class ReasoningParser(enum.IntEnum):
    """Mirrors `helios.v1.ReasoningParser`."""

    UNSPECIFIED = 0
    NONE = 1
    THINK_TAGS = 2
    XTML_THINK = 3
    RECIPIENT_HEADER = 4


class ImagePreparation(enum.IntEnum):
    """Mirrors `helios.v1.ImagePreparation`."""

    UNSPECIFIED = 0
    NONE = 1
    PATCH_GRID = 2
    TILED_GLOBAL = 3


class ImageLayout(enum.IntEnum):
    """Mirrors `helios.v1.ImageLayout`."""

    UNSPECIFIED = 0
    NONE = 1
    SINGLE_SPAN = 2
    ROW_SEPARATED_SPAN = 3
    TILE_GRID_SPAN = 4


class ImageResample(enum.IntEnum):
    """Mirrors `helios.v1.ImageResample`."""

    UNSPECIFIED = 0
    BILINEAR = 1
    BICUBIC = 2
    LANCZOS = 3


class FrontendMessageRole(enum.IntEnum):
    """Mirrors `helios.v1.FrontendMessageRole`."""

    UNSPECIFIED = 0
    SYSTEM = 1
    USER = 2
    ASSISTANT = 3
    TOOL = 4


@dataclass(frozen=True, slots=True)
class ToolSyntax:
    """Tool-call syntax strings; empty means absent (see `helios.v1.ToolSyntax`)."""

    call_open: str = ""
    call_close: str = ""
    function_name_open: str = ""
    function_name_close: str = ""
    function_close: str = ""
    parameter_name_open: str = ""
    parameter_name_close: str = ""
    parameter_kind_open: str = ""
    parameter_kind_close: str = ""
    parameter_kind_string: str = ""
    parameter_kind_json: str = ""
    parameter_value_open: str = ""
    parameter_value_close: str = ""
    wrapping_newline: str = ""
    tag_separator: str = ""
    json_name_key: str = ""
    json_arguments_key: str = ""


@dataclass(frozen=True, slots=True)
class ReasoningSyntax:
    """Reasoning delimiters (see `helios.v1.ReasoningSyntax`)."""

    open: str = ""
    close: str = ""
    terminal_markers: tuple[str, ...] = ()
    answer_separator: str = ""


@dataclass(frozen=True, slots=True)
class AssistantBoundaries:
    """Message end markers and the assistant header (see `helios.v1.AssistantBoundaries`)."""

    message_end_markers: tuple[str, ...] = ()
    assistant_header: str = ""


@dataclass(frozen=True, slots=True)
class RecipientSyntax:
    """Recipient-header frame syntax (see `helios.v1.RecipientSyntax`)."""

    recipient_prefix: str = ""
    message_open: str = ""
    internal_message_end: str = ""
    reasoning_recipient: str = ""
    content_recipients: tuple[str, ...] = ()
    tool_recipient: str = ""
    named_tool_separator: str = ""
    answer_recipient: str = ""
    frame_start: str = ""


@dataclass(frozen=True, slots=True)
class PrefixBoundaryRule:
    """A reusable prefix boundary after a rendered message (see `helios.v1.PrefixBoundaryRule`)."""

    role: FrontendMessageRole = FrontendMessageRole.UNSPECIFIED
    end_marker: str = ""
    rerendered_by_later_messages: bool = False


@dataclass(frozen=True, slots=True)
class ImageTokenLayout:
    """Image token ids and span geometry (see `helios.v1.ImageTokenLayout`)."""

    feature_token_id: int = 0
    span_start_token_id: int = 0
    span_end_token_id: int = 0
    row_separator_token_id: int = 0
    patches_per_feature: int = 0
    atomic_spans: bool = False
    tile_token_ids: tuple[int, ...] = ()
    tile_grid_columns: int = 0
    global_token_id: int = 0
    grid_end_token_ids: tuple[int, ...] = ()
    template_placeholder: str = ""


@dataclass(frozen=True, slots=True)
class ImageTiling:
    """Mirrors `helios.v1.ImageTiling` (pixels; per-RGB-channel mean and std)."""

    tile_pixels: int = 0
    patch_pixels: int = 0
    resize_longest_edge: int = 0
    resample: ImageResample = ImageResample.UNSPECIFIED
    rescale: float = 0.0
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()


_MESSAGE_TYPES: dict[str, type] = {
    "tool_syntax": ToolSyntax,
    "reasoning_syntax": ReasoningSyntax,
    "assistant_boundaries": AssistantBoundaries,
    "recipient_syntax": RecipientSyntax,
    "image_token_layout": ImageTokenLayout,
    "image_tiling": ImageTiling,
}
_ENUM_TYPES: dict[str, type[enum.IntEnum]] = {
    "tool_parser": ToolParser,
    "reasoning_parser": ReasoningParser,
    "image_preparation": ImagePreparation,
    "image_layout": ImageLayout,
    "resample": ImageResample,
    "role": FrontendMessageRole,
}


def _read(cls: type, msg: Any) -> Any:
    """Copy a generated message into the mirror dataclass `cls`, field by field."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        raw = getattr(msg, f.name)
        if f.name in _MESSAGE_TYPES:
            values[f.name] = _read(_MESSAGE_TYPES[f.name], raw)
        elif f.name == "prefix_boundary_rules":
            values[f.name] = tuple(_read(PrefixBoundaryRule, r) for r in raw)
        elif f.name in _ENUM_TYPES:
            values[f.name] = _ENUM_TYPES[f.name](int(raw))
        elif isinstance(f.default, tuple) or f.type.startswith("tuple"):
            values[f.name] = tuple(raw)
        else:
            values[f.name] = raw
    return cls(**values)


def _write(obj: Any, msg: Any) -> None:
    """Copy a mirror dataclass into a generated message, field by field."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name in _MESSAGE_TYPES:
            if value != type(value)():  # unset sub-messages stay absent (HasField False)
                _write(value, getattr(msg, f.name))
        elif f.name == "prefix_boundary_rules":
            for rule in value:
                _write(rule, getattr(msg, f.name).add())
        elif isinstance(value, tuple):
            getattr(msg, f.name).extend(value)
        else:
            setattr(msg, f.name, int(value) if isinstance(value, enum.IntEnum) else value)


@dataclass(frozen=True, slots=True)
class FrontendSyntax:
    """Mirror of `helios.v1.FrontendContract`: parser selectors plus their syntax data."""

    tool_parser: ToolParser = ToolParser.UNSPECIFIED
    reasoning_parser: ReasoningParser = ReasoningParser.UNSPECIFIED
    image_preparation: ImagePreparation = ImagePreparation.UNSPECIFIED
    image_layout: ImageLayout = ImageLayout.UNSPECIFIED
    tool_syntax: ToolSyntax = field(default_factory=ToolSyntax)
    reasoning_syntax: ReasoningSyntax = field(default_factory=ReasoningSyntax)
    assistant_boundaries: AssistantBoundaries = field(default_factory=AssistantBoundaries)
    recipient_syntax: RecipientSyntax = field(default_factory=RecipientSyntax)
    prefix_boundary_rules: tuple[PrefixBoundaryRule, ...] = ()
    image_token_layout: ImageTokenLayout = field(default_factory=ImageTokenLayout)
    image_tiling: ImageTiling = field(default_factory=ImageTiling)

    @classmethod
    def from_contract(cls, msg: Any) -> FrontendSyntax:
        """Read a generated `helios.v1.FrontendContract` message.

        Args:
            msg: a `helios_contract` generated `FrontendContract`.

        Returns:
            The equal plain-data syntax. Enum numbers unknown to this build raise
            ValueError (the contract is rejected at startup).
        """
        return _read(cls, msg)

    def to_contract(self) -> Any:
        """Build the generated `helios.v1.FrontendContract` message (recipes call this)."""
        msg = frontend_pb2.FrontendContract()
        _write(self, msg)
        return msg


# ---- Canonical syntax presets (docs/frontend-syntax.md) ----

THINK_TAGS_DEFAULT = ReasoningSyntax(open="<think>", close="</think>", answer_separator="\n\n")

CHATML_BOUNDARIES = AssistantBoundaries(
    message_end_markers=("<|im_end|>",), assistant_header="<|im_start|>assistant"
)

QWEN_CODER_TAGS = ToolSyntax(
    call_open="<tool_call>",
    call_close="</tool_call>",
    function_name_open="<function=",
    function_name_close=">",
    function_close="</function>",
    parameter_name_open="<parameter=",
    parameter_name_close=">",
    parameter_value_close="</parameter>",
    wrapping_newline="\n",
    tag_separator="\n",
)

GLM_TAGS = ToolSyntax(
    call_open="<tool_call>",
    call_close="</tool_call>",
    parameter_name_open="<arg_key>",
    parameter_name_close="</arg_key>",
    parameter_value_open="<arg_value>",
    parameter_value_close="</arg_value>",
    tag_separator="\n",
)

DSML_TAGS = ToolSyntax(
    call_open="<｜DSML｜function_calls>",
    call_close="</｜DSML｜function_calls>",
    function_name_open='<｜DSML｜invoke name="',
    function_name_close='">',
    function_close="</｜DSML｜invoke>",
    parameter_name_open='<｜DSML｜parameter name="',
    parameter_name_close='"',
    parameter_kind_open=' string="',
    parameter_kind_close='"',
    parameter_kind_string="true",
    parameter_kind_json="false",
    parameter_value_open=">",
    parameter_value_close="</｜DSML｜parameter>",
    tag_separator="\n",
)

JSON_IN_TAGS = ToolSyntax(
    call_open="<tool_call>",
    call_close="</tool_call>",
    wrapping_newline="\n",
    tag_separator="\n",
    json_name_key="name",
    json_arguments_key="arguments",
)

XTML = ToolSyntax(
    call_open="<xtml:calls>",
    call_close="</xtml:calls>",
    function_name_open='<xtml:call name="',
    function_name_close='">',
    function_close="</xtml:call>",
    parameter_name_open='<xtml:arg name="',
    parameter_name_close='">',
    parameter_value_close="</xtml:arg>",
    tag_separator="\n",
)

XTML_THINK = ReasoningSyntax(
    open="<xtml:think>",
    close="</xtml:think>",
    terminal_markers=(XTML.call_open,),
    answer_separator="\n",
)

ATEM = ToolSyntax(
    call_open="<atem:function_calls>",
    call_close="</atem:function_calls>",
    function_name_open='<atem:invoke name="',
    function_name_close='">',
    function_close="</atem:invoke>",
    parameter_name_open='<atem:parameter name="',
    parameter_name_close='">',
    parameter_value_close="</atem:parameter>",
    tag_separator="\n",
)

ATEM_RECIPIENTS = RecipientSyntax(
    recipient_prefix=" to=",
    message_open="<|message|>",
    internal_message_end="<|eom|>",
    reasoning_recipient="self",
    content_recipients=("commentary", "user"),
    tool_recipient="functions",
    named_tool_separator=".",
    answer_recipient="user",
    frame_start="<|start|>",
)

ATEM_BOUNDARIES = AssistantBoundaries(
    message_end_markers=("<|end|>", "<|eom|>"), assistant_header="<|start|>assistant"
)


def think_tags_with(tools: ToolSyntax, reasoning: ReasoningSyntax = THINK_TAGS_DEFAULT) -> ReasoningSyntax:
    """Think-tag reasoning whose terminal marker is `tools.call_open` (the spec's pairing rule)."""
    markers = (tools.call_open,) if tools.call_open else ()
    return ReasoningSyntax(reasoning.open, reasoning.close, markers, reasoning.answer_separator)
