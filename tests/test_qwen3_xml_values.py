"""qwen3-xml typed values: declared types in order, strict per type, errors not guesses."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.parsers.qwen3_xml_values import RAW, declared_types, decode, streams_as_text


@pytest.mark.parametrize(
    ("prop", "types"),
    [
        ({"type": "integer"}, ("integer",)),
        ({"type": ["integer", "null"]}, ("integer", "null")),
        ({"anyOf": [{"type": "number"}, {"type": "null"}]}, ("number", "null")),
        ({"oneOf": [{"type": "boolean"}, {"enum": ["a"]}]}, ("boolean", "string")),
        ({"type": "date"}, (RAW,)),
        ({"description": "no type"}, ()),
        (None, ()),
    ],
)
def test_declared_types(prop: Any, types: tuple[str, ...]) -> None:
    assert declared_types(prop) == types


@pytest.mark.parametrize(
    ("text", "types", "value"),
    [
        ("404", ("string",), "404"),
        ("None", ("string", "null"), "None"),
        ("None", ("integer", "null"), None),
        ("null", ("null",), None),
        ("15", ("integer", "null"), 15),
        ("-0", ("integer",), 0),
        ("12345678901234567890", ("integer",), 12345678901234567890),
        ("1e-07", ("number",), 1e-07),
        ("20.0", ("number",), 20.0),
        ("-2.5", ("number",), -2.5),
        ("True", ("boolean",), True),
        ("false", ("boolean",), False),
        ("[1, 2]", ("object", "array"), [1, 2]),
        ('{"a": [true]}', ("object",), {"a": [True]}),
        ("anything <at> all", (), "anything <at> all"),
        ("x", ("integer", RAW), "x"),
    ],
)
def test_decode(text: str, types: tuple[str, ...], value: Any) -> None:
    typed = decode(text, types)
    assert typed.error is None
    assert typed.value == value and type(typed.value) is type(value)


@pytest.mark.parametrize(
    ("text", "types", "code"),
    [
        ("three", ("integer",), "value_type_mismatch"),
        ("1.0", ("integer",), "value_type_mismatch"),
        ("+1", ("integer",), "value_type_mismatch"),
        (".5", ("number",), "value_type_mismatch"),
        ("NaN", ("number",), "value_type_mismatch"),
        ("TRUE", ("boolean",), "value_type_mismatch"),
        ("nil", ("null",), "value_type_mismatch"),
        ("[1]", ("object",), "value_type_mismatch"),
        ("[1,]", ("array",), "invalid_json_value"),
        ("{'a': 1}", ("object",), "invalid_json_value"),
        ("[Infinity]", ("array",), "invalid_json_value"),
        ("oops", ("array", "null"), "value_type_mismatch"),
    ],
)
def test_decode_errors(text: str, types: tuple[str, ...], code: str) -> None:
    typed = decode(text, types)
    assert typed.error == code
    assert typed.expected == " or ".join(types)


def test_only_text_first_types_stream() -> None:
    assert streams_as_text(())
    assert streams_as_text(("string", "null"))
    assert streams_as_text((RAW,))
    assert not streams_as_text(("null", "string"))
