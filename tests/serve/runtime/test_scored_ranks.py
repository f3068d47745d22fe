"""SCORED_PREFILL on a tensor-parallel core (the tiny model, `--tensor-parallel 2`, ranks
as threads): the vocabulary-parallel head over every packed token (each rank's columns,
then all_gather_columns) gives the one-rank core's prompt scores."""

from __future__ import annotations

import numpy as np
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core

from tests.tiny_model import PROMPTS, prompt_ids


def _scores(exported, prompt: tuple[int, ...]):
    core = open_core(exported.path, [load_public_key(exported.public_key)])
    authorize(core, exported.namespace)
    model = load_native(core, "cpu")
    try:
        pages = -(-len(prompt) // model.manifests.page_tokens)
        row = RowPlan(request_id=1, slot=0, generation=1, tokens=prompt, start_position=0,
                      page_ids=tuple(range(pages)), sample=True, sampling=SamplingParams(),
                      histogram_tokens=prompt, score_targets=tuple(prompt[1:]) + (-1,))
        plan = StepPlan(StepKind.PREFILL, (row,))
        done = model.wait_step(model.submit(plan))
        return int(done.sampled[0]), done.prompt_scores(plan, {1: 5})[1]
    finally:
        model.close()


def test_two_ranks_score_the_prompt_as_one_rank(tiny_served, tiny_tp2):
    prompt = tuple(prompt_ids(PROMPTS[0]))
    sampled_1, one = _scores(tiny_served.core, prompt)
    sampled_2, two = _scores(tiny_tp2, prompt)
    assert sampled_2 == sampled_1
    assert [s.token_id for s in two] == list(prompt[1:]) == [s.token_id for s in one]
    np.testing.assert_allclose([s.logprob for s in two], [s.logprob for s in one], atol=1e-5)
    assert [[i for i, _ in s.top] for s in two] == [[i for i, _ in s.top] for s in one]
