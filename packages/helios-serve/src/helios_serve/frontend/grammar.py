"""Structured output: llguidance grammars for response_format and forced tool choice.

The grammar is built from the same `FrontendSyntax` the parsers read:
the declared reasoning envelope stays free text (a reasoning model still reasons), and
only the answer after it is constrained, either to the response_format JSON schema (an
opaque document, so literal delimiters inside it stay answer text) or, for tool_choice
"required" or a named function, to the declared tool envelope holding the registered
tools' schemas (with parallel calls, at most as many calls as functions offered).
Single-token markers are written as their token (`<[id]>`), other markers
as text, exactly as the parsers recognise them.

Masks are llguidance bitmasks: int32 words, bit `t % 32` of word `t // 32` allows token t.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance
import numpy as np

from .errors import GrammarError
from .pipeline import Frontend, answers_or_calls, tool_registry
from .reasoning import ReasoningStart, initial_reasoning_state, prompt_tail
from .strict import strict_schema
from .syntax import ReasoningParser, ToolParser
from .tools import parameter_schema


def _regex_escape(text: str) -> str:
    """Escape text for a Lark /regex/ (Rust regex syntax; `<` `>` stay bare, as `\\<` is
    a word-boundary assertion there)."""
    out = []
    for ch in text:
        if ch in "\\.+*?()|[]{}^$#&-~/":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        else:
            out.append(ch)
    return "".join(out)


_ANY_TEXT = "/(.|\\n)*/"  # any text, newlines included (Lark regex)


def _one_line(message: str) -> str:
    """An llguidance error as one line for the client: without the position in, and the
    listing of, the internal Lark grammar that wraps the request's schema."""
    kept = []
    for line in message.splitlines():
        if re.match(r"\s*\d+ \| ", line):  # the grammar listing starts
            break
        if line.strip():
            kept.append(line.strip())
    return re.sub(r"^at \d+\(\d+\): ", "", " ".join(kept))


def _json_inline(schema: Any) -> str:
    """A JSON schema as a grammar item, with Helios' strictness (frontend.strict)."""
    return "%json " + json.dumps(strict_schema(schema), ensure_ascii=False)


class _Lark:
    """Accumulates named rules; markers become tokens or string literals."""

    def __init__(self, frontend: Frontend) -> None:
        self._marks = frontend.marks
        self.rules: list[str] = []
        self._n = 0

    def lit(self, text: str) -> str:
        """A marker or fixed text: its token when token-bound, else a string literal."""
        if not text:
            return ""
        tid = self._marks.by_text.get(text)
        if tid is not None:
            return f"<[{tid}]>"
        return json.dumps(text, ensure_ascii=False)

    def rule(self, body: str, attrs: str = "") -> str:
        self._n += 1
        name = f"r{self._n}"
        self.rules.append(f"{name}{attrs}: {body}")
        return name

    def text_until(self, terminator: str) -> str:
        """Free text ended by `terminator` (which the returned expression includes)."""
        tid = self._marks.by_text.get(terminator)
        if tid is not None:
            return f"{self.rule(_ANY_TEXT)} <[{tid}]>"
        return self.rule(f"/(.|\\n)*{_regex_escape(terminator)}/", "[lazy]")


def _types(schema: Mapping[str, Any] | None) -> list[str]:
    t = (schema or {}).get("type")
    return [t] if isinstance(t, str) else list(t or [])


