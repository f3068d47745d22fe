"""bench/gpu_mixed_step.py's plans (CPU only): the prompt chunks filling a budget, the
steps it times with their rows and tokens (256 lanes leave no row for a chunk), the pages
each row owns, one run on the cpu backend (SmolLM2's geometry, tiny numbers) picking the
expected programs, and the refusal of a context the recipe's page table cannot hold."""

from __future__ import annotations

import json
import sys

import pytest

from tests.bench.scripts import load_script

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256)


@pytest.fixture(scope="module")
def ms():
    return load_script("gpu_mixed_step.py")


def test_chunks_fill_the_budget_from_mid_prompt(ms):
    assert ms.chunks(288, 1024) == [(512, 288)]
    assert ms.chunks(448, 1024) == [(512, 448)]
    assert ms.chunks(1824, 1024) == [(512, 512), (0, 1024), (0, 288)]
    assert ms.chunks(2048, 1024) == [(512, 512), (0, 1024), (0, 512)]
    assert ms.chunks(0, 1024) == []


def test_steps_rows_tokens_and_pages(ms):
    steps = ms.Steps(1500, 1024, 16)
    assert steps.per == 94  # ceil(1,501 / 16)
    plans = dict(ms.cases(steps, [64, 224, 256], [512, 2048], BUCKETS))
    shape = {n: (p.kind.value, len(p.rows), p.token_count, p.lanes) for n, p in plans.items()}
    assert shape == {
        "decode_b64": ("decode", 64, 64, 0), "decode_b224": ("decode", 224, 224, 0),
        "decode_b256": ("decode", 256, 256, 0),
        "mixed_b64_t512": ("mixed", 65, 512, 64), "mixed_b64_t2048": ("mixed", 67, 2048, 64),
        "lanes_b64": ("mixed", 64, 64, 64),
        "mixed_b224_t512": ("mixed", 225, 512, 224),
        "mixed_b224_t2048": ("mixed", 227, 2048, 224),
        "lanes_b224": ("mixed", 224, 224, 224), "lanes_b256": ("mixed", 256, 256, 256),
        "prefill_t512": ("prefill", 1, 512, 0), "prefill_t2048": ("prefill", 3, 2048, 0)}
    mixed = plans["mixed_b224_t512"]
    lane, chunk = mixed.rows[223], mixed.rows[224]
    assert (lane.slot, lane.tokens, lane.start_position) == (223, (ms.LANE_TOKEN,), 1500)
    assert lane.page_ids == tuple(range(223 * 94, 223 * 94 + 94))
    assert (chunk.slot, chunk.start_position, len(chunk.tokens)) == (224, 512, 288)
    assert chunk.page_ids == tuple(range(224 * 94, 224 * 94 + 50))  # ceil(800 / 16)
    assert chunk.sample is False and chunk.histogram_tokens is None
    assert plans["lanes_b256"].token_budget == 512
    assert plans["mixed_b224_t2048"].token_budget == 2048
    assert plans["decode_b64"].rows[0].tokens == (-1,)  # the device-owned pending token
    last = plans["prefill_t2048"].rows[2]
    assert (last.start_position, len(last.tokens), last.sample) == (0, 512, False)
    assert plans["prefill_t2048"].rows[0].sample is True  # 512..1023 ends its prompt


def test_cpu_backend_runs_every_step(ms, tmp_path, monkeypatch):
    out = tmp_path / "ms.json"
    monkeypatch.setattr(sys, "argv", [
        "gpu_mixed_step.py", "--backend", "cpu", "--geometry", "smollm2-135m",
        "--batches", "2", "4", "--budgets", "16", "32", "--context", "40", "--prompt", "24",
        "--json", str(out)])
    ms.main()
    got = json.loads(out.read_text())
    assert got["pages_per_row"] == 3 and got["num_pages"] == 18  # 6 rows: 4 + 2 chunks
    assert got["capacities"]["decode_batch"] == [2, 4, 8, 512]  # 512: the slots
    assert got["capacities"]["mixed_tokens"] == [16, 32]
    assert got["attn_mma"] == "off"  # HELIOS_ATTN_MMA unset: the FMA attention bodies
    assert [(s["name"], s["graph"], s["rows"], s["tokens"]) for s in got["steps"]] == [
        ("decode_b2", "decode_b2", 2, 2), ("decode_b4", "decode_b4", 4, 4),
        ("mixed_b2_t16", "mixed_b4_t16", 4, 16), ("mixed_b2_t32", "mixed_b4_t32", 4, 32),
        ("lanes_b2", "mixed_b2_t16", 2, 2),
        ("mixed_b4_t16", "mixed_b8_t16", 5, 16), ("mixed_b4_t32", "mixed_b8_t32", 6, 32),
        ("lanes_b4", "mixed_b4_t16", 4, 4),
        ("prefill_t16", "prefill_t16", 2, 16), ("prefill_t32", "prefill_t32", 2, 32)]


def test_context_past_the_page_table_is_refused(ms, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_mixed_step.py", "--dry-run", "--context", "4096"])
    with pytest.raises(SystemExit) as exc:
        ms.main()
    assert exc.value.code == 2
    assert ("--context 4096 / --prompt 1024 need 257 pages a row; the recipe's context "
            "holds 256") in capsys.readouterr().err
