"""Load a HF safetensors checkpoint directory as a `Checkpoint` (`SUPPORTED_HF_ARCHITECTURES`:
Llama, Qwen3, Qwen3-MoE, Gemma 3 text; Idefics3 with a Llama text model).

Expected files: `config.json`, `model.safetensors` or shards `model-*.safetensors`,
`tokenizer.json`, and a chat template in `tokenizer_config.json["chat_template"]` or
`chat_template.jinja`. Tensors are read one at a time with `safe_open(framework="numpy")`;
BF16 has no NumPy dtype, so BF16 tensors are read as raw uint16 from the file (offsets from
the safetensors header) and widened exactly: float32 bits = bf16 bits << 16. FP8
checkpoints (F8_E4M3 weights with their `weight_scale`, HF compressed-tensors / FBGEMM
layouts) read as their codes times their scales; `Checkpoint.fp8` hands the codes and
scales over as stored (`ignition export --quantize fp8` keeps them). 4-bit AWQ and GPTQ
checkpoints (`X.qweight`, `X.qzeros`, `X.scales`, GPTQ's `X.g_idx`; the format from
config.json's `quantization_config.quant_method`) read as their dequantized weights;
`Checkpoint.int4` hands the codes over repacked into helios_tools.kernels.int4's layout
(`ignition export --quantize int4` keeps them, never through floats).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from helios_tools.kernels.fp8 import dequantize_rows
from helios_tools.kernels.int4 import dequantize_int4, pack_int4
from safetensors import safe_open

from .checkpoint import Checkpoint
from .errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    GeometryError,
    MissingChatTemplateError,
    MissingTensorError,
    MissingTokenizerError,
    UnsupportedTensorError,
)
from .gemma3 import HF_ARCHITECTURE as GEMMA3_ARCHITECTURE
from .gemma3 import Gemma3Geometry, gemma3_hf_geometry
from .geometry import VISION_PREFIX, LlamaGeometry, VisionGeometry
from .qwen3 import QWEN3_ARCHITECTURES, qwen3_geometry

_FLOAT_DTYPES = {"F32", "F16", "F64", "BF16"}
PATCH_WEIGHT = VISION_PREFIX + "embeddings.patch_embedding.weight"


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bits (uint16, any shape) to float32 exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1}
# FP8 weights (HF compressed-tensors "float-quantized" and FBGEMM FP8 checkpoints): the
# weight `X.weight` in F8_E4M3 and its scale `X.weight_scale` (F32 or BF16; [rows, 1] per
# output channel, or one value per tensor). Activation scales (`input_scale`,
# `input_scale_ub`) are not read: activations are quantized per token when served.
FP8_DTYPE = "F8_E4M3"
FP8_SCALE_SUFFIX = "_scale"
# The compressed-tensors schemes read: 8-bit float weights ("float-quantized", or
# "naive-quantized", which stores the same codes) per output channel or per tensor. Its
# other schemes (int4 "pack-quantized", int8 "int-quantized", block- or group-wise FP8,
# FP4) store other tensors or other scales: refused by their config group.
CT_FORMATS = ("float-quantized", "naive-quantized")
CT_STRATEGIES = ("channel", "tensor")


def _check_compressed_tensors(quant: dict[str, Any], source: str) -> None:
    """Raise UnsupportedTensorError for a compressed-tensors config group whose weights
    are not FP8 per channel or per tensor."""
    for name, group in (quant.get("config_groups") or {}).items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not weights:  # activations only: the weights stay float
            continue
        fmt = group.get("format") or quant.get("format")
        kind, bits, strategy = weights.get("type"), weights.get("num_bits"), \
            weights.get("strategy")
        if fmt not in CT_FORMATS or (kind, bits) != ("float", 8) or \
                strategy not in CT_STRATEGIES:
            raise UnsupportedTensorError(
                f"{source}: config.json's quantization_config group {name!r} is {fmt} "
                f"{kind}{bits} weights by {strategy}; the compressed-tensors scheme read is "
                "float8 weights by channel or tensor (float-quantized)")


# 4-bit weight-only checkpoints: X.weight is stored as X.qweight (int32, eight codes each),
# X.qzeros (int32, eight zero points each) and X.scales (F16 [in / group, out]).
# AWQ (GEMM layout): qweight [in, out / 8], codes of eight output columns per int32 in the
# order AWQ_ORDER (nibble i holds column 8c + AWQ_ORDER[i]); qzeros [in / group, out / 8]
# the same way. GPTQ: qweight [in / 8, out], nibble i of row r holds input row 8r + i;
# qzeros [in / group, out / 8] sequential along out, storing zero - 1 unless the
# checkpoint_format is "gptq_v2"; g_idx [in] must be i // group (no act-order permutation).
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
INT4_PARTS = (".qweight", ".qzeros", ".scales")
# The packed layouts read, by the quantization_config key that names them (its value when
# the key is absent first): AutoAWQ's GEMM (its GEMV layouts pack along the other axis),
# GPTQ's continuous v1 and v2 (GPTQModel's planar "gptq_p", "marlin", "bitblas", ... use
# the same tensor names with other bit layouts, so the key is checked, not the names).
INT4_LAYOUTS = {"awq": ("version", ("gemm",)), "gptq": ("checkpoint_format", ("gptq", "gptq_v2"))}


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """int32 [..., C] -> uint8 [..., C, 8]: nibble i (bits 4i..4i+3) of each word."""
    words = packed.astype(np.int64) & 0xFFFFFFFF
    return ((words[..., None] >> (4 * np.arange(8))) & 0xF).astype(np.uint8)


def awq_codes(qweight: np.ndarray, qzeros: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AWQ GEMM qweight [in, out / 8] and qzeros [G, out / 8] (int32) -> codes [in, out]
    and zero points [G, out] (uint8, 0..15) in column order."""
    order = np.argsort(AWQ_ORDER)  # column 8c + j sits in nibble order[j]

    def unpack(q):
        return _nibbles(q)[..., order].reshape(q.shape[0], -1)

    return unpack(qweight), unpack(qzeros)


