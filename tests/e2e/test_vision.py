"""Images in, text out: the tiny Idefics3 core (tests/fixtures/idefics3_tiny) exported,
linted and served on the cpu backend, checked against transformers' reference
(make_reference.py there) through the official openai client; every bad image a 400.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anthropic
import numpy as np
import openai
import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime.native_model import NativeModel
from helios_serve.server import Server

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "idefics3_tiny"
REFERENCE = np.load(FIXTURE / "reference.npz")
META = json.loads((FIXTURE / "reference.json").read_text())
NAMESPACE = "example.org/helios-vision-tests"


def data_url(name: str, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode((FIXTURE / name).read_bytes()).decode()


@pytest.fixture(scope="module")
def vision_core(module_tmp, signing_key_pair):
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    out = module_tmp("vision") / "idefics3-tiny.core"
    # f32 storage of the bf16 checkpoint (exact): the products run in float32 as the
    # reference does (bf16 cores may round prefill activations: docs/cpu-kernels.md)
    export_core(FIXTURE / "recipe.py", checkpoint=str(FIXTURE / "checkpoint"),
                key_path=private, namespace=NAMESPACE, out=out, weight_dtype="f32")
    return out, public


@pytest.fixture(scope="module")
def server(vision_core):
    path, public = vision_core
    bootstrap = Bootstrap.load(path, [public], NAMESPACE)
    settings = resolve(ServeOptions(port=0, max_active=2, queue_capacity=4), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    yield server
    server.stop()
    bootstrap.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120.0)


MESSAGES = [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": data_url("wide.png"), "detail": "high"}},
    {"type": "text", "text": "Compare the two images."},
    {"type": "image_url", "image_url": {"url": data_url("square.png")}},
    {"type": "text", "text": "What is in this image?"}]}]


def test_lint_passes_on_both_backends(vision_core):
    from helios_tools.core import open_core
    from helios_tools.lint import lint_core

    path, public = vision_core
    with open_core(path, [public.read_bytes()]) as core:
        assert [f.rule for f in lint_core(core, acceptance=NAMESPACE)] == []  # cpu and cuda


def test_greedy_equals_transformers(client):
    reply = client.chat.completions.create(
        model="idefics3-tiny", messages=MESSAGES, max_tokens=8, temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True})
    sentinel = META["vocab"]  # Helios' nonsampled sentinel where the processor has <image>
    prompt = [META["image_token_id"] if t == sentinel else t
              for t in reply.model_extra["prompt_token_ids"]]
    assert prompt == REFERENCE["input_ids"].tolist()
    assert reply.choices[0].model_extra["token_ids"] == META["greedy"]
    assert reply.usage.prompt_tokens == len(REFERENCE["input_ids"]) == 94
    assert reply.usage.completion_tokens == 8


def test_first_token_logprobs_equal_transformers_logits(client):
    reply = client.chat.completions.create(
        model="idefics3-tiny", messages=MESSAGES, max_tokens=1, temperature=0,
        logprobs=True, top_logprobs=5)
    logits = REFERENCE["logits"][-1].astype(np.float64)
    reference = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    top = reply.choices[0].logprobs.content[0].top_logprobs
    order = np.argsort(-reference, kind="stable")[:5]
    # transformers' float32 logits of this prompt are up to 3.6e-3 from a float64 forward
    # of the same weights, which Helios' first-token logprobs match to 1e-6 (checked once
    # by hand): the bound is the reference's own error
    assert [t.logprob for t in top] == pytest.approx(reference[order].tolist(), abs=1e-3)


def _error(client, messages, **kw) -> tuple[int, str]:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="idefics3-tiny", messages=messages, max_tokens=2,
                                       **kw)
    body = info.value.body
    return info.value.status_code, f"{body['param']}: {body['message']}"


def _image(url: str, text: str = "What is it?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


PNG = (FIXTURE / "wide.png").read_bytes()


@pytest.mark.parametrize(("url", "message"), [
    ("data:image/png;base64," + base64.b64encode(PNG[:len(PNG) // 2]).decode(),
     "messages[0].content[0].image_url: the image is corrupt or truncated"),
    ("data:image/png;base64," + base64.b64encode(b"GIF89a not a png").decode(),
     "messages[0].content[0].image_url: not a readable PNG, JPEG or WebP image"),
    ("data:image/jpeg;base64," + base64.b64encode(PNG).decode(),
     "messages[0].content[0].image_url: the data URL says image/jpeg but the image is "
     "image/png"),
    ("data:image/gif;base64,R0lGODlh",
     "messages[0].content[0].image_url: unsupported image type 'image/gif': send one of "
     "image/jpeg, image/png, image/webp"),
    ("https://example.com/cat.png",
     "messages[0].content[0].image_url: remote image URLs are refused: send a data: URL, or "
     "start the server with --allow-image-urls"),
    ("file:///etc/passwd",
     "messages[0].content[0].image_url: an image URL is a data: URL (or http(s) with "
     "--allow-image-urls)"),
])
def test_bad_images_are_400s_naming_the_part(client, url, message):
    assert _error(client, _image(url)) == (400, message)


def test_huge_dimensions_are_a_400_naming_the_limit(client):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buffer, "PNG", optimize=True)  # 25 Mpx > 16.7 Mpx
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    assert _error(client, _image(url)) == (
        400, "messages[0].content[0].image_url: the image is 5000x5000 = 25000000 pixels; "
        "the limit is 16777216")


def test_too_many_images_is_a_400_naming_the_limit(client):
    parts = [{"type": "image_url", "image_url": {"url": data_url("wide.png")}}] * 9
    assert _error(client, [{"role": "user", "content": parts}]) == (
        400, "messages[0].content[8]: more than 8 images in one request "
        "(max_images_per_request)")


def test_feature_slots_bound_the_images_of_a_request(client):
    parts = [{"type": "image_url", "image_url": {"url": data_url("square.png")}}] * 3
    status, message = _error(client, [{"role": "user", "content": parts}])
    assert (status, message) == (
        400, "messages[0].content[2].image_url: the images need 60 feature slots; the model "
        "holds 40 per request (vision.feature_slots)")


def test_typed_placeholder_is_a_400(client):
    assert _error(client, _image(data_url("wide.png"), "see <image> here")) == (
        400, "messages: the prompt holds 2 image placeholders ('<image>') for 1 images: the "
        "text may not contain the placeholder")


def test_server_still_serves_after_bad_images(client):
    test_greedy_equals_transformers(client)


def _flipped_wide_url() -> str:
    import io

    from PIL import Image, ImageOps

    buffer = io.BytesIO()  # same size as wide.png (same span), other pixels
    ImageOps.mirror(Image.open(FIXTURE / "wide.png").convert("RGB")).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _reused(client, messages) -> tuple[int, list[int], list[int]]:
    reply = client.chat.completions.create(
        model="idefics3-tiny", messages=messages, max_tokens=4, temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True})
    extra = reply.model_extra
    return (extra["reused_prompt_tokens"], extra["prompt_token_ids"],
            reply.choices[0].model_extra["token_ids"])


def test_prefix_cache_keys_image_spans_by_content(client):
    """Equal pixels reuse the cached state; equal tokens of other pixels reuse none past
    the first feature sentinel (position 8: no complete 16-token page before it)."""
    _reused(client, MESSAGES)
    reused, ids, out = _reused(client, MESSAGES)
    user_end = ids.index(2) + 2  # the user message's end: its snapshot (86 tokens)
    assert reused == user_end == 86
    other = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _flipped_wide_url()}},
        *MESSAGES[0]["content"][1:]]}]
    reused_other, ids_other, out_other = _reused(client, other)
    assert ids_other == ids  # the same token ids (sentinels) ...
    assert reused_other == 0  # ... but another image: nothing cached is reused
    assert out == META["greedy"][:4]
    fresh = _reused(client, other)  # and it computes its own answer, cached in turn
    assert fresh[0] == 86 and fresh[2] == out_other


def test_image_on_a_text_only_core_is_a_400(tiny_thread_server):
    text_only = openai.OpenAI(base_url=tiny_thread_server.url + "/v1", api_key="unused",
                              max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        text_only.chat.completions.create(
            model=tiny_thread_server.settings.served_name, messages=_image(data_url("wide.png")),
            max_tokens=2)
    assert (info.value.body["param"], info.value.body["message"]) == (
        "messages[0].content[0]", "this model accepts no images")


@pytest.fixture(scope="module")
def image_host():
    """A local HTTP server of the fixture folder (for --allow-image-urls)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(FIXTURE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def url_client(vision_core):
    path, public = vision_core
    bootstrap = Bootstrap.load(path, [public], NAMESPACE)
    options = ServeOptions(port=0, max_active=2, queue_capacity=4, allow_image_urls=True,
                           max_images_per_request=2)
    settings = resolve(options, bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                        timeout=120.0)
    server.stop()
    bootstrap.close()


def test_allowed_image_urls_are_fetched(url_client, image_host):
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"{image_host}/wide.png"}},
        *MESSAGES[0]["content"][1:2],
        {"type": "image_url", "image_url": {"url": f"{image_host}/square.png"}},
        *MESSAGES[0]["content"][3:]]}]
    reply = url_client.chat.completions.create(
        model="idefics3-tiny", messages=messages, max_tokens=8, temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True})
    assert reply.choices[0].model_extra["token_ids"] == META["greedy"]
    status, message = _error(url_client, _image(f"{image_host}/missing.png"))
    assert (status, message) == (400, "messages[0].content[0].image_url: the image URL could "
                                 "not be fetched: File not found")
    parts = [{"type": "image_url", "image_url": {"url": data_url("wide.png")}}] * 3
    assert _error(url_client, [{"role": "user", "content": parts}]) == (
        400, "messages[0].content[2]: more than 2 images in one request "
        "(max_images_per_request)")


