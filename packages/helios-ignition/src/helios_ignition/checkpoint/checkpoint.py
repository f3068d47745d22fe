"""The loader-independent checkpoint: geometry, lazily read tensors, tokenizer and template.

Invariant: a `Checkpoint` never holds dequantized weights. Each `tensor(name)` call reads,
decodes and shape-checks one tensor and hands it over, so a multi-GB checkpoint is never
materialized twice (once here, once in the consumer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from .errors import MissingTensorError, TensorShapeError
from .geometry import LlamaGeometry

# Reads one HF-named tensor as float32 `[out, in]` (the loader's own layout fixes applied).
TensorReader = Callable[[str], np.ndarray]
# A GGUF tensor's stored blocks: (ggml type name such as "Q4_1", uint8 [rows, row bytes]
# with the loader's row fixes applied), or None for a tensor not stored in blocks.
BlockReader = Callable[[str], "tuple[str, np.ndarray] | None"]
# A GGUF tensor's ggml type name without reading it (None: not stored in blocks).
BlockTypeReader = Callable[[str], "str | None"]
# An FP8 checkpoint tensor's stored codes and per-row scales (uint8 e4m3 [rows, K], f32
# [rows, 1]), or None for a tensor not stored in FP8.
Fp8Reader = Callable[[str], "tuple[np.ndarray, np.ndarray] | None"]
# A 4-bit (AWQ/GPTQ) checkpoint tensor's codes repacked into helios_tools.kernels.int4's
# layout with its group scales and zero points, or None for a tensor not stored in 4 bits.
Int4Reader = Callable[[str], "tuple[np.ndarray, np.ndarray, np.ndarray] | None"]


@dataclass(frozen=True)
class Checkpoint:
    """A Llama checkpoint as plain data plus a per-tensor reader.

    Attributes:
        source: file or directory it came from (used in every error message).
        geometry: model shapes and constants.
        tokenizer_json: HF `tokenizers` JSON text (`tokenizers.Tokenizer.from_str`).
        chat_template: Jinja2 chat template, verbatim.
        bos_token_id: beginning-of-sequence id, or None.
        eos_token_ids: ids that end generation (first is the primary EOS).
        special_tokens: template variables such as `bos_token`/`eos_token` -> token text,
            passed to the chat template the way transformers passes `special_tokens_map`.
        tensor_names: HF names available, canonical order.
    """

    source: str
    geometry: LlamaGeometry
    tokenizer_json: str
    chat_template: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    special_tokens: dict[str, str]
    tensor_names: tuple[str, ...]
    _read: TensorReader = field(repr=False, compare=False)
    _read_blocks: BlockReader | None = field(default=None, repr=False, compare=False)
    _block_type: BlockTypeReader | None = field(default=None, repr=False, compare=False)
    _read_fp8: Fp8Reader | None = field(default=None, repr=False, compare=False)
    _read_int4: Int4Reader | None = field(default=None, repr=False, compare=False)

    def fp8(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """`name`'s FP8 codes and per-row scales as stored (HF compressed-tensors / FBGEMM
        FP8 checkpoints: ``float8_e4m3fn`` weights with a ``weight_scale`` per output
        channel or per tensor, broadcast to rows): ``(uint8 [rows, K], f32 [rows, 1])``;
        None for a tensor stored otherwise. ``tensor(name)`` is their product.

        Raises:
            MissingTensorError: not a tensor of this geometry.
        """
        self.expected_shape(name)
        return self._read_fp8(name) if self._read_fp8 is not None else None

    def int4(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """`name`'s 4-bit codes as an AWQ or GPTQ checkpoint stores them, repacked (no
        float round trip) into ``(packed codes [out, in / 2] uint8, scales [out, in / G]
        f32, zero points [out, in / G] f32)``; None for a tensor stored otherwise.

        Raises:
            UnsupportedTensorError: a GPTQ act-order (g_idx) permutation.
        """
        return self._read_int4(name) if self._read_int4 is not None else None

    def block_type(self, name: str) -> str | None:
        """The GGUF block type (ggml name, e.g. "Q4_1") `name` is stored in, read from the
        file's index alone; None for a tensor of plain floats or a checkpoint without
        blocks (safetensors, random weights).

        Raises:
            MissingTensorError: not a tensor of this geometry.
        """
        self.expected_shape(name)
        return self._block_type(name) if self._block_type is not None else None

    def blocks(self, name: str) -> tuple[str, np.ndarray]:
        """`name`'s stored blocks as they are: (ggml type name, uint8 [rows, row bytes]),
        rows in the same order as `tensor(name)`'s.

        Raises:
            MissingTensorError: not a tensor of this geometry, or not stored in blocks.
        """
        self.expected_shape(name)
        found = self._read_blocks(name) if self._read_blocks is not None else None
        if found is None:
            raise MissingTensorError(self.source, name, "not stored in GGUF blocks")
        return found

    @property
    def tensors(self) -> Mapping[str, np.ndarray]:
        """Read-only mapping view: `ck.tensors[name]` reads (and checks) one tensor."""
        return _LazyTensors(self)

    def expected_shape(self, name: str) -> tuple[int, ...]:
        """Shape the geometry implies for `name`.

        Raises:
            MissingTensorError: `name` is not a tensor of this geometry.
        """
        shape = self.geometry.tensor_shapes().get(name)
        if shape is None:
            raise MissingTensorError(self.source, name, "not a tensor of this geometry")
        return shape

    def tensor(self, name: str) -> np.ndarray:
        """Read one tensor as a float32 C-contiguous array (`[out, in]`; norms `[d]`).

        Raises:
            MissingTensorError: the checkpoint lacks it.
            TensorShapeError: its shape disagrees with the geometry (names both shapes).
        """
        expected = self.expected_shape(name)
        array = self._read(name)
        if tuple(array.shape) != expected:
            raise TensorShapeError(self.source, name, expected, tuple(array.shape))
        return np.ascontiguousarray(array, dtype=np.float32)

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """Yield `(name, float32 array)` one at a time in canonical order."""
        for name in self.tensor_names:
            yield name, self.tensor(name)

    def lm_head(self) -> np.ndarray:
        """The LM head `[vocab, d]`: `lm_head.weight`, or the embedding when tied."""
        if self.geometry.tie_word_embeddings:
            return self.tensor("model.embed_tokens.weight")
        return self.tensor("lm_head.weight")


class _LazyTensors(Mapping):
    """Mapping over a checkpoint's tensors; every lookup reads from the source again."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self._ck = checkpoint

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._ck.tensor_names:
            raise KeyError(name)
        return self._ck.tensor(name)

    def __contains__(self, name: object) -> bool:
        return name in self._ck.tensor_names

    def __iter__(self) -> Iterator[str]:
        return iter(self._ck.tensor_names)

    def __len__(self) -> int:
        return len(self._ck.tensor_names)
