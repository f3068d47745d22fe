"""The completion record: what a step copies back to the host, and its host view.

Specification: "Host values and graph state" (completion record layout). Every graph's
``CompletionLayout`` names the int32 sampled-id buffer and, optionally, the logprobs
record: f32 ``[rows, 1 + K]`` (the sampled token's logprob under the raw model
distribution, then the top K alternatives) and i32 ``[rows, K]`` (their ids). A backend
copies each named buffer's leading ``rows`` rows into the frame's staging after the
launches; `CompletionReader` turns one frame's staging into a `StepCompletion`, reading
the logprobs only for steps in which some row asked for them. A SPECULATIVE program's
record is its lane records instead (manifest SpeculativeCompletion). A SCORED_PREFILL
program's record adds the per-token scores (``scores_buffer`` f32 ``[T, 1 + K]`` and
``score_ids_buffer`` i32 ``[T, K]``), whose leading ``token_capacity`` rows are copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels.speculative import RECORD_FIELDS

from ..engine.plan import StepCompletion
from .errors import RuntimeLoadError


def completion_buffers(layout: mpb.CompletionLayout) -> tuple[str, ...]:
    """The buffers a step's completion record copies back (their leading rows): sampled
    ids, then the optional logprobs and top-id buffers, then a scored program's scores
    and score ids. The framed confidence record (`layout.confidence_buffer`) is copied
    into its frame's plane instead."""
    names = (layout.buffer, layout.logprobs_buffer, layout.top_ids_buffer,
             layout.scores_buffer, layout.score_ids_buffer)
    return tuple(n for n in names if n)


def record_rows(program: mpb.GraphProgram, buffer: str) -> int:
    """Leading rows of `buffer` that `program`'s completion copies back: the packed
    tokens of its scores record, else the record's submission rows."""
    done = program.completion
    if buffer in (done.scores_buffer, done.score_ids_buffer):
        return int(program.token_capacity)
    return int(done.rows)


def rank_record_buffers(layout: mpb.CompletionLayout) -> tuple[str, ...]:
    """What each tensor-parallel rank returns of a step for the agreement check
    (runtime.ranks): `completion_buffers`, then the framed confidence record (its plane
    of the step's frame only: runtime.ranks.RankStep), which every rank must hold equal
    too."""
    names = completion_buffers(layout)
    return names + ((layout.confidence_buffer,) if layout.confidence_buffer else ())


def framed_confidence(programs: Sequence[mpb.GraphProgram]) -> dict[str, str]:
    """Graph -> its framed proposal-confidence buffer, for the programs producing one."""
    return {g.name: g.completion.confidence_buffer for g in programs
            if g.completion.confidence_buffer}


def confidence_buffers(programs: Sequence[mpb.GraphProgram]) -> frozenset[str]:
    """Framed proposal-confidence buffers (f32 [2, request_slots, draft_capacity]): ONE
    host array shared by both frames; a step's completion copies the program's rows of
    plane 0 (where the launches write them) into the plane of its frame."""
    return frozenset(g.completion.confidence_buffer for g in programs
                     if g.completion.confidence_buffer)


