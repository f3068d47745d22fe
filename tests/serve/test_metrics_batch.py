"""HistogramBatch (the worker's per-token inter-token latency): after `flush`, the
exposition equals the one `Histogram.observe` of every value gives."""

from __future__ import annotations

import random

import pytest
from helios_serve.metrics import _LATENCY_BUCKETS_S, HistogramBatch
from prometheus_client import CollectorRegistry, Histogram, generate_latest


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("itl_seconds", "test", buckets=_LATENCY_BUCKETS_S,
                               registry=registry)


def test_a_flushed_batch_exports_what_observe_would():
    rng = random.Random(7)
    # Values on the bounds themselves (le is inclusive), between them, 0 and past the last.
    values = [*_LATENCY_BUCKETS_S, 0.0, 1e9, *(rng.expovariate(200.0) for _ in range(500))]
    direct_registry, direct = _histogram()
    batch_registry, batched = _histogram()
    batch = HistogramBatch(batched)
    for step in range(0, len(values), 37):  # several flushes, as one per step
        for value in values[step:step + 37]:
            direct.observe(value)
            batch.observe(value)
        batch.flush()
    def samples(registry: CollectorRegistry) -> dict:
        return {(s.name, s.labels.get("le")): s.value for m in registry.collect()
                for s in m.samples if not s.name.endswith("_created")}

    direct_samples, batch_samples = samples(direct_registry), samples(batch_registry)
    total = ("itl_seconds_sum", None)
    # Bucket counts exactly; the sum up to float addition order.
    assert batch_samples.pop(total) == pytest.approx(direct_samples.pop(total), rel=1e-12)
    assert batch_samples == direct_samples
    assert direct_samples[("itl_seconds_count", None)] == len(values)


def test_nothing_is_exported_before_flush_and_an_empty_flush_adds_nothing():
    registry, histogram = _histogram()
    batch = HistogramBatch(histogram)
    batch.flush()
    batch.observe(0.003)
    assert 'itl_seconds_count 0.0' in generate_latest(registry).decode()
    batch.flush()
    batch.flush()
    text = generate_latest(registry).decode()
    assert 'itl_seconds_count 1.0' in text
    assert 'itl_seconds_bucket{le="0.0025"} 0.0' in text
    assert 'itl_seconds_bucket{le="0.005"} 1.0' in text
    assert 'itl_seconds_sum 0.003' in text
