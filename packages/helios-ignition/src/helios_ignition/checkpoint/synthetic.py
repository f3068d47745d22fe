"""Seeded random checkpoints of real geometries (for benchmarks where no weights exist).

Weights are never zeros: matrices are N(0, 1) * 0.02 and norms are 1 + N(0, 1) * 0.02, in
float32 (NumPy's float32 ziggurat yields an exact 0.0 about once per 2**19 draws; no
tensor is ever zero as a whole). Tensor i (canonical order of `LlamaGeometry.tensor_shapes`) is drawn from its own
PCG64 stream seeded by `SeedSequence([seed, i])`, so any tensor can be produced alone, in
any order, and identically on every machine; nothing is generated until asked for.

Tokenizer: the SmolLM2 tokenizer and chat template (from the verified GGUF) are reused.
When the geometry's vocab exceeds SmolLM2's 49152 ids (llama-3.1-8b: 128256), the BPE vocab
is extended with filler tokens `<|filler_{id}|>` for ids 49152..vocab-1. No merge produces
them, so encoding text gives exactly SmolLM2's ids; they exist so every id of the embedding
and LM head decodes and vocab-sized tables line up.

Where the 98 MB GGUF cannot travel (a lent GPU machine takes at most 64 MiB a call, with
the repository), the environment variable ``HELIOS_SYNTHETIC_FRONTEND`` may name the
frontend alone: a JSON file of `frontend_json()`'s bytes, written where the verified
GGUF is (`bench/gpu_device.sh` says how). Its sha256 must equal
``SMOLLM2_FRONTEND_SHA256`` (`ChecksumMismatchError` otherwise), so the tokenizer and
template are the GGUF's byte for byte and the core is the same.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from .checkpoint import Checkpoint
from .errors import CheckpointError
from .geometry import NAMED_GEOMETRIES, LlamaGeometry
from .gguf_loader import load_gguf
from .locate import smollm2_gguf_path, verify_sha256
from .qwen3 import QWEN3_GEOMETRIES

# Every named geometry random weights can take (Llama's and Qwen3's).
RANDOM_GEOMETRIES = {**NAMED_GEOMETRIES, **QWEN3_GEOMETRIES}

WEIGHT_STD = 0.02
NORM_NOISE_STD = 0.02
# Tensors drawn ahead of the one asked for, in canonical order, by a small thread pool:
# NumPy's generators release the GIL, so an 8B export draws its 8e9 values on several
# cores while the caller converts and writes (single-threaded, ~80 s of the 8B export).
READ_AHEAD = 6


FRONTEND_ENV = "HELIOS_SYNTHETIC_FRONTEND"
# sha256 of `frontend_json()` (the verified SmolLM2 GGUF's tokenizer, template, BOS, EOS
# and special tokens).
SMOLLM2_FRONTEND_SHA256 = "df9028f30167ffb124900da82ab4d5e64e381298e9ff81e00b401a8cf45887dc"

_Frontend = tuple[str, str, int | None, tuple[int, ...], tuple[tuple[str, str], ...]]


def frontend_json() -> bytes:
    """The SmolLM2 frontend random checkpoints reuse, from the verified GGUF, as canonical
    JSON bytes (sorted keys, UTF-8): ``tokenizer_json``, ``chat_template``,
    ``bos_token_id``, ``eos_token_ids``, ``special_tokens``.

    Raises:
        CheckpointNotFoundError / ChecksumMismatchError: the GGUF is missing or altered.
    """
    ck = load_gguf(smollm2_gguf_path())
    doc = {"tokenizer_json": ck.tokenizer_json, "chat_template": ck.chat_template,
           "bos_token_id": ck.bos_token_id, "eos_token_ids": list(ck.eos_token_ids),
           "special_tokens": sorted(ck.special_tokens.items())}
    return json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8")


@lru_cache(maxsize=1)
def _smollm2_frontend() -> _Frontend:
    path = os.environ.get(FRONTEND_ENV)
    if path:
        doc = json.loads(verify_sha256(path, SMOLLM2_FRONTEND_SHA256).read_bytes())
    else:
        doc = json.loads(frontend_json())
    return (doc["tokenizer_json"], doc["chat_template"], doc["bos_token_id"],
            tuple(doc["eos_token_ids"]), tuple((k, v) for k, v in doc["special_tokens"]))


def extend_vocab_with_fillers(tokenizer_json: str, vocab_size: int) -> str:
    """Add `<|filler_{id}|>` entries to a BPE vocab so ids up to `vocab_size - 1` exist."""
    data = json.loads(tokenizer_json)
    vocab = data["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in data.get("added_tokens") or []}
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<|filler_{i}|>"] = i
    return json.dumps(data, ensure_ascii=False)


def synthetic_tensor(geometry: LlamaGeometry, seed: int, index: int, name: str) -> np.ndarray:
    """The float32 tensor `name` (canonical position `index`) of a seeded random model."""
    shape = geometry.tensor_shapes()[name]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, index])))
    out = rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("norm.weight"):
        out *= np.float32(NORM_NOISE_STD)
        out += np.float32(1.0)
    else:
        out *= np.float32(WEIGHT_STD)
    return out


def random_checkpoint(geometry_name: str, seed: int = 0) -> Checkpoint:
    """A lazily generated checkpoint of a named real geometry.

    Args:
        geometry_name: one of `RANDOM_GEOMETRIES` (`smollm2-135m`, `llama-3.1-8b`,
            `qwen3-8b`, `qwen3-30b-a3b`).
        seed: base seed; tensor i uses `SeedSequence([seed, i])`.

    Returns:
        A `Checkpoint` whose `tensor(name)` draws the tensor on demand (an 8B embedding
        is 2.1 GB of float32, so only what is asked for is produced).

    Raises:
        CheckpointError: unknown geometry name (the message lists the known ones).
    """
    geometry = RANDOM_GEOMETRIES.get(geometry_name)
    if geometry is None:
        raise CheckpointError(
            f"unknown geometry {geometry_name!r}; known: {', '.join(sorted(RANDOM_GEOMETRIES))}"
        )
    tokenizer_json, template, bos, eos, special = _smollm2_frontend()
    base_vocab = len(json.loads(tokenizer_json)["model"]["vocab"])
    if geometry.vocab_size > base_vocab:
        tokenizer_json = extend_vocab_with_fillers(tokenizer_json, geometry.vocab_size)
    names = tuple(geometry.tensor_shapes())

    read = _ReadAhead(geometry, seed, names)

    return Checkpoint(
        source=f"synthetic:{geometry_name}:seed={seed}",
        geometry=geometry,
        tokenizer_json=tokenizer_json,
        chat_template=template,
        bos_token_id=bos,
        eos_token_ids=eos,
        special_tokens=dict(special),
        tensor_names=names,
        _read=read,
    )


class _ReadAhead:
    """`read(name)` for a synthetic checkpoint: the tensor, with the next READ_AHEAD tensors
    in canonical order already being drawn on a pool of threads.

    Values do not depend on the order or the pool (each tensor has its own stream); only
    tensors read in roughly canonical order (as export does) profit. At most READ_AHEAD
    drawn tensors wait in memory (an 8B layer's largest is 235 MB of float32).
    """

    def __init__(self, geometry: LlamaGeometry, seed: int, names: tuple[str, ...]) -> None:
        self._geometry, self._seed, self._names = geometry, seed, names
        self._index = {name: i for i, name in enumerate(names)}
        self._pending: dict[int, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def _draw(self, index: int) -> np.ndarray:
        return synthetic_tensor(self._geometry, self._seed, index, self._names[index])

    def __call__(self, name: str) -> np.ndarray:
        index = self._index[name]
        if self._pool is None:
            workers = max(1, min(READ_AHEAD, (os.cpu_count() or 1) - 1))
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="synthetic")
        for ahead in range(index + 1, min(index + 1 + READ_AHEAD, len(self._names))):
            if ahead not in self._pending:
                self._pending[ahead] = self._pool.submit(self._draw, ahead)
        # Drawn tensors behind the one asked for will not be asked for again in order.
        for stale in [i for i in self._pending if i < index]:
            self._pending.pop(stale).cancel()
        future = self._pending.pop(index, None)
        return future.result() if future is not None else self._draw(index)
