"""Shared packing writes exact per-row values, whichever request holds a slot.

The SamplingParams-only sources are gathered from per-slot tables (runtime.packing
SAMPLING_VALUES); these tests move requests between slots, reorder rows and change a
slot's holder, and compare every destination with the values written out by hand.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from helios_contract.schema import contract_pb2 as c
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.runtime.packing import DirtyRange, SharedPacking
from helios_serve.scheduler.request import RowResult

CAPACITY = 4
A = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, presence_penalty=0.5,
                   frequency_penalty=0.25, repetition_penalty=1.1, seed=(3 << 32) | 9,
                   logit_bias=((1, 2.0),), logprobs=2)
B = SamplingParams(temperature=0.0, seed=11)
C = SamplingParams(temperature=1.3, top_p=0.5, top_k=40, seed=(7 << 32) | 1, logprobs=0)

# source -> (destination dtype, per-row extra shape)
SOURCES = {
    c.VALUE_SOURCE_SLOT: np.int32,
    c.VALUE_SOURCE_GENERATION: np.int32,
    c.VALUE_SOURCE_QUERY_LENGTH: np.int32,
    c.VALUE_SOURCE_SAMPLING_DECISION: np.int32,
    c.VALUE_SOURCE_TEMPERATURE: np.float32,
    c.VALUE_SOURCE_TOP_P: np.float32,
    c.VALUE_SOURCE_TOP_K: np.int32,
    c.VALUE_SOURCE_MIN_P: np.float32,
    c.VALUE_SOURCE_PRESENCE_PENALTY: np.float32,
    c.VALUE_SOURCE_FREQUENCY_PENALTY: np.float32,
    c.VALUE_SOURCE_REPETITION_PENALTY: np.float32,
    c.VALUE_SOURCE_GRAMMAR_MASK_ENABLED: np.int32,
    c.VALUE_SOURCE_LOGIT_BIAS_ENABLED: np.int32,
    c.VALUE_SOURCE_LOGPROBS: np.int32,
}
PADDING = -3


def _packing(offset: int = 0):
    bindings = [c.ValueBinding(destination=f"d{s}", source=s, offset=offset, padding=PADDING,
                               indexing=c.INDEXING_SUBMISSION_ROW) for s in SOURCES]
    bindings.append(c.ValueBinding(destination="seed", source=c.VALUE_SOURCE_SEED_BITS,
                                   indexing=c.INDEXING_SUBMISSION_ROW))
    staging = {f"d{s}": np.full(CAPACITY, 99, dtype) for s, dtype in SOURCES.items()}
    staging["seed"] = np.full((CAPACITY, 2), 99, np.uint32)
    return SharedPacking([c.GraphContract(name="g", bindings=bindings)], [staging]), staging


def _row(slot: int, sampling: SamplingParams, *, generation: int = 1, sample: bool = True,
         tokens: tuple[int, ...] = (5,), mask: bool = False) -> RowPlan:
    return RowPlan(request_id=slot, slot=slot, generation=generation, tokens=tokens,
                   start_position=20, page_ids=(0, 1), sample=sample, sampling=sampling,
                   grammar_mask=np.zeros(2, np.int32) if mask else None)


def _expected(rows: tuple[RowPlan, ...], offset: int = 0) -> dict:
    """The values written out per row, as the contract defines each source."""
    def pad(values):
        return [v + offset for v in values] + [PADDING] * (CAPACITY - len(values))

    s = [r.sampling for r in rows]
    return {
        c.VALUE_SOURCE_SLOT: pad([r.slot for r in rows]),
        c.VALUE_SOURCE_GENERATION: pad([r.generation for r in rows]),
        c.VALUE_SOURCE_QUERY_LENGTH: pad([len(r.tokens) for r in rows]),
        c.VALUE_SOURCE_SAMPLING_DECISION: pad([int(r.sample) for r in rows]),
        c.VALUE_SOURCE_TEMPERATURE: pad([np.float32(x.temperature) for x in s]),
        c.VALUE_SOURCE_TOP_P: pad([np.float32(x.top_p) for x in s]),
        c.VALUE_SOURCE_TOP_K: pad([x.top_k for x in s]),
        c.VALUE_SOURCE_MIN_P: pad([np.float32(x.min_p) for x in s]),
        c.VALUE_SOURCE_PRESENCE_PENALTY: pad([np.float32(x.presence_penalty) for x in s]),
        c.VALUE_SOURCE_FREQUENCY_PENALTY: pad([np.float32(x.frequency_penalty) for x in s]),
        c.VALUE_SOURCE_REPETITION_PENALTY: pad([np.float32(x.repetition_penalty) for x in s]),
        c.VALUE_SOURCE_GRAMMAR_MASK_ENABLED: pad([int(r.grammar_mask is not None)
                                                  for r in rows]),
        c.VALUE_SOURCE_LOGIT_BIAS_ENABLED: pad([int(bool(x.logit_bias)) for x in s]),
        c.VALUE_SOURCE_LOGPROBS: pad([r.sampling.logprobs if r.sample and
                                      r.sampling.logprobs is not None else -1
                                      for r in rows]),
    }


def _check(staging: dict, rows: tuple[RowPlan, ...], offset: int = 0) -> None:
    for source, want in _expected(rows, offset).items():
        got = staging[f"d{source}"].tolist()
        assert got == [pytest.approx(float(w)) if isinstance(w, np.floating) else w
                       for w in want], c.ValueSource.Name(source)
    seeds = [[r.sampling.seed & 0xFFFFFFFF, r.sampling.seed >> 32] for r in rows]
    assert staging["seed"][:len(rows)].tolist() == seeds


@pytest.mark.parametrize("offset", [0, 2])
def test_rows_get_their_own_values_as_requests_move_between_slots(offset):
    pack, staging = _packing(offset)
    steps = [
        (_row(1, A), _row(3, B)),
        (_row(3, B), _row(1, A, mask=True)),  # same holders, reordered
        (_row(1, C, generation=2), _row(3, B), _row(0, A, sample=False, tokens=(4, 5, 6))),
        (_row(3, A, generation=5),),  # batch 1: a new holder of slot 3
        (_row(1, C, generation=2), _row(3, A, generation=5), _row(2, B), _row(0, C)),
    ]
    for rows in steps:
        pack.pack("g", StepPlan(StepKind.PREFILL, rows), rows=CAPACITY, tokens=8)
        _check(staging, rows, offset)


def test_a_destination_two_kinds_of_binding_write_is_rewritten_every_step():
    """Packing skips rewriting the values a destination already holds only where no
    other kind of binding writes it."""
    def graph(name, source):
        return c.GraphContract(name=name, bindings=[c.ValueBinding(
            destination="d", source=source, indexing=c.INDEXING_SUBMISSION_ROW)])

    dest = np.zeros(2, np.float32)
    pack = SharedPacking([graph("t", c.VALUE_SOURCE_TEMPERATURE),
                          graph("p", c.VALUE_SOURCE_TOP_P)], [{"d": dest}])
    plan = StepPlan(StepKind.DECODE, (_row(0, A), _row(1, C)))
    for name, want in [("t", [0.7, 1.3]), ("p", [0.9, 0.5]), ("t", [0.7, 1.3]),
                       ("t", [0.7, 1.3]), ("p", [0.9, 0.5])]:
        pack.pack(name, plan, rows=2, tokens=2)
        assert dest.tolist() == [float(np.float32(v)) for v in want]


def test_float_values_are_the_float32_of_the_parameter():
    pack, staging = _packing()
    rows = (_row(0, A), _row(2, C))
    pack.pack("g", StepPlan(StepKind.DECODE, rows), rows=CAPACITY, tokens=8)
    assert staging[f"d{c.VALUE_SOURCE_TEMPERATURE}"][:2].tolist() == [
        float(np.float32(0.7)), float(np.float32(1.3))]
    assert staging[f"d{c.VALUE_SOURCE_MIN_P}"][:2].tolist() == [float(np.float32(0.05)), 0.0]


def test_page_tables_upload_only_new_entries_and_all_after_a_new_generation():
    binding = c.ValueBinding(destination="pt", source=c.VALUE_SOURCE_PAGE_TABLE,
                             indexing=c.INDEXING_PHYSICAL_REQUEST_ROW)
    table = np.full((4, 6), -1, np.int32)
    pack = SharedPacking([c.GraphContract(name="g", bindings=[binding])], [{"pt": table}])

    def step(*rows):
        dirty = pack.pack("g", StepPlan(StepKind.DECODE, rows), rows=4, tokens=4)
        return [(d.destination, d.row, d.start, d.end) for d in dirty]

    def row(slot, generation, pages):
        return dataclasses.replace(_row(slot, B, generation=generation), page_ids=pages)

    assert step(row(2, 1, (7, 8)), row(0, 1, (3,))) == [("pt", 2, 0, 2), ("pt", 0, 0, 1)]
    assert step(row(0, 1, (3,)), row(2, 1, (7, 8))) == []
    assert step(row(2, 1, (7, 8, 9))) == [("pt", 2, 2, 3)]
    assert step(row(2, 2, (5,)), row(0, 1, (3, 4))) == [("pt", 2, 0, 1), ("pt", 0, 1, 2)]
    assert table[2].tolist() == [5, 8, 9, -1, -1, -1]
    assert table[0].tolist() == [3, 4, -1, -1, -1, -1]


@pytest.mark.parametrize("cls", [RowPlan, RowResult, StepPlan, DirtyRange])
def test_hand_written_init_takes_exactly_the_dataclass_fields(cls):
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for f in fields]
    assert [p.kind is inspect.Parameter.KEYWORD_ONLY for p in params] == [
        f.kw_only is True for f in fields]
    positional = [f.name for f in fields if f.kw_only is not True]
    built = cls(*range(len(positional)),
                **{f.name: i for i, f in enumerate(fields) if f.kw_only is True})
    assert [getattr(built, f.name) for f in fields] == list(range(len(fields)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, fields[0].name, 5)