def gptq_codes(qweight: np.ndarray, qzeros: np.ndarray, v2: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ qweight [in / 8, out] and qzeros [G, out / 8] (int32) -> codes [in, out] and
    zero points [G, out] (0..15; v1 stores zero - 1, so 1 is added unless `v2`)."""
    codes = np.moveaxis(_nibbles(qweight), -1, 1).reshape(-1, qweight.shape[1])
    zeros = _nibbles(qzeros).reshape(qzeros.shape[0], -1).astype(np.int16)
    return codes, (zeros if v2 else (zeros + 1) & 0xF).astype(np.uint8)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"{path}: not valid JSON: {exc}") from exc


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    """(header dict, byte offset where tensor data starts) of a safetensors file.

    Every tensor's extent is checked against the file size and its dtype and shape here,
    so a truncated or inconsistent file fails at load, naming the file and the tensor.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"header length {n} exceeds the file")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"{path}: not a safetensors file: {exc}") from exc
    data_bytes = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            want = count * _DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointFormatError(f"{path}: tensor {name!r} has a bad header entry") from exc
        if end > data_bytes or end - begin != want or begin < 0:
            raise CheckpointFormatError(
                f"{path}: tensor {name!r} spans bytes [{begin}, {end}) of {data_bytes} "
                f"data bytes, expected {want} bytes (truncated or corrupt file)"
            )
    return header, 8 + n


# HF architectures of families whose geometry has its own reader (Llama's is below).
ARCHITECTURE_GEOMETRY = {**{arch: qwen3_geometry for arch in QWEN3_ARCHITECTURES},
                         GEMMA3_ARCHITECTURE: gemma3_hf_geometry}
