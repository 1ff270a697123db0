"""The format registry: six formats, each spec self-consistent."""

from __future__ import annotations

import pytest

from callgate.formats import FORMATS, get_format


def test_six_formats_registered() -> None:
    assert set(FORMATS) == {"dsml-v3.2", "dsml-v4", "qwen3-xml", "hermes", "llama3-json", "mistral"}


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
