"""The JSON family's markers as one type: what the family's parser and grammars read.

Knows: that hermes, llama3-json and mistral share the call-object keys (`name_key`,
`arguments_key`) and differ in their `call_layout` ("object", "single", "list"), which
tells their markers classes apart. Does not know: the texts (formats/hermes.py,
llama3_json.py, mistral.py).
"""

from __future__ import annotations

from callgate.formats.hermes import HermesMarkers
from callgate.formats.llama3_json import Llama3Markers
from callgate.formats.mistral import MistralMarkers
from callgate.formats.spec import ToolCallFormat

JsonMarkers = HermesMarkers | Llama3Markers | MistralMarkers


def json_markers(fmt: ToolCallFormat) -> JsonMarkers:
    """The markers of a JSON-family spec; TypeError for a spec of another family."""
    m = fmt.markers
    if not isinstance(m, HermesMarkers | Llama3Markers | MistralMarkers):
        raise TypeError(f"{fmt.name}: its markers are {type(m).__name__}, not a JSON family's")
    return m