def test_images_cross_to_the_engine_process(vision_core):
    """PromptImage is plain data: the same answer with the model worker in its own
    process (--engine-process)."""
    from helios_serve.cli import start

    path, public = vision_core
    server = start(path, [str(public)], NAMESPACE,
                   ServeOptions(port=0, max_active=2, queue_capacity=4, engine_process=True))
    server.serve_in_background()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=120.0)
        test_greedy_equals_transformers(client)
    finally:
        server.stop()
        server.bootstrap.close()


def test_responses_input_image(client):
    """The Responses API's input_image parts take the chat path: the same answer."""
    chat = client.chat.completions.create(model="idefics3-tiny", messages=MESSAGES,
                                          max_tokens=6, temperature=0)
    content = [{"type": "input_image", "image_url": MESSAGES[0]["content"][0]["image_url"]["url"],
                "detail": "high"},
               {"type": "input_text", "text": "Compare the two images."},
               {"type": "input_image", "image_url": MESSAGES[0]["content"][2]["image_url"]["url"]},
               {"type": "input_text", "text": "What is in this image?"}]
    response = client.responses.create(model="idefics3-tiny", max_output_tokens=6,
                                       temperature=0, input=[{"role": "user",
                                                              "content": content}])
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == 94
    items = client.responses.input_items.list(response.id).data
    assert [p.type for p in items[0].content] == ["input_image", "input_text", "input_image",
                                                  "input_text"]


