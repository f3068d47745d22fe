"""The Qwen3 recipes' parsers through HTTP, with the official openai client, on cores
exported from the Qwen3 fixture checkpoint (tests/fixtures/qwen3/dense_tied): the real
contract, tokenizer (with Qwen3's added tokens) and chat template of each recipe.

recipes/qwen3.py declares Hermes tools (JSON_IN_TAGS) and think-tag reasoning with the
checkpoint's Qwen3 template; recipes/qwen3_coder.py the Qwen Coder function tags with
Qwen3-Coder's template. Random weights cannot reason or call tools, so the outputs come
from the scripted backend (helios_serve.testing.scripted): chosen token ids, encoded by
the core's own tokenizer, through the real worker, scheduler, output pipeline and HTTP
server on a free port. One request is served by the core's own weights on the cpu
backend, greedy, and must return exactly the ids the cpu Driver generates.
"""

from __future__ import annotations

import json

import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime.driver import Driver
from helios_serve.server import Server
from helios_serve.testing.native import load_native
from helios_serve.testing.scripted import ScriptBook, ScriptedModel, tiny_geometry
from helios_tools.frontend_assets import render_chat

from tests.ignition.export.tiny import NAMESPACE, REPO, run_export

FIXTURE = REPO / "tests" / "fixtures" / "qwen3" / "dense_tied"
IM_END = 2  # <|im_end|>, the checkpoint's first EOS id
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
HERMES_OUT = ('<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
THINK_OUT = "<think>\nA short answer.\n</think>\n\nIt is sunny."
CODER_OUT = ("Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
             "</parameter>\n</function>\n</tool_call>")


def _export(tmp, keys, recipe: str):
    out = tmp / f"{recipe}.core"
    result = run_export(REPO / "recipes" / f"{recipe}.py", "--checkpoint", FIXTURE, "--key",
                        keys[0], "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32")
    assert result.exit_code == 0, result.output
    return Bootstrap.load(out, [keys[1]], NAMESPACE)


class Served:
    """A Server around `model` for `bootstrap` on 127.0.0.1 (a free port)."""

    def __init__(self, bootstrap: Bootstrap, model) -> None:
        self.bootstrap = bootstrap
        self.server = Server.start(bootstrap, model,
                                   resolve(ServeOptions(port=0), bootstrap.contract),
                                   ObservationClock())
        self.model_name = bootstrap.contract.served_id

    def openai(self):
        import openai  # start-up time: the openai client takes seconds to import

        return openai.OpenAI(base_url=self.server.url + "/v1", api_key="unused",
                             max_retries=0, timeout=60.0)


def scripted(bootstrap: Bootstrap, scripts: dict[str, str]) -> Served:
    """`bootstrap` served by a ScriptedModel: a prompt containing a key emits its text
    (encoded by the core's tokenizer), then <|im_end|>."""
    tok = bootstrap.tokenizer
    vocab = bootstrap.contract.model.vocabulary.sampled_tokens
    book = ScriptBook(lambda ids: tok.decode(list(ids), skip_special_tokens=False))
    for trigger, text in scripts.items():
        book.add(trigger, tok.encode(text, add_special_tokens=False).ids + [IM_END])
    model = ScriptedModel(tiny_geometry(vocab, eos_token_ids=(IM_END,), page_tokens=16,
                                        max_pages_per_request=128, num_pages=1024), book)
    return Served(bootstrap, model)


@pytest.fixture(scope="module")
def keys(module_tmp):
    from helios_tools.core import generate_key, write_key_pair

    return write_key_pair(generate_key(), module_tmp("keys") / "publisher.key")


@pytest.fixture(scope="module")
def hermes(module_tmp, keys):
    bootstrap = _export(module_tmp("qwen3"), keys, "qwen3")
    served = scripted(bootstrap, {"weather": HERMES_OUT, "brief": THINK_OUT})
    yield served
    served.server.stop()


@pytest.fixture(scope="module")
def coder(module_tmp, keys):
    bootstrap = _export(module_tmp("coder"), keys, "qwen3_coder")
    served = scripted(bootstrap, {"weather": CODER_OUT})
    yield served
    served.server.stop()


def test_the_cores_declare_the_recipes_syntax(hermes, coder):
    from helios_contract.schema import frontend_pb2 as fe

    front = hermes.bootstrap.contract.model.frontend
    assert front.tool_parser == fe.TOOL_PARSER_JSON_IN_TAGS
    assert front.reasoning_parser == fe.REASONING_PARSER_THINK_TAGS
    assert list(front.reasoning_syntax.terminal_markers) == ["<tool_call>"]
    assert hermes.bootstrap.chat_template == (REPO / "tests" / "fixtures" / "qwen3" /
                                              "qwen3_chat_template.jinja").read_text()
    front = coder.bootstrap.contract.model.frontend
    assert front.tool_parser == fe.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS
    assert front.reasoning_parser == fe.REASONING_PARSER_NONE
    assert coder.bootstrap.chat_template == (REPO / "recipes" / "templates" /
                                             "qwen3_coder.jinja").read_text()
    assert hermes.model_name == "qwen3-dense-tied"
    assert coder.model_name == "qwen3-coder-dense-tied"


def test_hermes_tool_call_after_reasoning(hermes):
    r = hermes.openai().chat.completions.create(
        model=hermes.model_name, tools=[WEATHER],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    # The syntax declares no separator after <think>: its newline is reasoning text.
    assert choice.message.model_extra["reasoning_content"] == \
        "\nThe user wants the weather in Paris.\n"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_hermes_streamed_reasoning_then_answer(hermes):
    stream = hermes.openai().chat.completions.create(
        model=hermes.model_name, stream=True,
        messages=[{"role": "user", "content": "Be brief: the weather?"}])
    reasoning, content, finish = "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, content, finish) == ("\nA short answer.\n", "It is sunny.", "stop")


def test_qwen_coder_function_tags(coder):
    r = coder.openai().chat.completions.create(
        model=coder.model_name, tools=[WEATHER],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_the_prompt_is_the_real_template_with_tools(hermes):
    """The tool-call turn is rendered by Qwen3's template (tools in the system prompt,
    the assistant's call and the tool response) and the follow-up is served."""
    tool_call = {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [tool_call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, brief sun"}]
    r = hermes.openai().chat.completions.create(model=hermes.model_name, tools=[WEATHER],
                                                messages=messages)
    assert r.choices[0].message.content == "It is sunny."
    prompt = render_chat(hermes.bootstrap.chat_template, messages, tools=[WEATHER],
                         add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more "
                             "functions to assist with the user query.")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' \
        '</tool_call><|im_end|>' in prompt
    assert prompt.endswith("<|im_start|>user\n<tool_response>\n18 C, brief sun\n"
                           "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    ids = hermes.bootstrap.tokenizer.encode(prompt, add_special_tokens=False).ids
    assert r.usage.prompt_tokens == len(ids)


def test_the_cores_weights_serve_greedy_ids(tmp_path, keys):
    """The same core on the cpu backend (its random weights) through HTTP: the greedy
    completion's ids are the cpu Driver's for the rendered prompt."""
    bootstrap = _export(tmp_path, keys, "qwen3")
    messages = [{"role": "user", "content": "Hello there"}]
    prompt = render_chat(bootstrap.chat_template, messages, add_generation_prompt=True)
    ids = bootstrap.tokenizer.encode(prompt, add_special_tokens=False).ids
    want = Driver(load_native(bootstrap.core, "cpu")).generate([ids], max_new_tokens=6)[0]
    served = Served(bootstrap, load_native(bootstrap.core, "cpu"))
    try:
        r = served.openai().completions.create(
            model=served.model_name, prompt=ids, max_tokens=6, temperature=0.0,
            logprobs=1)
    finally:
        served.server.stop()
    assert r.usage.completion_tokens == len(want) == 6
    assert r.choices[0].text == bootstrap.tokenizer.decode(want, skip_special_tokens=True)
