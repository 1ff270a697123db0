"""Tool-call format specs: the single source of truth for every wire format.

Knows: each format's markers (typed per family), special tokens, how arguments are
encoded, the trigger that opens a call block, the chat framing it belongs to, its
reasoning markers, its quick-instruction heads and the form of its own call ids. One
module per format family, named after it: dsml.py (dsml-v3.2, dsml-v4), qwen3_xml.py,
hermes.py (hermes, hermes-qwen2.5), llama3_json.py, mistral.py; spec.py holds what they
share. Does not know: how to render, parse or constrain (templates/, parsers/,
constraints/ derive all of that from these specs, so the three cannot drift apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from callgate.formats.dsml import DSML_V4, DSML_V32, DsmlMarkers, DsmlV4Markers, DsmlV32Markers
from callgate.formats.hermes import HERMES, HERMES_QWEN25, QWEN3_FRAMING, QWEN25_FRAMING, HermesMarkers
from callgate.formats.json_family import JsonMarkers, json_markers
from callgate.formats.llama3_json import LLAMA3_JSON, Llama3Markers, ToolsPosition
from callgate.formats.mistral import MISTRAL, MistralMarkers
from callgate.formats.quick_tasks import TEXT_QUICK_TASKS
from callgate.formats.qwen3_xml import QWEN3_XML, Qwen3XmlMarkers
from callgate.formats.spec import ArgumentEncoding, CallIdForm, Family, FormatMarkers, ToolCallFormat, call_id_pattern

__all__ = [
    "DSML_V4",
    "DSML_V32",
    "FORMATS",
    "HERMES",
    "HERMES_QWEN25",
    "LLAMA3_JSON",
    "MISTRAL",
    "QWEN3_FRAMING",
    "QWEN3_XML",
    "QWEN25_FRAMING",
    "TEXT_QUICK_TASKS",
    "ArgumentEncoding",
    "CallIdForm",
    "DsmlMarkers",
    "DsmlV4Markers",
    "DsmlV32Markers",
    "Family",
    "FormatMarkers",
    "HermesMarkers",
    "JsonMarkers",
    "Llama3Markers",
    "MistralMarkers",
    "Qwen3XmlMarkers",
    "ToolCallFormat",
    "ToolsPosition",
    "call_id_pattern",
    "get_format",
    "json_markers",
]

FORMATS: Mapping[str, ToolCallFormat] = MappingProxyType(
    {f.name: f for f in (DSML_V32, DSML_V4, QWEN3_XML, HERMES, HERMES_QWEN25, LLAMA3_JSON, MISTRAL)}
)


def get_format(name: str) -> ToolCallFormat:
    """The spec for `name`; raises KeyError naming the known formats."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; known: {', '.join(FORMATS)}") from None
