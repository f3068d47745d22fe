"""Speculative steps through the real worker, output path and HTTP (scripted lanes).

The scripted backend emits the script's next accepted + 1 tokens per SPECULATIVE lane, so
every multi-token run is exact and known: stops, EOS and output limits inside a run,
token observations and the spec-decode metrics are checked against it."""

from __future__ import annotations

import urllib.request

import pytest
from helios_serve.engine.plan import StepKind
from helios_serve.testing.harness import ScriptedServer, sse_post
from helios_serve.testing.tokenizer import EOS_ID

LETTERS = ["Letters", ":", " H", "IJ", "K", "LM", "NOP", " Hello", "!"]


@pytest.fixture
def spec_server(tok):
    with ScriptedServer(tok, geometry={"speculative_widths": (1, 2, 4)}) as server:
        yield server


def _chat(server, prompt: str, **extra):
    return {"model": server.model_name, "messages": [{"role": "user", "content": prompt}],
            **extra}


def _metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_stop_inside_an_accepted_run_cuts_there(spec_server):
    spec_server.script("letters please", LETTERS)
    client = spec_server.openai()
    r = client.chat.completions.create(
        model=spec_server.model_name, messages=[{"role": "user", "content": "letters please"}],
        stop=["KLMNOP"], extra_body={"return_token_ids": True})
    assert r.choices[0].message.content == "Letters: HIJ"
    assert r.choices[0].finish_reason == "stop"
    # "NOP" (7th token) completes the stop inside the run [K, LM, NOP, Hello]: usage and
    # observation count it, nothing after it.
    assert r.usage.completion_tokens == 7
    assert r.choices[0].token_ids == spec_server.tok.ids(LETTERS[:7])
    assert spec_server.model.launches[StepKind.SPECULATIVE] == 2  # lanes of 4, then 3 + EOS
    spec_server.wait_idle()


def test_stop_inside_a_run_streams_nothing_past_it(spec_server):
    spec_server.script("letters please", LETTERS)
    status, events = sse_post(spec_server.url, _chat(spec_server, "letters please", stream=True,
                                                     stop=["KLMNOP"]))
    assert status == 200
    pieces = [e["choices"][0]["delta"].get("content") for e in events
              if isinstance(e, dict) and e["choices"]]
    assert "".join(p for p in pieces if p) == "Letters: HIJ"
    assert events[-1] == "[DONE]"


def test_eos_inside_a_run_ends_the_request_there(spec_server):
    spec_server.script("short", ["Hello", "!"])  # then EOS, mid-lane
    client = spec_server.openai()
    r = client.chat.completions.create(
        model=spec_server.model_name, messages=[{"role": "user", "content": "short"}],
        extra_body={"return_token_ids": True})
    assert r.choices[0].message.content == "Hello!"
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].token_ids == spec_server.tok.ids(["Hello", "!"]) + [EOS_ID]
    assert r.usage.completion_tokens == 3


@pytest.mark.parametrize("limit", [1, 2, 5, 6])
def test_output_limit_is_never_exceeded(spec_server, limit):
    spec_server.script("letters please", LETTERS)
    client = spec_server.openai()
    r = client.chat.completions.create(
        model=spec_server.model_name, messages=[{"role": "user", "content": "letters please"}],
        max_tokens=limit, extra_body={"return_token_ids": True})
    assert r.usage.completion_tokens == limit
    assert r.choices[0].token_ids == spec_server.tok.ids(LETTERS[:limit])
    assert r.choices[0].finish_reason == "length"


def test_one_observation_per_token_with_the_step_time(spec_server):
    spec_server.script("letters please", LETTERS)
    spec_server.model.accept = lambda _rid, offers: offers - 1  # every draft accepted
    client = spec_server.openai()
    r = client.chat.completions.create(
        model=spec_server.model_name, messages=[{"role": "user", "content": "letters please"}],
        max_tokens=9, extra_body={"return_token_ids": True, "return_token_timestamps": True})
    stamps = r.choices[0].model_extra["token_timestamps_ns"]
    assert len(stamps) == len(r.choices[0].token_ids) == 9
    # token 1 from prefill, then lanes of 4, 4: tokens of one step share its stamp.
    assert len(set(stamps[1:5])) == 1 and len(set(stamps[5:9])) == 1
    assert stamps == sorted(stamps) and stamps[1] > stamps[0] and stamps[5] > stamps[4]