CHUNKED_RECIPE = '''
import dataclasses, importlib.util
spec = importlib.util.spec_from_file_location("fixture_recipe", {path!r})
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)


def make_recipe(checkpoint):
    recipe = base.make_recipe(checkpoint)
    return dataclasses.replace(recipe, capacities=dataclasses.replace(
        recipe.capacities, prefill_tokens=(40,), image_windows=5))
'''


def test_chunked_prefill_never_splits_a_span(tmp_path, signing_key_pair):
    """40-token chunks and 5 encoder windows: the 94-token prompt takes several steps
    (chunks end before each 21- and 34-token span, one image a step) and still answers
    as transformers does."""
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    recipe = tmp_path / "chunked.py"
    recipe.write_text(CHUNKED_RECIPE.format(path=str(FIXTURE / "recipe.py")))
    out = tmp_path / "chunked.core"
    export_core(recipe, checkpoint=str(FIXTURE / "checkpoint"), key_path=private,
                namespace=NAMESPACE, out=out, weight_dtype="f32")
    bootstrap = Bootstrap.load(out, [public], NAMESPACE)
    settings = resolve(ServeOptions(port=0, max_active=2, queue_capacity=4), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        test_greedy_equals_transformers(client)
        # [0, 39) ends before the second span; [39, 79) holds it whole; [79, 94)
        assert model.launches["prefill"] == 3
    finally:
        server.stop()
        bootstrap.close()


def test_the_next_turn_restores_the_image_turn(client):
    """A conversation's second turn continues from the snapshot published at the end of
    the first (image) turn's user message: exactly those tokens are reused."""
    first = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url("wide.png")}},
        {"type": "text", "text": "What is in this image?"}]}]
    one = client.chat.completions.create(model="idefics3-tiny", messages=first, max_tokens=3,
                                         temperature=0, extra_body={"return_token_ids": True})
    ids = one.model_extra["prompt_token_ids"]
    user_end = ids.index(2) + 2  # <end_of_utterance> "\n": the user message's end
    assert user_end % 16 != 0  # not a page boundary: only a snapshot reuses it exactly
    second = [*first, {"role": "user", "content": "And the colors?"}]  # diverges at user_end
    two = client.chat.completions.create(model="idefics3-tiny", messages=second, max_tokens=3,
                                         temperature=0, extra_body={"return_token_ids": True})
    reused = two.model_extra["reused_prompt_tokens"]
    assert two.model_extra["prompt_token_ids"][:reused] == ids[:reused]
    assert reused == user_end