class GrammarCompiler:
    """Builds request grammars for one served model (construct once at startup).

    Args:
        frontend: the validated output frontend (syntax, tokenizer, marks, EOS ids).
        vocab_size: sampled vocabulary size the masks cover (>= the tokenizer's); None
            uses the tokenizer's size.
    """

    def __init__(self, frontend: Frontend, vocab_size: int | None = None) -> None:
        self._fe = frontend
        eos = sorted(frontend.eos_token_ids)
        self.tokenizer = llguidance.LLTokenizer(
            frontend.tokenizer.to_str(), n_vocab=vocab_size, eos_token=eos or None
        )
        self.mask_words = (self.tokenizer.vocab_size + 31) // 32

    # ---- request entry point ----

    def for_request(
        self,
        *,
        response_format: Any = None,
        tools: Any = None,
        tool_choice: Any = "auto",
        parallel_tool_calls: bool = True,
        prompt_text: str = "",
    ) -> GrammarState | None:
        """The request's grammar state, or None when output is unconstrained.

        Raises:
            GrammarError: a malformed response_format, an invalid JSON schema, or a tool
                choice the model's tool syntax cannot constrain.
        """
        lark = self.grammar(
            response_format=response_format,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            prompt_text=prompt_text,
        )
        if lark is None:
            return None
        return self.compile(lark, field="tool_choice" if response_format is None else "response_format")

    def compile(self, lark: str, field: str = "response_format") -> GrammarState:
        """Validate and instantiate a Lark grammar (raises GrammarError on any error)."""
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer
        )
        if is_error:
            raise GrammarError(field, _one_line(messages[0]) if messages else "invalid grammar")
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(field, _one_line(matcher.get_error()))
        return GrammarState(matcher, self.mask_words, frozenset(self._fe.eos_token_ids),
                            lark)

    def grammar(
        self,
        *,
        response_format: Any = None,
        tools: Any = None,
        tool_choice: Any = "auto",
        parallel_tool_calls: bool = True,
        prompt_text: str = "",
    ) -> str | None:
        """The Lark grammar text for a request, or None when unconstrained."""
        schema = _answer_schema(response_format)
        forced = tool_choice == "required" or isinstance(tool_choice, dict)
        # A named function is called exactly once (OpenAI's forced-function semantics);
        # only "required" may repeat calls when parallel calls are allowed.
        parallel_tool_calls = parallel_tool_calls and not isinstance(tool_choice, dict)
        if schema is None and not forced:
            return None
        if schema is not None and forced:
            raise GrammarError("response_format", "cannot be combined with a forced tool_choice")
        g = _Lark(self._fe)
        syn = self._fe.syntax
        registry: Mapping[str, Any] = {}
        if forced:
            registry = tool_registry(tools, tool_choice)
            if not registry:
                raise GrammarError("tool_choice", "requires at least one tool")
            if syn.tool_parser is ToolParser.NONE:
                raise GrammarError("tool_choice", "this model declares no tool-call syntax")
        if syn.reasoning_parser is ReasoningParser.RECIPIENT_HEADER:
            start = self._recipient_frames(g, schema, registry, parallel_tool_calls, prompt_text)
        else:
            if forced:
                answer = self._tool_calls(g, registry, parallel_tool_calls)
            elif answers_or_calls(syn, tools, tool_choice):
                # OpenAI's response_format with tools the model may call ("auto"): it
                # either calls tools or answers in the schema, never both in one turn.
                calls = self._tool_calls(g, tool_registry(tools, "auto"), parallel_tool_calls)
                answer = f"({_json_inline(schema)} | {calls})"
            else:
                answer = _json_inline(schema)
            start = f"{self._reasoning_prefix(g, prompt_text)} {answer}"
        return "\n".join([f"start: {start}", *g.rules]) + "\n"

    # ---- reasoning envelope ----

    def _reasoning_prefix(self, g: _Lark, prompt_text: str) -> str:
        syn = self._fe.syntax
        if syn.reasoning_parser not in (ReasoningParser.THINK_TAGS, ReasoningParser.XTML_THINK):
            return ""
        r = syn.reasoning_syntax
        state = initial_reasoning_state(prompt_text, r, syn.assistant_boundaries)
        sep = f"{g.lit(r.answer_separator)}?" if r.answer_separator else ""
        body = f"{g.text_until(r.close)} {sep}"
        if state is ReasoningStart.IN_REASONING:
            return body
        if state is ReasoningStart.UNDECIDED:
            return f"({g.lit(r.open)} {body})?"
        return ""

    # ---- tool envelopes ----

    def _tool_calls(self, g: _Lark, registry: Mapping[str, Any], parallel: bool) -> str:
        t = self._fe.syntax.tool_syntax
        sep = g.lit(t.tag_separator)
        if self._fe.syntax.tool_parser is ToolParser.JSON_IN_TAGS:
            # One JSON document per function: its parameters' local definitions ($defs,
            # definitions; pydantic puts nested models there) move to the document root,
            # where their "#/$defs/..." references resolve.
            objects = []
            for name, params in registry.items():
                obj = {
                    "type": "object",
                    "properties": {
                        t.json_name_key: {"const": name},
                        t.json_arguments_key: params or {"type": "object"},
                    },
                    "required": [t.json_name_key, t.json_arguments_key],
                    "additionalProperties": False,
                }
                for key in ("$defs", "definitions"):
                    if isinstance(params, dict) and key in params:
                        obj[key] = params[key]
                objects.append(_json_inline(obj))
            wrap = g.lit(t.wrapping_newline)
            body = g.rule(" | ".join(objects))
            call = g.rule(f"{g.lit(t.call_open)} {wrap} {body} {wrap} {g.lit(t.call_close)}")
        else:
            functions = g.rule(" | ".join(self._function(g, n, p) for n, p in registry.items()))
            if t.function_name_open:
                inner = (f"{sep} {_at_most(f'{functions} {sep}', len(registry))}" if parallel
                         else f"{sep} {functions} {sep}")  # fmt: skip
            else:
                inner = functions
            call = g.rule(f"{g.lit(t.call_open)} {inner} {g.lit(t.call_close)}")
        tail = f"{sep}?" if sep else ""
        # The limit of parallel calls: as many calls as functions offered (tag families:
        # in their one block). After the last allowed call the grammar allows only the
        # end of the turn, so a model that would repeat its call until the output limit
        # (SmolLM2-135M does) ends with finish tool_calls.
        blocks = len(registry) if parallel and not t.function_name_open else 1
        return _at_most(f"{call} {tail}", blocks)

    def _function(self, g: _Lark, name: str, params: Mapping[str, Any]) -> str:
        t = self._fe.syntax.tool_syntax
        sep = g.lit(t.tag_separator)
        props: Mapping[str, Any] = params.get("properties") or {}
        required = set(params.get("required") or [])
        parts = []
        for pname in props:
            p = self._parameter(g, pname, parameter_schema(params, pname) or {})
            parts.append(f"{p} {sep}" if pname in required else f"({p} {sep})?")
        esc = self._fe.syntax.tool_parser is ToolParser.XTML
        head = f"{g.lit(t.function_name_open)} {g.lit(_xml(name) if esc else name)} {g.lit(t.function_name_close)}"
        body = " ".join(parts)
        if t.function_close:
            return g.rule(f"{head} {sep} {body} {g.lit(t.function_close)}")
        return g.rule(f"{head} {sep} {body}")

    def _parameter(self, g: _Lark, pname: str, schema: Mapping[str, Any]) -> str:
        t = self._fe.syntax.tool_syntax
        xml = self._fe.syntax.tool_parser is ToolParser.XTML
        types = _types(schema)
        is_string = not types or types[0] == "string"
        head = f"{g.lit(t.parameter_name_open)} {g.lit(_xml(pname) if xml else pname)} {g.lit(t.parameter_name_close)}"
        if t.parameter_kind_open:
            kind = t.parameter_kind_string if is_string else t.parameter_kind_json
            head += f" {g.lit(t.parameter_kind_open + kind + t.parameter_kind_close)}"
        if t.parameter_value_open:  # a tag separator may stand between the name and value tags
            sep = g.lit(t.tag_separator)
            head += f" {sep + '?' if sep else ''} {g.lit(t.parameter_value_open)}"
        wrap = g.lit(t.wrapping_newline)
        close = t.wrapping_newline + t.parameter_value_close
        if is_string and "enum" not in schema:
            if xml:
                text = g.rule(r"/([^<&]|&(lt|gt|amp|quot|apos);)*/")
                return g.rule(f"{head} {wrap} {text} {g.lit(t.parameter_value_close)}")
            tid = g._marks.by_text.get(t.parameter_value_close)
            if tid is not None:
                return g.rule(f"{head} {wrap} {g.rule(_ANY_TEXT)} <[{tid}]>")
            return g.rule(f"{head} {wrap} {g.text_until(close)}")
        value = _json_inline(schema) if not is_string else _enum_literals(g, schema)
        return g.rule(f"{head} {wrap} {value} {wrap} {g.lit(t.parameter_value_close)}")

    # ---- recipient frames ----

    def _recipient_frames(
        self,
        g: _Lark,
        schema: Any,
        registry: Mapping[str, Any],
        parallel: bool,
        prompt_text: str,
    ) -> str:
        syn = self._fe.syntax
        r, b = syn.recipient_syntax, syn.assistant_boundaries
        role = b.assistant_header.removeprefix(r.frame_start)
        start_, msg, eom = g.lit(r.frame_start), g.lit(r.message_open), g.lit(r.internal_message_end)

        def after_header(recipient: str, body: str) -> str:
            return f"{g.lit(r.recipient_prefix + recipient)} {msg} {body}"

        reasoning_body = g.rule(f"{g.text_until(r.internal_message_end)}")
        self_after = g.rule(after_header(r.reasoning_recipient, reasoning_body))
        if registry:
            calls = self._tool_calls(g, registry, parallel=False)
            final_after = g.rule(after_header(r.tool_recipient, calls))
            final_body = calls
            if parallel:
                final_after = g.rule(f"{final_after} ({eom} {start_} {g.lit(role)} {final_after})*")
        else:
            final_body = _json_inline(schema)
            final_after = g.rule(after_header(r.answer_recipient, final_body))
        rest = g.rule(f"({start_} {g.lit(role)} {self_after})* {start_} {g.lit(role)} {final_after}")
        tail = prompt_tail(prompt_text, b) if prompt_text else None
        if tail is None:
            return rest
        opened = tail.find(r.message_open)
        if opened < 0:  # the prompt opened the header: the recipient suffix comes first
            return f"{self_after} {rest} | {final_after}"
        recipient = tail[:opened].strip().removeprefix(r.recipient_prefix.strip()).strip()
        if recipient == r.reasoning_recipient:
            return f"{reasoning_body} {rest}"
        return final_body