class CompletionReader:
    """Reads one execution frame's completion record.

    Args:
        programs: every graph program of the manifest. The prefill and decode programs
            must agree on the sampled-id buffer and the logprobs record; a SPECULATIVE
            program's record is its int32 ``[rows, RECORD_FIELDS + W]`` lane records.
        staging: per execution frame, buffer name -> host array (the backend's staging).

    Raises:
        RuntimeLoadError: sampling graphs disagree on the completion buffers, a logprobs
            record lacks its id buffer (or the reverse), or its buffers do not hold
            ``[rows, 1 + K]`` f32 / ``[rows, K]`` i32.
    """

    def __init__(self, programs: Sequence[mpb.GraphProgram],
                 staging: Sequence[Mapping[str, np.ndarray]]):
        self._staging = staging
        # Speculative programs: graph -> (record buffer, columns per lane).
        self._records = {g.name: (g.completion.buffer,
                                  RECORD_FIELDS + g.completion.speculative.token_width)
                         for g in programs if g.completion.HasField("speculative")}
        # Programs producing proposal confidence: graph -> its framed buffer.
        self._confidence = {g.name: g.completion.confidence_buffer for g in programs
                            if g.completion.confidence_buffer}
        # SCORED_PREFILL programs: graph -> (scores buffer, score ids buffer).
        self._scores = {g.name: (g.completion.scores_buffer, g.completion.score_ids_buffer)
                        for g in programs if g.completion.scores_buffer}
        # RESTORE programs copy rows between storage tiers: no record.
        self._none = {g.name for g in programs if not g.completion.buffer}
        layouts = {(g.completion.buffer, g.completion.logprobs_buffer,
                    g.completion.top_ids_buffer, g.completion.top_logprobs)
                   for g in programs if g.name not in self._records and g.name not in self._none}
        if len(layouts) != 1:
            raise RuntimeLoadError(f"graphs disagree on the completion record: {layouts}")
        sampled, logprobs, top_ids, width = layouts.pop()
        if bool(logprobs) != bool(top_ids):
            raise RuntimeLoadError("the completion record names logprobs_buffer and "
                                   "top_ids_buffer together or neither")
        self._sampled = [frame[sampled] for frame in staging]
        self.top_logprobs: int | None = None  # None: the record holds no logprobs
        self._logprobs: list[np.ndarray] = []
        self._top_ids: list[np.ndarray] = []
        if logprobs:
            self._logprobs = [frame[logprobs] for frame in staging]
            self._top_ids = [frame[top_ids] for frame in staging]
            lp, ids = self._logprobs[0], self._top_ids[0]
            if (lp.dtype != np.float32 or ids.dtype != np.int32 or lp.ndim != 2
                    or ids.ndim != 2 or lp.shape[1] != width + 1 or ids.shape[1] != width):
                raise RuntimeLoadError(
                    f"completion logprobs record: {logprobs} {lp.dtype}{list(lp.shape)} and "
                    f"{top_ids} {ids.dtype}{list(ids.shape)} do not hold f32 [rows, "
                    f"{width + 1}] and i32 [rows, {width}]")
            self.top_logprobs = int(width)

    def read(self, graph: str, frame: int, rows: int, logprobs: bool,
             tokens: int = 0) -> StepCompletion:
        """`graph`'s record in `frame` for its `rows` live rows (copies): sampled ids (the
        logprobs too when `logprobs`, i.e. some row asked, and the record holds them), or
        a speculative program's lane records as `sampled`; an empty record for a
        RESTORE program). A scored program's first `tokens` packed tokens' scores too
        (`tokens` > 0)."""
        if graph in self._none:
            return StepCompletion(np.empty(0, np.int32))
        record = self._records.get(graph)
        if record is not None:  # one contiguous [rows, columns] block at the buffer's start
            buffer, columns = record
            done = self._staging[frame][buffer]
            lanes = done.reshape(-1)[:rows * columns].reshape(rows, columns).copy()
            framed = self._confidence.get(graph)
            confidence = None if framed is None else \
                self._staging[frame][framed][frame, :rows].copy()
            return StepCompletion(lanes, confidence=confidence)
        sampled = self._sampled[frame][:rows].copy()
        scores = score_ids = None
        if tokens and (named := self._scores.get(graph)) is not None:
            staged = self._staging[frame]
            scores = staged[named[0]][:tokens].copy()
            score_ids = staged[named[1]][:tokens].copy()
        if not logprobs or self.top_logprobs is None:
            return StepCompletion(sampled, scores=scores, score_ids=score_ids)
        return StepCompletion(sampled, self._logprobs[frame][:rows].copy(),
                              self._top_ids[frame][:rows].copy(),
                              scores=scores, score_ids=score_ids)