def test_messages_api_image_blocks(server, client):
    """Anthropic image blocks (base64 sources) take the chat path too: the same answer."""
    chat = client.chat.completions.create(model="idefics3-tiny", messages=MESSAGES,
                                          max_tokens=6, temperature=0)

    def block(name: str) -> dict:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": base64.b64encode(
                                                (FIXTURE / name).read_bytes()).decode()}}

    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    reply = messages.messages.create(
        model="idefics3-tiny", max_tokens=6, messages=[{"role": "user", "content": [  # greedy: the core default
            block("wide.png"), {"type": "text", "text": "Compare the two images."},
            block("square.png"), {"type": "text", "text": "What is in this image?"}]}])
    assert reply.content[0].text == chat.choices[0].message.content
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == 94  # the snapshot


def test_continue_final_message_on_an_image_model(client):
    """Assistant content reaches an image model's template as parts; continuing it
    still cuts the prompt right after that text."""
    messages = [*_image(data_url("wide.png")), {"role": "assistant", "content": "It is a"}]
    reply = client.chat.completions.create(
        model="idefics3-tiny", messages=messages, max_tokens=2, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "return_token_ids": True})
    from tokenizers import Tokenizer

    ids = reply.model_extra["prompt_token_ids"]
    tok = Tokenizer.from_file(str(FIXTURE / "checkpoint" / "tokenizer.json"))
    assert tok.decode(ids[-16:], skip_special_tokens=False).endswith("\nAssistant: It is a")


SCORED_RECIPE = CHUNKED_RECIPE.replace("prefill_tokens=(40,), image_windows=5",
                                      "scored_tokens=(128,)")


@pytest.fixture(scope="module")
def scored_server(module_tmp, signing_key_pair):
    """The tiny Idefics3 core with a SCORED_PREFILL program beside its image prefills."""
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    folder = module_tmp("scored-vision")
    (folder / "scored.py").write_text(SCORED_RECIPE.format(path=str(FIXTURE / "recipe.py")))
    out = folder / "scored.core"
    export_core(folder / "scored.py", checkpoint=str(FIXTURE / "checkpoint"), key_path=private,
                namespace=NAMESPACE, out=out, weight_dtype="f32")
    bootstrap = Bootstrap.load(out, [public], NAMESPACE)
    settings = resolve(ServeOptions(port=0, max_active=2, queue_capacity=4), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    yield server, out, public
    server.stop()
    bootstrap.close()


def test_a_scored_vision_core_lints_clean(scored_server):
    from helios_tools.core import open_core
    from helios_tools.lint import lint_core

    _, path, public = scored_server
    with open_core(path, [public.read_bytes()]) as core:
        assert [f.rule for f in lint_core(core, acceptance=NAMESPACE)] == []


def test_prompt_logprobs_of_a_prompt_with_images_are_a_400(scored_server):
    server = scored_server[0]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert _error(client, _image(data_url("wide.png")), extra_body={"prompt_logprobs": 1}) == (
        400, "prompt_logprobs: prompt log probabilities of a prompt with images are not "
             "computed")


def test_scored_text_and_images_on_one_core(scored_server):
    """A text prompt's scores equal the sampling step's logprobs after each prefix, and an
    image chat sent beside it still answers as transformers does (the scheduler keeps
    image rows out of scored steps)."""
    from concurrent.futures import ThreadPoolExecutor

    server = scored_server[0]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=120.0)
    ids = [120, 45, 200, 77, 150, 33, 99, 180, 61, 222, 140, 88]  # no special token
    with ThreadPoolExecutor(2) as pool:
        images = pool.submit(test_greedy_equals_transformers, client)
        scored = pool.submit(client.completions.create, model="idefics3-tiny", prompt=ids,
                             max_tokens=1, temperature=0, echo=True, logprobs=1)
        images.result()
        reply = scored.result()
    scores = reply.choices[0].logprobs.token_logprobs
    assert scores[0] is None and len(scores) == len(ids) + 1
    for p in (1, 5, 11):
        step = client.completions.create(model="idefics3-tiny", prompt=ids[:p], max_tokens=1,
                                         temperature=0, logprobs=1,
                                         logit_bias={str(ids[p]): 100})
        assert step.choices[0].logprobs.tokens[0] == reply.choices[0].logprobs.tokens[p]
        assert scores[p] == pytest.approx(step.choices[0].logprobs.token_logprobs[0], abs=1e-5)
