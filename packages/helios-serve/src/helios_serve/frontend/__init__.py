"""helios-serve frontend: the host-side output path (pure Python; no HTTP, no CUDA).

Startup builds one `Frontend` from the prepared `FrontendSyntax` (parsers chosen by the
contract's enums); each request gets an `OutputPipeline` (detokenizer, stops, reasoning
parser, tool parser) and, for structured output, a `GrammarState` (llguidance masks).
"""

from .deltas import (
    ChatResult,
    ContentDelta,
    Delta,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    accumulate,
)
from .errors import FrontendConfigError, FrontendRequestError, GrammarError, StopValidationError
from .pipeline import REASONING_PARSERS, TOOL_PARSERS, Frontend, OutputPipeline, validate_syntax
from .reasoning import ReasoningStart
from .stops import StopSpec, parse_stops
from .syntax import FrontendSyntax, ReasoningParser, ToolParser

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ChatResult",
    "ContentDelta",
    "Delta",
    "Frontend",
    "FrontendConfigError",
    "FrontendRequestError",
    "FrontendSyntax",
    "GrammarError",
    "OutputPipeline",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningStart",
    "StopSpec",
    "StopValidationError",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallStart",
    "ToolParser",
    "accumulate",
    "parse_stops",
    "validate_syntax",
]
