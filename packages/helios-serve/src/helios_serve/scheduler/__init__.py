"""Host scheduler: continuous batching, paged KV, prefix reuse, preemption.

Plain Python over plain data: no HTTP, no CUDA.
"""

from helios_serve.scheduler.capacity import check_capacity, smallest_capacity
from helios_serve.scheduler.pages import (
    ROOT_HASH,
    PageAllocator,
    PageGrant,
    PrefixMatch,
    chain_hashes,
    page_hash,
)
from helios_serve.scheduler.request import (
    AdmissionError,
    AdmissionReason,
    CompletionError,
    FinishedRequest,
    FinishReason,
    RowResult,
    RowResults,
    SchedRequest,
    SchedulerStats,
    TransferCost,
)
from helios_serve.scheduler.scheduler import MAX_FRAMES, Scheduler

__all__ = [
    "MAX_FRAMES",
    "ROOT_HASH",
    "AdmissionError",
    "AdmissionReason",
    "CompletionError",
    "FinishReason",
    "FinishedRequest",
    "PageAllocator",
    "PageGrant",
    "PrefixMatch",
    "RowResult",
    "RowResults",
    "SchedRequest",
    "Scheduler",
    "SchedulerStats",
    "TransferCost",
    "chain_hashes",
    "check_capacity",
    "page_hash",
    "smallest_capacity",
]
