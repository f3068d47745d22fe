"""Request preparation: plain request data in, one frozen `PreparedRequest` out.

    ChatInput -> chat template (or an assistant continuation) -> tokenize
    CompletionInput -> tokenize (or the given ids)
      -> stops -> grammar -> sampling (request values over the core's defaults)
      -> output limit -> the scheduler's capacity rule -> PreparedRequest

Runs in a preparation thread (HTTP admission's preparation slots). It imports nothing
of the HTTP layer: the handler builds the plain-data input from its validated request,
and a bad field raises `FrontendRequestError` naming it (400); a request that can never
fit the prepared capacities raises `CapacityExceeded` (503 before any response byte,
docs/api.md), decided by the same `check_capacity` the scheduler runs.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from helios_contract.schema import contract_pb2
from helios_tools.frontend_assets import ChatTemplateError, render_chat

from helios_serve.engine.plan import ModelGeometry, PromptImage, SamplingParams
from helios_serve.scheduler import AdmissionError, SchedRequest, check_capacity

from .boundaries import first_message_end, prefix_endpoints
from .detokenizer import IncrementalDetokenizer
from .errors import FrontendRequestError
from .grammar import GrammarCompiler, GrammarState
from .image_prompt import ImagePrompt, ImageSource
from .logit_bias import parse_logit_bias
from .pipeline import Frontend, OutputPipeline
from .stops import StopSpec, parse_stops

MAX_TOP_LOGPROBS = 20
_TEMPLATE_RESERVED = frozenset({"messages", "tools", "add_generation_prompt"})


class CapacityExceeded(Exception):
    """The request can never fit the prepared capacities (scheduler admission, 503).

    Attributes:
        error: the scheduler's admission verdict (reason and numbers).
        param: the request field at fault: the prompt field when the prompt alone does
            not fit, else the field that set the output limit (None: the core default).
    """

    def __init__(self, error: AdmissionError, param: str | None) -> None:
        super().__init__(error.detail)
        self.error = error
        self.param = param


@dataclass(frozen=True)
class GenerationInput:
    """Generation fields shared by chat and completions, as the request gave them
    (None: not given; the core's serving defaults apply).

    Attributes:
        max_tokens: the output limit in tokens, or None for the core's default.
        limit_field: the request field that gave max_tokens (named by a rejection).
        n: choices to generate for the prompt.
        logprobs: None for no log probabilities; else the number of most likely
            alternatives (0..20) to report beside each sampled token.
        top_field: the request field that gave that number (named by a rejection).
        logit_bias: (token id as given, bias) pairs added to the logits before sampling
            (validated by `frontend.logit_bias.parse_logit_bias`).
        ignore_eos: keep generating past EOS until the output limit (vLLM's field).
        min_tokens: EOS and stop tokens cannot be sampled before this many tokens.
        prompt_logprobs: None for no prompt log probabilities; else the number of most
            likely alternatives (0..20) to report beside each prompt token's.
        prompt_field_logprobs: the request field that asked for them (named by a
            rejection).
    """

    max_tokens: int | None = None
    limit_field: str = "max_tokens"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    n: int = 1
    stop: str | tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_token_sequences: tuple[tuple[int, ...], ...] | None = None
    logprobs: int | None = None
    top_field: str = "top_logprobs"
    logit_bias: tuple[tuple[str, float], ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    observe_ids: bool = False
    observe_timestamps: bool = False
    prompt_logprobs: int | None = None
    prompt_field_logprobs: str = "prompt_logprobs"


@dataclass(frozen=True)
class ChatInput:
    """A chat request as plain data.

    Attributes:
        messages: OpenAI messages as dicts; `content` is a string, None, or a list of
            parts ({"type": "text", "text": ...} or an image part).
        tools: the OpenAI `tools` array as dicts, or None.
        chat_template_kwargs: extra chat template variables (e.g. enable_thinking).
        add_generation_prompt: open a new assistant turn after the messages.
        continue_final_message: the last message is an assistant message the output
            continues (inside its reasoning, content or tool body).
        prompt_prefix: token ids the prompt should continue exactly (a stored
            conversation's prompt and output ids, /v1/responses' previous_response_id).
            When the rendered prompt's text starts with their text, the prompt is these
            ids followed by the encoding of the rest, so prefix reuse finds the pages and
            the end snapshot the previous request left; else it is the rendered text's
            encoding, as without a prefix.
    """

    messages: tuple[Mapping[str, Any], ...]
    generation: GenerationInput = field(default_factory=GenerationInput)
    tools: tuple[Mapping[str, Any], ...] | None = None
    tool_choice: str | Mapping[str, Any] = "auto"
    parallel_tool_calls: bool = True
    response_format: Mapping[str, Any] | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    prompt_prefix: tuple[int, ...] = ()


@dataclass(frozen=True)
class CompletionInput:
    """A legacy completion prompt: text, or token ids (input vocabulary)."""

    prompt: str | tuple[int, ...]
    generation: GenerationInput = field(default_factory=GenerationInput)


@dataclass(frozen=True)
class ChoiceOutput:
    """What one choice's generation needs on the worker thread (mutable parts)."""

    pipeline: OutputPipeline
    grammar: GrammarState | None


JsonObject = Mapping[str, object]  # a decoded JSON object (an OpenAI tool, tool_choice)


@dataclass(frozen=True)
class PipelineArgs:
    """The request's part of an output pipeline (`Frontend.output_pipeline`'s arguments)."""

    prompt_ids: tuple[int, ...]
    stops: StopSpec
    prompt_text: str = ""
    tools: tuple[JsonObject, ...] | None = None
    tool_choice: str | JsonObject = "auto"
    parallel_tool_calls: bool = True
    structured_answer: bool = False
    ignore_eos: bool = False
    plain_text: bool = False

    def build(self, frontend: Frontend) -> OutputPipeline:
        """A fresh pipeline. Raises FrontendRequestError for bad tools or tool_choice."""
        choice = dict(self.tool_choice) if isinstance(self.tool_choice, Mapping) \
            else self.tool_choice
        return frontend.output_pipeline(
            prompt_text=self.prompt_text, prompt_ids=self.prompt_ids,
            tools=[dict(t) for t in self.tools] if self.tools else None, tool_choice=choice,
            parallel_tool_calls=self.parallel_tool_calls, stops=self.stops,
            structured_answer=self.structured_answer, ignore_eos=self.ignore_eos,
            plain_text=self.plain_text,
        )  # fmt: skip


@dataclass(frozen=True)
class OutputRecipe:
    """How to build a fresh output pipeline and grammar state for each choice."""

    frontend: Frontend
    pipeline: PipelineArgs
    grammar: GrammarState | None  # a never-advanced prototype; each choice gets a copy

    def new_choice(self) -> ChoiceOutput:
        grammar = self.grammar.fork() if self.grammar is not None else None
        return ChoiceOutput(self.pipeline.build(self.frontend), grammar)


class RequestData(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The data half of a prepared request: everything the model worker needs that is
    plain data. It is the request that crosses to the engine process as it is
    (`wire.WireRequest`); `PreparedRequest` adds the output objects, which cannot cross
    and which the engine rebuilds from data (`engine_process.engine_request`).

    Attributes:
        prompt_text: the rendered prompt (or the completion prompt's text).
        prompt_token_ids: the tokenized prompt.
        sampling: choice 0's sampling parameters after the core's defaults apply.
        max_output_tokens: the output limit (tokens) of each choice.
        limit_field: the request field that set the limit, or None (core default).
        prompt_field: the request field of the prompt ("messages" or "prompt").
        stops: validated string and token stops.
        n: choices; choice i samples with seed `sampling.seed + i` (mod 2**64).
        logprobs: None, or the alternatives reported beside each sampled token.
        logit_bias: (token id, bias) pairs, ascending ids.
        ignore_eos: EOS does not end generation.
        min_tokens: EOS and stop tokens are masked before this many output tokens.
        observe_ids / observe_timestamps: token and timing observation.
        prompt_logprobs: None, or the alternatives reported beside each prompt token's
            log probability (the first prompt token has none): the prompt's first choice
            scores it through SCORED_PREFILL programs (OpenAI completions' echo with
            logprobs, vLLM's prompt_logprobs).
        publish_endpoints: prompt-turn ends (token counts, ascending) the template marks
            (frontend.boundaries.prefix_endpoints): where the scheduler publishes
            snapshots of the prompt's state.
        images: the prompt's images (spans, feature positions, windows; PromptImage).
    """

    prompt_text: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    max_output_tokens: int
    limit_field: str | None
    prompt_field: str
    stops: StopSpec
    n: int = 1
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    observe_ids: bool = False
    observe_timestamps: bool = False
    publish_endpoints: tuple[int, ...] = ()
    prompt_logprobs: int | None = None
    images: tuple[PromptImage, ...] = ()

    def choice_sampling(self, index: int) -> SamplingParams:
        """Choice `index`'s parameters: its own RNG stream, seed + index (mod 2**64),
        as vLLM derives the seeds of parallel samples."""
        if index == 0:
            return self.sampling
        return dataclasses.replace(self.sampling, seed=(self.sampling.seed + index) % 2**64)


class PreparedRequest(RequestData, frozen=True, kw_only=True):
    """A prepared request: everything the model worker needs, nothing of HTTP. Its
    `RequestData` fields, and:

    Attributes:
        output: builds each choice's output pipeline and grammar (not data: it holds
            the frontend and a compiled grammar).
    """

    output: OutputRecipe

    @classmethod
    def rebuild(cls, data: RequestData, output: OutputRecipe) -> PreparedRequest:
        """`data` with output objects made for it (the engine process's side)."""
        return cls(**msgspec.structs.asdict(data), output=output)

    @property
    def data(self) -> RequestData:
        """The data half, without the output objects (what crosses to the engine)."""
        return RequestData(**{name: getattr(self, name) for name in RequestData.__struct_fields__})

    @property
    def constrained(self) -> bool:
        return self.output.grammar is not None

    @property
    def needs_feedback(self) -> bool:
        """Each sampled token must reach the worker before another round is submitted
        (grammar, string or token stops); min_tokens masks depend only on the position."""
        return self.constrained or self.stops.has_host_stops


class Preparer:
    """Prepares requests for one served model (construct once at startup).

    Args:
        frontend: the startup-validated output frontend.
        chat_template: the Jinja2 chat template text.
        template_variables: special-token strings the template names (bos_token, ...).
        defaults: the core's serving defaults (sampling, output limit).
        geometry: the serving geometry the scheduler plans against.
    """

    def __init__(
        self,
        frontend: Frontend,
        chat_template: str,
        template_variables: Mapping[str, str],
        defaults: contract_pb2.ServingDefaults,
        geometry: ModelGeometry,
        images: ImagePrompt | None = None,
    ) -> None:
        self.frontend = frontend
        self.images = images or ImagePrompt(frontend.syntax, geometry)
        self.tokenizer = frontend.tokenizer
        self.chat_template = chat_template
        self.template_variables = dict(template_variables)
        self.defaults = defaults
        self.geometry = geometry
        # llguidance token table, built once; masks cover the sampled vocabulary.
        self.grammars = GrammarCompiler(frontend, vocab_size=geometry.vocab_size)

    # -- entry points ---------------------------------------------------------------

    def chat(self, request: ChatInput) -> PreparedRequest:
        """Prepare a chat request.

        Raises:
            FrontendRequestError: a field is invalid (named in `field`).
            CapacityExceeded: the prompt plus the output limit can never fit.
        """
        sources: list[ImageSource] = []
        messages = [self._message(i, m, sources) for i, m in enumerate(request.messages)]
        tools = [dict(t) for t in request.tools] if request.tools else None
        prompt_text = self._render(request, messages, tools)
        prompt_ids, token_ends = self._encode_prompt(
            prompt_text, () if sources else request.prompt_prefix)
        # Where the rendered turns end: the scheduler publishes a snapshot there, so a
        # later conversation sharing those turns restores the state after them.
        rules = self.frontend.syntax.prefix_boundary_rules
        endpoints = prefix_endpoints(prompt_text, token_ends,
                                     [m.get("role", "") for m in messages], rules,
                                     self._first_message_end(request, messages, tools,
                                                             prompt_text, rules))
        images: tuple[PromptImage, ...] = ()
        if self.images.accepts:  # placeholders become image spans; endpoints move with them
            placeholder = self.tokenizer.token_to_id(
                self.frontend.syntax.image_token_layout.template_placeholder)
            prompt_ids, images, moved = self.images.expand(prompt_ids, placeholder, sources)
            endpoints = tuple(moved[e] for e in endpoints)
        g = request.generation
        fmt = (request.response_format or {}).get("type")
        structured = fmt in ("json_object", "json_schema") or (
            bool(tools) and (request.tool_choice == "required" or isinstance(request.tool_choice, Mapping))
        )
        stops = self._stops(g, structured)
        tool_choice = dict(request.tool_choice) if isinstance(request.tool_choice, Mapping) \
            else request.tool_choice
        pipeline = PipelineArgs(
            prompt_text=prompt_text, prompt_ids=prompt_ids,
            tools=tuple(tools) if tools else None, tool_choice=tool_choice,
            parallel_tool_calls=request.parallel_tool_calls, stops=stops,
            structured_answer=fmt in ("json_object", "json_schema"), ignore_eos=g.ignore_eos,
        )  # fmt: skip
        pipeline.build(self.frontend)  # validates tools and tool_choice
        grammar = self.grammars.for_request(
            response_format=dict(request.response_format) if request.response_format else None,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            prompt_text=prompt_text,
        )
        return self._finish(prompt_text, prompt_ids, "messages", g, stops,
                            OutputRecipe(self.frontend, pipeline, grammar),
                            endpoints, images)  # fmt: skip

    def completion(self, request: CompletionInput) -> PreparedRequest:
        """Prepare a legacy completion (no chat template).

        Raises:
            FrontendRequestError: a field is invalid (named in `field`).
            CapacityExceeded: the prompt plus the output limit can never fit.
        """
        g = request.generation
        if isinstance(request.prompt, str):
            prompt_text = request.prompt
            prompt_ids = tuple(self.tokenizer.encode(prompt_text, add_special_tokens=False).ids)
        else:
            limit = self.tokenizer.get_vocab_size(with_added_tokens=True)
            for i, tid in enumerate(request.prompt):
                if not 0 <= tid < limit:
                    raise FrontendRequestError(
                        f"prompt[{i}]", f"token id {tid} is outside the vocabulary of {limit}")
            prompt_ids = tuple(request.prompt)
            prompt_text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        if not prompt_ids:
            raise FrontendRequestError("prompt", "the prompt has no tokens")
        stops = self._stops(g, structured=False)
        pipeline = PipelineArgs(prompt_ids=prompt_ids, stops=stops, ignore_eos=g.ignore_eos,
                                plain_text=True)  # fmt: skip
        return self._finish(prompt_text, prompt_ids, "prompt", g, stops,
                            OutputRecipe(self.frontend, pipeline, None))  # fmt: skip

    def encode_chat(self, request: ChatInput) -> tuple[str, tuple[int, ...]]:
        """The rendered prompt and its ids (POST /tokenize with messages)."""
        messages = [self._message(i, m, []) for i, m in enumerate(request.messages)]
        tools = [dict(t) for t in request.tools] if request.tools else None
        text = self._render(request, messages, tools)
        return text, tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    # -- parts ----------------------------------------------------------------------

    def _encode_prompt(self, text: str, prefix: tuple[int, ...]
                       ) -> tuple[tuple[int, ...], list[int]]:  # fmt: skip
        """The prompt's ids and the character offset in `text` where each ends: `prefix`
        followed by the encoding of the rest when `text` starts with the prefix's text
        (ChatInput.prompt_prefix), else the encoding of `text`. A prefix id that ends
        inside a character is given the end of the text before it."""
        if prefix:
            detokenizer = IncrementalDetokenizer(self.tokenizer)
            ends, pieces, length = [], [], 0
            for token_id in prefix:
                piece = detokenizer.push(token_id)
                pieces.append(piece)
                length += len(piece)
                ends.append(length)
            tail = detokenizer.flush()
            pieces.append(tail)
            ends[-1] += len(tail)
            head = "".join(pieces)
            if text.startswith(head):
                rest = self.tokenizer.encode(text[len(head):], add_special_tokens=False)
                return (tuple(prefix) + tuple(rest.ids),
                        ends + [len(head) + end for _, end in rest.offsets])  # fmt: skip
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return tuple(encoding.ids), [end for _, end in encoding.offsets]

    def _message(self, i: int, message: Mapping[str, Any],
                 sources: list[ImageSource]) -> dict[str, Any]:
        """Message `i` as the template sees it. A model with images gets content as
        parts ({"type": "text"} / {"type": "image"}, image parts appended to `sources`);
        a text model gets the text parts joined (an image part is a 400)."""
        out = {k: v for k, v in message.items() if v is not None}
        content = message.get("content")
        if self.images.accepts:
            if isinstance(content, str):
                out["content"] = [{"type": "text", "text": content}]
            elif isinstance(content, list | tuple):
                out["content"] = self.images.message_parts(i, content, sources)
            return out
        if isinstance(content, list | tuple):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text":
                    raise FrontendRequestError(f"messages[{i}].content[{j}]",
                                               "this model accepts no images")
                texts.append(part["text"])
            out["content"] = "".join(texts)
        return out

    def _first_message_end(self, request: ChatInput, messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]] | None, prompt_text: str,
                           rules) -> int | None:
        """Where messages[0]'s rendering ends in `prompt_text` (boundaries.first_message_end):
        one more render of the first message alone, only when some role has a rule."""
        if not rules or len(messages) < 1:
            return None
        kwargs = {**self.template_variables, **dict(request.chat_template_kwargs)}
        try:
            alone = render_chat(self.chat_template, messages[:1], add_generation_prompt=False,
                                tools=tools, **kwargs)
        except ChatTemplateError:
            return None  # the full render succeeded: fall back to the marker search
        return first_message_end(prompt_text, alone)

    def _render(self, request: ChatInput, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None) -> str:  # fmt: skip
        kwargs = dict(request.chat_template_kwargs)
        for key in kwargs:
            if key in _TEMPLATE_RESERVED:
                raise FrontendRequestError(
                    f"chat_template_kwargs.{key}", "is set by the request itself")
        continuation = request.continue_final_message
        if continuation:
            if request.add_generation_prompt:
                raise FrontendRequestError("continue_final_message",
                                           "cannot be combined with add_generation_prompt=true")
            if not messages or messages[-1].get("role") != "assistant":
                raise FrontendRequestError("continue_final_message",
                                           "the last message must be an assistant message")
        try:
            text = render_chat(
                self.chat_template, messages, add_generation_prompt=request.add_generation_prompt,
                tools=tools, **{**self.template_variables, **kwargs},
            )  # fmt: skip
        except ChatTemplateError as exc:
            raise FrontendRequestError("messages", f"messages: {exc}") from None
        if continuation:
            final = messages[-1].get("content") or ""
            if not isinstance(final, str):  # an image model's parts: the text they hold
                final = "".join(p.get("text", "") for p in final if p.get("type") == "text")
            text = _continue_final(text, final)
        return text

    def _stops(self, g: GenerationInput, structured: bool) -> StopSpec:
        stop: Any = list(g.stop) if isinstance(g.stop, tuple) else g.stop
        return parse_stops(
            stop,
            list(g.stop_token_ids) if g.stop_token_ids is not None else None,
            [list(s) for s in g.stop_token_sequences] if g.stop_token_sequences is not None
            else None,
            vocab_size=self.geometry.vocab_size,
            structured_output=structured,
        )

    def _finish(self, prompt_text: str, prompt_ids: tuple[int, ...], prompt_field: str,
                g: GenerationInput, stops: StopSpec, output: OutputRecipe,
                publish_endpoints: tuple[int, ...] = (),
                images: tuple[PromptImage, ...] = ()) -> PreparedRequest:  # fmt: skip
        slots = self.geometry.slots
        if g.n > slots:
            raise FrontendRequestError(
                "n", f"n {g.n} exceeds the {slots} requests this server runs at once")
        self._check_logprobs(g.logprobs, g.top_field)
        self._check_prompt_logprobs(g.prompt_logprobs, g.prompt_field_logprobs, bool(images))
        bias = parse_logit_bias(dict(g.logit_bias), self.geometry.vocab_size)
        if bias:
            self._check_logit_bias()
        if g.min_tokens and g.max_tokens is not None and g.min_tokens > g.max_tokens:
            raise FrontendRequestError(
                "min_tokens", f"min_tokens {g.min_tokens} exceeds {g.limit_field} {g.max_tokens}")
        max_output = self._output_limit(g, len(prompt_ids))
        error = check_capacity(self.geometry, SchedRequest(0, prompt_ids, max_output))
        if error is not None:
            param = g.limit_field if g.max_tokens is not None else None
            raise CapacityExceeded(error, param if error.prompt_fits else prompt_field)
        return PreparedRequest(
            prompt_text=prompt_text,
            prompt_token_ids=prompt_ids,
            sampling=self._sampling(g, bias, stops),
            max_output_tokens=max_output,
            limit_field=g.limit_field if g.max_tokens is not None else None,
            prompt_field=prompt_field,
            stops=stops,
            output=output,
            n=g.n,
            logprobs=g.logprobs,
            logit_bias=bias,
            ignore_eos=g.ignore_eos,
            min_tokens=g.min_tokens,
            observe_ids=g.observe_ids,
            observe_timestamps=g.observe_timestamps,
            publish_endpoints=publish_endpoints,
            prompt_logprobs=g.prompt_logprobs,
            images=images,
        )

    def _check_prompt_logprobs(self, top: int | None, field_name: str,
                               images: bool = False) -> None:
        """Whether this core scores prompts (SCORED_PREFILL programs) and records `top`
        alternatives per token; a prompt with `images` is never scored (no SCORED_PREFILL
        program encodes images)."""
        if top is None:
            return
        g = self.geometry
        if not g.scored_token_capacities or g.top_logprobs is None:
            raise FrontendRequestError(field_name, "this model computes no prompt log "
                                       "probabilities (its core has no SCORED_PREFILL "
                                       "programs)")
        if images:
            raise FrontendRequestError(field_name, "prompt log probabilities of a prompt "
                                       "with images are not computed")
        if not 0 <= top <= g.top_logprobs:
            raise FrontendRequestError(field_name, f"{top} alternatives outside the 0.."
                                       f"{g.top_logprobs} this model records")

    def _check_logprobs(self, logprobs: int | None, top_field: str) -> None:
        """Whether this core can report `logprobs` alternatives per token (computed on
        the device, in the sampling step: ModelGeometry.top_logprobs). On a speculative
        core such requests run as DECODE rows (scheduler.speculates)."""
        if logprobs is None:
            return
        g = self.geometry
        if g.top_logprobs is None:
            raise FrontendRequestError("logprobs", "this model records no logprobs (its core "
                                       "was exported without a logprobs record)")
        if logprobs > g.top_logprobs:
            raise FrontendRequestError(top_field, f"{logprobs} alternatives exceed the "
                                       f"{g.top_logprobs} this model records")

    def _check_logit_bias(self) -> None:
        g = self.geometry
        if not g.logit_bias:
            raise FrontendRequestError("logit_bias", "this model applies no logit bias (its "
                                       "core was exported without the logit bias input)")

    def _sampling(self, g: GenerationInput, logit_bias: tuple[tuple[int, float], ...],
                  stops: StopSpec) -> SamplingParams:  # fmt: skip
        """Explicit request values win over the core's sampling defaults. min_tokens bans
        the EOS ids (unless EOS is ignored) and the stop-token ids below the minimum."""
        d = self.defaults.sampling

        def given(value, default):
            return default if value is None else value

        seed = g.seed if g.seed is not None else secrets.randbits(64)
        return SamplingParams(
            temperature=float(given(g.temperature, d.temperature)),
            top_p=float(given(g.top_p, d.top_p if d.top_p > 0 else 1.0)),
            top_k=max(0, int(given(g.top_k, d.top_k))),  # -1 (OpenAI "disabled") is 0 here
            min_p=float(given(g.min_p, d.min_p)),
            presence_penalty=float(given(g.presence_penalty, d.presence_penalty)),
            frequency_penalty=float(given(g.frequency_penalty, d.frequency_penalty)),
            repetition_penalty=float(given(
                g.repetition_penalty, d.repetition_penalty if d.repetition_penalty > 0 else 1.0)),
            seed=seed % 2**64,
            logit_bias=logit_bias,
            logprobs=g.logprobs,
            min_tokens=g.min_tokens,
            min_tokens_banned=tuple(sorted(set(
                (() if g.ignore_eos else self.geometry.eos_token_ids) + stops.token_ids)))
            if g.min_tokens else (),
        )  # fmt: skip

    def _output_limit(self, g: GenerationInput, prompt_tokens: int) -> int:
        """An explicit limit is kept (the capacity rule rejects one beyond the context);
        the default is the core's default output limit, cut to the context left."""
        if g.max_tokens is not None:
            return g.max_tokens
        room = self.geometry.context_tokens - prompt_tokens
        default = self.defaults.sampling.max_output_tokens or room
        return max(1, min(default, room))


def _continue_final(rendered: str, final_content: str) -> str:
    """Cut the rendered conversation right after the final message's content, so the
    output continues it (transformers' `continue_final_message`)."""
    for needle in (final_content, final_content.strip()):
        if needle and needle in rendered:
            return rendered[: rendered.rindex(needle) + len(needle)]
    raise FrontendRequestError(
        "continue_final_message", "the chat template does not render the final message's "
        "content verbatim, so it cannot be continued")
