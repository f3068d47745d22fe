"""MIXED programs on the cuda backend equal the cpu backend's (issue 27, item 2).

The tiny model (helios_ignition.testing) captured with mixed token capacities and
compiled for this GPU: one mixed step (a decode lane and a prefill chunk) samples the ids
the cpu backend samples, with the same logprobs to f32 rounding; and the scheduler's
workload of running streams with a long prompt arriving gives the same greedy outputs
on both backends, with the same MIXED steps planned.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.testing import TINY_CAPACITIES, tiny_core
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
from helios_serve.testing.native import load_native

CAPS = dataclasses.replace(TINY_CAPACITIES, mixed_tokens=(8, 16))
LOGPROBS = SamplingParams(logprobs=5)


class CompiledTinyCore:
    """The tiny core with mixed programs and kernel binaries for `target`."""

    def __init__(self, target: str) -> None:
        core = tiny_core(seed=3, caps=CAPS)
        self.contract, self.manifest = core.contract, core.manifest
        self._resources = {rid: a.tobytes() for rid, a in core.weights.items()}
        self._resources.update(compile_targets(self.manifest, (target,)))

    def read_resource(self, rid: str) -> bytes:
        return self._resources[rid]


def _row(rid, slot, tokens, start, pages, hist=None):
    return RowPlan(request_id=rid, slot=slot, generation=1, tokens=tuple(tokens),
                   start_position=start, page_ids=tuple(pages), sample=True,
                   sampling=LOGPROBS, histogram_tokens=None if hist is None else tuple(hist))


def _mixed_step(model):
    prompt, other = [5, 17, 3, 88, 41], [9, 12, 60, 2, 33, 70, 11]
    first = int(model.execute(StepPlan(StepKind.PREFILL, (_row(1, 0, prompt, 0, [1, 2],
                                                               prompt),)))[0])
    plan = StepPlan(StepKind.MIXED, (_row(1, 0, [first], 5, [1, 2]),
                                     _row(2, 1, other, 0, [3, 4], other)), lanes=1)
    return model.wait_step(model.submit(plan))


def _serve(model):
    requests = [(1, [5, 17, 3, 88, 41], 12, 0), (2, [9, 12, 60, 2], 12, 0),
                (3, list(range(20, 50)), 4, 3)]
    limits = {rid: limit for rid, _, limit, _ in requests}
    sched = Scheduler(model.manifests, frames=model.frames, device_pending=model.device_pending)
    outputs = {rid: [] for rid in limits}
    kinds = []
    for step in range(400):
        for rid, prompt, limit, at in requests:
            if at == step:
                assert sched.add(SchedRequest(rid, tuple(prompt), limit)) is None
        plan = sched.schedule()
        if plan is None:
            if step > 3 and not sched.has_work():
                return outputs, kinds
            continue
        kinds.append(plan.kind)
        for r in sched.complete(plan, model.execute(plan)):
            if r.token_id is not None:
                outputs[r.request_id].append(r.token_id)
                if r.output_tokens == limits[r.request_id]:
                    sched.finish(r.request_id, FinishReason.LENGTH)
    raise AssertionError("did not drain")


def test_mixed_programs_on_cuda_equal_the_cpu_backend(gpu):
    core = CompiledTinyCore(gpu.target)
    cuda, cpu = load_native(core, "cuda"), load_native(core, "cpu")
    try:
        got, want = _mixed_step(cuda), _mixed_step(cpu)
        assert got.sampled.tolist() == want.sampled.tolist()
        for i in range(2):
            a, b = got.token_logprob(i, 5), want.token_logprob(i, 5)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            np.testing.assert_allclose(a.logprob, b.logprob, atol=1e-4)
    finally:
        cuda.close()
        cpu.close()
    cuda, cpu = load_native(core, "cuda"), load_native(core, "cpu")
    try:
        (cuda_out, cuda_kinds), (cpu_out, cpu_kinds) = _serve(cuda), _serve(cpu)
        assert cuda_out == cpu_out
        assert cuda_kinds == cpu_kinds and cuda_kinds.count(StepKind.MIXED) == 5
    finally:
        cuda.close()
        cpu.close()
