"""Strict decoding of Helios messages from binary wire bytes and from protobuf JSON.

The Protobuf runtime is lenient in two ways that a signed contract cannot afford
(docs/architecture.md, "The core file"): the binary parser keeps unknown fields, and proto3 enums are open, so any
enum number parses. Both decoders here parse with the runtime and then walk the whole
message tree (nested messages, repeated messages and map values) rejecting:

- any unknown field (binary) or unknown key (JSON) -> ``UnknownFieldError``;
- any enum number or JSON enum name the schema does not define -> ``UnknownEnumError``;
- truncated or corrupt bytes, invalid JSON, duplicate JSON keys, wrongly typed JSON values
  -> ``MalformedMessageError``.

Error paths use the proto field names: ``model.graphs[2].bindings[0].source``;
map entries read ``constants["BLOCK"]``.

A message truncated exactly at a field boundary is itself a valid, shorter message; the
binary format cannot tell it apart. Signed payloads are protected by their signature, not
by this decoder.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from google.protobuf import json_format, unknown_fields
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from helios_contract._gen.helios.v1 import contract_pb2, core_pb2, manifest_pb2
from helios_contract.errors import MalformedMessageError, UnknownEnumError, UnknownFieldError

__all__ = [
    "check_message",
    "decode_core_body",
    "decode_deployment_body",
    "decode_execution_manifest",
    "decode_json",
    "decode_location_set",
    "decode_message",
    "decode_model_index",
    "decode_payload_envelope",
    "decode_protected_index",
    "decode_serving_contract",
    "decode_serving_contract_json",
    "encode_json",
]

M = TypeVar("M", bound=Message)

_ENUM = FieldDescriptor.TYPE_ENUM
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf 7 removed FieldDescriptor.label.
    return bool(field.is_repeated)


def _check_enum(enum: EnumDescriptor, number: int, path: str) -> None:
    if number not in enum.values_by_number:
        raise UnknownEnumError(path, number, f"not a value of enum {enum.full_name}")


# --- binary ----------------------------------------------------------------------------------


def check_message(message: Message, path: str = "") -> None:
    """Walk a parsed message and reject unknown fields and unknown enum numbers anywhere.

    Args:
        message: Any parsed message (binary or JSON origin).
        path: Field path of ``message`` itself, prefixed to every reported path.

    Raises:
        UnknownFieldError: The message tree holds a field number the schema lacks.
        UnknownEnumError: An enum field holds a number its enum lacks.
    """
    unknown = unknown_fields.UnknownFieldSet(message)
    if len(unknown):
        first = unknown[0]
        numbers = sorted({entry.field_number for entry in unknown})
        raise UnknownFieldError(
            _join(path, f"<field {first.field_number}>"),
            first.field_number,
            f"unknown field number(s) {numbers} in {message.DESCRIPTOR.full_name}",
        )
    for field, value in message.ListFields():
        here = _join(path, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            for key in sorted(value):
                item_path = f"{here}[{key!r}]" if isinstance(key, str) else f"{here}[{key}]"
                if value_field.type == _MESSAGE:
                    check_message(value[key], item_path)
                elif value_field.type == _ENUM:
                    _check_enum(value_field.enum_type, value[key], item_path)
        elif field.type == _MESSAGE:
            if _is_repeated(field):
                for index, item in enumerate(value):
                    check_message(item, f"{here}[{index}]")
            else:
                check_message(value, here)
        elif field.type == _ENUM:
            if _is_repeated(field):
                for index, number in enumerate(value):
                    _check_enum(field.enum_type, number, f"{here}[{index}]")
            else:
                _check_enum(field.enum_type, value, here)


def decode_message(cls: type[M], data: bytes) -> M:
    """Decode binary wire bytes into ``cls``, rejecting anything outside the schema.

    Args:
        cls: Generated message class, e.g. ``ServingContract``.
        data: Serialized bytes (``bytes``, ``bytearray`` or ``memoryview``).

    Returns:
        The parsed message.

    Raises:
        MalformedMessageError: Truncated or corrupt bytes (bad wire type, bad length,
            field number 0, invalid UTF-8 in a string).
        UnknownFieldError: An unknown field anywhere in the tree.
        UnknownEnumError: An enum number outside the schema anywhere in the tree.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"decode_message expects bytes, not {type(data).__name__}")
    message = cls()
    try:
        message.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise MalformedMessageError(
            "", f"{len(data)} bytes", f"not a valid {cls.DESCRIPTOR.full_name}: {exc}"
        ) from None
    check_message(message)
    return message


def decode_serving_contract(data: bytes) -> contract_pb2.ServingContract:
    """Strictly decode a ``ServingContract`` (see ``decode_message``)."""
    return decode_message(contract_pb2.ServingContract, data)


def decode_execution_manifest(data: bytes) -> manifest_pb2.ExecutionManifest:
    """Strictly decode an ``ExecutionManifest`` (see ``decode_message``)."""
    return decode_message(manifest_pb2.ExecutionManifest, data)


def decode_deployment_body(data: bytes) -> core_pb2.DeploymentBody:
    """Strictly decode a signed payload's ``DeploymentBody`` (see ``decode_message``)."""
    return decode_message(core_pb2.DeploymentBody, data)


