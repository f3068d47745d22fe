"""The limit of parallel calls under tool_choice "required": at most as many calls as
functions offered. After the last allowed call the grammar allows only the end of the
turn, so a model that repeats its call ends with finish tool_calls instead of running to
the output limit."""

from __future__ import annotations

import pytest
from helios_serve.frontend.testing import Special as S
from helios_serve.frontend.testing import chunkings

from tests.serve.frontend.test_grammar import (
    EOS,
    FORECAST,
    TIME,
    TOOL_CASES,
    allowed,
    generate,
    setup,
)

PROMPT = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"


def _state(case: str, tools: list, script: list):
    syn, specials, _ = TOOL_CASES[case]
    opener, close = syn.reasoning_syntax.open, syn.reasoning_syntax.close
    script = [S(opener), "ok", S(close), *script]
    st, fe, gc = setup(syn, [script], [opener, close, *specials])
    state = gc.for_request(tools=tools, tool_choice="required", prompt_text=PROMPT)
    generate(state, st.ids(dict(chunkings(script))["bytes"]))
    return st, state


@pytest.mark.parametrize("case", sorted(TOOL_CASES))
def test_one_function_offered_allows_one_call_then_only_the_end(case):
    call = TOOL_CASES[case][2]
    st, state = _state(case, [FORECAST], call)
    assert allowed(state, st.special_id(EOS))
    assert not allowed(state, st.ids([call[0]])[0])  # no second call (block) opener


def test_two_functions_offered_allow_two_calls_then_only_the_end():
    call = TOOL_CASES["json"][2]
    st, state = _state("json", [FORECAST, TIME], call)
    assert allowed(state, st.special_id(EOS)) and allowed(state, st.ids([call[0]])[0])
    st, state = _state("json", [FORECAST, TIME], [*call, *call])
    assert allowed(state, st.special_id(EOS))
    assert not allowed(state, st.ids([call[0]])[0])
