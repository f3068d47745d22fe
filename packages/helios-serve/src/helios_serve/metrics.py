"""Prometheus metrics of one server (the specification, "/metrics").

Every metric lives in the server's own `CollectorRegistry` (never the process-global
one), so several servers in one test process do not collide. Labels carry only bounded
enumerations (reasons, operations): never request ids, prompt contents or token ids.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Rejection reasons (label values of helios_requests_rejected_total).
REJECT_INGRESS_FULL = "ingress_full"  # 429: queue_capacity + max_active admitted
REJECT_INVALID = "invalid"  # 400: preparation failed
REJECT_SCHEDULER = "scheduler"  # 503 / terminal rejection event

_LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_PHASE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, *_E2E_BUCKETS_S)


# Runtime resources created at load ("Ownership and bootstrap": nothing is allocated,
# loaded or captured while serving), exported as helios_runtime_resources{kind}.
RUNTIME_KINDS = ("device_allocations", "host_allocations", "module_loads", "graph_captures")


class _RuntimeResources:
    """Collector reading the backend's load counters at scrape time."""

    def __init__(self, read: Callable[[], Mapping[str, int]], frames: int) -> None:
        self._read = read
        self._frames = frames

    def describe(self):
        return []  # read at scrape time only

    def collect(self):
        counters = dict(self._read())
        family = GaugeMetricFamily(
            "helios_runtime_resources",
            "Runtime resources created by the backend, by kind (device_allocations, "
            "host_allocations, module_loads, graph_captures); fixed after load.",
            labels=["kind"],
        )
        for kind in RUNTIME_KINDS:
            family.add_metric([kind], float(counters.get(kind, 0)))
        yield family
        yield GaugeMetricFamily("helios_execution_frames",
                                "Execution frames the backend offers (steps in flight at most).",
                                value=float(self._frames))


class HistogramBatch:
    """Observations of one unlabelled Histogram gathered on one thread, added at `flush`.

    The model worker observes inter-token latency once per generated token;
    `Histogram.observe` walks the bucket bounds in Python and takes two locks per value.
    Here a value costs one `bisect` and a list increment, and `flush` (once per step)
    adds each bucket's count and the sum with one locked increment each: the exposition
    after `flush` is the one `observe` of every value would give (same bucket rule:
    the first upper bound >= the value).
    """

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._bounds = list(histogram._upper_bounds)  # ends with +Inf
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = False

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount
        self._pending = True

    def flush(self) -> None:
        if not self._pending:
            return
        buckets = self._histogram._buckets
        for i, count in enumerate(self._counts):
            if count:
                buckets[i].inc(count)
                self._counts[i] = 0
        self._histogram._sum.inc(self._sum)
        self._sum = 0.0
        self._pending = False


