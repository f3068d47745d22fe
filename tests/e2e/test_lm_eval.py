"""lm-eval's loglikelihood (multiple-choice) tasks run against a real helios-serve: its
`local-completions` model with no local tokenizer detects /tokenizer_info and /tokenize
(vLLM's) and tokenizes through them, then scores each choice with echo + logprobs
(prompt log probabilities, SCORED_PREFILL programs) and drops the generated token.

The task is tests/e2e/lm_eval_task/ (three capital-city questions, three choices each); the server is the real
SmolLM2 core on the cpu backend, on a free port. lm-eval is a dev dependency (no torch:
its `api` extra needs only HTTP).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
TASK = Path(__file__).parent / "lm_eval_task"


def test_multiple_choice_task_runs_against_the_server(real_server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the task's data is a local file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # imported here: lm-eval (and datasets) take seconds to import and read the
    # environment set above
    import lm_eval
    from lm_eval.tasks import TaskManager

    config = (TASK / "helios_capitals.yaml").read_text()
    (tmp_path / "helios_capitals.yaml").write_text(
        config.replace("test: capitals.jsonl", f"test: {TASK / 'capitals.jsonl'}"))
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=(f"base_url={real_server.url}/v1/completions,"
                    "model=smollm2-135m-instruct,num_concurrent=1,max_retries=1"),
        tasks=["helios_capitals"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        log_samples=True,
    )
    samples = results["samples"]["helios_capitals"]
    assert len(samples) == 3
    for sample in samples:
        # one (loglikelihood, is_greedy) per choice, each loglikelihood finite and < 0
        scores = [resp[0] for resp in sample["filtered_resps"]]
        assert len(scores) == 3 and all(-100 < s < 0 for s in scores)
    acc = results["results"]["helios_capitals"]["acc,none"]
    assert acc == sum(s["acc"] for s in samples) / 3
    assert acc >= 2 / 3  # SmolLM2 knows these capitals
