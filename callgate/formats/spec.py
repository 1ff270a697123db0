"""What every tool-call format spec is: the fields all families share, and the typed
markers each family adds.

Knows: the shape of a spec (`ToolCallFormat`), the base of every family's markers
(`FormatMarkers`), and the form of model-written call ids (`CallIdForm`).
Does not know: any format's texts (formats/dsml.py, qwen3_xml.py, hermes.py,
llama3_json.py, mistral.py define them), nor how to render, parse or constrain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeVar

Family = Literal["dsml", "qwen3-xml", "json"]
ArgumentEncoding = Literal["dsml-typed", "schema-typed-text", "json"]


@dataclass(frozen=True, slots=True)
class FormatMarkers:
    """The base of a family's markers: a frozen dataclass whose fields are the literal texts
    (block open/close, invoke and parameter tags, ...) that the family's renderer, parser and
    grammar share, read as typed attributes."""

    def named_texts(self) -> tuple[tuple[str, str], ...]:
        """(field name, text) for every text-valued field, in declaration order."""
        pairs = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return tuple((k, v) for k, v in pairs if isinstance(v, str))

    def texts(self) -> tuple[str, ...]:
        """Every text-valued field, in declaration order (injection and fuzz tests insert them)."""
        return tuple(v for _, v in self.named_texts())


@dataclass(frozen=True, slots=True)
class CallIdForm:
    """The one form of call id a format's model writes itself (mistral: 9 letters/digits).

    `pattern` is the same set as a regex (no anchors), spelled for the grammar engines;
    `alphabet` and `length` are what callgate draws fresh ids from."""

    alphabet: str
    length: int
    pattern: str


M = TypeVar("M", bound=FormatMarkers)


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """One wire format.

    `markers` holds the family-specific literal texts, typed per family: read them with
    `markers_as(<the family's markers class>)`, which raises TypeError for a spec of another
    family (a programming error). `special_tokens` lists every text that is a control token
    for the model; text from untrusted sources (tool results, user content) must never produce
    one in a prompt. `call_trigger` is the text whose appearance in free text commits the
    model to a call block (the lazy `auto` grammar starts there). `quick_tasks` maps a
    quick-instruction head to the suffix that asks for it (dsml-v4: the model's own task
    tokens). `call_ids` is the form of the ids the model writes itself, None where it
    writes none (callgate then makes OpenAI-style ids).
    """

    name: str
    family: Family
    framing: str  # chat framing, e.g. "deepseek-v4", "chatml-qwen3", "llama3.1", "mistral-v3-tekken"
    argument_encoding: ArgumentEncoding
    bos: str  # "" where the framing writes none
    eos: str  # the token that ends an assistant turn in model output
    call_trigger: str
    reasoning_open: str | None
    reasoning_close: str | None
    markers: FormatMarkers = field(default_factory=FormatMarkers)
    special_tokens: tuple[str, ...] = ()
    quick_tasks: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    call_ids: CallIdForm | None = None

    def markers_as(self, kind: type[M]) -> M:
        """The markers, typed as the family's class `kind`; TypeError when they are not."""
        if not isinstance(self.markers, kind):
            raise TypeError(f"{self.name}: its markers are {type(self.markers).__name__}, not {kind.__name__}")
        return self.markers


def call_id_pattern(fmt: ToolCallFormat) -> str:
    """The regex (no anchors) of the call ids `fmt`'s model writes; TypeError where it writes none."""
    if fmt.call_ids is None:
        raise TypeError(f"{fmt.name}: the model writes no call ids of its own")
    return fmt.call_ids.pattern


def frozen(d: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of `d`."""
    return MappingProxyType(dict(d))