def _at_most(item: str, limit: int) -> str:
    """Lark for 1 to `limit` repetitions of `item` (nested optionals: `a (a (a)?)?`)."""
    out = item
    for _ in range(limit - 1):
        out = f"{item} ({out})?"
    return out


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _enum_literals(g: _Lark, schema: Mapping[str, Any]) -> str:
    values = [v for v in schema.get("enum", []) if isinstance(v, str)]
    if not values:
        raise GrammarError("tools", "a string enum parameter needs string values")
    return "(" + " | ".join(json.dumps(v, ensure_ascii=False) for v in values) + ")"


def _answer_schema(response_format: Any) -> Any:
    """The JSON schema that constrains the answer, or None (text)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise GrammarError("response_format", "must be an object")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict | bool):
            raise GrammarError("response_format.json_schema", "must be an object with a schema")
        schema = spec.get("schema", {})
        return {} if schema is True else schema
    raise GrammarError("response_format.type", f"unknown type {kind!r}")


class GrammarState:
    """One request's grammar matcher: masks before sampling, advance after.

    A token the grammar rejects moves the matcher to its error state (a value, not an
    exception): `advance` returns False and the request ends with a grammar failure.
    """

    def __init__(self, matcher: llguidance.LLMatcher, mask_words: int,
                 eos_token_ids: frozenset[int] = frozenset(), lark: str | None = None) -> None:
        self._m = matcher
        self.mask_words = mask_words
        self._eos = eos_token_ids
        self.lark = lark  # the source (the engine process compiles it again)

    def fill_mask(self, out_row: np.ndarray) -> None:
        """Write the allowed-token bitmask.

        Args:
            out_row: int32 [mask_words], C-contiguous; bit t%32 of word t//32 = token t.
        """
        if out_row.dtype != np.int32 or out_row.shape != (self.mask_words,):
            raise ValueError(f"mask row must be int32[{self.mask_words}], got {out_row.dtype}{out_row.shape}")
        if not out_row.flags["C_CONTIGUOUS"]:
            raise ValueError("mask row must be C-contiguous")
        self._m.unsafe_compute_mask_ptr(out_row.ctypes.data, out_row.nbytes)

    def candidate_prefix(self, token_ids: Sequence[int]) -> int:
        """How many leading copied candidates the grammar accepts from its current state
        (history drafting; the state does not change). The run stops before the first
        token the grammar rejects and before any EOS id: the end of the output is the
        target's own token, never a copied one.

        Args:
            token_ids: candidate ids following the tokens consumed so far.
        """
        eos = self._eos
        valid = self._m.validate_tokens(list(token_ids))
        for i, t in enumerate(token_ids[:valid]):
            if t in eos:
                return i
        return valid

    def candidate_masks(self, token_ids: Sequence[int]) -> np.ndarray:
        """The allowed-token bitmask of every position after each candidate:
        int32 ``[len(token_ids), mask_words]``, row i = the mask after consuming
        token_ids[0..i] (the lane's verified position i + 1). The matcher advances
        tentatively along the candidates and rolls back: its state does not change.

        Raises:
            ValueError: the grammar rejects a candidate (callers pass only the prefix
                ``candidate_prefix`` accepted).
        """
        ids = [int(t) for t in token_ids]
        valid = self._m.validate_tokens(ids)  # consuming a rejected token is not undone
        if valid < len(ids):
            raise ValueError(f"the grammar rejects copied candidate {ids[valid]} at "
                             f"position {valid}")
        out = np.zeros((len(ids), self.mask_words), dtype=np.int32)
        consumed = 0
        try:
            for i, t in enumerate(ids):
                if not self._m.consume_token(t):
                    raise ValueError(f"the grammar rejects copied candidate {t} at "
                                     f"position {i}")
                consumed += 1
                self._m.unsafe_compute_mask_ptr(out[i].ctypes.data, out[i].nbytes)
        finally:
            if consumed:
                self._m.rollback(consumed)
        return out

    def fork(self) -> GrammarState:
        """An independent copy in the same state (one per choice of n > 1)."""
        return GrammarState(self._m.deep_copy(), self.mask_words, self._eos, self.lark)

    def advance(self, token_id: int) -> bool:
        """Consume a sampled token; False when the grammar rejects it (error state)."""
        return self._m.consume_token(token_id)

    def advance_all(self, token_ids: Sequence[int]) -> bool:
        return all(self.advance(t) for t in token_ids)

    def is_terminated(self) -> bool:
        """True when no token but EOS (or none at all) can follow."""
        return self._m.is_stopped()

    def is_accepting(self) -> bool:
        return self._m.is_accepting()

    @property
    def error(self) -> str:
        return self._m.get_error()
