"""Special tokens that are no syntax marker have no text (frontend/pipeline.py): Qwen3's
`<|endoftext|>` (id 0) and `<|im_start|>` (id 1), special in its tokenizer (a GGUF's
CONTROL tokens are exported special), decode to nothing, as HF's
`skip_special_tokens=True` and vLLM's default decode them; `<think>`/`</think>` (added,
not special, and markers) still drive reasoning; a stop on a hidden id still stops. The
served output of the Qwen3 GGUF fixture: tests/ignition/families/test_qwen3_gguf.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helios_contract.schema import frontend_pb2 as fe
from helios_serve.frontend import FrontendSyntax
from helios_serve.frontend.pipeline import Frontend
from helios_serve.frontend.stops import StopSpec
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[3]
ENDOFTEXT, IM_START, IM_END, THINK, END_THINK = 0, 1, 2, 314, 315


@pytest.fixture(scope="module")
def qwen3() -> tuple[Frontend, Tokenizer]:
    spec = importlib.util.spec_from_file_location("qwen3", REPO / "recipes" / "qwen3.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    syntax = FrontendSyntax.from_contract(
        recipe.frontend(fe.TOOL_PARSER_JSON_IN_TAGS, recipe.HERMES_TOOLS))
    tok = Tokenizer.from_file(str(REPO / "tests" / "fixtures" / "qwen3" / "tokenizer.json"))
    return Frontend(syntax, tok, [IM_END]), tok


def _run(frontend: Frontend, ids: list[int], **options):
    pipeline = frontend.output_pipeline(prompt_text="<|im_start|>assistant\n", **options)
    streamed = []
    for i in ids:
        streamed += pipeline.feed(i)
        if pipeline.finished:
            break
    else:
        streamed += pipeline.finish("length")
    return pipeline.result(), streamed


def test_the_hidden_ids_are_the_special_tokens_that_are_no_marker(qwen3):
    frontend, _ = qwen3
    assert frontend.hidden_ids == {ENDOFTEXT, IM_START}  # <|im_end|> is a marker (and EOS)


def test_special_tokens_have_no_text_in_content_and_reasoning(qwen3):
    frontend, tok = qwen3

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    ids = [THINK, *enc("plan"), ENDOFTEXT, END_THINK, *enc("\n\nHi"), IM_START, ENDOFTEXT,
           *enc(" there"), IM_END]
    result, _ = _run(frontend, ids)
    assert (result.reasoning_content, result.content, result.finish_reason) == (
        "plan", "Hi there", "stop")
    # as HF decodes the answer's ids skipping special tokens
    assert tok.decode(ids[ids.index(END_THINK) + 1:], skip_special_tokens=True) == \
        "\n\nHi there"
    plain, streamed = _run(frontend, [*enc("a"), ENDOFTEXT, *enc("b"), ENDOFTEXT],
                           plain_text=True)
    assert (plain.content, plain.finish_reason) == ("ab", "length")
    assert "<|endoftext|>" not in "".join(getattr(d, "text", "") for d in streamed)


def test_a_stop_on_a_hidden_id_still_stops(qwen3):
    frontend, tok = qwen3
    ids = [*tok.encode("one", add_special_tokens=False).ids, ENDOFTEXT,
           *tok.encode("two", add_special_tokens=False).ids]
    result, _ = _run(frontend, ids, stops=StopSpec(token_ids=(ENDOFTEXT,)))
    assert (result.content, result.finish_reason) == ("one", "stop")


def test_the_messages_stop_sequence_is_named_as_the_pipeline_matched_it(qwen3):
    """A stop string spanning a hidden token: the pipeline matches it (no text between),
    and Anthropic's `stop_sequence` names it from the same decoding."""
    from helios_serve.events import Finished, FinishReason
    from helios_serve.http.messages_shapes import stop_sequence
    from helios_serve.http.responses import ChoiceRecord

    frontend, tok = qwen3
    ids = [*tok.encode("xa", add_special_tokens=False).ids, ENDOFTEXT,
           *tok.encode("b", add_special_tokens=False).ids]
    result, _ = _run(frontend, ids, stops=StopSpec(strings=("ab",)))
    assert (result.content, result.finish_reason) == ("x", "stop")
    record = ChoiceRecord(token_ids=ids, finished=Finished(FinishReason.STOP, 0, len(ids), 0))
    assert stop_sequence(record, ("ab",), tok, (), (IM_END,), frontend.hidden_ids) == "ab"
    assert stop_sequence(record, ("ab",), tok, (), (IM_END,)) is None  # decoding it as text