class Metrics:
    """The server's counters, gauges and histograms.

    Written by the HTTP layer (received, admitted, rejected, permits) and by the model
    worker (everything else). prometheus-client metrics are thread-safe.
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        # Request lifecycle.
        self.requests_received = Counter(
            "helios_requests_received",
            "Generation requests (chat and completions) received by HTTP.", registry=r
        )
        self.requests_admitted = Counter(
            "helios_requests_admitted",
            "Generation requests given an HTTP admission permit (one refused later by the "
            "scheduler, 503, counts here and under rejected reason=scheduler).", registry=r
        )
        self.requests_rejected = Counter(
            "helios_requests_rejected",
            "Generation requests rejected, by reason (ingress_full, invalid, scheduler).",
            ["reason"],
            registry=r,
        )
        self.requests_finished = Counter(
            "helios_requests_finished",
            "Choices that left the model worker, by reason (stop, length, tool_calls, "
            "cancelled, error): one per choice, so a request with n = 3 counts 3.",
            ["reason"],
            registry=r,
        )
        self.requests_running = Gauge(
            "helios_requests_running", "Requests holding a model slot.", registry=r
        )
        self.requests_waiting = Gauge(
            "helios_requests_waiting", "Requests queued for a model slot.", registry=r
        )
        self.http_permits_in_use = Gauge(
            "helios_http_admission_permits_in_use",
            "Admitted HTTP requests not yet released by their reader.",
            registry=r,
        )
        self.http_permits_capacity = Gauge(
            "helios_http_admission_permits_capacity",
            "HTTP admission limit: queue_capacity + max_active.",
            registry=r,
        )
        # Engine liveness (liveness.StallWatch; docs/api.md, "Engine liveness"): set by
        # the frontend at each scrape, never by an engine process (its copies stay 0).
        self.engine_stalled = Gauge(
            "helios_engine_stalled",
            "1 while the model engine has work and made no progress for "
            "--engine-stall-timeout (/health answers 503), else 0.",
            registry=r,
        )
        self.engine_stalled_seconds = Gauge(
            "helios_engine_stalled_seconds",
            "Seconds the model engine has had work without progress (0 while it "
            "progresses or is idle).",
            registry=r,
        )
        self.engine_metrics_stale = Gauge(
            "helios_engine_metrics_stale",
            "1 when the engine's share of this exposition was not refreshed for this "
            "scrape (a stalled engine, or an engine process that did not answer in time "
            "or has exited: its last values are shown), else 0.",
            registry=r,
        )
        # Latency.
        self.time_to_first_token = Histogram(
            "helios_time_to_first_token_seconds",
            "Enqueue to first generated token.",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "helios_inter_token_latency_seconds",
            "Time between consecutive generated tokens of one request.",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        # Per-request phases (vLLM's request_queue/prefill/decode_time_seconds): each
        # choice of n > 1 is observed on its own.
        self.queue_time = Histogram(
            "helios_request_queue_time_seconds",
            "Enqueue to the request's first planned step (time waiting for a slot).",
            buckets=_PHASE_BUCKETS_S,
            registry=r,
        )
        self.prefill_time = Histogram(
            "helios_request_prefill_time_seconds",
            "First planned step to the first generated token (prompt computation).",
            buckets=_PHASE_BUCKETS_S,
            registry=r,
        )
        self.decode_time = Histogram(
            "helios_request_decode_time_seconds",
            "First generated token to the last (generation after the prefill).",
            buckets=_PHASE_BUCKETS_S,
            registry=r,
        )
        self.e2e_latency = Histogram(
            "helios_e2e_request_latency_seconds",
            "Enqueue to the terminal event of a prompt's last choice (a completions request "
            "of several prompts observes one per prompt).",
            buckets=_E2E_BUCKETS_S,
            registry=r,
        )
        # Tokens.
        self.prompt_tokens = Counter(
            "helios_prompt_tokens", "Prompt tokens of admitted requests.", registry=r
        )
        self.generation_tokens = Counter(
            "helios_generation_tokens", "Generated (sampled) tokens.", registry=r
        )
        # Execution.
        self.graph_launches = Counter(
            "helios_graph_launches",
            "Successful graph launches, by operation.",
            ["operation"],
            registry=r,
        )
        # Bucket fill: a DECODE step runs the smallest captured batch variant that holds
        # its rows; the rows past them are padding. Padding fraction = padded / (rows +
        # padded), over any window (bench/serve_load.py reports it per run).
        self.decode_rows = Counter(
            "helios_decode_rows", "Live rows of submitted DECODE steps.", registry=r
        )
        self.mixed_lanes = Counter(
            "helios_mixed_lanes",
            "Decode lanes of submitted MIXED steps (running streams that got a token in a "
            "step that also prefilled prompt chunks).",
            registry=r,
        )
        # The per-step budget rule (docs/mixed.md, "Token budget"): how often each
        # captured mixed token capacity was the budget. Summed over the label, it is
        # helios_graph_launches_total{operation="mixed"}.
        self.mixed_steps = Counter(
            "helios_mixed_steps",
            "Submitted MIXED steps, by the token budget the scheduler chose for the step "
            "(a captured mixed token capacity; the variant run may be a smaller one).",
            ["token_capacity"],
            registry=r,
        )
        self.decode_padded_rows = Counter(
            "helios_decode_padded_rows",
            "Captured rows of submitted DECODE steps' graph variants past their live rows.",
            registry=r,
        )
        self.execution_failures = Counter(
            "helios_execution_failures", "Graph launches that raised.", registry=r
        )
        # Prefix reuse.
        self.prefix_cache_queries = Counter(
            "helios_prefix_cache_queries",
            "Prefix-cache lookups (one per admission or readmission).",
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "helios_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache.",
            registry=r,
        )
        self.pages_published = Counter(
            "helios_cache_pages_published",
            "Complete pages published to the prefix cache.",
            registry=r,
        )
        self.page_evictions = Counter(
            "helios_cache_page_evictions",
            "Unreferenced cached pages evicted (LRU).",
            registry=r,
        )
        self.preemptions = Counter(
            "helios_preemptions",
            "Running requests preempted (recompute) for pages.",
            registry=r,
        )
        self.prefill_tokens = Counter(
            "helios_prefill_tokens",
            "Prompt tokens computed by prefill (prompt tokens less those reused from the "
            "cache; preempted requests' recomputed tokens included).",
            registry=r,
        )
        # Exact-endpoint snapshots (the specification, "Attention histories and cache
        # policy") and the host-memory cache tier.
        self.snapshot_publications = Counter(
            "helios_snapshot_publications",
            "Snapshots published at exact token endpoints (a partial page copied to a "
            "continuation row whose copy completed).",
            registry=r,
        )
        self.snapshot_evictions = Counter(
            "helios_snapshot_evictions",
            "Unreferenced snapshots evicted from their continuation row (LRU), moved to the "
            "host tier or discarded.",
            registry=r,
        )
        self.snapshot_hits = Counter(
            "helios_snapshot_hits",
            "Admissions that restored a snapshot into a private page.",
            registry=r,
        )
        self.snapshots_resident = Gauge(
            "helios_snapshots_resident",
            "Snapshots a prompt can restore now (continuation rows and host rows).",
            registry=r,
        )
        self.snapshot_capacity = Gauge(
            "helios_snapshot_capacity", "Continuation rows backed at load.", registry=r
        )
        self.host_cache_bytes_capacity = Gauge(
            "helios_host_cache_bytes_capacity",
            "Bytes of the host-memory cache tier (--host-cache-bytes, rounded down to rows).",
            registry=r,
        )
        self.host_cache_bytes_used = Gauge(
            "helios_host_cache_bytes_used",
            "Bytes of host-tier rows holding a page or snapshot (or being written).",
            registry=r,
        )
        self.host_cache_hits = Counter(
            "helios_host_cache_hits",
            "Rows (pages and snapshots) an admission found in the host tier and copied back.",
            registry=r,
        )
        self.host_cache_swap_ins = Counter(
            "helios_host_cache_swap_ins",
            "Rows copied from the host tier to device pages (completed copies).",
            registry=r,
        )
        self.host_cache_swap_outs = Counter(
            "helios_host_cache_swap_outs",
            "Rows copied to the host tier: evicted pages and snapshots (completed copies).",
            registry=r,
        )
        self.host_cache_evictions = Counter(
            "helios_host_cache_evictions",
            "Host-tier rows evicted (LRU) to make room; their payload is discarded.",
            registry=r,
        )
        # Resource capacity.
        self.pages_capacity = Gauge(
            "helios_cache_pages_capacity", "Physical cache pages backed at load.", registry=r
        )
        self.pages_used = Gauge(
            "helios_cache_pages_used",
            "Cache pages referenced by at least one request (the prefix cache's idle pages "
            "are helios_cache_pages_evictable).",
            registry=r,
        )
        self.pages_evictable = Gauge(
            "helios_cache_pages_evictable",
            "Published cache pages no request references: prefix-cache pages a later prompt "
            "may reuse, evicted least recently used first when an allocation needs them.",
            registry=r,
        )
        # The sliding-window region's own pool (0 without one): the helios_cache_pages_*
        # gauges above count the paged region's pages.
        self.window_pages_capacity = Gauge(
            "helios_cache_window_pages_capacity",
            "Pages of the sliding-window region's pool (its planes' extent; 0: no window "
            "region).",
            registry=r,
        )
        self.window_pages_used = Gauge(
            "helios_cache_window_pages_used",
            "Sliding-window pages held by running requests (pages wholly behind a "
            "request's window are back in the pool).",
            registry=r,
        )
        self.window_pages_released = Counter(
            "helios_cache_window_pages_released",
            "Sliding-window pages returned to the pool behind their request's window.",
            registry=r,
        )
        self.slots_capacity = Gauge(
            "helios_request_slots_capacity", "Physical request rows.", registry=r
        )
        # The Gateway API Inference Extension's model-server protocol (docs/deploy.md,
        # "Inference-gateway metrics"): the endpoint picker reads queued and running
        # requests (helios_requests_waiting, helios_requests_running above), this fraction,
        # the LoRA info and the cache info, each under a name its flags select.
        self.kv_cache_usage = Gauge(
            "helios_kv_cache_usage_perc",
            "Fraction (0 to 1) of the physical cache pages that requests reference: "
            "helios_cache_pages_used / helios_cache_pages_capacity (idle prefix-cache pages "
            "count as free, as a later allocation may evict them).",
            registry=r,
        )
        self.lora_requests_info = Gauge(
            "helios_lora_requests_info",
            "LoRA adapters in the inference gateway's label format; the value is the "
            "Unix time (s) of the last update. Helios serves no adapters: max_lora is 0 and "
            "both lists are empty.",
            ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            registry=r,
        )
        self.cache_config_info = Gauge(
            "helios_cache_config_info",
            "The cache geometry in the inference gateway's label format: block_size = "
            "tokens per page, num_gpu_blocks = physical pages; the value is 1.",
            ["block_size", "num_gpu_blocks"],
            registry=r,
        )
        # Speculative decoding (the shape of vLLM's spec-decode metrics; source "learned"
        # = the drafter, "copied" = history drafting).
        self.spec_draft_tokens = Counter(
            "helios_spec_decode_draft_tokens",
            "Draft tokens offered to verification, by proposal source.",
            ["source"],
            registry=r,
        )
        self.spec_accepted_tokens = Counter(
            "helios_spec_decode_accepted_tokens",
            "Draft tokens accepted by verification, by proposal source.",
            ["source"],
            registry=r,
        )
        self.spec_accepted_per_position = Counter(
            "helios_spec_decode_accepted_per_position",
            "Accepted draft tokens by draft position (0 = the first draft of a round) and "
            "proposal source.",
            ["position", "source"],
            registry=r,
        )
        self.spec_draft_per_position = Counter(
            "helios_spec_decode_draft_per_position",
            "Draft tokens offered to verification by draft position (0 = the first draft "
            "of a round) and proposal source: the acceptance rate at a position is "
            "accepted_per_position over this.",
            ["position", "source"],
            registry=r,
        )
        self.spec_accepted_length = Histogram(
            "helios_spec_decode_accepted_length",
            "Tokens emitted by one speculative lane round with drafts (accepted + 1).",
            buckets=tuple(float(n) for n in range(1, 9)),
            registry=r,
        )
        for source in ("learned", "copied"):
            self.spec_draft_tokens.labels(source)
            self.spec_accepted_tokens.labels(source)
        # the specification, "/metrics": both cover the lifetime of the model worker.
        self.mixed_grammar_decode_steps = Counter(
            "flare_mixed_grammar_decode_steps",
            "Successful decode submissions whose request lanes include both constrained "
            "and unconstrained requests.",
            registry=r,
        )
        self.constrained_max_inflight = Gauge(
            "flare_constrained_max_inflight",
            "Maximum outstanding executor frames immediately after a successful "
            "constrained submission (0 before any).",
            registry=r,
        )
        for reason in (REJECT_INGRESS_FULL, REJECT_INVALID, REJECT_SCHEDULER):
            self.requests_rejected.labels(reason)
        for reason in ("stop", "length", "tool_calls", "cancelled", "error"):
            self.requests_finished.labels(reason)
        for op in ("prefill", "decode", "speculative", "transfer", "mixed"):
            self.graph_launches.labels(op)

    def watch_runtime(self, read: Callable[[], Mapping[str, int]], frames: int) -> None:
        """Export the backend's load counters (`read()` at each scrape) and frame count."""
        self.registry.register(_RuntimeResources(read, frames))

    def render(self, engine: list | None = None) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type; with `engine` (the
        engine process's `engine_families`), one exposition of both processes."""
        if engine is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        merged = CollectorRegistry()
        merged.register(_Merged(self.registry, engine))
        return generate_latest(merged), CONTENT_TYPE_LATEST


def engine_families(metrics: Metrics) -> list:
    """The engine process's metric families as MessagePack-ready lists (for the
    frontend's /metrics): [name, type, documentation, unit, [[sample, labels, value]]]."""
    return [[f.name, f.type, f.documentation, f.unit,
             [[s.name, s.labels, s.value] for s in f.samples]]
            for f in metrics.registry.collect()]


# Gauges that record a lifetime maximum, not live state (the specification, "/metrics":
# flare_constrained_max_inflight "must remain one afterward"): kept after the engine died.
LIFETIME_GAUGES = frozenset({"flare_constrained_max_inflight"})


def dead_engine_families(families: list) -> list:
    """The engine's share of /metrics once its process has died: `families` (the last
    `engine_families` received from it, [] when none was) with counters and histograms
    as they were, so that no counter goes backwards while the frontend lives, and every
    gauge 0 (nothing runs, no slot, page, row or runtime resource is held any more)
    except the LIFETIME_GAUGES."""
    return [[name, typ, doc, unit,
             samples if typ != "gauge" or name in LIFETIME_GAUGES
             else [[sample, labels, 0.0] for sample, labels, _ in samples]]
            for name, typ, doc, unit, samples in families]


class _Merged:
    """One exposition of two processes' registries with the same metric names (the
    frontend's and the engine's `Metrics`): each counter, gauge and histogram sample
    is the sum of both (each process moves only its own share: the other's stays at
    zero), `_created` the earlier of the two; families only the engine has (runtime
    resources) are added as they are."""

    def __init__(self, registry: CollectorRegistry, engine: list) -> None:
        self._registry = registry
        self._engine = engine

    def describe(self):
        return []

    def collect(self):
        remote = {}
        for name, typ, doc, unit, samples in self._engine:
            remote[name] = (typ, doc, unit, {(s, tuple(sorted(labels.items()))): value
                                             for s, labels, value in samples})
        for family in self._registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            other = remote.pop(family.name, None)
            extra = other[3] if other is not None else {}
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                value = sample.value
                if key in extra:
                    theirs = extra.pop(key)
                    value = min(value, theirs) if sample.name.endswith("_created") \
                        else value + theirs
                out.add_sample(sample.name, sample.labels, value)
            for (name, labels), value in extra.items():
                out.add_sample(name, dict(labels), value)
            yield out
        for name, (typ, doc, unit, samples) in remote.items():
            out = Metric(name, doc, typ, unit)
            for (sample, labels), value in samples.items():
                out.add_sample(sample, dict(labels), value)
            yield out
