"""Strict binary and JSON decoding: exact error class, field path and value."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format
from helios_contract import (
    CoreBody,
    DeploymentBody,
    ExecutionManifest,
    LocationSet,
    MalformedMessageError,
    ModelIndex,
    PayloadEnvelope,
    ProtectedIndex,
    ServingContract,
    UnknownEnumError,
    UnknownFieldError,
    ValueBinding,
    decode_core_body,
    decode_deployment_body,
    decode_execution_manifest,
    decode_json,
    decode_location_set,
    decode_message,
    decode_model_index,
    decode_payload_envelope,
    decode_protected_index,
    decode_serving_contract,
    decode_serving_contract_json,
    encode_json,
)

from tests.contract.example import (
    add_speculative,
    add_tuning,
    example_contract,
    example_deployment_body,
    example_manifest,
)

# Field 99, wire type 0 (varint), value 1: a field no message of the schema defines.
UNKNOWN_VARINT = b"\x98\x06\x01"  # tag 99 << 3 | 0 = 792 -> varint 0x98 0x06; value 1


def _with_unknown(message):
    """A copy of ``message`` carrying unknown field 99 (as a newer writer would emit)."""
    out = type(message)()
    out.ParseFromString(message.SerializeToString() + UNKNOWN_VARINT)
    return out


def _full_contract() -> ServingContract:
    serving, manifest = example_contract(), example_manifest()
    add_speculative(serving, manifest, confidence=True)
    add_tuning(serving, manifest)
    return serving


# --- binary ----------------------------------------------------------------------------------


def test_binary_round_trip_accepts_example():
    body = example_deployment_body()
    assert decode_deployment_body(body.SerializeToString()) == body


def test_unknown_field_top_level():
    data = example_contract().SerializeToString() + UNKNOWN_VARINT
    with pytest.raises(UnknownFieldError) as info:
        decode_serving_contract(data)
    assert type(info.value) is UnknownFieldError
    assert info.value.path == "<field 99>"
    assert info.value.value == 99


def test_unknown_field_nested_deep():
    serving = example_contract()
    graph = serving.model.graphs[1]
    graph.bindings[0].CopyFrom(_with_unknown(graph.bindings[0]))
    data = serving.SerializeToString()
    with pytest.raises(UnknownFieldError) as info:
        decode_serving_contract(data)
    assert info.value.path == "model.graphs[1].bindings[0].<field 99>"
    assert "helios.v1.ValueBinding" in str(info.value)


def test_unknown_field_inside_repeated_message_of_manifest():
    manifest = example_manifest()
    launch = manifest.graphs[0].launches[2]
    launch.args[1].CopyFrom(_with_unknown(launch.args[1]))
    with pytest.raises(UnknownFieldError) as info:
        decode_execution_manifest(manifest.SerializeToString())
    assert info.value.path == "graphs[0].launches[2].args[1].<field 99>"


def test_unknown_field_in_deployment_body_contract():
    body = example_deployment_body()
    body.contract.model.cache.CopyFrom(_with_unknown(body.contract.model.cache))
    with pytest.raises(UnknownFieldError) as info:
        decode_deployment_body(body.SerializeToString())
    assert info.value.path == "contract.model.cache.<field 99>"


def test_unknown_enum_number():
    serving = example_contract()
    serving.model.graphs[1].bindings[0].source = 999  # proto3 enums are open in memory
    data = serving.SerializeToString()
    with pytest.raises(UnknownEnumError) as info:
        decode_serving_contract(data)
    assert type(info.value) is UnknownEnumError
    assert info.value.path == "model.graphs[1].bindings[0].source"
    assert info.value.value == 999
    assert "helios.v1.ValueSource" in str(info.value)


def test_unknown_enum_number_in_frontend():
    serving = example_contract()
    serving.model.frontend.tool_parser = 42
    with pytest.raises(UnknownEnumError) as info:
        decode_serving_contract(serving.SerializeToString())
    assert info.value.path == "model.frontend.tool_parser"
    assert info.value.value == 42


def test_unknown_enum_number_in_manifest_buffer():
    manifest = example_manifest()
    manifest.buffers[3].dtype = 77
    with pytest.raises(UnknownEnumError) as info:
        decode_execution_manifest(manifest.SerializeToString())
    assert info.value.path == "buffers[3].dtype"


def test_truncated_message():
    data = example_contract().SerializeToString()
    # `model` (field 13) is serialized last and spans most bytes: cutting inside it leaves a
    # length prefix longer than the rest.
    with pytest.raises(MalformedMessageError) as info:
        decode_serving_contract(data[: len(data) // 2])
    assert type(info.value) is MalformedMessageError
    assert info.value.path == ""
    assert "helios.v1.ServingContract" in str(info.value)


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff\xff",  # unterminated varint tag
        b"\x00\x01",  # field number 0
        b"\x0f\x00",  # field 1 with invalid wire type 7
        b"\x0a\x05ab",  # field 1 (served_id) declares 5 bytes, 2 follow
        b"\x0a\x02\xff\xfe",  # served_id is not UTF-8
    ],
    ids=["varint", "field-zero", "wire-type-7", "short-length", "bad-utf8"],
)
def test_malformed_bytes(data):
    with pytest.raises(MalformedMessageError):
        decode_serving_contract(data)


def test_decode_requires_bytes():
    with pytest.raises(TypeError):
        decode_message(ServingContract, "not bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("decode", "make"),
    [
        (decode_serving_contract, example_contract),
        (decode_execution_manifest, example_manifest),
        (decode_deployment_body, example_deployment_body),
        (decode_payload_envelope, lambda: PayloadEnvelope(payload=b"x", payload_type="t",
                                                          key_id="k", signature=b"s")),
        (decode_core_body, lambda: CoreBody(format_version=2)),
        (decode_location_set, lambda: LocationSet()),
        (decode_model_index, lambda: ModelIndex(contract=example_contract())),
        (decode_protected_index, lambda: ProtectedIndex(version=6)),
    ],
)
def test_named_decoders_round_trip_and_reject_unknown(decode, make):
    message = make()
    assert decode(message.SerializeToString()) == message
    assert type(decode(message.SerializeToString())) is type(message)
    with pytest.raises(UnknownFieldError):
        decode(message.SerializeToString() + UNKNOWN_VARINT)


# --- JSON ------------------------------------------------------------------------------------


def test_json_round_trip_is_lossless():
    serving = _full_contract()
    text = encode_json(serving)
    assert decode_serving_contract_json(text) == serving
    # Binary of the reloaded message equals binary of the original, byte for byte.
    assert decode_serving_contract_json(text).SerializeToString(deterministic=True) == \
        serving.SerializeToString(deterministic=True)


def test_json_round_trip_of_deployment_body():
    body = example_deployment_body()
    assert decode_json(DeploymentBody, encode_json(body)) == body


def test_json_accepts_camel_case_names_and_enum_numbers():
    serving = example_contract()
    text = json_format.MessageToJson(serving, use_integers_for_enums=True)
    assert "servedId" in text
    assert decode_serving_contract_json(text) == serving


def _document() -> dict:
    return json.loads(encode_json(example_contract()))


def test_json_unknown_key_top_level():
    doc = _document()
    doc["served_model"] = "x"
    with pytest.raises(UnknownFieldError) as info:
        decode_serving_contract_json(json.dumps(doc))
    assert info.value.path == "served_model"
    assert info.value.value == "served_model"


def test_json_unknown_key_nested():
    doc = _document()
    doc["model"]["graphs"][1]["bindings"][0]["sauce"] = 1
    with pytest.raises(UnknownFieldError) as info:
        decode_serving_contract_json(json.dumps(doc))
    assert type(info.value) is UnknownFieldError
    assert info.value.path == "model.graphs[1].bindings[0].sauce"


def test_json_unknown_enum_name():
    doc = _document()
    doc["model"]["graphs"][1]["bindings"][0]["source"] = "VALUE_SOURCE_TELEPATHY"
    with pytest.raises(UnknownEnumError) as info:
        decode_serving_contract_json(json.dumps(doc))
    assert type(info.value) is UnknownEnumError
    assert info.value.path == "model.graphs[1].bindings[0].source"
    assert info.value.value == "VALUE_SOURCE_TELEPATHY"


@pytest.mark.parametrize(("data", "value"), [
    (b'{"served_id": "caf\xe9"}', "byte 18"),  # Latin-1, not UTF-8
    (b'{"served_id": "\xed\xa0\x80"}', "byte 15"),  # an encoded surrogate
    ('{"served_id": "x"}'.encode("utf-16"), "byte 0"),  # RFC 8259: JSON text is UTF-8
])
def test_json_bytes_that_are_not_utf8(data, value):
    with pytest.raises(MalformedMessageError) as info:
        decode_serving_contract_json(data)
    assert info.value.path == "" and info.value.value == value
    assert "JSON text is not UTF-8" in str(info.value)


def test_json_utf8_bytes_decode_like_text():
    text = encode_json(example_contract())
    assert decode_serving_contract_json(text.encode()) == decode_serving_contract_json(text)
    with pytest.raises(MalformedMessageError, match="invalid JSON"):
        decode_serving_contract_json(b"\xef\xbb\xbf" + text.encode())  # a byte order mark


def test_json_unknown_enum_number():
    doc = _document()
    doc["model"]["frontend"]["reasoning_parser"] = 12
    with pytest.raises(UnknownEnumError) as info:
        decode_serving_contract_json(json.dumps(doc))
    assert info.value.path == "model.frontend.reasoning_parser"
    assert info.value.value == 12


def test_json_unknown_enum_in_manifest():
    doc = json.loads(encode_json(example_manifest()))
    doc["buffers"][0]["role"] = "BUFFER_ROLE_MAGIC"
    with pytest.raises(UnknownEnumError) as info:
        decode_json(ExecutionManifest, json.dumps(doc))
    assert info.value.path == "buffers[0].role"


@pytest.mark.parametrize(
    "text",
    [
        '{"served_id": "a", "served_id": "b"}',  # duplicate key
        '{"context_tokens": "many"}',  # wrong type
        '{"model": [1]}',  # message given as a list
        '{"model": ',  # invalid JSON
        "[1, 2]",  # not an object
        '{"model": {"graphs": [{"operation": true}]}}',  # bool for an enum
    ],
    ids=["duplicate", "wrong-type", "list-for-message", "invalid", "not-object", "bool-enum"],
)
def test_json_malformed(text):
    with pytest.raises(MalformedMessageError):
        decode_serving_contract_json(text)


def test_json_rejects_unknown_field_of_decode_json_generic():
    with pytest.raises(UnknownFieldError) as info:
        decode_json(ValueBinding, '{"destination": "x", "sourcee": 1}')
    assert info.value.path == "sourcee"