def decode_payload_envelope(data: bytes) -> core_pb2.PayloadEnvelope:
    """Strictly decode a ``PayloadEnvelope`` (see ``decode_message``)."""
    return decode_message(core_pb2.PayloadEnvelope, data)


def decode_core_body(data: bytes) -> core_pb2.CoreBody:
    """Strictly decode a ``CoreBody`` (see ``decode_message``)."""
    return decode_message(core_pb2.CoreBody, data)


def decode_location_set(data: bytes) -> core_pb2.LocationSet:
    """Strictly decode an (unsigned) ``LocationSet`` (see ``decode_message``)."""
    return decode_message(core_pb2.LocationSet, data)


def decode_model_index(data: bytes) -> core_pb2.ModelIndex:
    """Strictly decode a logical-resource core's ``ModelIndex`` (see ``decode_message``)."""
    return decode_message(core_pb2.ModelIndex, data)


def decode_protected_index(data: bytes) -> core_pb2.ProtectedIndex:
    """Strictly decode a ``ProtectedIndex`` (see ``decode_message``)."""
    return decode_message(core_pb2.ProtectedIndex, data)


# --- JSON ------------------------------------------------------------------------------------


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise MalformedMessageError(key, value, "duplicate JSON key")
        out[key] = value
    return out


def _field_for_key(descriptor: Descriptor, key: str) -> FieldDescriptor | None:
    field = descriptor.fields_by_name.get(key)
    if field is not None:
        return field
    for candidate in descriptor.fields:
        if candidate.json_name == key:
            return candidate
    return None


def _check_json_enum(enum: EnumDescriptor, value: Any, path: str) -> None:
    if value is None:
        return
    if isinstance(value, bool):
        raise MalformedMessageError(path, value, f"not a value of enum {enum.full_name}")
    if isinstance(value, str):
        if value not in enum.values_by_name:
            raise UnknownEnumError(path, value, f"not a name of enum {enum.full_name}")
    elif isinstance(value, int):
        _check_enum(enum, value, path)
    # Other types: json_format reports them as malformed below.


def _check_json_value(field: FieldDescriptor, value: Any, path: str) -> None:
    if field.type == _MESSAGE:
        if isinstance(value, dict):
            _check_json_object(field.message_type, value, path)
    elif field.type == _ENUM:
        _check_json_enum(field.enum_type, value, path)


def _check_json_object(descriptor: Descriptor, obj: dict[str, Any], path: str) -> None:
    for key, value in obj.items():
        field = _field_for_key(descriptor, key)
        if field is None:
            raise UnknownFieldError(
                _join(path, key), key, f"unknown JSON key in {descriptor.full_name}"
            )
        here = _join(path, field.name)
        if _is_map(field):
            if isinstance(value, dict):
                value_field = field.message_type.fields_by_name["value"]
                for map_key, item in value.items():
                    _check_json_value(value_field, item, f"{here}[{map_key!r}]")
        elif _is_repeated(field):
            if isinstance(value, list):
                for index, item in enumerate(value):
                    _check_json_value(field, item, f"{here}[{index}]")
        else:
            _check_json_value(field, value, here)


def decode_json(cls: type[M], text: str | bytes) -> M:
    """Load protobuf-JSON text into ``cls``, rejecting anything outside the schema.

    Both the proto field names and their lowerCamelCase JSON names are accepted as keys
    (the protobuf JSON mapping); enum values may be names or numbers, and both must be
    defined by the schema.

    Args:
        cls: Generated message class.
        text: JSON document (one object).

    Returns:
        The parsed message.

    Raises:
        UnknownFieldError: A key that names no field.
        UnknownEnumError: An enum name or number outside the schema.
        MalformedMessageError: Bytes that are not UTF-8 (RFC 8259 §8.1), invalid JSON, a
            duplicate key, or a value of the wrong type.
    """
    if isinstance(text, bytes | bytearray | memoryview):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessageError("", f"byte {exc.start}",
                                        f"JSON text is not UTF-8: {exc.reason}") from None
    try:
        document = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as exc:
        raise MalformedMessageError("", f"line {exc.lineno} column {exc.colno}",
                                    f"invalid JSON: {exc.msg}") from None
    if not isinstance(document, dict):
        raise MalformedMessageError("", type(document).__name__, "expected a JSON object")
    _check_json_object(cls.DESCRIPTOR, document, "")
    message = cls()
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise MalformedMessageError(
            "", detail=f"not a valid {cls.DESCRIPTOR.full_name}: {exc}"
        ) from None
    check_message(message)
    return message


def decode_serving_contract_json(text: str | bytes) -> contract_pb2.ServingContract:
    """Strictly load a ``ServingContract`` from protobuf JSON (see ``decode_json``)."""
    return decode_json(contract_pb2.ServingContract, text)


def encode_json(message: Message) -> str:
    """Write ``message`` as protobuf JSON with proto field names, omitting default values.

    ``decode_json(type(message), encode_json(message)) == message`` for every message the
    strict decoders accept.
    """
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=2)
