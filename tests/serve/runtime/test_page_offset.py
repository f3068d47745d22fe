"""page_table_views[*].page_offset is executed, not ignored (contract.proto PageTableView:
entry i of a view references the request's page i + page_offset).

A core whose one view is shifted by a page keeps the history of block i in page
page_ids[i + 1]: packing writes the shifted ids, the kernels read the shifted column, the
scheduler reserves the extra page and keeps shifted pages private. Greedy output equals
the unshifted core's and the independent dense forward's.
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_ignition.testing import TINY_SHAPES, dense_forward, tiny_core
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.scheduler import SchedRequest, Scheduler
from helios_serve.testing.native import load_native

GREEDY = SamplingParams()
PROMPT = [5, 17, 3, 88, 41, 9]  # 6 tokens: 2 pages of 4


def shifted_core(offset: int = 1, seed: int = 3):
    core = tiny_core(seed=seed)
    core.contract.model.cache.page_table_views[0].page_offset = offset
    return core


def row(tokens, start, pages, *, hist=None) -> RowPlan:
    return RowPlan(request_id=1, slot=2, generation=1, tokens=tuple(tokens),
                   start_position=start, page_ids=tuple(pages), sample=True, sampling=GREEDY,
                   histogram_tokens=None if hist is None else tuple(hist))


def test_a_shifted_view_reads_the_shifted_column():
    core = shifted_core()
    model = load_native(core, "cpu")
    assert model.manifests.extra_pages_per_request == 1
    pages = [7, 3, 12]  # two token pages and the page the shifted view also references
    out = model.execute(StepPlan(StepKind.PREFILL, (row(PROMPT, 0, pages, hist=PROMPT),)))
    table = model.backend.buffers["state.page_table"]
    np.testing.assert_array_equal(table[2, :2], [3, 12])  # entry i = page i + 1
    k_cache = model.backend.buffers["L0.k_cache"]
    assert not k_cache[7].any()  # page_ids[0] holds no block: the view starts at page 1
    assert k_cache[3].any() and k_cache[12, :2].any()  # block 0 in page 3, block 1 in 12
    seq = list(PROMPT)
    for step in range(4):  # positions 6..9 cross into block 2 = page 20
        seq.append(int(out[0]))
        ref = dense_forward(core.weights, TINY_SHAPES, seq[:-1])[-1]
        assert int(np.argmax(ref)) == seq[-1], step
        n = len(seq)
        owned = [7, 3, 12, 20][:-(-n // 4) + 1]
        out = model.execute(StepPlan(StepKind.DECODE, (row([seq[-1]], n - 1, owned),)))
    assert k_cache[20, :2].any() and table[2, 2] == 20


def test_shifted_and_unshifted_cores_generate_the_same_ids():
    from helios_serve.runtime.driver import Driver

    prompts = [PROMPT, [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    plain = Driver(load_native(tiny_core(seed=3), "cpu")).generate(prompts, max_new_tokens=10)
    shifted = Driver(load_native(shifted_core(), "cpu")).generate(prompts, max_new_tokens=10)
    assert shifted == plain


def test_the_scheduler_reserves_the_extra_page_and_shares_none():
    core = shifted_core(offset=2)
    model = load_native(core, "cpu")
    g = model.manifests
    sched = Scheduler(g, frames=1, device_pending=model.device_pending)
    for rid in (1, 2):  # the same prompt twice: unshifted, the second would reuse pages
        assert sched.add(SchedRequest(rid, tuple(PROMPT), max_output_tokens=3,
                                      sampling=GREEDY)) is None
    plan = sched.schedule()
    assert [len(r.page_ids) for r in plan.rows] == [2 + 2, 2 + 2]  # token pages + offset
    assert not set(plan.rows[0].page_ids) & set(plan.rows[1].page_ids)
    out = model.execute(plan)
    sched.complete(plan, [int(t) for t in out])
    ref = dense_forward(core.weights, TINY_SHAPES, PROMPT)[-1]
    assert [int(t) for t in out] == [int(np.argmax(ref))] * 2


@pytest.mark.parametrize(("offset", "owned"), [(0, 3), (1, 4), (3, 6)])
def test_admission_counts_the_extra_pages(offset, owned):
    """12 tokens fill 3 pages; a request owns those plus the offset, so it fits a 3-page
    cache only unshifted."""
    from dataclasses import replace

    from helios_serve.scheduler import AdmissionReason

    g = load_native(shifted_core(offset=offset), "cpu").manifests
    sched = Scheduler(replace(g, num_pages=3), frames=1)
    error = sched.add(SchedRequest(1, tuple(range(8)), max_output_tokens=4, sampling=GREEDY))
    if offset == 0:
        assert error is None
    else:
        assert error.reason is AdmissionReason.CACHE_EXCEEDED
        assert error.detail == f"12 tokens need {owned} pages; the cache has 3"