def test_spec_decode_metrics_move_with_real_steps(spec_server):
    spec_server.script("letters please", LETTERS)
    spec_server.model.accept = lambda _rid, offers: min(2, offers - 1)
    before = _metrics(spec_server)
    client = spec_server.openai()
    client.chat.completions.create(
        model=spec_server.model_name, messages=[{"role": "user", "content": "letters please"}],
        max_tokens=7)
    spec_server.wait_idle()
    after = _metrics(spec_server)

    def moved(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    # prefill gives token 1; lanes of 4 (2 accepted -> 3 tokens), 3 (2 -> 3): 7 tokens.
    assert moved('helios_spec_decode_draft_tokens_total{source="learned"}') == 3 + 2
    assert moved('helios_spec_decode_accepted_tokens_total{source="learned"}') == 4
    # per draft position: both lanes offered drafts 0 and 1 and had them accepted; only
    # the lane of 4 offered draft 2 (rejected)
    for position, offered, accepted in ((0, 2, 2), (1, 2, 2), (2, 1, 0)):
        label = f'{{position="{position}",source="learned"}}'
        assert moved(f"helios_spec_decode_draft_per_position_total{label}") == offered
        assert moved(f"helios_spec_decode_accepted_per_position_total{label}") == accepted
        copied = f'{{position="{position}",source="copied"}}'
        assert moved(f"helios_spec_decode_draft_per_position_total{copied}") == 0
    # the acceptance length histogram: two lanes emitting 3 tokens each
    assert moved("helios_spec_decode_accepted_length_count") == 2
    assert moved("helios_spec_decode_accepted_length_sum") == 6
    for le, lanes in (("1.0", 0), ("2.0", 0), ("3.0", 2), ("4.0", 2), ("+Inf", 2)):
        assert moved(f'helios_spec_decode_accepted_length_bucket{{le="{le}"}}') == lanes
    assert moved('helios_spec_decode_draft_tokens_total{source="copied"}') == 0
    assert moved('helios_graph_launches_total{operation="speculative"}') == 2


def test_per_position_and_per_source_metrics_count_copied_and_learned_drafts(tok):
    """Suffix drafting on a constructed prompt (see the proposer test below): every lane's
    first drafts are copied candidates, the rest learned; one draft accepted per lane.
    Each lane's counts follow from what the model saw (its length and candidates)."""
    geometry = {"speculative_widths": (1, 2, 4), "copied_proposals": True}
    with ScriptedServer(tok, geometry=geometry, history_drafting=True,
                        history_proposer="suffix") as server:
        server.script("qrsqrsqrt", ["q", "r", "s", "q", "r", "t", "!"])
        server.model.accept = lambda _rid, offers: min(1, offers - 1)
        before = _metrics(server)
        r = server.openai().chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": " qrsqrsqrt"}],
            max_tokens=7)
        assert r.choices[0].message.content == "qrsqrt!"
        server.wait_idle()
        after = _metrics(server)
        lanes = list(zip(server.model.lane_lengths, server.model.lane_candidates,
                         strict=True))

    def moved(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    # prefill gives "q"; lanes of 4, 4, 2 (6, 4, 2 tokens left) emit 2, 2, 2 tokens
    assert [n for n, _ in lanes] == [4, 4, 2]
    assert [len(ids) for _, ids in lanes] == [3, 3, 1]  # every draft copied
    assert lanes[0][1] == tuple(tok.ids(["r", "s", "q"]))
    for position, offered in ((0, 3), (1, 2), (2, 2)):
        copied = f'{{position="{position}",source="copied"}}'
        learned = f'{{position="{position}",source="learned"}}'
        assert moved(f"helios_spec_decode_draft_per_position_total{copied}") == offered
        assert moved(f"helios_spec_decode_accepted_per_position_total{copied}") == (
            3 if position == 0 else 0)
        assert moved(f"helios_spec_decode_draft_per_position_total{learned}") == 0
    assert moved('helios_spec_decode_draft_tokens_total{source="copied"}') == 7
    assert moved('helios_spec_decode_accepted_tokens_total{source="copied"}') == 3
    assert moved('helios_spec_decode_draft_tokens_total{source="learned"}') == 0
    assert moved("helios_spec_decode_accepted_length_count") == 3
    assert moved('helios_spec_decode_accepted_length_bucket{le="2.0"}') == 3


def test_constrained_requests_run_at_width_one(spec_server, tok):
    spec_server.book.add("json please", tok.byte_ids(b'{"city": "Paris"}'))
    r = spec_server.openai().chat.completions.create(
        model=spec_server.model_name, messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_object"})
    assert r.choices[0].message.content == '{"city": "Paris"}'
    assert spec_server.model.lane_lengths and set(spec_server.model.lane_lengths) == {1}
    assert spec_server.model.masked_rows >= len(b'{"city": "Paris"}')


def test_an_invalid_record_fails_exactly_that_steps_requests(spec_server):
    spec_server.script("letters please", LETTERS)
    spec_server.script("other", ["Hello", "!"])

    corrupted = []

    def corrupt(plan, record):
        if not corrupted:  # the first speculative step only
            record[:, 4] += 1  # a draft cursor that disagrees with the consumed endpoint
            corrupted.append(plan)

    spec_server.model.corrupt_records(corrupt)
    status, events = sse_post(spec_server.url, _chat(spec_server, "letters please",
                                                     stream=True))
    assert status == 200
    assert "error" in events[-1] and "draft cursor" in events[-1]["error"]["message"]
    spec_server.wait_idle()
    r = spec_server.openai().chat.completions.create(
        model=spec_server.model_name, messages=[{"role": "user", "content": "other"}])
    assert r.choices[0].message.content == "Hello!"



def test_history_drafting_counts_copied_drafts_under_their_source(tok):
    geometry = {"speculative_widths": (1, 2, 4), "copied_proposals": True}
    with ScriptedServer(tok, geometry=geometry, history_drafting=True) as server:
        # The answer repeats the prompt's words: their n-grams propose the rest.
        words = ["Letters", ":", " H", "IJ", "K", "LM"]
        server.script("Letters: HIJKLM Letters: HIJKLM", words * 3)
        server.model.accept = lambda _rid, offers: offers - 1
        before = _metrics(server)
        r = server.openai().chat.completions.create(
            model=server.model_name,
            messages=[{"role": "user", "content": "Letters: HIJKLM Letters: HIJKLM"}])
        assert r.choices[0].message.content == "Letters: HIJKLM" * 3
        server.wait_idle()
        after = _metrics(server)
    copied = 'helios_spec_decode_draft_tokens_total{source="copied"}'
    learned = 'helios_spec_decode_draft_tokens_total{source="learned"}'
    accepted = 'helios_spec_decode_accepted_tokens_total{source="copied"}'
    assert after[copied] - before.get(copied, 0.0) > 0
    assert after[accepted] - before.get(accepted, 0.0) == after[copied] - before.get(copied, 0.0)
    total = after[copied] + after.get(learned, 0.0) - before.get(copied, 0.0) - before.get(
        learned, 0.0)
    assert total == sum(n - 1 for n in server.model.lane_lengths)  # every draft counted once


@pytest.mark.parametrize(("proposer", "first_lane"), [("copy", ""), ("suffix", "rsq")])
def test_the_history_proposer_option_picks_the_lanes_candidates(tok, proposer, first_lane):
    """The prompt's content " qrsqrsqrt" is one token per byte; the answer starts "q".
    Its first lane (pending "q") has no earlier 2-gram "\nq" for the copy proposer
    (n = 4, 3, 2), while suffix drafting matches "q" (followed by "r" three times) and
    walks r s q: probabilities 1, 2/3, 2/3, three tokens allowed after a match of 1
    (2 x 1 + 1)."""
    geometry = {"speculative_widths": (1, 2, 4), "copied_proposals": True}
    with ScriptedServer(tok, geometry=geometry, history_drafting=True,
                        history_proposer=proposer) as server:
        server.script("qrsqrsqrt", ["q", "r", "s", "q", "r"])
        server.model.accept = lambda _rid, offers: 0
        r = server.openai().chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": " qrsqrsqrt"}],
            max_tokens=5)  # the first lane: 4 tokens left, 3 drafts
        assert r.choices[0].message.content == "qrsqr"
        assert server.model.lane_candidates[0] == tuple(tok.ids(list(first_lane)))


def test_logprobs_and_logit_bias_requests_decode_beside_speculating_ones(tok):
    geometry = {"speculative_widths": (1, 2, 4), "top_logprobs": 5, "logit_bias": True}
    with ScriptedServer(tok, geometry=geometry) as server:
        server.script("letters please", LETTERS)
        client = server.openai()
        r = client.chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": "letters please"}],
            max_tokens=6, logprobs=True, top_logprobs=2)
        content = r.choices[0].logprobs.content
        assert "".join(c.token for c in content) == "".join(LETTERS[:6])
        assert [c.logprob for c in content] == [-0.25] * 6
        # The scripted model, like the real programs, refuses them in a lane: decode rows.
        assert server.model.launches[StepKind.SPECULATIVE] == 0
        assert server.model.launches[StepKind.DECODE] == 5  # token 1 comes from prefill
        r = client.chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": "letters please"}],
            max_tokens=6, logit_bias={str(tok.ids(["K"])[0]): 1.0})
        assert r.choices[0].message.content == "".join(LETTERS[:6])
        assert server.model.launches[StepKind.DECODE] == 10
        r = client.chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": "letters please"}],
            max_tokens=6)
        assert r.choices[0].message.content == "".join(LETTERS[:6])
        assert server.model.launches[StepKind.SPECULATIVE] >= 2
