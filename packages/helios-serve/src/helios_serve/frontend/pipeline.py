"""OutputPipeline: sampled token ids in, presentation deltas and the final message out.

    token id -> EOS check -> token stops -> detokenizer -> string stops
             -> reasoning parser -> tool parser -> coalesced presentation deltas

A special token (an added token the tokenizer marks special: a GGUF's CONTROL tokens, HF's
`special: true`) that is no syntax marker has no text: it reaches the stops and parsers
with none, as HF's `skip_special_tokens=True` and vLLM's default decode it. Syntax markers
stay, whether special or not: the parsers consume them.

Parsers are chosen from tables keyed by the contract's `ReasoningParser` and `ToolParser`
enums, never by model name; an unknown or UNSPECIFIED selector fails startup listing the
known ones. The final message is the accumulation of exactly the deltas that were
streamed, so streaming and non-streaming results cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any, Protocol

from helios_contract import frontend_syntax_findings
from helios_tools.token_rules import token_findings

from helios_serve.scheduler.finish import ending_eos_ids
from helios_serve.scheduler.request import FinishReason

from .deltas import (
    AnswerPiece,
    ChatResult,
    ContentDelta,
    Delta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
    accumulate,
    coalesce,
)
from .detokenizer import IncrementalDetokenizer
from .errors import FrontendConfigError, FrontendRequestError
from .markup import TokenMarks, resolve_marks
from .reasoning import (
    PassthroughReasoning,
    ReasoningStart,
    ThinkTagReasoning,
    initial_reasoning_state,
)
from .recipient import RecipientFrameParser
from .stops import StopSpec, StringStopMatcher, TokenStopMatcher
from .syntax import FrontendSyntax, ReasoningParser, ToolParser
from .tools import (
    AnswerOrCalls,
    CallSink,
    JsonInTagsToolParser,
    NoToolParser,
    TaggedToolParser,
    random_call_id,
)
from .vocab import ByteLevelPieces


class IncrementalParser(Protocol):
    def feed(self, token_id: int, text: str) -> list[Any]: ...

    def finish(self) -> list[Any]: ...


class _Request:
    """What a parser factory needs from one request."""

    def __init__(
        self, prompt_text: str, sink: CallSink, structured: bool, forced_call: bool = False
    ) -> None:
        self.prompt_text = prompt_text
        self.sink = sink
        self.structured = structured
        # tool_choice required or named: the grammar constrains the answer to calls, so
        # answer text outside them (a partial opener cut by the output limit) is markup.
        self.forced_call = forced_call


def _think(fe: Frontend, req: _Request) -> IncrementalParser:
    s = fe.syntax
    start = initial_reasoning_state(req.prompt_text, s.reasoning_syntax, s.assistant_boundaries)
    return ThinkTagReasoning(s.reasoning_syntax, fe.marks, start, req.structured)


REASONING_PARSERS: dict[ReasoningParser, Callable[[Frontend, _Request], IncrementalParser]] = {
    ReasoningParser.NONE: lambda fe, req: PassthroughReasoning(),
    ReasoningParser.THINK_TAGS: _think,
    ReasoningParser.XTML_THINK: _think,
    # The recipient frame parser (the ATEM tool parser) consumes complete frames itself.
    ReasoningParser.RECIPIENT_HEADER: lambda fe, req: PassthroughReasoning(),
}


def _tagged(xml: bool) -> Callable[[Frontend, _Request], IncrementalParser]:
    def make(fe: Frontend, req: _Request) -> IncrementalParser:
        return TaggedToolParser(fe.syntax.tool_syntax, fe.marks, req.sink, xml_escaped=xml,
                                emit_content=not req.forced_call)

    return make


def _recipient(fe: Frontend, req: _Request) -> IncrementalParser:
    s = fe.syntax
    return RecipientFrameParser(
        s.tool_syntax,
        s.recipient_syntax,
        s.assistant_boundaries,
        fe.marks,
        req.sink,
        req.prompt_text,
    )


TOOL_PARSERS: dict[ToolParser, Callable[[Frontend, _Request], IncrementalParser]] = {
    ToolParser.NONE: lambda fe, req: NoToolParser(),
    ToolParser.QWEN_CODER_FUNCTION_TAGS: _tagged(False),
    ToolParser.GLM_ARGUMENT_TAGS: _tagged(False),
    ToolParser.DSML: _tagged(False),
    ToolParser.XTML: _tagged(True),
    ToolParser.ATEM_RECIPIENT_HEADERS: _recipient,
    ToolParser.JSON_IN_TAGS: lambda fe, req: JsonInTagsToolParser(
        fe.syntax.tool_syntax, fe.marks, req.sink, emit_content=not req.forced_call
    ),
}


def _known(table: Mapping[Any, Any]) -> str:
    return ", ".join(k.name for k in table)


def _markers(syntax: FrontendSyntax) -> tuple[list[str], list[str]]:
    """(delimiters under the one-token rule, other syntax tags) of a frontend syntax."""
    t, r, b, rc = (
        syntax.tool_syntax,
        syntax.reasoning_syntax,
        syntax.assistant_boundaries,
        syntax.recipient_syntax,
    )
    delimiters = [
        r.open, r.close, *r.terminal_markers, *b.message_end_markers,
        rc.frame_start, rc.message_open, rc.internal_message_end,
    ]  # fmt: skip
    tags = [
        t.call_open, t.call_close, t.function_name_open, t.function_name_close,
        t.function_close, t.parameter_name_open, t.parameter_name_close,
        t.parameter_kind_open, t.parameter_kind_close, t.parameter_value_open,
        t.parameter_value_close,
    ]  # fmt: skip
    return delimiters, tags


def validate_syntax(syntax: FrontendSyntax, tokenizer) -> None:
    """Reject a frontend contract that this output frontend cannot serve.

    The syntax rules are helios-contract's (``frontend_syntax_findings``) and the
    tokenizer-bound ones helios-tools' (``token_findings``): the same generators
    ``PreparedContract.from_contract`` and ``lint-core`` run. What is checked only here is
    that the parser tables implement each selector.

    Raises:
        FrontendConfigError: an unknown or UNSPECIFIED selector (listing the known ones),
            or the first finding of those rules (its message names the field path).
    """
    if syntax.reasoning_parser not in REASONING_PARSERS:
        raise FrontendConfigError(
            f"unknown reasoning parser {syntax.reasoning_parser!r}; "
            f"known reasoning parsers: {_known(REASONING_PARSERS)}"
        )
    if syntax.tool_parser not in TOOL_PARSERS:
        raise FrontendConfigError(
            f"unknown tool parser {syntax.tool_parser!r}; known tool parsers: {_known(TOOL_PARSERS)}"
        )
    front = syntax.to_contract()
    for finding in chain(frontend_syntax_findings(front), token_findings(front, tokenizer)):
        raise FrontendConfigError(str(finding.to_error()), finding.rule)


def answers_or_calls(syntax: FrontendSyntax, tools: Any, tool_choice: Any) -> bool:
    """Whether a response_format answer may be tool calls instead (OpenAI's semantics
    for response_format with tools and tool_choice "auto": the model calls tools or
    answers in the schema, one or the other in a turn). The one rule of the grammar
    (`GrammarCompiler.grammar`: the schema's document or the tool-call envelopes) and
    the pipeline (`AnswerOrCalls`: the answer's opening decides). For syntaxes whose
    calls open with a tag; recipient frames carry answers and calls in frames of their
    own (the ATEM grammar and parser handle both)."""
    return (bool(tools) and tool_choice in (None, "auto")
            and syntax.tool_parser not in (ToolParser.NONE, ToolParser.ATEM_RECIPIENT_HEADERS)
            and bool(syntax.tool_syntax.call_open))


def tool_registry(tools: Any, tool_choice: Any = "auto") -> dict[str, dict[str, Any]]:
    """Map a request's OpenAI `tools` to name -> parameters schema, filtered by tool_choice.

    Raises:
        FrontendRequestError: malformed tools or a tool_choice naming an unknown function.
    """
    registry: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise FrontendRequestError(f"tools[{i}]", "must be {type: function, function: {name, ...}}")
        params = fn.get("parameters") or {}
        if not isinstance(params, dict):
            raise FrontendRequestError(f"tools[{i}].function.parameters", "must be an object")
        registry[fn["name"]] = params
    if tool_choice in (None, "auto", "required"):
        return registry
    if tool_choice == "none":
        return {}
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if function is None or tool_choice.get("type") != "function" or not isinstance(name, str) \
            or not name:
        raise FrontendRequestError("tool_choice", _TOOL_CHOICE_FORMS)
    if name not in registry:
        raise FrontendRequestError("tool_choice", f"names unknown function {name!r}")
    return {name: registry[name]}


_TOOL_CHOICE_FORMS = (
    'must be "none", "auto", "required" or {"type": "function", "function": {"name": NAME}}'
)


class Frontend:
    """The startup-validated output frontend of one served model.

    Args:
        syntax: the prepared frontend contract.
        tokenizer: the frontend `tokenizers.Tokenizer`.
        eos_token_ids: the core's EOS ids; generation ends only at these.

    Raises:
        FrontendConfigError: see `validate_syntax`.
    """

    def __init__(self, syntax: FrontendSyntax, tokenizer, eos_token_ids: Sequence[int]) -> None:
        validate_syntax(syntax, tokenizer)
        self.syntax = syntax
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.marks: TokenMarks = resolve_marks(tokenizer, *_markers(syntax))
        # Rendered as no text (the module docstring): special, and no syntax marker.
        self.hidden_ids = frozenset(
            i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
        ) - set(self.marks.by_id)
        # Byte-level tokenizers: the detokenizers decode bytes, not ids (shared cache).
        self.pieces = ByteLevelPieces.of(tokenizer)

    def initial_reasoning(self, prompt_text: str) -> ReasoningStart:
        """Where output starts for a rendered prompt (think-tag reasoning)."""
        s = self.syntax
        if s.reasoning_parser not in (ReasoningParser.THINK_TAGS, ReasoningParser.XTML_THINK):
            return ReasoningStart.ANSWER
        return initial_reasoning_state(prompt_text, s.reasoning_syntax, s.assistant_boundaries)

    def output_pipeline(
        self,
        *,
        prompt_text: str = "",
        prompt_ids: Sequence[int] = (),
        tools: Any = None,
        tool_choice: Any = "auto",
        parallel_tool_calls: bool = True,
        stops: StopSpec | None = None,
        structured_answer: bool = False,
        ignore_eos: bool = False,
        plain_text: bool = False,
        call_id: Callable[[], str] = random_call_id,
    ) -> OutputPipeline:
        """Build one request's output pipeline.

        Args:
            prompt_text: the rendered prompt (initial reasoning / frame state).
            prompt_ids: the prompt's token ids (seed the detokenizer window).
            tools: the request's OpenAI `tools` array, or None.
            tool_choice: "none", "auto", "required" or {"type": "function", ...} (named:
                its call ends with finish_reason "stop", as OpenAI's does; auto and
                required calls with "tool_calls").
            parallel_tool_calls: False keeps only the first call.
            stops: validated stops (`parse_stops`).
            structured_answer: response_format constrains the answer, which is then an
                opaque document (literal delimiters in it stay answer text).
            ignore_eos: EOS ids do not end the output (vLLM's ignore_eos): they are
                omitted from presentation and generation goes on to the output limit.
            plain_text: no reasoning or tool parsing: every character is content (legacy
                completions).
            call_id: tool-call id factory (unique per call).

        Raises:
            FrontendRequestError: tools for a model without tool syntax, bad tools.
        """
        if tools and self.syntax.tool_parser is ToolParser.NONE:
            raise FrontendRequestError("tools", "this model declares no tool-call syntax")
        registry = tool_registry(tools, tool_choice)
        forced = bool(tools) and (tool_choice == "required" or isinstance(tool_choice, dict))
        req = _Request(prompt_text, CallSink(registry, call_id), structured_answer, forced)
        reasoning = (PassthroughReasoning() if plain_text
                     else REASONING_PARSERS[self.syntax.reasoning_parser](self, req))
        tool_parser: IncrementalParser
        if structured_answer and not plain_text and answers_or_calls(self.syntax, tools,
                                                                     tool_choice):
            tool_parser = AnswerOrCalls(TOOL_PARSERS[self.syntax.tool_parser](self, req),
                                        self.syntax.tool_syntax.call_open)
        elif plain_text or (structured_answer
                            and self.syntax.tool_parser is not ToolParser.ATEM_RECIPIENT_HEADERS):
            # The constrained answer is an opaque document: literal tags in it stay text.
            tool_parser = NoToolParser()
        else:
            tool_parser = TOOL_PARSERS[self.syntax.tool_parser](self, req)
        return OutputPipeline(
            detokenizer=IncrementalDetokenizer(self.tokenizer, prompt_ids, self.pieces),
            reasoning=reasoning,
            tools=tool_parser,
            eos_token_ids=self.eos_token_ids,
            hidden_ids=self.hidden_ids,
            stops=stops or StopSpec(),
            parallel_tool_calls=parallel_tool_calls,
            ignore_eos=ignore_eos,
            named_call=bool(tools) and isinstance(tool_choice, dict),
        )


class OutputPipeline:
    """One request's output path. Build it with `Frontend.output_pipeline`.

    Feed every sampled id in order with `feed`; call `finish("length")` at the output
    limit (or STOP on cancellation). After EOS or a matched stop, `finish_reason` is set
    and the pipeline must not be fed again.
    """

    def __init__(
        self,
        *,
        detokenizer: IncrementalDetokenizer,
        reasoning: IncrementalParser,
        tools: IncrementalParser,
        eos_token_ids: frozenset[int],
        stops: StopSpec,
        parallel_tool_calls: bool = True,
        ignore_eos: bool = False,
        named_call: bool = False,
        hidden_ids: frozenset[int] = frozenset(),
    ) -> None:
        self._detok = detokenizer
        self._hidden = hidden_ids  # special tokens that are no marker: no text
        self._reasoning = reasoning
        self._tools = tools
        self._eos = ending_eos_ids(eos_token_ids, ignore_eos)
        self._omitted = eos_token_ids - self._eos  # ignored EOS ids: no text
        self._token_stops = (
            TokenStopMatcher(stops.token_ids, stops.token_sequences)
            if (stops.token_ids or stops.token_sequences)
            else None
        )
        self._string_stops = StringStopMatcher(stops.strings) if stops.strings else None
        self._parallel = parallel_tool_calls
        # EOS after calls finishes "tool_calls", except for a named tool_choice: OpenAI
        # (and vLLM since #25054) finish a forced named call with "stop".
        self._calls_reason = FinishReason.STOP if named_call else FinishReason.TOOL_CALLS
        # No stops, no reasoning and no tool parsing: every piece of text is one content
        # delta (what the general path gives, without its per-token parser objects).
        self._plain = (self._token_stops is None and self._string_stops is None
                       and type(reasoning) is PassthroughReasoning
                       and type(tools) is NoToolParser)
        self._deltas: list[Delta] = []
        self._calls = 0
        self.finish_reason: FinishReason | None = None
        # A token or string stop ended the output (not EOS, not the output limit): the
        # request's end is then no publishable snapshot endpoint ("String stops").
        self.matched_stop = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, token_id: int) -> list[Delta]:
        """Process one sampled token id.

        Returns:
            Presentation deltas now safe to send (possibly none).

        Raises:
            RuntimeError: fed after the pipeline finished (a worker bug).
        """
        if self.finished:
            raise RuntimeError("OutputPipeline fed after it finished")
        if token_id in self._eos:
            return self._end(None)
        if token_id in self._omitted:  # an ignored EOS: no text, generation goes on
            return []
        if self._plain:
            text = self._push(token_id)
            if not text:
                return []
            delta = ContentDelta(text)
            self._deltas.append(delta)
            return [delta]
        out: list[Delta] = []
        if self._token_stops is not None:
            ids, stopped = self._token_stops.feed(token_id)
            for tid in ids:
                self._text(tid, self._push(tid), out)
            if stopped:
                self._text(-1, self._detok.flush(), out)
                return self._end(FinishReason.STOP, out)
            return self._publish(out)
        text = self._push(token_id)
        if self._string_stops is not None:
            pieces, stopped = self._string_stops.feed(token_id, text)
            for tid, piece in pieces:
                self._parse(tid, piece, out)
            if stopped:
                return self._end(FinishReason.STOP, out, flush_text=False)
            return self._publish(out)
        self._parse(token_id, text, out)
        return self._publish(out)

    def finish(self, reason: FinishReason | str) -> list[Delta]:
        """End without EOS, for `reason` (decided by scheduler/finish.py's rule: LENGTH at
        the output or context end; or STOP on cancellation).

        Held stop prefixes and partial characters are flushed as text.
        """
        if self.finished:
            return []
        return self._end(FinishReason(reason))

    def result(self) -> ChatResult:
        """The final message: the accumulation of every delta returned so far."""
        if not self.finished:
            raise RuntimeError("OutputPipeline.result before it finished")
        return accumulate(self._deltas, self.finish_reason or FinishReason.STOP)

    # ---- internals ----

    def _push(self, token_id: int) -> str:
        """The text `token_id` completes; none for a hidden special token, which never
        enters the detokenizer's window (as a decode that skips special tokens)."""
        return "" if token_id in self._hidden else self._detok.push(token_id)

    def _text(self, token_id: int, text: str, out: list[Delta]) -> None:
        if self._string_stops is not None:  # not combinable with token stops; kept general
            for tid, piece in self._string_stops.feed(token_id, text)[0]:
                self._parse(tid, piece, out)
        else:
            self._parse(token_id, text, out)

    def _parse(self, token_id: int, text: str, out: list[Delta]) -> None:
        for item in self._reasoning.feed(token_id, text):
            self._route(item, out)

    def _route(self, item: Any, out: list[Delta]) -> None:
        if isinstance(item, AnswerPiece):
            out.extend(self._tools.feed(item.token_id, item.text))
        else:
            out.append(item)

    def _end(self, reason: FinishReason | None, out: list[Delta] | None = None,
             flush_text: bool = True) -> list[Delta]:
        """Flush and finish; reason None is EOS (`_calls_reason` after completed calls)."""
        out = [] if out is None else out
        if flush_text:
            if self._token_stops is not None:
                for tid in self._token_stops.flush():
                    self._text(tid, self._push(tid), out)
            self._text(-1, self._detok.flush(), out)
            if self._string_stops is not None:
                for tid, piece in self._string_stops.flush():
                    self._parse(tid, piece, out)
        for item in self._reasoning.finish():
            self._route(item, out)
        out.extend(self._tools.finish())
        published = self._publish(out)
        if reason is None:
            reason = self._calls_reason if self._calls else FinishReason.STOP
        elif reason is FinishReason.STOP:
            self.matched_stop = True
        self.finish_reason = reason
        return published

    def _publish(self, out: list[Delta]) -> list[Delta]:
        kept: list[Delta] = []
        for d in out:
            if isinstance(d, ToolCallStart | ToolCallArguments) and not self._parallel and d.index > 0:
                continue
            if isinstance(d, ToolCallStart):
                self._calls += 1
            kept.append(d)
        kept = coalesce(kept)
        self._deltas.extend(kept)
        return kept


__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "Frontend",
    "OutputPipeline",
    "ReasoningDelta",
    "tool_registry",
    "validate_syntax",
]
