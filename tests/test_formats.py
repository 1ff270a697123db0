"""The format registry: six formats (hermes under two framings), each spec self-consistent."""

from __future__ import annotations

import re
import string

import pytest

from callgate.formats import FORMATS, DsmlMarkers, Qwen3XmlMarkers, call_id_pattern, get_format, json_markers
from callgate.serving.conform import call_id_factory


def test_six_formats_registered() -> None:
    assert set(FORMATS) == {"dsml-v3.2", "dsml-v4", "qwen3-xml", "hermes", "hermes-qwen2.5", "llama3-json", "mistral"}


def test_hermes_qwen25_is_hermes_without_reasoning() -> None:
    """Same call syntax as hermes; the Qwen2.5 framing, no reasoning block, no think tags."""
    base, qwen25 = get_format("hermes"), get_format("hermes-qwen2.5")
    assert qwen25.framing == "chatml-qwen2.5"
    assert qwen25.markers == base.markers
    assert qwen25.call_trigger == base.call_trigger
    assert qwen25.reasoning_open is None and "<think>" not in qwen25.special_tokens


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_spec_names_itself_and_has_trigger(name: str) -> None:
    fmt = get_format(name)
    assert fmt.name == name
    assert fmt.call_trigger
    assert fmt.eos
    assert (fmt.reasoning_open is None) == (fmt.reasoning_close is None)


def test_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="hermes"):
        get_format("nope")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_markers_are_read_as_their_family_and_refused_as_another(name: str) -> None:
    """Each family's renderer, parser and grammar read the markers through `markers_as`; a
    spec of another family is a programming error (TypeError), never a silent default."""
    fmt = get_format(name)
    own = {"dsml": DsmlMarkers, "qwen3-xml": Qwen3XmlMarkers}.get(fmt.family) or type(json_markers(fmt))
    assert fmt.markers_as(own) is fmt.markers
    other = Qwen3XmlMarkers if fmt.family != "qwen3-xml" else DsmlMarkers
    with pytest.raises(TypeError, match=name):
        fmt.markers_as(other)
    assert all(isinstance(t, str) for t in fmt.markers.texts())


def test_json_markers_refuse_another_family() -> None:
    with pytest.raises(TypeError, match="dsml-v4"):
        json_markers(get_format("dsml-v4"))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_own_call_ids_only_where_the_model_writes_them(name: str) -> None:
    """mistral's model writes 9-letter/digit ids; every id drawn from the form matches its
    pattern, and nothing outside it does. Other formats have none (OpenAI-style ids)."""
    fmt = get_format(name)
    if name != "mistral":
        assert fmt.call_ids is None
        with pytest.raises(TypeError, match=name):
            call_id_pattern(fmt)
        return
    form = fmt.call_ids
    assert form is not None and form.length == 9
    pattern = re.compile(call_id_pattern(fmt))
    made = call_id_factory(name)
    assert all(pattern.fullmatch(made(i)) for i in range(50))
    assert not pattern.fullmatch("abc12345") and not pattern.fullmatch("abc-12345")
    assert set(string.ascii_letters + string.digits) == set(form.alphabet)
