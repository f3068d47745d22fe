"""The learned drafter checkpoint: an EAGLE-style draft head as one safetensors file.

Architecture (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", 2024), one decoder layer over the target's features: to propose the token
after position j the head reads the token x_j and the target's feature f_{j-1} (the
final-norm hidden state that feeds the target's LM head at position j - 1)::

    z   = fc_embed @ embed[x_j] + fc_feature @ f_{j-1}       # embed: the target's table
    r   = z + wo @ attn(rope(wqkv @ rmsnorm(z, attn_norm)))   # causal over draft positions
    r   = r + w_down @ swiglu(w_gate_up @ rmsnorm(r, ffn_norm))
    g_j = rmsnorm(r, final_norm)                              # predicted feature f_j
    logits over the draft vocabulary = embed[vocab_map] @ g_j

so the head shares the target's embedding and LM head (the rows `vocab_map` of the tied
table: a reduced draft vocabulary as in EAGLE-3) and its own predicted feature feeds the
next draw. Q/K rows of `wqkv` are in HF half-split RoPE order with the target's rope
table (so head_dim and rope base are the target's).

File layout (safetensors): matrices bf16 or f32 `[out, in]`, norms f32 `[hidden]`,
`vocab_map` int32 `[draft_vocab]` (strictly ascending target ids); metadata
`format = helios-eagle-drafter-v1` plus the geometry as decimal strings. Written by
scripts/train_drafter.py (and `random_drafter` for tests); read by `read_drafter`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CheckpointFormatError, CheckpointNotFoundError, GeometryError
from .geometry import LlamaGeometry
from .safetensors_loader import _read_header, bf16_to_float32

DRAFTER_FORMAT = "helios-eagle-drafter-v1"
MATRICES = ("fc_embed", "fc_feature", "wqkv", "wo", "w_gate_up", "w_down")
NORMS = ("attn_norm", "ffn_norm", "final_norm")
VOCAB_MAP = "vocab_map"
GEOMETRY_KEYS = ("hidden", "heads", "kv_heads", "head_dim", "ffn", "draft_vocab")


class DrafterError(CheckpointFormatError):
    """A drafter file is malformed or does not fit its target (names file and field)."""


@dataclass(frozen=True)
class DrafterGeometry:
    """Shapes of the draft head.

    Attributes:
        hidden: model width (the target's hidden size).
        heads: query heads of the draft layer.
        kv_heads: key/value heads of the draft layer.
        head_dim: per-head width (the target's: the rope table is shared).
        ffn: SwiGLU width of the draft layer.
        draft_vocab: rows of the draft LM head (target ids in `vocab_map`).
    """

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    draft_vocab: int

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape, in file order."""
        d = self.hidden
        return {"fc_embed": (d, d), "fc_feature": (d, d), "attn_norm": (d,),
                "wqkv": (self.qkv_width, d), "wo": (d, self.heads * self.head_dim),
                "ffn_norm": (d,), "w_gate_up": (2 * self.ffn, d), "w_down": (d, self.ffn),
                "final_norm": (d,), VOCAB_MAP: (self.draft_vocab,)}

    def parameter_count(self) -> int:
        return sum(int(np.prod(s)) for n, s in self.tensor_shapes().items() if n != VOCAB_MAP)

    @classmethod
    def for_target(cls, target: LlamaGeometry, draft_vocab: int) -> DrafterGeometry:
        """The default head for `target`: its attention geometry and FFN width."""
        return cls(hidden=target.hidden_size, heads=target.num_heads,
                   kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   ffn=target.intermediate_size, draft_vocab=draft_vocab)


@dataclass(frozen=True)
class Drafter:
    """A read drafter: geometry, float32 tensors, the int32 vocabulary map, metadata."""

    source: str
    geometry: DrafterGeometry
    tensors: Mapping[str, np.ndarray]
    metadata: Mapping[str, str]

    @property
    def vocab_map(self) -> np.ndarray:
        return self.tensors[VOCAB_MAP]


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits (nearest, ties to even); NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> 16
    return np.where(np.isnan(x), np.uint32(0x7FC0), rounded).astype(np.uint16)


def write_drafter(path: str | Path, geometry: DrafterGeometry, tensors: Mapping[str, np.ndarray],
                  metadata: Mapping[str, str] | None = None, matrix_dtype: str = "bf16") -> Path:
    """Write a drafter safetensors file (matrices in `matrix_dtype`, norms f32, map i32).

    Raises:
        DrafterError: a tensor is missing or has the wrong shape, or a bad dtype name.
    """
    if matrix_dtype not in ("bf16", "f32"):
        raise DrafterError(f"matrix dtype must be bf16 or f32, got {matrix_dtype!r}")
    path = Path(path)
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    for name, shape in geometry.tensor_shapes().items():
        if name not in tensors:
            raise DrafterError(f"{path}: missing tensor {name!r}")
        array = np.asarray(tensors[name])
        if tuple(array.shape) != shape:
            raise DrafterError(f"{path}: tensor {name!r} has shape {tuple(array.shape)}, "
                               f"expected {shape}")
        if name == VOCAB_MAP:
            data, dtype = np.ascontiguousarray(array, dtype="<i4").tobytes(), "I32"
        elif name in MATRICES and matrix_dtype == "bf16":
            data, dtype = _f32_to_bf16_bits(array).astype("<u2").tobytes(), "BF16"
        else:
            data, dtype = np.ascontiguousarray(array, dtype="<f4").tobytes(), "F32"
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    meta = {"format": DRAFTER_FORMAT, **{k: str(getattr(geometry, k)) for k in GEOMETRY_KEYS}}
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    header["__metadata__"] = meta
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for chunk in chunks:
            f.write(chunk)
    return path


def read_drafter(path: str | Path, target: LlamaGeometry) -> Drafter:
    """Read and check a drafter file against its target's geometry.

    Raises:
        CheckpointNotFoundError: no such file.
        CheckpointFormatError: not a safetensors file, or truncated.
        DrafterError: wrong format tag, missing or misshapen tensor, bad dtype, a vocab_map
            that is not strictly ascending inside the target vocabulary.
        GeometryError: hidden size or head_dim differ from the target's, or the draft
            layer's heads do not group (heads % kv_heads).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"{path}: no drafter file")
    header, data_start = _read_header(path)
    meta = header.get("__metadata__") or {}
    if meta.get("format") != DRAFTER_FORMAT:
        raise DrafterError(f"{path}: metadata format is {meta.get('format')!r}, expected "
                           f"{DRAFTER_FORMAT!r}")
    try:
        geometry = DrafterGeometry(**{k: int(meta[k]) for k in GEOMETRY_KEYS})
    except (KeyError, ValueError) as exc:
        raise DrafterError(f"{path}: metadata lacks an integer geometry field: {exc}") from None
    if geometry.hidden != target.hidden_size or geometry.head_dim != target.head_dim:
        raise GeometryError(f"{path}: drafter hidden {geometry.hidden} / head_dim "
                            f"{geometry.head_dim} differ from the target's "
                            f"{target.hidden_size} / {target.head_dim}")
    if geometry.kv_heads < 1 or geometry.heads % geometry.kv_heads:
        raise GeometryError(f"{path}: drafter heads {geometry.heads} are not a multiple of "
                            f"kv_heads {geometry.kv_heads}")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    tensors: dict[str, np.ndarray] = {}
    for name, shape in geometry.tensor_shapes().items():
        info = header.get(name)
        if info is None:
            raise DrafterError(f"{path}: missing tensor {name!r}")
        if tuple(info["shape"]) != shape:
            raise DrafterError(f"{path}: tensor {name!r} has shape {tuple(info['shape'])}, "
                               f"expected {shape}")
        begin, end = (data_start + int(x) for x in info["data_offsets"])
        allowed = ("I32",) if name == VOCAB_MAP else ("BF16", "F32")
        if info["dtype"] not in allowed:
            raise DrafterError(f"{path}: tensor {name!r} has dtype {info['dtype']}, expected "
                               f"one of {', '.join(allowed)}")
        buf = raw[begin:end]
        if info["dtype"] == "I32":
            array = buf.view("<i4").astype(np.int32)
        elif info["dtype"] == "BF16":
            array = bf16_to_float32(buf.view("<u2"))
        else:
            array = buf.view("<f4").astype(np.float32)
        tensors[name] = array.reshape(shape)
    vocab_map = tensors[VOCAB_MAP]
    if (vocab_map.size == 0 or vocab_map[0] < 0 or vocab_map[-1] >= target.vocab_size
            or np.any(np.diff(vocab_map) <= 0)):
        raise DrafterError(f"{path}: vocab_map must be strictly ascending ids in "
                           f"[0, {target.vocab_size})")
    for name in MATRICES + NORMS:
        if not np.all(np.isfinite(tensors[name])):
            raise DrafterError(f"{path}: tensor {name!r} holds non-finite values")
    return Drafter(str(path), geometry, tensors, dict(meta))


def random_drafter(target: LlamaGeometry, draft_vocab: int, seed: int,
                   eos_token_ids: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Seeded random tensors of the default head shape (tests and untrained cores).

    Matrices are N(0, 0.02^2) except `fc_feature`, which starts as the identity (the
    head passes the target feature through); norms are ones. `vocab_map` is the
    `draft_vocab` lowest ids plus `eos_token_ids`, ascending.

    Raises:
        ValueError: draft_vocab outside [1, vocab_size].
    """
    if not 1 <= draft_vocab <= target.vocab_size:
        raise ValueError(f"draft_vocab {draft_vocab} outside [1, {target.vocab_size}]")
    g = DrafterGeometry.for_target(target, draft_vocab)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in g.tensor_shapes().items():
        if name in NORMS:
            out[name] = np.ones(shape, np.float32)
        elif name != VOCAB_MAP:
            out[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    out["fc_feature"] = np.eye(g.hidden, dtype=np.float32)
    keep = {int(e) for e in eos_token_ids}
    ids = sorted(keep | set(range(draft_vocab)))
    while len(ids) > draft_vocab:  # an EOS above the low range displaces the highest other id
        ids.remove(max(i for i in ids if i not in keep))
    out[VOCAB_MAP] = np.asarray(ids, np.int32)
    return out
