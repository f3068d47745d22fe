"""What every GGUF reader shares (gguf_loader.py's llama, gemma3.py's, qwen3.py's):
metadata values, HF tensor names, the special tokens, lazy access to a tensor's values or
blocks, and the `Checkpoint` built from them (`gguf_checkpoint`).

An architecture's reader keeps only what differs: its name maps, geometry keys,
tokenizer and the adjustment of a tensor as stored (llama: the Q/K row permutation
undone; gemma3: the norm shift removed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .checkpoint import Checkpoint
from .errors import MissingTensorError, MissingTokenizerError, UnsupportedTensorError
from .tokenizer_build import bpe_tokenizer_json

LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
# A tensor's adjustment from the GGUF's convention to HF's: (HF name, array) -> array.
Adjust = Callable[[str, np.ndarray], np.ndarray]


def field_value(reader: Any, key: str, default: Any = None) -> Any:
    """Scalar, string or list value of a GGUF metadata key (`default` when absent, [] for
    an empty array)."""
    f = reader.fields.get(key)
    if f is None:
        return default
    if not f.data:
        return []
    values = [f.parts[i] for i in f.data]
    decoded = [
        bytes(v).decode("utf-8") if v.dtype == np.uint8 else v.tolist()[0] for v in values
    ]
    # Arrays have types [ARRAY, elem]; scalars/strings have one type.
    from gguf import GGUFValueType  # start-up time: gguf only once a GGUF is read

    if f.types and f.types[0] == GGUFValueType.ARRAY:
        return decoded
    return decoded[0]


def hf_name(name: str, global_map: Mapping[str, str], layer_map: Mapping[str, str]
            ) -> str | None:
    """HF name of GGUF tensor `name` (`blk.N.SUFFIX` through `layer_map` to
    `model.layers.N.HF_SUFFIX`, others through `global_map`), or None when it has no HF
    counterpart."""
    if name in global_map:
        return global_map[name]
    m = LAYER_RE.match(name)
    if m and m.group(2) in layer_map:
        return f"model.layers.{m.group(1)}.{layer_map[m.group(2)]}"
    return None


def tensors_by_hf(reader: Any, to_hf: Callable[[str], str | None]) -> dict[str, Any]:
    """HF name -> the reader's tensor, for every tensor `to_hf` names."""
    by_hf: dict[str, Any] = {}
    for t in reader.tensors:
        hf = to_hf(t.name)
        if hf is not None:
            by_hf[hf] = t
    return by_hf


def require_tensors(by_hf: Mapping[str, Any], names: Iterable[str], source: str) -> None:
    """Raises MissingTensorError for the first of `names` the GGUF does not hold."""
    for name in names:
        if name not in by_hf:
            raise MissingTensorError(source, name, "no matching GGUF tensor")


def rms_eps(value: Any) -> float:
    """The RMS norm epsilon GGUF stores as float32 (9.9999997e-06), as the decimal it
    encodes (1e-05)."""
    return float(np.format_float_positional(np.float32(value), unique=True))


def gpt2_tokenizer_json(field_of: Callable[[str], Any], source: str) -> str:
    """`tokenizers` JSON of a GGUF's GPT-2 style byte-level BPE (`tokenizer.ggml.model`
    gpt2): its tokens, merges and pre-tokenizer (`tokenizer.ggml.pre`); CONTROL tokens
    become special added tokens, USER_DEFINED ones (Qwen3's `<think>`, `<tool_call>`)
    plain added tokens, never split, as llama.cpp's tokenizer treats them.

    Raises:
        MissingTokenizerError: no gpt2 tokenizer in the file, or a pre-tokenizer the
            builder does not know (the message names `source`).
    """
    tokens = field_of("tokenizer.ggml.tokens")
    if field_of("tokenizer.ggml.model") != "gpt2" or not tokens:
        raise MissingTokenizerError(f"{source}: no GPT-2 style BPE tokenizer (tokenizer.ggml.*)")
    types = field_of("tokenizer.ggml.token_type") or [1] * len(tokens)
    try:
        return bpe_tokenizer_json(
            tokens, field_of("tokenizer.ggml.merges") or [],
            [i for i, kind in enumerate(types) if kind == TOKEN_TYPE_CONTROL],
            pre=field_of("tokenizer.ggml.pre") or "default",
            plain_ids=[i for i, kind in enumerate(types) if kind == TOKEN_TYPE_USER_DEFINED])
    except MissingTokenizerError as exc:
        raise MissingTokenizerError(f"{source}: {exc}") from exc


