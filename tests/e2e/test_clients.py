"""Real clients, unchanged, against helios-serve: the official openai client, litellm,
langchain-openai, instructor and guidellm (issue 14, "Done when").

The tiny-model server (real weights, real kernels on the CPU) serves the clients whose
answers need no meaning; structured output through langchain and instructor uses the
scripted server, whose answer is chosen, so the parsed object can be checked exactly.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import openai
import pytest
from helios_serve.testing.harness import ScriptedServer
from helios_serve.testing.tokenizer import EOS_ID
from pydantic import BaseModel

from tests.tiny_model import TOKENIZER, plain_logprobs, prompt_ids

REPO = Path(__file__).resolve().parents[2]
GUIDELLM_ENV = REPO / "tests" / "e2e" / "guidellm"  # its own locked environment (click < 8.2)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)  # fmt: skip


def test_openai_client_against_the_tiny_model(tiny_server):
    client = _client(tiny_server)
    name = tiny_server.settings.served_name
    messages = [{"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=6, user="u1",
                                       seed=3, temperature=0.8)  # fmt: skip
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 6
    again = client.chat.completions.create(model=name, messages=messages, max_tokens=6,
                                           user="u1", seed=3, temperature=0.8)  # fmt: skip
    assert again.choices[0].message.content == r.choices[0].message.content  # seeded
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=6, n=2,
                                       seed=3, temperature=0.8)  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1]
    # Choice 0 of a seeded n=2 request is the seeded n=1 answer (choice i: seed + i).
    assert r.choices[0].message.content == again.choices[0].message.content
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=6,
                                                 stream=True))  # fmt: skip
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    c = client.completions.create(model=name, prompt="once upon a time", max_tokens=5)
    assert c.object == "text_completion" and c.usage.completion_tokens <= 5
    assert client.models.retrieve(name).id == name
    with pytest.raises(openai.InternalServerError) as info:  # raised at once: no retry
        openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="x").chat.completions.create(
            model=name, messages=messages, max_tokens=10_000)
    assert info.value.code == "context_length_exceeded"


def _token_bytes(token_id: int) -> bytes:
    """A tiny-tokenizer id's bytes, from the tokenizer's own vocabulary: special tokens
    are their text, the others byte-level strings (GPT-2's reversible byte map)."""
    from helios_serve.testing.tokenizer import SPECIAL_TOKENS, _bytes_to_unicode

    if token_id < len(SPECIAL_TOKENS):
        return SPECIAL_TOKENS[token_id].encode()
    inverse = {c: b for b, c in _bytes_to_unicode().items()}
    piece = next(p for p, i in TOKENIZER.vocab.items() if i == token_id)
    return bytes(inverse[c] for c in piece)


def _expected_logprobs(tiny_served, ids: list[int], steps: int, top: int, reply) -> list:
    """The plain NumPy forward's greedy steps for `ids`, cut where the reply ended (an
    ending EOS has no logprobs entry)."""
    expected = plain_logprobs(tiny_served.checkpoint, ids, steps, top)
    tokens = reply.usage.completion_tokens
    if reply.choices[0].finish_reason == "stop":
        assert expected[tokens - 1][0] == EOS_ID
        tokens -= 1
    return expected[:tokens]


def test_openai_client_logprobs_in_chat_json_and_stream(tiny_server, tiny_served):
    """logprobs=True with top_logprobs=3, greedy: every output token has its entry
    (token, logprob, bytes, top_logprobs) and the values are the raw model distribution
    of the independent NumPy forward; the stream carries the same entries."""
    client = _client(tiny_server)
    request = dict(model=tiny_server.settings.served_name, max_tokens=8, temperature=0,
                   messages=[{"role": "user", "content": "hello"}], logprobs=True,
                   top_logprobs=3)  # fmt: skip
    r = client.chat.completions.create(**request)
    content = r.choices[0].logprobs.content
    expected = _expected_logprobs(tiny_served, prompt_ids("hello"), 8, 3, r)
    assert len(content) == len(expected) > 0
    for entry, (token, logprob, top) in zip(content, expected, strict=True):
        assert bytes(entry.bytes) == _token_bytes(token)
        assert entry.token == _token_bytes(token).decode("utf-8", errors="replace")
        assert entry.logprob == pytest.approx(logprob, abs=2e-4)
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [_token_bytes(t) for t, _ in top]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
            [v for _, v in top], abs=2e-4)
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy: the top token
    text = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    assert text == r.choices[0].message.content
    streamed = [e for chunk in client.chat.completions.create(**request, stream=True)
                if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]  # fmt: skip
    # The same entries (the stream's prompt comes from the prefix cache: float32 sums in
    # another order, so values agree to rounding).
    assert [(e.token, e.bytes, [t.bytes for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.bytes, [t.bytes for t in e.top_logprobs]) for e in content]
    assert [[e.logprob] + [t.logprob for t in e.top_logprobs] for e in streamed] == [
        pytest.approx([e.logprob] + [t.logprob for t in e.top_logprobs], abs=1e-5)
        for e in content]


def test_openai_client_logprobs_in_legacy_completions(tiny_server, tiny_served):
    """logprobs=2 on /v1/completions: the legacy object (tokens, token_logprobs,
    top_logprobs as {token: logprob}, text_offset), JSON and stream alike."""
    client = _client(tiny_server)
    prompt = "once upon a time"
    request = dict(model=tiny_server.settings.served_name, prompt=prompt, max_tokens=6,
                   temperature=0, logprobs=2)  # fmt: skip
    c = client.completions.create(**request)
    lp = c.choices[0].logprobs
    ids = TOKENIZER.tokenizer.encode(prompt, add_special_tokens=False).ids
    expected = _expected_logprobs(tiny_served, ids, 6, 2, c)
    texts = [_token_bytes(t).decode("utf-8", errors="replace") for t, _, _ in expected]
    assert lp.tokens == texts
    assert lp.token_logprobs == pytest.approx([v for _, v, _ in expected], abs=2e-4)
    for got, (_, _, top) in zip(lp.top_logprobs, expected, strict=True):
        want = {_token_bytes(t).decode("utf-8", errors="replace"): v for t, v in top}
        assert got.keys() == want.keys()
        assert list(got.values()) == pytest.approx(list(want.values()), abs=2e-4)
    assert lp.text_offset == [len("".join(texts[:i])) for i in range(len(texts))]
    assert "".join(texts) == c.choices[0].text
    chunks = [ch.choices[0].logprobs for ch in client.completions.create(**request, stream=True)
              if ch.choices and ch.choices[0].logprobs]  # fmt: skip
    assert [t for ch in chunks for t in ch.tokens] == lp.tokens
    assert [v for ch in chunks for v in ch.token_logprobs] == pytest.approx(lp.token_logprobs,
                                                                            abs=1e-5)
    assert [o for ch in chunks for o in ch.text_offset] == lp.text_offset


def test_litellm(tiny_server):
    import litellm

    name = tiny_server.settings.served_name
    kwargs = dict(model=f"openai/{name}", api_base=tiny_server.url + "/v1", api_key="unused",
                  messages=[{"role": "user", "content": "hello"}], max_tokens=5, user="u1")
    r = litellm.completion(**kwargs)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 5
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(**kwargs, stream=True)]
    assert len(pieces) >= 1


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def scripted_json():
    # Context 2048 tokens: instructor's JSON-mode system prompt is long.
    with ScriptedServer(geometry={"max_pages_per_request": 512, "num_pages": 1024}) as server:
        server.book.add("Paris", server.tok.byte_ids(b'{"name": "Paris", "country": "France"}'))
        yield server