# Architectures refused with their own reason rather than the supported list alone.
REFUSED_HF_ARCHITECTURES = {
    "Gemma3ForConditionalGeneration": "Gemma 3 with its vision tower is not supported; "
                                      "only the text model (Gemma3ForCausalLM)",
}
# config.json `architectures` this loader reads.
SUPPORTED_HF_ARCHITECTURES = ("LlamaForCausalLM", *ARCHITECTURE_GEOMETRY)


def _vision_geometry(config: dict[str, Any], text: LlamaGeometry, source: str
                     ) -> VisionGeometry:  # fmt: skip
    """An Idefics3 config's vision tower (``vision_config``, ``scale_factor``)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        raise GeometryError(f"{source}/config.json: an idefics3 config has a vision_config")
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise GeometryError(f"{source}/config.json: vision hidden_act {act!r} is not the tanh "
                            "GELU this family captures")
    try:
        return VisionGeometry(
            hidden_size=int(vision["hidden_size"]),
            intermediate_size=int(vision["intermediate_size"]),
            num_layers=int(vision["num_hidden_layers"]),
            num_heads=int(vision["num_attention_heads"]),
            image_size=int(vision["image_size"]), patch_size=int(vision["patch_size"]),
            layer_norm_eps=float(vision.get("layer_norm_eps", 1e-6)),
            scale_factor=int(config.get("scale_factor", 2)), text_hidden=text.hidden_size)
    except KeyError as exc:
        raise GeometryError(f"{source}/config.json: vision_config lacks {exc.args[0]!r}") from exc


# config.json keys the families read as counts and as positive reals: a value of another
# JSON type would otherwise be coerced (int("64"), int(4.5) == 4) or fail deep in a reader.
# Absent or null keys are the readers' business (defaults, or "missing key").
_COUNT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim",
               "max_position_embeddings", "num_experts", "num_local_experts",
               "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
               "sliding_window_pattern", "scale_factor")
_REAL_KEYS = ("rope_theta", "rms_norm_eps", "query_pre_attn_scalar", "rope_local_base_freq")


def _check_config_types(config: dict[str, Any], where: str) -> None:
    """Refuse a config.json value of the wrong JSON type, naming its key.

    Raises:
        GeometryError: `architectures` is not a list of strings, a count key
            (`_COUNT_KEYS`) is not a positive JSON integer, or a real key (`_REAL_KEYS`) is
            not a positive finite JSON number.
    """
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        raise GeometryError(f"{where}: architectures must be a list of strings, not {archs!r}")
    for key in _COUNT_KEYS:
        value = config.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise GeometryError(f"{where}: {key} must be a positive integer, not {value!r}")
    for key in _REAL_KEYS:
        value = config.get(key)
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value)
                                  or value <= 0):
            raise GeometryError(f"{where}: {key} must be a positive number, not {value!r}")


def _geometry(config: dict[str, Any], source: str) -> LlamaGeometry | Gemma3Geometry:
    """The geometry config.json declares, read by its architecture's reader.

    Raises:
        GeometryError: a value of the wrong type (`_check_config_types`; a null where a
            number is needed), a missing key, an unsupported architecture, or what the
            family's reader refuses.
    """
    where = f"{source}/config.json"
    _check_config_types(config, where)
    try:
        return _read_geometry(config, source)
    except (TypeError, ValueError) as exc:  # a null or nested value of the wrong type
        raise GeometryError(f"{where}: a value is not a number: {exc}") from exc


def _read_geometry(config: dict[str, Any], source: str) -> LlamaGeometry | Gemma3Geometry:
    if config.get("model_type") == "idefics3":  # a Llama text model beside a vision tower
        text_config = config.get("text_config")
        if not isinstance(text_config, dict):
            raise GeometryError(f"{source}/config.json: an idefics3 config has a text_config")
        text = _geometry({"tie_word_embeddings": config.get("tie_word_embeddings", False),
                          **text_config, "model_type": "llama"}, source)
        return replace(text, vision=_vision_geometry(config, text, source))
    archs = config.get("architectures") or []
    model_type = config.get("model_type")
    reader = next((ARCHITECTURE_GEOMETRY[a] for a in archs if a in ARCHITECTURE_GEOMETRY), None)
    if reader is not None:
        return reader(config, source)
    refused = next((a for a in archs if a in REFUSED_HF_ARCHITECTURES), None)
    if refused is not None:
        raise GeometryError(f"{source}: architecture {refused!r}: "
                            f"{REFUSED_HF_ARCHITECTURES[refused]}")
    if "LlamaForCausalLM" not in archs and (archs or model_type not in (None, "llama")):
        name = archs[0] if archs else model_type
        raise GeometryError(f"{source}: architecture {name!r} is not supported; supported: "
                            f"{', '.join(SUPPORTED_HF_ARCHITECTURES)}")
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return LlamaGeometry(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            # transformers 5 writes rope_parameters; earlier versions rope_theta
            rope_theta=float(config.get("rope_theta") or
                             (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rms_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_context=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_scaling=dict(config["rope_scaling"]) if config.get("rope_scaling") else None,
        )
    except KeyError as exc:
        raise GeometryError(f"{source}/config.json: missing key {exc.args[0]!r}") from exc


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: Path, tok_config: dict[str, Any]) -> str:
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return template
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    raise MissingChatTemplateError(
        f"{folder}: no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)"
    )


def load_safetensors_dir(folder: str | Path) -> Checkpoint:
    """Open a HF-layout safetensors directory; tensors are read lazily, one per call.

    Raises:
        CheckpointNotFoundError: no directory, no config.json, or no *.safetensors file.
        CheckpointFormatError: a JSON file does not parse, or a safetensors file is
            truncated or corrupt (names the file and tensor).
        GeometryError: config.json lacks a required key, declares what its family does
            not capture, or names an architecture not in SUPPORTED_HF_ARCHITECTURES.
        MissingTokenizerError: no tokenizer.json.
        MissingChatTemplateError: no chat template.
        MissingTensorError: a tensor the geometry needs is in no shard.
        UnsupportedTensorError: a tensor has a non-float dtype.
    """
    folder = Path(folder)
    source = str(folder)
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: no such directory")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointNotFoundError(f"{folder}: no config.json")
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise CheckpointFormatError(f"{config_path}: not a JSON object")
    geometry = _geometry(config, source)

    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise CheckpointNotFoundError(f"{folder}: no *.safetensors files")
    # HF name -> (shard path, dtype, shape, absolute data offset, nbytes)
    where: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
    for shard in shards:
        header, data_start = _read_header(shard)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            where[name] = (shard, info["dtype"], tuple(info["shape"]), data_start + begin,
                           end - begin)
    names = tuple(geometry.tensor_shapes())
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        _check_compressed_tensors(quant, source)
    int4_names: set[str] = set()
    for name in names:
        if geometry.vision is not None and name.startswith("model.") and \
                not name.startswith((VISION_PREFIX, "model.connector.")):
            name = "model.text_model." + name[len("model."):]
        prefix = name.removesuffix(".weight")
        if name not in where and prefix + ".qweight" in where:
            if method not in ("awq", "gptq") or int(quant.get("bits", 4)) != 4:
                raise UnsupportedTensorError(
                    f"{folder}: {prefix}.qweight is 4-bit packed but config.json's "
                    f"quantization_config is {method or 'absent'!r} with bits "
                    f"{quant.get('bits')}; only 4-bit awq and gptq are read")
            key, layouts = INT4_LAYOUTS[method]
            layout = str(quant.get(key, layouts[0])).lower()
            if layout not in layouts:
                raise UnsupportedTensorError(
                    f"{folder}: config.json's quantization_config {key} is {layout!r}; the "
                    f"{method} layouts read are {', '.join(repr(x) for x in layouts)}")
            for part in INT4_PARTS:
                if prefix + part not in where:
                    raise MissingTensorError(source, prefix + part,
                                             f"(part of the {method} weight {name!r})")
            int4_names.add(name)
            continue
        if name not in where:
            raise MissingTensorError(source, name, f"in none of {[s.name for s in shards]}")

    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise MissingTokenizerError(f"{folder}: no tokenizer.json")
    tokenizer_json = tokenizer_path.read_text(encoding="utf-8")
    tok_config_path = folder / "tokenizer_config.json"
    tok_config = _read_json(tok_config_path) if tok_config_path.is_file() else {}
    chat_template = _chat_template(folder, tok_config)

    vocab_ids = _token_ids(tokenizer_json, tokenizer_path)
    special = {
        key: text for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        if (text := _token_text(tok_config.get(key))) is not None
    }
    eos_ids = _eos_ids(folder, config, special, vocab_ids)
    bos = config.get("bos_token_id")
    if bos is None and "bos_token" in special:
        bos = vocab_ids.get(special["bos_token"])

    def read(name: str) -> np.ndarray:
        if geometry.vision is not None:  # Idefics3 nests the text model's tensors
            if name == PATCH_WEIGHT:
                return read_raw(name).reshape(geometry.vision.hidden_size, -1)
            if name.startswith("model.") and not name.startswith((VISION_PREFIX,
                                                                  "model.connector.")):
                return read_raw("model.text_model." + name[len("model."):])
        return read_raw(name)

    def read_raw(name: str) -> np.ndarray:
        entry = where.get(name) or where.get(name.removesuffix(".weight") + ".qweight")
        if entry is None:
            raise MissingTensorError(source, name)
        shard, dtype, shape, offset, nbytes = entry
        if name in int4_names:  # the 4-bit checkpoint's weight, (code - zero) * scale
            return dequantize_int4(*read_int4(name))
        if dtype == FP8_DTYPE:  # codes x their scales: the weight the FP8 checkpoint means
            codes, scales = read_fp8(name)
            return dequantize_rows(codes, scales).reshape(shape)
        if dtype not in _FLOAT_DTYPES:
            raise UnsupportedTensorError(f"{shard}: tensor {name!r} has dtype {dtype}")
        if dtype == "BF16":
            bits = np.fromfile(shard, dtype="<u2", count=nbytes // 2, offset=offset)
            return bf16_to_float32(bits).reshape(shape)
        try:
            with safe_open(str(shard), framework="numpy") as f:
                return np.asarray(f.get_tensor(name), dtype=np.float32)
        except Exception as exc:  # SafetensorError comes from Rust as a bare Exception
            raise CheckpointFormatError(f"{shard}: cannot read tensor {name!r}: {exc}") from exc

    def read_fp8(name: str) -> tuple[np.ndarray, np.ndarray]:
        shard, _, shape, offset, nbytes = where[name]
        if len(shape) != 2:
            raise UnsupportedTensorError(f"{shard}: FP8 tensor {name!r} has shape "
                                         f"{list(shape)}; FP8 weights are matrices")
        scale_name = name + FP8_SCALE_SUFFIX
        if scale_name not in where:
            raise MissingTensorError(source, scale_name, f"(the scale of FP8 tensor {name!r})")
        scale = read_raw(scale_name).astype(np.float32)
        rows = shape[0]
        if scale.size == 1:  # per tensor
            scale = np.full((rows, 1), scale.reshape(()), np.float32)
        elif scale.shape in ((rows,), (rows, 1)):  # per output channel
            # by shape, not size: a block-wise scale [rows / b, K / b] can hold `rows`
            # values too (K = b * b), and read per channel it would be silently wrong
            scale = scale.reshape(rows, 1)
        else:
            raise UnsupportedTensorError(
                f"{shard}: {scale_name!r} has shape {list(scale.shape)}; FP8 scales are one "
                f"per tensor or one per output channel ({rows}), not per block")
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise CheckpointFormatError(f"{shard}: {scale_name!r} holds a scale that is not "
                                        "a positive finite number")
        codes = np.fromfile(shard, dtype=np.uint8, count=nbytes, offset=offset).reshape(shape)
        return codes, scale

    def read_int_tensor(name: str) -> np.ndarray:
        shard, dtype, shape, offset, nbytes = where[name]
        if dtype != "I32":
            raise UnsupportedTensorError(f"{shard}: {name!r} has dtype {dtype}; packed 4-bit "
                                         "tensors are I32")
        return np.fromfile(shard, dtype="<i4", count=nbytes // 4, offset=offset).reshape(shape)

    def read_int4(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(packed codes [out, in / 2] uint8, scales, zero points [out, in / group] f32)."""
        prefix = name.removesuffix(".weight")
        qweight, qzeros = read_int_tensor(prefix + ".qweight"), read_int_tensor(prefix + ".qzeros")
        scales = read_raw(prefix + ".scales").astype(np.float32)
        if method == "awq":
            codes, zeros = awq_codes(qweight, qzeros)
        else:
            codes, zeros = gptq_codes(qweight, qzeros,
                                      str(quant.get("checkpoint_format")).lower() == "gptq_v2")
        k, n = codes.shape
        if scales.shape[1] != n or zeros.shape != scales.shape or k % scales.shape[0]:
            raise CheckpointFormatError(
                f"{source}: {prefix} has codes [{k}, {n}], scales {list(scales.shape)} and "
                f"zero points {list(zeros.shape)}: not one group layout")
        group = k // scales.shape[0]
        if method == "gptq" and prefix + ".g_idx" in where:
            g_idx = read_int_tensor(prefix + ".g_idx").reshape(-1)
            if not np.array_equal(g_idx, np.arange(k) // group):
                raise UnsupportedTensorError(
                    f"{source}: {prefix}.g_idx permutes the groups (GPTQ act-order / "
                    "desc_act); re-quantize with desc_act=False")
        return (pack_int4(codes.T), np.ascontiguousarray(scales.T),
                np.ascontiguousarray(zeros.T.astype(np.float32)))

    def stored_int4(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        return read_int4(name) if name in int4_names else None

    def stored_fp8(name: str) -> tuple[np.ndarray, np.ndarray] | None:
        if geometry.vision is not None and name.startswith("model.") and \
                not name.startswith((VISION_PREFIX, "model.connector.")):
            name = "model.text_model." + name[len("model."):]
        entry = where.get(name)
        return read_fp8(name) if entry is not None and entry[1] == FP8_DTYPE else None

    return Checkpoint(
        source=source,
        geometry=geometry,
        tokenizer_json=tokenizer_json,
        chat_template=chat_template,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=eos_ids,
        special_tokens=special,
        tensor_names=names,
        _read=read,
        _read_fp8=stored_fp8,
        _read_int4=stored_int4,
    )


def _token_ids(tokenizer_json: str, path: Path) -> dict[str, int]:
    try:
        data = json.loads(tokenizer_json)
        vocab = (data.get("model") or {}).get("vocab") or {}
        ids = dict(vocab) if isinstance(vocab, dict) else {}
        for added in data.get("added_tokens") or []:
            ids[added["content"]] = int(added["id"])
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise CheckpointFormatError(f"{path}: not a valid tokenizer.json: {exc}") from exc
    return ids


def _eos_ids(
    folder: Path, config: dict[str, Any], special: dict[str, str], vocab_ids: dict[str, int]
) -> tuple[int, ...]:
    out: list[int] = []
    gen_path = folder / "generation_config.json"
    sources = [config.get("eos_token_id")]
    if gen_path.is_file():
        gen = _read_json(gen_path)
        sources.insert(0, gen.get("eos_token_id") if isinstance(gen, dict) else None)
    for value in sources:
        for eos in value if isinstance(value, list) else [value]:
            if eos is not None and int(eos) not in out:
                out.append(int(eos))
    if not out and special.get("eos_token") in vocab_ids:
        out.append(vocab_ids[special["eos_token"]])
    return tuple(out)
