"""Startup options and the settings resolved from them and the core's defaults.

the specification, "Serving metadata": core defaults fill missing settings; explicit
startup options take precedence. A setting neither gives falls back to the built-in
value below.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from helios_contract.prepared import default_max_active
from helios_contract.schema import contract_pb2

from helios_serve.liveness import DEFAULT_STALL_TIMEOUT_S

FALLBACK_QUEUE_CAPACITY = 64
FALLBACK_EVENT_CAPACITY = 256
FALLBACK_MAX_ACTIVE = 8


@dataclass(frozen=True)
class ServeOptions:
    """What the operator gave on the command line (None: not given)."""

    host: str = "127.0.0.1"
    port: int = 8000
    backend: str = "cpu"
    max_active: int | None = None
    queue_capacity: int | None = None
    frontend_workers: int | None = None
    event_capacity: int | None = None
    served_name: str | None = None
    speculative_width: int | None = None  # None: the core's widest; 0: speculation off
    num_pages: int | None = None
    kv_cache_memory: int | None = None
    kv_cache_fraction: float | None = None
    api_key: str | None = None
    history_drafting: bool = False  # copied proposals beside the learned drafter
    history_proposer: str = "copy"  # speculation.PROPOSERS: "copy" or "suffix"
    speculative_policy: str = "adaptive"  # "adaptive": speculation.WidthPolicy; "fixed"
    snapshots: int | None = None  # continuation rows; None: the core's prepared count; 0: off
    host_cache_bytes: int = 0  # host-memory cache tier; 0: none
    stream_interval: int = 1  # tokens per SSE delivery of a choice (vLLM's --stream-interval)
    engine_process: bool = False  # the model worker in its own process (docs/serving.md)
    responses_db: str | None = None  # stored /v1/responses: a SQLite file; None: in memory
    engine_stall_timeout: float = DEFAULT_STALL_TIMEOUT_S  # seconds (liveness.StallWatch)
    allow_image_urls: bool = False  # fetch http(s) image URLs (else data: URLs only)
    max_images_per_request: int = 8
    max_image_pixels: int = 4096 * 4096  # width x height of one decoded image


@dataclass(frozen=True)
class ServeSettings:
    """Resolved settings.

    Attributes:
        max_active: requests running on the model at once (model slots used).
        queue_capacity: bound of the worker's ingress channel and of the scheduler's
            waiting deque; HTTP admits at most queue_capacity + max_active requests.
        frontend_workers: CPU preparation slots (template, tokenize, grammar compile).
        event_capacity: minimum per-response event budget (a minimum, not a cap).
        served_name: the OpenAI `model` name responses carry.
        aliases: other accepted request model names.
        api_key: the Bearer key /v1/* and the tokenize routes require, or None (open).
        history_drafting: lanes carry copied candidates (helios-serve --history-drafting).
        history_proposer: which proposer makes them (--history-proposer: a key of
            speculation.PROPOSERS).
        width_policy: speculative programs chosen per step from observations
            (--speculative-policy adaptive) rather than the widest lane always.
        stream_interval: a choice's output reaches its reader every this many tokens
            (its first token and its end at once); 1 streams every token.
        responses_db: the stored-responses SQLite file (helios-serve --responses-db),
            or None for a bounded in-memory store.
        engine_stall_timeout_s: seconds the model engine may have work without progress
            before /health answers 503 (helios-serve --engine-stall-timeout;
            `liveness.StallWatch`).
        allow_image_urls: image parts may name http(s) URLs, fetched with a timeout and
            the byte bound (--allow-image-urls); else data: URLs only.
        max_images_per_request / max_image_pixels: image bounds of one request
            (--max-images-per-request, --max-image-pixels; frontend/images.ImageLimits).
    """

    host: str
    port: int
    backend: str
    max_active: int
    queue_capacity: int
    frontend_workers: int
    event_capacity: int
    served_name: str
    aliases: tuple[str, ...]
    api_key: str | None = None
    history_drafting: bool = False
    history_proposer: str = "copy"
    width_policy: bool = False
    stream_interval: int = 1
    responses_db: str | None = None
    engine_stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    allow_image_urls: bool = False
    max_images_per_request: int = 8
    max_image_pixels: int = 4096 * 4096

    @property
    def http_capacity(self) -> int:
        return self.queue_capacity + self.max_active


# Settings (ServeOptions and ServeSettings fields alike) that must be at least 1.
POSITIVE_SETTINGS = ("max_active", "queue_capacity", "frontend_workers", "event_capacity",
                     "stream_interval", "max_images_per_request", "max_image_pixels")


def check_positive(values: ServeOptions | ServeSettings) -> None:
    """Refuse a POSITIVE_SETTINGS value below 1: on the options before any core is read
    (None: not given, the core's default decides), on the resolved settings after.

    Raises:
        ValueError: "--NAME must be at least 1" for the first one below 1.
    """
    for name in POSITIVE_SETTINGS:
        value = getattr(values, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


def resolve(options: ServeOptions, contract: contract_pb2.ServingContract) -> ServeSettings:
    """Options beat core defaults; core defaults (nonzero) fill missing options.

    Raises:
        ValueError: a resolved setting is not positive.
    """
    d = contract.defaults

    def pick(option: int | None, default: int, fallback: int) -> int:
        if option is not None:
            return option
        return default if default > 0 else fallback

    settings = ServeSettings(
        host=options.host,
        port=options.port,
        backend=options.backend,
        max_active=pick(options.max_active, default_max_active(contract), FALLBACK_MAX_ACTIVE),
        queue_capacity=pick(options.queue_capacity, d.queue_capacity, FALLBACK_QUEUE_CAPACITY),
        frontend_workers=pick(
            options.frontend_workers, d.frontend_workers, min(4, os.cpu_count() or 1)
        ),
        event_capacity=pick(options.event_capacity, d.event_capacity, FALLBACK_EVENT_CAPACITY),
        served_name=options.served_name or contract.served_id,
        aliases=tuple(
            a
            for a in (contract.served_id, *contract.aliases)
            if a != (options.served_name or contract.served_id)
        ),
        api_key=options.api_key or None,
        history_drafting=options.history_drafting,
        history_proposer=options.history_proposer,
        width_policy=options.speculative_policy == "adaptive",
        stream_interval=options.stream_interval,
        responses_db=options.responses_db,
        engine_stall_timeout_s=options.engine_stall_timeout,
        allow_image_urls=options.allow_image_urls,
        max_images_per_request=options.max_images_per_request,
        max_image_pixels=options.max_image_pixels,
    )
    check_positive(settings)
    if not settings.engine_stall_timeout_s > 0:
        raise ValueError("--engine-stall-timeout must be positive (seconds)")
    if not settings.served_name:
        raise ValueError("the core declares no served id; pass --served-name")
    return settings


_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


class ByteCount(int):
    """A byte count as the operator wrote it: an int whose str() is the text given
    ("4GiB"), so an error naming the option (`f"--host-cache-bytes {n}: ..."`, in the
    runtime too) echoes what was typed, not the parsed number."""

    text: str

    def __new__(cls, value: int, text: str) -> ByteCount:
        self = super().__new__(cls, value)
        self.text = text
        return self

    def __str__(self) -> str:
        return self.text

    def __getnewargs__(self) -> tuple[int, str]:  # pickled into the engine process
        return int(self), self.text


def parse_bytes(text: str, *, zero: bool = False) -> ByteCount:
    """A byte count: an integer with an optional unit (B; K/M/G/T and KiB..TiB are powers
    of 1024, KB..TB powers of 1000; case-insensitive; so what `format_bytes` prints
    parses, as rounded): "2147483648", "100 B", "2GiB", "1.5G", "720.0 KiB", rounded down
    to whole bytes. With `zero`, any spelling of zero ("0", "0.0", "0GiB")
    is 0 (none). The result's str() is `text` as given (stripped).

    Raises:
        ValueError: not a finite byte count of at least one byte (or zero, with `zero`);
            the message quotes `text` and names the accepted forms or values.
    """
    stripped = text.strip()
    number = stripped.rstrip("kKmMgGtTiIbB")
    unit = stripped[len(number):].lower()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a byte count (an integer, optionally with B, K, M, "
                         "G, T, KiB..TiB or KB..TB)") from None
    if not math.isfinite(value):  # "inf", "nan", "1e400"
        raise ValueError(f"{text!r} is not a finite byte count")
    if zero and value == 0:
        return ByteCount(0, stripped)
    if value < 1:
        rule = "a non-negative byte count (0: none)" if zero else "a positive byte count"
        raise ValueError(f"{text!r} is not {rule}")
    return ByteCount(int(value), stripped)


def format_bytes(n: int) -> str:
    """A byte count for people, in the largest binary unit it reaches: "999 B",
    "50.0 KiB", "538.0 MiB" (one decimal), "1.00 GiB" and up (two decimals)."""
    if n < 2**10:
        return f"{n} B"
    if n < 2**20:
        return f"{n / 2**10:.1f} KiB"
    if n < 2**30:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**30:.2f} GiB"