def test_langchain_with_structured_output(scripted_json):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=scripted_json.model_name, base_url=scripted_json.url + "/v1",
                     api_key="unused", max_retries=0)  # fmt: skip
    city = llm.with_structured_output(City).invoke("Tell me about Paris.")
    assert city == City(name="Paris", country="France")
    plain = llm.invoke("say hi")
    assert plain.content == "Hello, world!"


def test_instructor_json_mode(scripted_json):
    import instructor

    client = instructor.from_openai(_client(scripted_json), mode=instructor.Mode.JSON)
    city = client.chat.completions.create(
        model=scripted_json.model_name, response_model=City, max_retries=0,
        messages=[{"role": "user", "content": "Tell me about Paris."}])
    assert city.model_dump() == {"name": "Paris", "country": "France"}


def test_guidellm_short_benchmark(tiny_server, tmp_path):
    """guidellm sends stream_options.continuous_usage_stats and ignore_eos; a bounded
    synchronous run of four requests must complete with no errored request."""
    processor = tmp_path / "tokenizer"
    processor.mkdir()
    (processor / "tokenizer.json").write_text(tiny_server.bootstrap.tokenizer_json)
    (processor / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}))
    out = tmp_path / "guidellm.json"
    guidellm = GUIDELLM_ENV / ".venv" / "bin" / "guidellm"
    assert guidellm.exists(), (f"guidellm has its own environment: run `uv sync --locked "
                               f"--project {GUIDELLM_ENV.relative_to(REPO)}` (.ci/run does)")
    proc = subprocess.run(
        [str(guidellm), "benchmark", "run", "--target", tiny_server.url,
         "--model", tiny_server.settings.served_name, "--processor", str(processor),
         "--data", "prompt_tokens=24,output_tokens=8", "--rate-type", "synchronous",
         "--max-requests", "4", "--disable-progress", "--output-path", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    totals = report["benchmarks"][0]["request_totals"]
    assert totals == {"successful": 4, "incomplete": 0, "errored": 0, "total": 4}, totals
