"""parse_logit_bias: OpenAI's limits, each rejection naming the field and the id."""

import pytest
from helios_serve.frontend.errors import FrontendRequestError
from helios_serve.frontend.logit_bias import parse_logit_bias

V = 1000


def test_valid_bias_becomes_sorted_pairs():
    assert parse_logit_bias(None, V) == ()
    assert parse_logit_bias({}, V) == ()
    got = parse_logit_bias({"999": 100, "0": -100, "17": 2.5, 5: -0.5}, V)
    assert got == ((0, -100.0), (5, -0.5), (17, 2.5), (999, 100.0))
    assert all(isinstance(b, float) for _, b in got)
    assert len(parse_logit_bias({str(i): 1 for i in range(300)}, V)) == 300


@pytest.mark.parametrize("value, message", [
    ([1, 2], "logit_bias: must be an object mapping token ids to a bias in [-100, 100]"),
    ({str(i): 1 for i in range(301)}, "logit_bias: has 301 entries; at most 300 are allowed"),
    ({"1000": 1}, "logit_bias: token id 1000 is outside the vocabulary [0, 1000)"),
    ({-1: 1}, "logit_bias: token id -1 is outside the vocabulary [0, 1000)"),
    ({"abc": 1}, "logit_bias: keys must be token ids (decimal integers), got 'abc'"),
    ({"-3": 1}, "logit_bias: keys must be token ids (decimal integers), got '-3'"),
    ({"07": 1}, "logit_bias: keys must be token ids (decimal integers), got '07'"),
    ({" 7": 1}, "logit_bias: keys must be token ids (decimal integers), got ' 7'"),
    ({"7": 100.5}, "logit_bias: the bias of token id 7 is 100.5; it must lie in [-100, 100]"),
    ({"7": -101}, "logit_bias: the bias of token id 7 is -101; it must lie in [-100, 100]"),
    ({"7": float("nan")}, "logit_bias: the bias of token id 7 is nan; it must lie in"),
    ({"7": "1"}, "logit_bias: the bias of token id 7 must be a number, got '1'"),
    ({"7": True}, "logit_bias: the bias of token id 7 must be a number, got True"),
    ({"7": 1, 7: 2}, "logit_bias: token id 7 is given twice"),
])  # fmt: skip
def test_rejections_name_the_field_and_the_id(value, message):
    with pytest.raises(FrontendRequestError) as info:
        parse_logit_bias(value, V)
    assert info.value.field == "logit_bias"
    assert str(info.value).startswith(message)