def special_tokens(field_of: Callable[[str], Any], tokens: list[str]
                   ) -> tuple[int | None, tuple[int, ...], dict[str, str]]:
    """(BOS id or None, EOS ids: the EOS then the EOT token when it differs, HF special
    token name -> its text for the BOS/EOS/UNK/PAD ids inside the vocabulary)."""
    bos = field_of("tokenizer.ggml.bos_token_id")
    eos = field_of("tokenizer.ggml.eos_token_id")
    eos_ids = tuple(int(e) for e in ([eos] if eos is not None else []))
    eot = field_of("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos_ids:
        eos_ids += (int(eot),)
    special = {}
    for key, tid in (("bos_token", bos), ("eos_token", eos),
                     ("unk_token", field_of("tokenizer.ggml.unknown_token_id")),
                     ("pad_token", field_of("tokenizer.ggml.padding_token_id"))):
        if tid is not None and 0 <= int(tid) < len(tokens):
            special[key] = tokens[int(tid)]
    return (int(bos) if bos is not None else None), eos_ids, special


def tensor_access(by_hf: Mapping[str, Any], source: str, block_types: tuple[str, ...], *,
                  values: Adjust | None = None, rows: Adjust | None = None
                  ) -> tuple[Callable[[str], np.ndarray], Callable[[str], str | None],
                             Callable[[str], tuple[str, np.ndarray] | None]]:
    """The three tensor readers of a `Checkpoint` (`_read`, `_block_type`, `_read_blocks`)
    over the memory-mapped tensors `by_hf`.

    Args:
        values: adjusts a tensor's dequantized float32 value to HF's convention.
        rows: adjusts a quantized tensor's `[rows, row bytes]` uint8 blocks (whole rows
            only: a block is never decoded).

    The readers: read(name) -> float32 value (dequantized with `gguf.quants`; raises
    MissingTensorError, or UnsupportedTensorError for a type gguf cannot decode);
    block_type(name) -> its type name when in `block_types`, else None;
    read_blocks(name) -> (type name, contiguous uint8 blocks) or None.
    """
    import gguf  # start-up time: 0.25 s to import, needed only when a GGUF is read

    def read(name: str) -> np.ndarray:
        t = by_hf.get(name)
        if t is None:
            raise MissingTensorError(source, name, "no matching GGUF tensor")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise UnsupportedTensorError(
                f"{source}: tensor {name!r} ({t.name}) has unsupported type {t.tensor_type.name}"
            ) from exc
        w = np.asarray(w, dtype=np.float32)
        return values(name, w) if values is not None else w

    def block_type(name: str) -> str | None:
        t = by_hf.get(name)
        if t is None or t.tensor_type.name not in block_types:
            return None
        return t.tensor_type.name

    def read_blocks(name: str) -> tuple[str, np.ndarray] | None:
        kind = block_type(name)
        if kind is None:
            return None
        raw = np.asarray(by_hf[name].data)  # [rows, row bytes] uint8, memory-mapped
        if rows is not None:
            raw = rows(name, raw)
        return kind, np.ascontiguousarray(raw)

    return read, block_type, read_blocks


def gguf_checkpoint(by_hf: Mapping[str, Any], source: str, field_of: Callable[[str], Any],
                    geometry: Any, tokenizer_json: str, block_types: tuple[str, ...], *,
                    chat_template: str | None = None, values: Adjust | None = None,
                    rows: Adjust | None = None) -> Checkpoint:
    """The `Checkpoint` of an opened GGUF, once its reader has the architecture's parts.

    Args:
        by_hf: HF name -> the reader's tensor (``tensors_by_hf``; every name of the
            geometry's ``tensor_shapes`` present: see ``require_tensors``).
        source: the file's path, for messages.
        field_of: metadata key -> value (None when absent).
        geometry: the architecture's geometry (its ``tensor_shapes`` order is the
            checkpoint's ``tensor_names``).
        tokenizer_json: the vocabulary as HF `tokenizers` JSON.
        block_types: the ggml block types a core may keep as they are.
        chat_template: the template, or None for the file's ``tokenizer.chat_template``
            ("" when absent).
        values, rows: the architecture's adjustments (``tensor_access``).
    """
    bos, eos_ids, special = special_tokens(field_of, field_of("tokenizer.ggml.tokens") or [])
    read, block_type, read_blocks = tensor_access(by_hf, source, block_types, values=values,
                                                  rows=rows)
    if chat_template is None:
        chat_template = field_of("tokenizer.chat_template") or ""
    return Checkpoint(
        source=source,
        geometry=geometry,
        tokenizer_json=tokenizer_json,
        chat_template=chat_template,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        special_tokens=special,
        tensor_names=tuple(geometry.tensor_shapes()),
        _read=read,
        _read_blocks=read_blocks,
        _block_type=block_type,
    )
