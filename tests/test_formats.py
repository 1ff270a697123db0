"""The format registry: six formats (hermes under two framings), each spec self-consistent."""

from __future__ import annotations

import pytest

from callgate.formats import FORMATS, get_format


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
